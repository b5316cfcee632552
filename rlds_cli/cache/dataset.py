"""Read access to a cached dataset: full TED views rebuilt from the flat layout.

A ``--force`` rebuild replaces a dataset's directory by a rename while readers may have it
open. A :class:`Dataset` is bound to the directory it opened (inode and ctime): it never
mixes the files of two versions. :func:`open_dataset` retries when a replacement races with
it, and a read that would need files of a replaced version raises
:class:`DatasetReplacedError`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.layout import EPISODES_FILE, SOURCE_ARRAYS_FILE, VIEW_LAYOUT
from rlds_cli.cache.manifest import FieldSpec, Manifest, read_manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.cache.views import SlicedColumn, ViewSpec
from rlds_cli.errors import CorruptDatasetError, DatasetNotFoundError, DatasetReplacedError

#: How often :func:`open_dataset` tries again while a replacement of the dataset is under way.
_OPEN_ATTEMPTS = 20
_OPEN_RETRY_SECONDS = 0.005


def _identity(directory: Path) -> tuple[int, int, int] | None:
    """What tells one published version of a dataset from the next: its directory's inode and
    ctime. Inodes of deleted versions are reused at once; the ctime (set when the directory
    was renamed into place, never changed after) tells the reuse apart."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def open_dataset(
    name: str,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    *,
    cache: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
) -> Dataset:
    """Open a converted dataset read-only.

    Args:
        name: The dataset's name in the cache (see ``rlds list``), or a registry id or alias
            of a downloaded dataset (see :func:`rlds_cli.resolve_name`), or the URL of a zarr
            dataset pushed with ``rlds push`` (``s3://bucket/prefix/NAME``, any fsspec URL): it
            is then read where it lies (see :class:`rlds_cli.remote.reader.RemoteDataset`).
        root: Cache root; ``None`` uses ``$RLDS_HOME`` or the platform cache dir.
        cache: For a URL: a folder where the files read are kept, so that a second pass reads
            nothing from the store (default ``$RLDS_REMOTE_CACHE``; none: ranged reads only).
        storage_options: For a URL: keyword arguments of its fsspec filesystem (credentials...).
        endpoint_url: For an ``s3://`` URL: an S3-compatible server.

    Returns:
        A :class:`Dataset`.

    Raises:
        DatasetNotFoundError: No dataset of that name in the cache.
        CorruptDatasetError: The dataset's files do not match its manifest.
        RemoteNotReadableError: A URL of a memmap dataset (pull it instead).
    """
    from rlds_cli.remote.reader import is_url

    if is_url(name):
        from rlds_cli.remote.reader import open_remote

        return open_remote(name, cache=cache, storage_options=storage_options, endpoint_url=endpoint_url)
    cache_root = root if isinstance(root, CacheRoot) else CacheRoot(root)
    name = _cache_name(name, cache_root)
    directory = cache_root.dataset_dir(name)
    for attempt in range(_OPEN_ATTEMPTS):
        before = _identity(directory)
        try:
            dataset = Dataset(directory, cache_root.manifest(name))
            if dataset._identity == before:  # manifest, index and directory of one version
                return dataset
        except (DatasetNotFoundError, CorruptDatasetError, DatasetReplacedError):
            if attempt + 1 == _OPEN_ATTEMPTS or not _being_replaced(cache_root, directory, before):
                raise
        time.sleep(_OPEN_RETRY_SECONDS)
    raise DatasetReplacedError(f"dataset {name!r} kept being replaced while it was opened")


def _cache_name(name: str, cache: CacheRoot) -> str:
    """The cache name ``name`` refers to (a registry alias resolves to its dataset's name).

    A name found nowhere is returned as it is: the open that follows either finds it once a
    replacement under way has finished, or raises with the name the user gave."""
    from rlds_cli.names import resolve_name

    try:
        return resolve_name(name, cache)
    except DatasetNotFoundError:
        return name


