"""Content digests: one XXH3-128 per stored array, recorded at publish and checked on verify.

Recomputed by ``rlds verify`` and ``rlds inspect --check``.

A digest covers the array's *logical* values, not its files: the hash of every element in C
order, little-endian. A memmap ``.npy`` and a zarr copy of the same data have the same digest.

The manifest's ``content_digest`` holds::

    {"algorithm": "xxh3_128", "columns": {"<key>": "<hex>", ...}, "episodes": "<hex>",
     "source_arrays": "<hex>"}

``episodes`` covers ``episodes.npy`` the same way; ``source_arrays`` is the hash of
``source_metadata.npz``'s bytes, when present. Every digest of one manifest uses its
``algorithm``: :data:`ALGORITHM` for what this rlds writes, ``sha256`` in datasets older rlds wrote
(still checked, by sha256); an algorithm this rlds does not know is reported as damage, never
skipped. A view records only its ``episodes`` digest; its columns are checked against its pinned
parent's digests. A dataset without ``content_digest`` is skipped, never failed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli._util.io import DIGEST_ALGORITHM, DIGEST_ALGORITHMS, file_digest, new_hash
from rlds_cli.cache.blocks import Budget, blocks
from rlds_cli.cache.layout import ARRAYS_DIR, EPISODES_FILE, MANIFEST_FILE, SOURCE_ARRAYS_FILE, VIEW_LAYOUT
from rlds_cli.errors import CorruptDatasetError

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset
    from rlds_cli.cache.manifest import Manifest

#: The algorithm of the digests this rlds writes (why XXH3-128: :data:`rlds_cli._util.io.DIGEST_ALGORITHM`).
ALGORITHM = DIGEST_ALGORITHM
#: Bytes of one column read at a time while hashing (memory stays bounded for any dataset).
BLOCK_BYTES = 16 * 1024 * 1024
#: Why a dataset without digests is not checked (the words ``rlds verify`` and ``--check`` use).
NOT_RECORDED = "no content digest recorded (written by an older rlds)"


def _canonical(rows: np.ndarray, dtype: np.dtype) -> memoryview:
    """The bytes the digest covers: ``rows`` as ``dtype``, C order, little-endian."""
    little = np.dtype(dtype).newbyteorder("<")  # a no-op for bool, bytes, and on x86/ARM
    data = np.ascontiguousarray(rows, dtype=little)
    return data.reshape(-1).view(np.uint8).data


def recorded_algorithm(content: Mapping[str, Any]) -> str:
    """The algorithm of a manifest's ``content_digest`` (``sha256`` where none is named: the
    only one older rlds wrote).

    Raises:
        ValueError: It names one this rlds does not know (a newer rlds's, or damage); the
            message says which.
    """
    algorithm = content.get("algorithm", "sha256")
    if algorithm not in DIGEST_ALGORITHMS:
        raise ValueError(
            f"its digests are of an algorithm this rlds does not know ({str(algorithm)[:40]!r}; "
            f"known: {', '.join(DIGEST_ALGORITHMS)}): written by a newer rlds, or the manifest is damaged"
        )
    return str(algorithm)


class ColumnHasher:
    """Digest of a column fed block by block, as it is written (no second read)."""

    def __init__(self, dtype: np.dtype | str, algorithm: str = ALGORITHM) -> None:
        self.dtype = np.dtype(dtype)
        self._hash = new_hash(algorithm)

    def update(self, rows: np.ndarray) -> None:
        """Add the next rows (first axis = time)."""
        self._hash.update(_canonical(rows, self.dtype))

    def update_bytes(self, data: memoryview) -> None:
        """Add the next rows given as the bytes the digest covers (stored bytes of an array of
        a :func:`canonical` dtype; cut anywhere, even inside a row)."""
        self._hash.update(data)

    def hexdigest(self) -> str:
        return str(self._hash.hexdigest())


def canonical(dtype: np.dtype | str) -> bool:
    """Whether an array of ``dtype`` stores exactly the bytes its digest covers (little-endian,
    or of one byte), so its stored bytes can be hashed as they are read."""
    dtype = np.dtype(dtype)
    return dtype == dtype.newbyteorder("<")


#: Blocks of at least this many bytes are hashed on a helper thread while they are written.
PARALLEL_MIN_BYTES = 1 << 20


def _feed(work: list[tuple[ColumnHasher, Any]]) -> None:
    for hasher, rows in work:
        hasher.update(np.asarray(rows))


class BlockHasher:
    """Feeds blocks to their column hashers on one helper thread while the caller writes them
    (both release the GIL; with sha256, saved ~20% of a 1M-step low-dim conversion).

    Blocks under :data:`PARALLEL_MIN_BYTES` are hashed inline unless the thread is busy; every
    hasher is fed in call order. The caller must not change the rows before calling the wait
    :meth:`start` returns."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._pid = 0  # the process that made the pool: a forked child has none of its threads
        self._last: Any = None  # the newest work handed to the thread

    def start(self, work: list[tuple[ColumnHasher, Any]]) -> Callable[[], None]:
        """Begin hashing ``(hasher, rows)`` pairs, in order, after the work of earlier calls;
        returns the wait for them (it raises what the hashing raised)."""
        busy = self._last is not None and not self._last.done() and self._pid == os.getpid()
        if not busy and sum(int(getattr(rows, "nbytes", 0)) for _, rows in work) < PARALLEL_MIN_BYTES:
            _feed(work)
            return _done
        if self._pool is None or self._pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlds-digest")
            self._pid = os.getpid()
        self._last = self._pool.submit(_feed, work)
        return self._last.result

    def close(self, *, cancel: bool = False) -> None:
        """Stop the helper thread after its queued work (``cancel``: drop work not begun)."""
        pool, self._pool, self._last = self._pool, None, None
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=cancel)


