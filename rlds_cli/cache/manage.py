"""Cache housekeeping: remove datasets, measure disk use, collect garbage."""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rlds_cli._util.io import file_bytes, tree_bytes
from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli.cache.layout import COMPOSED_LAYOUT, MANIFEST_FILE, VIEW_LAYOUT, download_locks, tmp_owner
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import CorruptDatasetError, DatasetInUseError, DatasetNotFoundError


def children_of(cache: CacheRoot, name: str, *, reading: bool | None = None) -> list[str]:
    """Names of the datasets made from ``name`` (:meth:`Manifest.parent_names`); ``reading``: only
    those that read its rows (views, merges, trims: they refuse to read once it is replaced), or
    (``False``) only the copies made from it (preprocessed: they keep reading)."""
    return [
        m.name
        for m in cache.iter_manifests()
        if name in m.parent_names()
        and (reading is None or (m.layout in (VIEW_LAYOUT, COMPOSED_LAYOUT)) == reading)
    ]


def remove_dataset(cache: CacheRoot, name: str, *, force: bool = False) -> Path:
    """Remove a dataset from the cache (invisible at once, then deleted).

    Args:
        cache: The cache.
        name: Dataset name.
        force: Remove it even when other datasets were derived from it.

    Returns:
        The directory that was removed.

    Raises:
        DatasetNotFoundError: No such dataset.
        DatasetInUseError: Other datasets name it as their parent and ``force`` is false.
    """
    directory = cache.dataset_dir(name)
    if not cache.exists(name):
        raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {cache.path}")
    children = children_of(cache, name)
    if children and not force:
        raise _in_use(cache, [name], sorted(children))
    cache.remove(name)
    return directory


def _in_use(cache: CacheRoot, names: list[str], children: list[str]) -> DatasetInUseError:
    """The refusal to remove ``names[0]`` (of ``names``, the datasets being removed), which
    ``children`` were made from: the hint's command names every dataset made from them, at any
    depth, and says which of them --force leaves unreadable."""
    name = names[0]
    among = set(names)
    every: dict[str, None] = {}
    pending = list(children)
    while pending:  # each dataset made from one being removed, and those made from it
        child = pending.pop(0)
        if child not in every and child not in among:
            every[child] = None
            pending += children_of(cache, child)
    reading = sorted(c for c in children if c in children_of(cache, name, reading=True))
    if reading:
        effect = f"leave {', '.join(reading)} unreadable"
    else:  # copies (preprocessed, downsampled) keep their own arrays
        effect = "remove it anyway (copies made from it keep their own data)"
    return DatasetInUseError(
        f"dataset {name!r} is the parent of {', '.join(children)}",
        hint=f"remove them with it ('rlds rm {' '.join(names)} {' '.join(every)} --yes'), or pass --force "
        f"to {effect}",
    )


@dataclass(frozen=True)
class RemovalPlan:
    """What :func:`remove_datasets` removes, checked whole before anything goes.

    Attributes:
        targets: The datasets, derived ones first (a parent removed with its children needs no
            ``force``).
        raw_folders: Per dataset, the folder of downloaded files it was converted from (or
            ``None``).
    """

    targets: list[str]
    raw_folders: dict[str, Path | None]


@dataclass(frozen=True)
class RemovalResult:
    """What :func:`remove_datasets` did: datasets removed, download folders removed, and
    download folders kept (still used, or ``raw`` not asked)."""

    removed: list[str]
    removed_raw: list[Path]
    kept_raw: list[Path]


def plan_removal(cache: CacheRoot, names: list[str], *, force: bool = False) -> RemovalPlan:
    """Check a removal of ``names`` (cache names, already resolved) before anything is removed.

    Raises:
        DatasetNotFoundError: A name is not in the cache.
        DatasetInUseError: A dataset not among ``names`` was derived from one of them and
            ``force`` is false.
    """
    targets = list(dict.fromkeys(names))
    for name in targets:
        if not cache.exists(name):
            raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {cache.path}")
    among = set(targets)  # not read inside the sort: a list being sorted looks empty
    targets.sort(key=lambda n: -_depth(cache, n, among))
    if not force:
        for name in targets:
            others = sorted(set(children_of(cache, name)) - among)
            if others:
                raise _in_use(cache, [name, *(n for n in targets if n != name)], others)
    return RemovalPlan(targets, {n: raw_folder_of(cache, n) for n in targets})


