"""Row counts that episode writers put in file names, and how rlds checks them.

Three writers name V-D4RL-style episode files, and they do not agree on the count
(``docs/formats.md``, "V-D4RL"):

* DreamerV2's ``save_episode`` (``dreamerv2/common/replay.py``): ``{timestamp}-{uuid4 hex}-{n}.npz``
  with ``n = eplen(episode) = len(episode['action']) - 1``: the reset row is not counted.
* DrQ-v2's ``ReplayBufferStorage._store_episode`` (``drqv2/replay_buffer.py``):
  ``{timestamp}_{index}_{n}.npz`` with ``n = episode_len(episode)``, also rows - 1 ("the dummy
  first transition").
* V-D4RL's own ``conversion_scripts/hdf5_to_npz.py``: Dreamer's pattern with
  ``n = len(episode['action'])``, every row counted (501 for a 500-step episode).

So a name says ``rows - 1`` or ``rows``, and both are accepted silently. The name is only a label
(the arrays are checked against each other, and they decide): any other number is a warning,
recorded in the conversion notes, never a refusal.
"""

from __future__ import annotations

import re
from pathlib import Path

#: DreamerV2 and V-D4RL: ``<YYYYmmddTHHMMSS>-<uuid4 hex>-<n>.npz``.
DREAMER_NAME = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{32}-(\d+)\.npz$")
#: DrQ-v2: ``<YYYYmmddTHHMMSS>_<episode index>_<n>.npz``.
DRQV2_NAME = re.compile(r"^\d{8}T\d{6}_\d+_(\d+)\.npz$")


def named_rows(path: Path) -> int | None:
    """The count a writer put in ``path``'s name, or ``None`` for a name no writer gave."""
    found = DREAMER_NAME.match(path.name) or DRQV2_NAME.match(path.name)
    return int(found.group(1)) if found else None


def name_mismatch(path: Path, rows: int) -> str | None:
    """A warning when ``path``'s name counts neither ``rows - 1`` (DreamerV2, DrQ-v2) nor
    ``rows`` (V-D4RL's ``hdf5_to_npz.py``); ``None`` when it agrees or carries no count."""
    named = named_rows(path)
    if named is None or named in (rows - 1, rows):
        return None
    return (
        f"{path.name}: the file name says {named} rows, but its arrays hold {rows} (writers name "
        f"{rows - 1} or {rows}); the arrays were used (a renamed episode?)"
    )
