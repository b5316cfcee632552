"""Where a run's replay logs lie: Dopamine's checkpoint file names, the ``replay_logs/`` folder,
sniffing, a conversion's source files, and the rules' constants (:mod:`rlds_cli.formats.atari_dqn`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

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


def file_name(name: str, checkpoint: int) -> str:
    """Dopamine's file name of array ``name`` in checkpoint ``checkpoint``."""
    return f"{name}_ckpt.{checkpoint}.gz"


def parse_name(name: str) -> tuple[str, int] | None:
    m = FILE_RE.match(name)
    if m is None or m["name"] not in FILE_NAMES:
        return None
    return m["name"], int(m["n"])


def scan_folder(folder: Path) -> dict[int, dict[str, Path]]:
    """The checkpoint files in ``folder``: number -> {name: path}."""
    found: dict[int, dict[str, Path]] = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            parsed = parse_name(entry.name)
            if parsed is not None and entry.is_file():
                found.setdefault(parsed[1], {})[parsed[0]] = Path(entry.path)
    return found


def has_logs(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(
                entry.name.startswith(STORE_PREFIX + "observation_ckpt.") and parse_name(entry.name)
                for entry in entries
            )
    except OSError:
        return False


def logs_folder(path: Path) -> Path | None:
    """The ``replay_logs`` folder ``path`` names: itself, its ``replay_logs/`` (a run folder), or
    the folder of one of its files; ``None`` when ``path`` is none of these."""
    if path.is_file():
        return path.parent if parse_name(path.name) is not None else None
    if path.is_dir():
        if has_logs(path):
            return path
        if has_logs(path / LOGS_DIR):
            return path / LOGS_DIR
    return None


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "a Dopamine replay_logs folder of gzip'd .npy files ($store$_observation_ckpt.N.gz, "
    "$store$_action_ckpt.N.gz, ..., add_count_ckpt.N.gz, invalid_range_ckpt.N.gz)"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Dopamine ``replay_logs`` folder, a run folder holding one, or one of
    its ``*_ckpt.N.gz`` files."""
    try:
        return logs_folder(path) is not None
    except OSError:
        return False


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The checkpoint files a conversion reads (all checkpoints of the folder, or those of the
    files named), by checkpoint then in :data:`FILE_NAMES` order."""
    out: list[Path] = []
    for p in paths:
        folder = logs_folder(p)
        if folder is None:  # not ours: the reader says what is wrong
            out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            continue
        only = parse_name(p.name) if p.is_file() else None
        for number, files in sorted(scan_folder(folder).items()):
            if only is None or number == only[1]:
                out += [files[name] for name in FILE_NAMES if name in files]
    return list(dict.fromkeys(out))
