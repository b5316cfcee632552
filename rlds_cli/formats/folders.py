"""Sources made of many files: folders of episode files that a writer may still be filling
(V-D4RL, Gen-DGRL, AMAGO), the row counts writers put in file names, and an ordered parallel map
over source files.

Rules (``docs/formats.md``, "Folders of episode files"):

* **Ignored names.** Names starting with ``.`` (temporary files such as rsync's
  ``.name.npz.Xy12Ab``, rlds's own ``.rlds/``) and names ending in an in-progress suffix
  (:data:`IN_PROGRESS_SUFFIXES`) are never read.
* **Half-written files.** The writers write the final name directly: DreamerV2's, DrQ-v2's and
  Gen-DGRL's ``save_episode`` write ``np.savez_compressed`` into a ``BytesIO``, then its bytes to
  ``<final name>.npz``; AMAGO's ``save_to_disk`` calls ``np.savez(path)`` (or ``pickle.dump`` into
  ``<path>.traj``). So a folder being written holds a truncated file under its final name. Such
  a file stops the conversion with one line naming it, unless ``--option skip_bad_files=true``:
  then it is skipped and named in the conversion notes. A hostile file (a bomb, links out) is
  never skipped.

**Row counts in file names** (``docs/formats.md``, "V-D4RL"); three writers disagree:

* DreamerV2's ``save_episode`` (``dreamerv2/common/replay.py``): ``{timestamp}-{uuid4 hex}-{n}.npz``
  with ``n = eplen(episode) = len(episode['action']) - 1`` (the reset row not counted).
* DrQ-v2's ``ReplayBufferStorage._store_episode`` (``drqv2/replay_buffer.py``):
  ``{timestamp}_{index}_{n}.npz`` with ``n = episode_len(episode)``, also rows - 1.
* V-D4RL's ``conversion_scripts/hdf5_to_npz.py``: Dreamer's pattern with
  ``n = len(episode['action'])``, every row counted (501 for a 500-step episode).

``rows - 1`` and ``rows`` are both accepted silently; the arrays decide, so any other number is a
warning in the conversion notes, never a refusal.

**Parallel map** (:func:`ordered_map`, used by the Roboset, AMAGO and RLDS TFRecord readers): over
source files, in worker processes, with a bounded window. Results come back in input order, so
converted arrays are byte-identical whatever the number of workers; at most ``window`` results
are in flight or waiting, bounding memory to about ``window`` times the largest unit.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rlds_cli._util.cpus import usable_cpus
from rlds_cli.errors import RldsError, SourceFormatError
from rlds_cli.formats.untrusted import UnsafeSourceError

#: DreamerV2 and V-D4RL: ``<YYYYmmddTHHMMSS>-<uuid4 hex>-<n>.npz``.
DREAMER_NAME = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{32}-(\d+)\.npz$")
#: DrQ-v2: ``<YYYYmmddTHHMMSS>_<episode index>_<n>.npz``.
DRQV2_NAME = re.compile(r"^\d{8}T\d{6}_\d+_(\d+)\.npz$")


def named_rows(path: Path) -> int | None:
    """The count a writer put in ``path``'s name, or ``None`` for a name no writer gave."""
    found = DREAMER_NAME.match(path.name) or DRQV2_NAME.match(path.name)
    return int(found.group(1)) if found else None


def name_mismatch(path: Path, rows: int) -> str | None:
    """A warning when ``path``'s name counts neither ``rows - 1`` (DreamerV2, DrQ-v2) nor ``rows``
    (V-D4RL); ``None`` when it agrees or carries no count."""
    named = named_rows(path)
    if named is None or named in (rows - 1, rows):
        return None
    return (
        f"{path.name}: the file name says {named} rows, but its arrays hold {rows} (writers name "
        f"{rows - 1} or {rows}); the arrays were used (a renamed episode?)"
    )


#: Name endings of files still being written or downloaded (never read from a folder).
IN_PROGRESS_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".crdownload", ".download", ".swp", "~")
#: What the user passes to convert a folder's readable files and skip the broken ones.
SKIP_OPTION = "skip_bad_files"
SKIP_HOW = f"pass --option {SKIP_OPTION}=true to convert the rest"


def ignored_name(relative: Path) -> bool:
    """Whether a path inside a source folder is never read: a hidden part, or in progress."""
    if any(part.startswith(".") for part in relative.parts):
        return True
    return relative.name.lower().endswith(IN_PROGRESS_SUFFIXES)


def folder_files(folder: Path, wanted: Callable[[Path], bool]) -> list[Path]:
    """The files under ``folder`` that ``wanted`` accepts, minus hidden and in-progress names, in sorted
    path order."""
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and not ignored_name(p.relative_to(folder)) and wanted(p)
    )


class BadFiles:
    """The broken files of one conversion: skipped (when the user asked), or a single error line."""

    def __init__(self, skip: bool) -> None:
        self.skip = bool(skip)
        self.skipped: list[str] = []

    def handle(self, path: Path, exc: RldsError) -> None:
        """Record ``path`` as skipped, or raise ``exc`` saying how to convert the rest.

        Raises:
            UnsafeSourceError: A hostile file, never skipped.
            SourceFormatError: ``exc``'s message with :data:`SKIP_HOW` (when not skipping).
        """
        if isinstance(exc, UnsafeSourceError) or not isinstance(exc, SourceFormatError):
            raise exc
        if not self.skip:
            raise SourceFormatError(f"{exc.message} ({SKIP_HOW})", hint=exc.hint) from exc
        self.skipped.append(exc.message if path.name in exc.message else f"{path}: {exc.message}")

    def note(self) -> str | None:
        """The conversion note naming every skipped file, or ``None``."""
        if not self.skipped:
            return None
        head = f"{len(self.skipped)} unreadable files skipped ({SKIP_OPTION}=true): "
        return head + "; ".join(self.skipped)


T = TypeVar("T")
R = TypeVar("R")

#: Below this many source bytes a pool costs more (process start, imports) than it saves.
MIN_PARALLEL_BYTES = 32 * 1024 * 1024


def default_workers(units: int, total_bytes: int) -> int:
    """Workers used when the caller did not say: the cores, but 1 for small sources."""
    if units < 2 or total_bytes < MIN_PARALLEL_BYTES:
        return 1
    return max(1, min(usable_cpus(), units))


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], workers: int, window: int | None = None
) -> Iterator[R]:
    """``map(fn, items)`` in ``workers`` processes, yielding results in input order.

    ``fn`` must be a module-level function (it is pickled). With ``workers <= 1`` everything
    runs in this process. Errors raised by ``fn`` reach the caller unchanged.
    """
    if workers <= 1:
        for item in items:
            yield fn(item)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # forkserver: never fork this process (it may hold HDF5 handles or a progress thread's locks)
    ctx = multiprocessing.get_context("forkserver")
    window = window or 2 * workers
    pending: deque[Any] = deque()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