def remove_datasets(
    cache: CacheRoot, plan: RemovalPlan, *, force: bool = False, raw: bool = False
) -> RemovalResult:
    """Remove the datasets of ``plan`` and, with ``raw``, the download folders no other dataset
    or download uses."""
    for name in plan.targets:
        remove_dataset(cache, name, force=force)
    folders = sorted({f for f in plan.raw_folders.values() if f is not None})
    removed_raw = remove_unused_raw(cache, folders) if raw else []
    kept_raw = [f for f in folders if f not in removed_raw and f.is_dir()]
    return RemovalResult(list(plan.targets), removed_raw, kept_raw)


def _depth(cache: CacheRoot, name: str, among: set[str]) -> int:
    """How many of ``among`` a dataset derives from, through its lineage (children sort first)."""
    depth, seen, current = 0, set(), name
    while True:
        try:
            lineage = cache.manifest(current).lineage
        except CorruptDatasetError:  # a damaged manifest names no parent: it is still removed
            return depth
        parents = [p.get("name") for p in lineage if p.get("name") in among]
        if not parents or parents[0] in seen:
            return depth
        current = str(parents[0])
        seen.add(current)
        depth += 1


@dataclass
class DiskUsage:
    """Bytes used under a cache root, by part."""

    root: Path
    datasets: dict[str, int] = field(default_factory=dict)
    tmp: int = 0
    raw: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return sum(self.datasets.values()) + self.tmp + self.raw + self.other

    def to_dict(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "datasets": dict(self.datasets),
            "tmp_bytes": self.tmp,
            "raw_bytes": self.raw,
            "other_bytes": self.other,
            "total_bytes": self.total,
        }


def disk_usage(cache: CacheRoot) -> DiskUsage:
    """Disk use of every dataset, temporary builds, raw downloads and the rest, in allocated
    bytes as ``du`` counts them (:func:`file_bytes`)."""
    usage = DiskUsage(cache.path)
    for manifest in cache.iter_manifests():
        usage.datasets[manifest.name] = tree_bytes(cache.dataset_dir(manifest.name))
    usage.tmp = tree_bytes(cache.tmp_dir)
    usage.raw = tree_bytes(cache.layout.raw_dir)
    if cache.path.is_dir():
        counted = {cache.datasets_dir, cache.tmp_dir, cache.layout.raw_dir}
        for child in cache.path.iterdir():
            if child not in counted:
                usage.other += tree_bytes(child)
        known = {cache.dataset_dir(n) for n in usage.datasets}
        if cache.datasets_dir.is_dir():  # directories without a manifest are not datasets
            usage.other += sum(tree_bytes(d) for d in cache.datasets_dir.iterdir() if d not in known)
    return usage


def collect_garbage(
    cache: CacheRoot, *, dry_run: bool = False, jobs: bool = False, raw: bool = False
) -> list[Path]:
    """Remove what no dataset needs: builds and trash left by killed processes, and directories
    under ``datasets/`` without a manifest.

    Args:
        cache: The cache.
        dry_run: Only report what would be removed.
        jobs: Also remove interrupted ``rlds preprocess`` job directories (what ``--resume``
            continues from; a running job is never touched).
        raw: Also remove download folders (``raw/``) that no cached dataset was converted from
            (a folder with a download in progress is never touched).

    Returns:
        The paths removed (or that would be).
    """
    found: list[Path] = []
    found.extend(cache.clean_stale_builds(dry_run=dry_run))
    if jobs:
        found.extend(_stale_jobs(cache, dry_run=dry_run))
    if raw:
        found.extend(_orphaned_raw(cache, dry_run=dry_run))
    if cache.datasets_dir.is_dir():
        for child in sorted(cache.datasets_dir.iterdir()):
            if child.is_dir() and not (child / MANIFEST_FILE).exists() and not _holds_files(child):
                found.append(child)
                if not dry_run:
                    shutil.rmtree(child, ignore_errors=True)
    return found