def _done() -> None:
    return None


def column_digest(
    column: Any, dtype: np.dtype | str, budget: Budget | None = None, algorithm: str = ALGORITHM
) -> str:
    """Digest of a stored column (any array-like with slices), read in bounded blocks of about
    :data:`BLOCK_BYTES` (or ``budget``'s) with :func:`rlds_cli.cache.blocks.blocks`."""
    own = getattr(column, "content_digest", None)
    if own is not None:  # a frame column: the digest of its stored bytes (backends/frames.py)
        return str(own(algorithm))
    hasher = ColumnHasher(dtype, algorithm)
    for _, rows in blocks(column, budget if budget is not None else Budget(BLOCK_BYTES)):
        hasher.update(rows)
    return hasher.hexdigest()


def array_digest(array: np.ndarray, algorithm: str = ALGORITHM) -> str:
    """Digest of an in-memory array (the episode index)."""
    hasher = ColumnHasher(array.dtype, algorithm)
    hasher.update(array)
    return hasher.hexdigest()


def record(
    columns: dict[str, str], episodes: np.ndarray, source_arrays: Path | None = None
) -> dict[str, Any]:
    """The manifest's ``content_digest`` (:data:`ALGORITHM`): column digests, the episode
    index's, and that of ``source_metadata.npz``'s bytes when there is one."""
    out: dict[str, Any] = {
        "algorithm": ALGORITHM,
        "columns": dict(sorted(columns.items())),
        "episodes": array_digest(episodes),
    }
    if source_arrays is not None and source_arrays.is_file():
        out["source_arrays"] = file_digest(source_arrays, ALGORITHM)
    return out


def column_path(directory: Path, backend: str, key: str) -> Path:
    """The file (memmap) or folder (zarr) that holds column ``key``: what a report names."""
    return directory / ARRAYS_DIR / (f"{key}.npy" if backend == "memmap" else key)


def digest_directory(
    directory: Path, backend: str, keys: list[str], episodes: np.ndarray, source_arrays: Path | None = None
) -> dict[str, Any]:
    """The ``content_digest`` of the columns under ``directory``, read back (for outputs written
    by several processes)."""
    from rlds_cli.cache.backends import get_backend

    store = get_backend(backend)
    columns = {}
    for key in keys:
        column = store.open_column(directory, key)
        columns[key] = column_digest(column, column.dtype)
    return record(columns, episodes, source_arrays)