def _being_replaced(cache: CacheRoot, directory: Path, before: tuple[int, int, int] | None) -> bool:
    """Whether a failed open may have raced with a rebuild: the directory changed, or a
    replaced version is on its way out (``publish`` renames it to ``tmp/*.trash`` first)."""
    if _identity(directory) != before:
        return True
    return cache.tmp_dir.is_dir() and any(cache.tmp_dir.glob(f"{directory.name}.*.trash"))


class Dataset:
    """A read-only TED dataset backed by the cache.

    ``observation``-like keys are stored once per step plus one final value per episode;
    reading rebuilds ``next/observation`` from the row after, so inside an episode
    ``next/observation[t] == observation[t + 1]`` and at the end of an episode it is the true
    final observation. ``next/done`` is ``next/terminated | next/truncated`` and ``episode`` is
    the episode's position in the dataset; both are derived, not stored.

    Args:
        directory: A published dataset directory.
        manifest: Its manifest (read from ``directory`` when ``None``).
    """

    def __init__(self, directory: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        self.directory = Path(directory)
        self._identity = _identity(self.directory)
        if manifest is None:
            try:
                manifest = read_manifest(self.directory)
            except FileNotFoundError:
                raise DatasetNotFoundError(f"{self.directory} is not an rlds dataset (no manifest)") from None
        self.manifest = manifest
        self._backend = get_backend(manifest.backend)
        self._columns: dict[str, Any] = {}
        self._parent_checked: Path | None = None
        self.episodes = self._load_episode_index()
        self._starts = np.ascontiguousarray(self.episodes["start"])
        self._check_not_replaced()

    # ------------------------------------------------------------------ pickling (workers)

    def __getstate__(self) -> dict[str, Any]:
        # Only the path and manifest travel to worker processes; arrays reopen lazily there.
        return {"directory": str(self.directory), "manifest": self.manifest.to_dict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["directory"])
        if self.manifest.to_dict() != state["manifest"]:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.directory} was replaced after it was opened"
            )

    def _check_not_replaced(self) -> None:
        if _identity(self.directory) != self._identity:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.directory} was replaced while it was open"
            )

    def _after_read(self, error: OSError | None = None) -> None:
        """Make sure rows just read (or a read that failed) belong to this version: memory maps
        keep reading the files they opened, zarr reads its chunks by path at every access."""
        if error is not None or not self._backend.stable_once_open:
            self._check_not_replaced()

    # ------------------------------------------------------------------ facts

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def num_steps(self) -> int:
        return self.manifest.num_steps

    @property
    def num_episodes(self) -> int:
        return self.manifest.num_episodes

    def __len__(self) -> int:
        return self.num_steps

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, steps={self.num_steps}, episodes={self.num_episodes}, "
            f"backend={self.manifest.backend!r})"
        )

    @property
    def stored_fields(self) -> dict[str, FieldSpec]:
        """The arrays on disk, by key (observation-like keys once, with ``storage="flat"``)."""
        return self.manifest.fields

    @property
    def fields(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The TED view: every readable key -> (per-step shape, dtype)."""
        out: dict[str, tuple[tuple[int, ...], str]] = {}
        for key, spec in self.manifest.fields.items():
            out[key] = (spec.shape, spec.dtype)
            if spec.storage == "flat":
                out[f"next/{key}"] = (spec.shape, spec.dtype)
        out["next/done"] = ((1,), "bool")
        out["episode"] = ((), "int64")
        return dict(sorted(out.items(), key=lambda kv: (kv[0].startswith("next/"), kv[0])))

    @property
    def source_arrays(self) -> dict[str, np.ndarray]:
        """Non-step arrays kept from the source file (e.g. D4RL ``metadata/policy/*``)."""
        path = self.directory / SOURCE_ARRAYS_FILE
        if not path.is_file():
            self._check_not_replaced()
            return {}
        with np.load(path, allow_pickle=False) as data:
            arrays = {k.replace("__", "/"): data[k] for k in data.files}
        self._check_not_replaced()
        return arrays

    def size_bytes(self) -> int:
        """Bytes the dataset uses on disk."""
        return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())

    def check_files(self) -> list[str]:
        """Every stored file there at its full size (memmap files, every zarr chunk), checked
        without reading data; returns the problems found (empty: complete). A view checks the
        files of its parent."""
        problems: list[str] = []
        directory = self.directory
        if self.manifest.layout == VIEW_LAYOUT:
            for key in self.manifest.fields:
                try:
                    self.column(key)
                except (CorruptDatasetError, KeyError) as exc:
                    problems.append(str(exc))
            view = ViewSpec.from_manifest(self.manifest)
            directory = self.directory.parent / view.parent.replace("/", "--")
            try:
                parent = read_manifest(directory)
            except (FileNotFoundError, CorruptDatasetError):
                return problems
            fields, steps, episodes = parent.fields, parent.num_steps, parent.num_episodes
        else:
            fields, steps, episodes = self.manifest.fields, self.num_steps, self.num_episodes
        for key, spec in fields.items():
            rows = steps + (episodes if spec.storage == "flat" else 0)
            problem = self._backend.check_column(directory, key, rows, spec.shape)
            if problem is not None:
                problems.append(problem)
        self._check_not_replaced()
        return problems

    # ------------------------------------------------------------------ raw columns

    def column(self, key: str) -> Any:
        """The stored array for ``key`` (memory-mapped or zarr), opened once and checked."""
        col = self._columns.get(key)
        if col is None:
            spec = self.manifest.fields.get(key)
            if spec is None:
                raise KeyError(f"dataset {self.name!r} stores no key {key!r}")
            try:
                col = self._open_column(key, spec)
                expected = (self._expected_rows(spec), *spec.shape)
                if tuple(col.shape) != expected or np.dtype(col.dtype) != np.dtype(spec.dtype):
                    raise CorruptDatasetError(
                        f"array {key!r} of dataset {self.name!r} has shape {tuple(col.shape)} "
                        f"{col.dtype}, manifest says {expected} {spec.dtype}"
                    )
            except OSError:
                self._check_not_replaced()  # a replaced dataset explains a missing or odd file
                raise
            self._check_not_replaced()  # the file opened is this version's
            self._columns[key] = col
        return col

    def _open_column(self, key: str, spec: FieldSpec) -> Any:
        """The backend's column, or, for a view, the slice of the parent's column it covers."""
        if self.manifest.layout != VIEW_LAYOUT:
            return self._backend.open_column(self.directory, key)
        view = ViewSpec.from_manifest(self.manifest)
        parent_dir = self.directory.parent / view.parent.replace("/", "--")
        if self._parent_checked is None:
            try:
                parent = read_manifest(parent_dir)
            except FileNotFoundError:
                raise CorruptDatasetError(
                    f"view {self.name!r}: its parent dataset {view.parent!r} is gone",
                    hint=f"remove the view ('rlds rm {self.name} --yes')",
                ) from None
            if parent.digest() != view.parent_digest:
                raise CorruptDatasetError(
                    f"view {self.name!r}: its parent {view.parent!r} was replaced since the view was made",
                    hint="create the view again ('rlds view' / 'rlds split' with --force)",
                )
            self._parent_checked = parent_dir
        start, stop = view.rows(spec.storage, self.num_steps)
        return SlicedColumn(self._backend.open_column(parent_dir, key), start, stop)

    def _expected_rows(self, spec: FieldSpec) -> int:
        return self.num_steps + (self.num_episodes if spec.storage == "flat" else 0)

    def _load_episode_index(self) -> np.ndarray:
        path = self.directory / EPISODES_FILE
        try:
            index = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            # numpy's message on pickled data suggests allow_pickle=True: never the fix here
            detail = "not a plain numeric .npy array" if "pickle" in str(exc) else str(exc).split("\n")[0]
            raise CorruptDatasetError(f"episode index {path} is unreadable: {detail}") from exc
        if len(index) != self.num_episodes or int(index["length"].sum()) != self.num_steps:
            raise CorruptDatasetError(f"episode index {path} does not match the manifest")
        return index

    # ------------------------------------------------------------------ reading

    def episode_of(self, steps: np.ndarray) -> np.ndarray:
        """The episode (position in the dataset) each step index belongs to."""
        return np.searchsorted(self._starts, steps, side="right") - 1

    def _resolve_keys(self, keys: Iterable[str | tuple[str, ...]] | None) -> list[str]:
        available = self.fields
        if keys is None:
            return list(available)
        wanted = [join_key(k) for k in keys]
        unknown = [k for k in wanted if k not in available]
        if unknown:
            raise KeyError(f"dataset {self.name!r} has no keys {unknown}; it has {sorted(available)}")
        return wanted

    def gather(self, indices: Any, keys: Iterable[str | tuple[str, ...]] | None = None) -> TedBatch:
        """Read the transitions at ``indices`` (any int array-like) as TED columns.

        Args:
            indices: Step indices in ``[0, num_steps)``; negative values count from the end.
            keys: TED keys to read (``None``: all). Unneeded arrays are never touched.

        Returns:
            A :class:`TedBatch` whose entries have the shape of ``indices`` in front.
        """
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < -self.num_steps or idx.max() >= self.num_steps):
            raise IndexError(f"step index out of range for dataset {self.name!r} with {self.num_steps} steps")
        idx = np.where(idx < 0, idx + self.num_steps, idx)
        wanted = self._resolve_keys(keys)
        episode = self.episode_of(idx)
        out = TedBatch()
        try:
            for key in wanted:
                if key == "episode":
                    out[key] = episode
                elif key == "next/done":
                    out[key] = self.column("next/terminated")[idx] | self.column("next/truncated")[idx]
                elif key in self.manifest.fields:
                    spec = self.manifest.fields[key]
                    out[key] = self.column(key)[idx + episode if spec.storage == "flat" else idx]
                else:  # next/<flat key>
                    out[key] = self.column(key[5:])[idx + episode + 1]
        except OSError as exc:
            self._after_read(exc)
            raise
        self._after_read()
        return out

    def __getitem__(self, index: Any) -> TedBatch:
        """``ds[i]``, ``ds[a:b]`` or ``ds[int_array]``: transitions as TED columns."""
        if isinstance(index, slice):
            index = np.arange(*index.indices(self.num_steps))
        return self.gather(index)

    def episode(self, i: int, keys: Iterable[str | tuple[str, ...]] | None = None) -> TedBatch:
        """All transitions of episode ``i`` (contiguous reads), as TED columns."""
        if not -self.num_episodes <= i < self.num_episodes:
            raise IndexError(
                f"episode {i} out of range for dataset {self.name!r} with {self.num_episodes} episodes"
            )
        i = i % self.num_episodes
        start, length = int(self.episodes["start"][i]), int(self.episodes["length"][i])
        steps = slice(start, start + length)
        out = TedBatch()
        try:
            for key in self._resolve_keys(keys):
                if key == "episode":
                    out[key] = np.full(length, i, np.int64)
                elif key == "next/done":
                    out[key] = np.asarray(self.column("next/terminated")[steps]) | np.asarray(
                        self.column("next/truncated")[steps]
                    )
                elif key in self.manifest.fields:
                    spec = self.manifest.fields[key]
                    rows = slice(start + i, start + i + length) if spec.storage == "flat" else steps
                    out[key] = np.asarray(self.column(key)[rows])
                else:
                    out[key] = np.asarray(self.column(key[5:])[start + i + 1 : start + i + 1 + length])
        except OSError as exc:
            self._after_read(exc)
            raise
        self._after_read()
        return out