def manifestless_datasets(cache: CacheRoot) -> list[Path]:
    """Folders under ``datasets/`` that hold files but no ``manifest.json``: damage (a dataset is
    published with its manifest, and withdrawn whole), never collected: views may read their
    arrays, and a restored manifest brings the dataset back."""
    if not cache.datasets_dir.is_dir():
        return []
    return [
        child
        for child in sorted(cache.datasets_dir.iterdir())
        if child.is_dir() and not (child / MANIFEST_FILE).exists() and _holds_files(child)
    ]


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` holds a file or link at any depth (empty folders alone are a leftover)."""
    return any(p.is_file() or p.is_symlink() for p in folder.rglob("*"))


def interrupted_jobs(cache: CacheRoot) -> list[Path]:
    """Directories of failed or interrupted preprocess jobs that no running job holds."""
    return _stale_jobs(cache, dry_run=True)


def _stale_jobs(cache: CacheRoot, *, dry_run: bool) -> list[Path]:
    """Preprocess job directories whose output name is not locked."""
    found: list[Path] = []
    for child in cache.layout.job_dirs():
        try:
            with FileLock(cache.layout.lock_file(tmp_owner(child)), timeout=0):
                if not dry_run:
                    shutil.rmtree(child, ignore_errors=True)
                found.append(child)
        except Timeout:
            continue  # the job is running
    return found


def raw_folder_of(cache: CacheRoot, name: str) -> Path | None:
    """The existing download folder (``raw/...``) a dataset was converted from, else ``None``."""
    try:
        raw = cache.manifest(name).source.get("raw_dir")
    except CorruptDatasetError:  # a damaged manifest: the dataset can still be removed
        return None
    return Path(raw) if raw and Path(raw).is_dir() else None


def remove_unused_raw(cache: CacheRoot, folders: list[Path], *, dry_run: bool = False) -> list[Path]:
    """Remove those of ``folders`` no cached dataset was converted from and no download is
    writing to (``rlds rm --raw``).

    Returns:
        The folders removed (or that would be); the others are kept.
    """
    wanted = {f.resolve() for f in folders}
    return _orphaned_raw(cache, dry_run=dry_run, only=wanted)


def _orphaned_raw(cache: CacheRoot, *, dry_run: bool, only: set[Path] | None = None) -> list[Path]:
    """Download folders no dataset's manifest names as its ``source.raw_dir`` (among ``only``)."""
    raw_root = cache.layout.raw_dir
    if not raw_root.is_dir():
        return []
    used = {Path(m.source["raw_dir"]).resolve() for m in cache.iter_manifests() if m.source.get("raw_dir")}
    found: list[Path] = []
    for folder in sorted(p for p in raw_root.iterdir() if p.is_dir()):
        if folder.resolve() in used or (only is not None and folder.resolve() not in only):
            continue
        with ExitStack() as held:
            try:  # every file download holds its lock while it runs
                for lock in download_locks(folder):
                    held.enter_context(FileLock(lock, timeout=0))
            except Timeout:
                continue
            if not dry_run:
                shutil.rmtree(folder, ignore_errors=True)
            found.append(folder)
    return found


def dataset_path(cache: CacheRoot, name: str) -> Path:
    """The directory of a published dataset."""
    if not cache.exists(name):
        raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {cache.path}")
    return cache.dataset_dir(name)


__all__ = [
    "DiskUsage",
    "children_of",
    "collect_garbage",
    "dataset_path",
    "disk_usage",
    "file_bytes",
    "interrupted_jobs",
    "raw_folder_of",
    "remove_dataset",
    "remove_unused_raw",
    "tree_bytes",
]