@dataclass(frozen=True)
class DigestProblem:
    """One digest that does not match: the key (a column, ``episodes`` or ``source_arrays``),
    the file or folder that holds it, and what is wrong."""

    key: str
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.key} ({self.path}): {self.message}"


@dataclass
class DigestReport:
    """The result of :func:`check_digests`.

    Attributes:
        recorded: Whether the dataset (for a view: its parent) has digests to compare with.
        checked: What was compared (column keys, ``episodes``, ``source_arrays``).
        problems: Every mismatch or unreadable array.
        scope: Whose arrays were checked, in words, when not the dataset's own (a view's
            columns are its parent's).
    """

    recorded: bool
    checked: list[str] = field(default_factory=list)
    problems: list[DigestProblem] = field(default_factory=list)
    scope: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def check_digests(
    ds: Dataset,
    progress: Callable[[str], None] | None = None,
    budget: Budget | None = None,
    keys: Collection[str] | None = None,
) -> DigestReport:
    """Recompute the content digests of ``ds`` and compare them with its manifest.

    A view's episode index is compared with its own digest, its columns (whole parent columns)
    with the parent's. Reads are bounded blocks.

    Args:
        ds: An open dataset.
        progress: Called with each key before it is hashed.
        budget: The block budget of the reads (default: :data:`BLOCK_BYTES` a block).
        keys: Check only these columns (default: all); the episode indices and source arrays
            are checked either way.

    Returns:
        A :class:`DigestReport`; ``recorded`` is false for datasets without digests.
    """
    from rlds_cli.cache.manifest import read_manifest
    from rlds_cli.cache.views import ViewSpec

    parts = getattr(ds, "segment_datasets", None)
    if parts is not None:  # a growing dataset: each segment carries the digests of its arrays
        check_segments = getattr(ds, "check_segments", None)  # a growing dataset's leaves out retired ones

        def check(part: Dataset) -> DigestReport:
            return check_digests(part, progress, budget, keys)

        if check_segments is None:
            reports = [check(part) for part in parts()]
        else:
            reports = [report for _, report in check_segments(check, lambda r: r.problems)]
        # a composed dataset's parts are its parents (cache/composed.py), beside its own index
        noun = getattr(ds, "part_noun", "segment")
        combined = DigestReport(
            recorded=all(r.recorded for r in reports),
            checked=sorted(
                {key for r in reports for key in r.checked if key != "episodes" or noun == "segment"}
            ),
            # a file two parts read (two views of one dataset) is one problem
            problems=list(dict.fromkeys(problem for r in reports for problem in r.problems)),
            scope=f"its {len(reports)} {noun}{'s' if len(reports) != 1 else ''}",
        )
        if noun == "segment":
            return combined
        _check_own_index(ds, combined)
        return combined
    own = ds.manifest.content_digest
    holder: Manifest = ds.manifest
    directory = ds.directory
    scope = ""
    if ds.manifest.layout == VIEW_LAYOUT:
        view = ViewSpec.from_manifest(ds.manifest)
        # the parent lies next to the view (the cache's name-to-directory rule, as in Dataset)
        directory = ds.directory.parent / view.parent.replace("/", "--")
        try:
            holder = read_manifest(directory)
        except (FileNotFoundError, CorruptDatasetError):
            # check_files already reports a missing or replaced parent
            return DigestReport(recorded=bool(own), scope=f"parent {view.parent!r} unreadable")
        scope = f"its parent {view.parent!r}"
    report = DigestReport(recorded=bool(holder.content_digest.get("columns")), scope=scope)
    if holder is not ds.manifest:
        _check_parent_index(ds, directory, report)
    recorded_columns: dict[str, str] = holder.content_digest.get("columns", {})
    algorithm = _algorithm_or_problem(holder, directory, report) if report.recorded else None
    if algorithm is not None:
        from rlds_cli.cache.backends import get_backend

        # the dataset's own backend reads its own columns (a remote dataset's reads the store)
        store = ds._backend if holder is ds.manifest else get_backend(holder.backend)
        from rlds_cli.cache.backends.frames import frame_files, open_frames

        for key, spec in holder.fields.items():
            if keys is not None and key not in keys:
                continue
            fmt = spec.frame_format
            path = frame_files(directory, key)[0] if fmt else column_path(directory, holder.backend, key)
            want = recorded_columns.get(key)
            if want is None:
                report.problems.append(DigestProblem(key, path, "the manifest records no digest of it"))
                continue
            if progress is not None:
                progress(key)
            try:
                if fmt is not None and holder is ds.manifest:  # its own (a remote one's: where it lies)
                    column = ds.column(key)
                elif fmt is not None:
                    column = open_frames(directory, key, fmt, repr(key))
                else:
                    column = store.open_column(directory, key)
                got = column_digest(column, spec.dtype, budget, algorithm)
            except CorruptDatasetError as exc:
                report.problems.append(DigestProblem(key, path, exc.message))
                continue
            report.checked.append(key)
            if got != want:
                report.problems.append(
                    DigestProblem(
                        key,
                        path,
                        f"content changed since it was written ({algorithm} {got[:16]}..., "
                        f"recorded {want[:16]}...)",
                    )
                )
    if algorithm is not None and holder is not ds.manifest:  # a view reads its parent's too
        _check_source_arrays(directory, holder.content_digest, algorithm, report)
    own_algorithm = _algorithm_or_problem(ds.manifest, ds.directory, report)
    if own_algorithm is None:
        return report
    _check_own_index(ds, report, own_algorithm)
    _check_source_arrays(ds.directory, own, own_algorithm, report)
    return report


