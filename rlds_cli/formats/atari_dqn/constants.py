"""The rules' constants of the Atari DQN replay logs reader: Dopamine's file names and the
reader's sizes (see :mod:`rlds_cli.formats.atari_dqn`)."""

from __future__ import annotations

import re

RULES = "atari-dqn-v1"
#: Dopamine's prefix of the files of its store arrays (``STORE_FILENAME_PREFIX``).
STORE_PREFIX = "$store$_"
STORE = ("observation", "action", "reward", "terminal")
SIDE = ("add_count", "invalid_range")
#: The six files of a checkpoint, by their name before ``_ckpt.N.gz``.
FILE_NAMES = (*(STORE_PREFIX + n for n in STORE), *SIDE)
LOGS_DIR = "replay_logs"
#: Dopamine's Atari frame stack (``stack_size``): ``stack_size - 1`` zero rows precede an episode.
DEFAULT_STACK_SIZE = 4
#: Largest ``invalid_range`` read (Dopamine's holds ``stack_size + update_horizon`` values).
MAX_INVALID_RANGE = 1024
#: Compressed bytes read from a file at a time.
READ_BYTES = 1 << 20
#: Most bytes inflated at once when skipping rows.
SKIP_BYTES = 4 << 20
FILE_RE = re.compile(r"^(?P<name>.+)_ckpt\.(?P<n>[0-9]{1,9})\.gz$")
REDOWNLOAD_HINT = "re-download the checkpoint's files; Dopamine writes each with np.save into a gzip file"