def _check_source_arrays(
    directory: Path, recorded: dict[str, Any], algorithm: str, report: DigestReport
) -> None:
    """``directory``'s ``source_metadata.npz`` against the digest ``recorded`` for it (none: no
    such file was written)."""
    want = recorded.get("source_arrays")
    if not want:
        return
    path = directory / SOURCE_ARRAYS_FILE
    report.checked.append("source_arrays")
    if not path.is_file():
        report.problems.append(DigestProblem("source_arrays", path, "the file is missing"))
    elif file_digest(path, algorithm) != want:
        report.problems.append(DigestProblem("source_arrays", path, "the file changed since it was written"))


def _algorithm_or_problem(holder: Manifest, directory: Path, report: DigestReport) -> str | None:
    """The algorithm of ``holder``'s digests, or ``None`` with the problem added to ``report``
    (one this rlds does not know: its digests cannot be checked, which is never a pass)."""
    try:
        return recorded_algorithm(holder.content_digest)
    except ValueError as exc:
        if not any(p.key == "content_digest" and p.path.parent == directory for p in report.problems):
            report.problems.append(DigestProblem("content_digest", directory / MANIFEST_FILE, str(exc)))
        return None


def _check_parent_index(ds: Dataset, directory: Path, report: DigestReport) -> None:
    """A view's parent's episode index, which its episode table reads (source ids, seeds): it
    opens, whole and as recorded (:meth:`Dataset.episode_index` checks both)."""
    try:
        parent = ds.view_parent()
        if parent is not None:
            _ = parent[0].episode_index  # loading it checks it
    except CorruptDatasetError as exc:
        report.problems.append(DigestProblem("episodes", directory / EPISODES_FILE, exc.message))


def _check_own_index(ds: Dataset, report: DigestReport, algorithm: str | None = None) -> None:
    """Compare the dataset's own episode index with its recorded digest (where one is)."""
    want = ds.manifest.content_digest.get("episodes")
    if not want:
        return
    if algorithm is None:
        algorithm = _algorithm_or_problem(ds.manifest, ds.directory, report)
        if algorithm is None:
            return
    report.checked.append("episodes")
    got = array_digest(ds.episode_index, algorithm)
    if got != want:
        report.problems.append(
            DigestProblem(
                "episodes",
                ds.directory / EPISODES_FILE,
                "the episode index changed since it was written "
                f"({algorithm} {got[:16]}..., recorded {want[:16]}...)",
            )
        )
