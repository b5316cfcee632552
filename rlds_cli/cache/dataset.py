"""Read access to a cached dataset: full TED views rebuilt from the flat layout.

A :class:`Dataset` is bound to the directory version it opened (inode and ctime) and never mixes
the files of two versions: a read that would need files of a version replaced by a ``--force``
rebuild raises :class:`DatasetReplacedError`. Columns of a backend that reads by path (zarr) are
wrapped in :class:`~rlds_cli.cache.reader.VersionedColumn`, which checks after every read. TED
reads go through :class:`~rlds_cli.cache.reader.TedReader`.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.io import tree_bytes
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.backends.frames import check_frames, open_frames
from rlds_cli.cache.backends.memmap import load_npy
from rlds_cli.cache.digest import array_digest, recorded_algorithm
from rlds_cli.cache.env_spec import RecordedEnvSpec, dataset_env_spec, recover_environment
from rlds_cli.cache.episode_table import EpisodeTable
from rlds_cli.cache.integrity import check_episode_index, damage_hint
from rlds_cli.cache.layout import (
    EPISODES_FILE,
    SOURCE_ARRAYS_FILE,
    VIEW_LAYOUT,
    entry_name,
    is_episode_array,
    text_blob_name,
)
from rlds_cli.cache.manifest import FieldSpec, Manifest, read_manifest
from rlds_cli.cache.reader import Episodes, TedReader, VersionedColumn, resolve_keys, ted_fields
from rlds_cli.cache.ted import TedBatch
from rlds_cli.cache.views import GatheredColumn, SlicedColumn, ViewSpec
from rlds_cli.errors import CorruptDatasetError, DatasetNotFoundError, DatasetReplacedError


def version_identity(directory: Path) -> tuple[int, int, int] | None:
    """The identity of a published dataset version: ``(st_dev, st_ino, st_ctime_ns)`` of its
    directory, or ``None`` if it is gone. The ctime (set by the rename into place) tells a reused
    inode apart."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def manifest_of(directory: Path, manifest: Manifest | None) -> Manifest:
    """``manifest``, or the one ``directory`` holds.

    Raises:
        DatasetNotFoundError: ``directory`` has no manifest.
    """
    if manifest is not None:
        return manifest
    try:
        return read_manifest(directory)
    except FileNotFoundError:
        raise DatasetNotFoundError(f"{directory} is not an rlds dataset (no manifest)") from None


def _text_of(table: list[Any], i: int) -> str | None:
    """Text ``i`` of a source's table of texts (``None`` outside it: no text)."""
    return str(table[i]) if 0 <= i < len(table) else None


def _text_at(ranges: np.ndarray, blob: np.ndarray, row: int) -> str | None:
    """Row ``row``'s text of a per-episode source text: ``ranges[row]`` is its ``[start, stop)``
    in the UTF-8 ``blob`` (``-1``: none)."""
    start, stop = (int(v) for v in ranges[row])
    return None if start < 0 else bytes(blob[start:stop]).decode("utf-8", "replace")


@dataclass(frozen=True)
class Instructions:
    """The language instruction of each step of a dataset, from whatever its source kept
    (:attr:`Dataset.instructions`): ``texts`` and, for each step, an index into them, read from a
    step column of indices (``step_key``: an RLDS source's ``info/language_instruction_index``, a
    LeRobot source's ``info/task_index``) or given per episode (``episode_task``: RoboCasa's
    ``ep_meta["lang"]``; LIBERO's one ``problem_info`` instruction for every episode).

    A merge of datasets whose step columns index tables of their own has ``maps`` (one per
    table: its index -> an index of ``texts``) and ``episode_table`` (int64, per episode, the map
    its steps' indices go through)."""

    texts: list[str]
    step_key: str | None
    episode_task: np.ndarray | None  # int64, one per episode of the dataset, when step_key is None
    episode_table: np.ndarray | None = None
    maps: tuple[np.ndarray, ...] = ()

    def of_steps(self, dataset: Dataset, e: int, rows: slice) -> np.ndarray:
        """The text index (int64) of each step ``rows`` of episode ``e`` (rows of ``dataset``'s
        step columns).

        Raises:
            CorruptDatasetError: An index outside ``texts`` (the column or the table is damaged).
        """
        if self.step_key is not None:
            index = np.asarray(dataset.column(self.step_key)[rows]).astype(np.int64).reshape(-1)
            if self.maps:
                assert self.episode_table is not None
                index = self._through(dataset, index, np.full(len(index), self.episode_table[e]))
        else:
            assert self.episode_task is not None
            index = np.full(rows.stop - rows.start, self.episode_task[e], np.int64)
        return self._checked(dataset, index)

    def used(self, dataset: Dataset) -> np.ndarray:
        """The text indices (int64, ascending) some step of ``dataset`` has, its step column read
        in bounded blocks: a source's table can hold texts no step has (LeRobot task ids with
        gaps, the tasks of episodes a view left out).

        Raises:
            CorruptDatasetError: An index outside ``texts``.
        """
        if self.step_key is None:
            assert self.episode_task is not None
            return self._checked(dataset, np.unique(self.episode_task))
        block, seen = 1 << 20, np.zeros(0, np.int64)
        for start in range(0, dataset.num_steps, block):
            seen = np.union1d(seen, np.unique(self.of_rows(dataset, start, start + block)))
        return seen

    def empty_steps(self, dataset: Dataset) -> np.ndarray:
        """Per episode of ``dataset`` (int64), its steps whose instruction is empty or blank; the
        step column read in blocks of steps.

        Raises:
            CorruptDatasetError: An index outside ``texts``.
        """
        lengths = dataset.episode_index["length"].astype(np.int64)
        empty = [i for i, text in enumerate(self.texts) if not text.strip()]
        if not empty:
            return np.zeros(len(lengths), np.int64)
        if self.step_key is None:
            assert self.episode_task is not None
            return np.where(np.isin(self.episode_task, empty), lengths, 0)
        out, block = np.zeros(len(lengths), np.int64), 1 << 20
        starts = dataset.episode_index["start"].astype(np.int64)
        for start in range(0, dataset.num_steps, block):
            hit = np.isin(self.of_rows(dataset, start, start + block), empty)
            out += np.bincount(np.searchsorted(starts, start + np.flatnonzero(hit), side="right") - 1,
                               minlength=len(out))  # fmt: skip
        return out

    def of_rows(self, dataset: Dataset, start: int, stop: int) -> np.ndarray:
        """The text index (int64) of each step row ``[start, stop)`` of ``dataset`` (across
        episodes: one read of the step column).

        Raises:
            CorruptDatasetError: An index outside ``texts``.
        """
        stop = min(stop, dataset.num_steps)
        if self.step_key is None:
            assert self.episode_task is not None
            episode = self._episodes(dataset, start, stop - start)
            return self._checked(dataset, np.asarray(self.episode_task, np.int64)[episode])
        return self.of_column(dataset, start, np.asarray(dataset.column(self.step_key)[start:stop]))

    def of_column(self, dataset: Dataset, start: int, values: np.ndarray) -> np.ndarray:
        """The text index (int64, flat) of each of ``values``: the step column's rows of
        ``dataset`` from step row ``start`` on, read already (each through its episode's table
        in a merge).

        Raises:
            CorruptDatasetError: An index outside ``texts``.
        """
        index = np.asarray(values).astype(np.int64).reshape(-1)
        if self.maps:
            assert self.episode_table is not None
            episode = self._episodes(dataset, start, len(index))
            return self._through(dataset, index, self.episode_table[episode])
        return self._checked(dataset, index)

    @staticmethod
    def _episodes(dataset: Dataset, start: int, count: int) -> np.ndarray:
        """The episode of each of ``count`` step rows of ``dataset`` from ``start``."""
        starts = dataset.episode_index["start"].astype(np.int64)
        return np.searchsorted(starts, np.arange(start, start + count), side="right") - 1

    def _through(self, dataset: Dataset, index: np.ndarray, tables: np.ndarray) -> np.ndarray:
        """``index`` (each row's own table's) as indices of ``texts``, row ``i`` through
        ``maps[tables[i]]``."""
        out = np.empty_like(index)
        for t in np.unique(tables).tolist():
            rows = tables == t
            out[rows] = self._checked(dataset, index[rows], self.maps[t])
        return out

    def _checked(self, dataset: Dataset, index: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
        """``index`` (through ``table`` when given), or damage where one is outside it."""
        size = len(self.texts) if table is None else len(table)
        if len(index) and (index.min() < 0 or index.max() >= size):
            raise CorruptDatasetError(
                f"dataset {dataset.name!r}: {self.step_key or 'an episode instruction'} holds a text "
                f"index outside its table of {size} strings",
                hint=damage_hint(dataset.name),
            )
        return index if table is None else table[index]

    def of_batch(self, batch: Any) -> np.ndarray:
        """The instruction (``str``) of each row of a batch of this dataset (a Loader's, with
        ``as_tensordict`` or not, or :meth:`Dataset.gather`'s), shaped as its rows (``[B]``, or
        ``[num_slices, slice_len]``): read from its ``step_key`` column (and ``episode``, for a
        merge with ``maps``), else its ``episode``. A Loader's batches are of ``loader.dataset``
        (a view, with ``episodes=`` or ``filter_key=``).

        Raises:
            KeyError: The batch lacks that column (``keys=`` left it out: add it).
            IndexError: An index outside ``texts`` (a batch of another dataset).
        """
        key = self.step_key if self.step_key is not None else "episode"
        index = _batch_column(batch, key)
        if self.step_key is not None and index.ndim and index.shape[-1] == 1:
            index = index[..., 0]  # a scalar's trailing axis
        table = self.episode_task if self.step_key is None else np.asarray(self.texts, dtype=object)
        assert table is not None
        if self.maps:  # each row's index through its episode's table
            assert self.episode_table is not None
            episode = _batch_column(batch, "episode").reshape(index.shape)
            if episode.size and (episode.min() < 0 or episode.max() >= len(self.episode_table)):
                raise IndexError(f"'episode' holds {int(episode.max())}: not an episode of this dataset")
            tables, mapped = self.episode_table[episode], np.empty_like(index)
            for t in np.unique(tables).tolist():
                rows, own = tables == t, self.maps[t]
                if index[rows].size and (index[rows].min() < 0 or index[rows].max() >= len(own)):
                    raise IndexError(f"{key!r} holds {int(index[rows].max())}: not a row of this dataset's")
                mapped[rows] = own[index[rows]]
            index = mapped
        if index.size and (index.min() < 0 or index.max() >= len(table)):
            raise IndexError(f"{key!r} holds {int(index.max())}: not a row of this dataset's (of another?)")
        if self.step_key is None:
            index = table[index]
        return np.asarray(self.texts, dtype=object)[index]


def _batch_column(batch: Any, key: str) -> np.ndarray:
    """Column ``key`` of a plain or TensorDict batch as int64, or a ``KeyError`` saying to add it."""
    try:
        values = batch[key]
    except KeyError:
        try:
            values = batch[tuple(key.split("/"))]  # a TensorDict's nested key
        except (KeyError, TypeError):
            raise KeyError(
                f"the batch has no {key!r}, which gives each row's instruction: add it to keys="
            ) from None
    return np.asarray(values.cpu() if hasattr(values, "cpu") else values).astype(np.int64)


class Dataset:
    """A read-only TED dataset backed by the cache.

    ``observation``-like keys are stored once per step plus one final value per episode;
    ``next/observation[t] == observation[t + 1]`` inside an episode and is the true final
    observation at its end. ``next/done`` (``next/terminated | next/truncated``) and ``episode``
    (the episode's position) are derived, not stored.

    Args:
        directory: A published dataset directory.
        manifest: Its manifest (read from ``directory`` when ``None``).
    """

    #: Whether bulk reads check every byte they return as they read it (a dataset at a URL:
    #: against the push's per-block crc32c); what is made from it then needs no digest pass first
    #: (:func:`~rlds_cli.cache.compose.verify_parent`).
    reads_checked: bool = False

    def __init__(self, directory: str | os.PathLike[str], manifest: Manifest | None = None) -> None:
        self.directory = Path(directory)
        #: The published version this object reads (:func:`version_identity` of its directory).
        self.identity = version_identity(self.directory)
        self.manifest = manifest = manifest_of(self.directory, manifest)
        self._backend = get_backend(manifest.backend)
        self._columns: dict[str, Any] = {}
        self._parent_checked: Path | None = None
        self._view_rows: dict[str, np.ndarray] = {}  # a selection view's parent rows, by storage
        self._readers: dict[tuple[str, ...], TedReader] = {}
        #: The stored episode index (:data:`~rlds_cli.cache.ted.EPISODE_DTYPE`), checked against
        #: the manifest.
        self.episode_index = self._load_episode_index()
        self._episode_table: EpisodeTable | None = None
        #: Episode bounds and the step -> episode lookup (see :class:`~rlds_cli.cache.reader.Episodes`).
        self.episode_bounds = Episodes(self.episode_index["length"])
        self._check_not_replaced()

    # ------------------------------------------------------------------ pickling (workers)

    def __getstate__(self) -> dict[str, Any]:
        # Only the path and manifest travel to workers; arrays reopen lazily there.
        return {"directory": str(self.directory), "manifest": self.manifest.to_dict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["directory"])
        if self.manifest.to_dict() != state["manifest"]:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.directory} was replaced after it was opened"
            )

    def _check_not_replaced(self) -> None:
        if version_identity(self.directory) != self.identity:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.directory} was replaced while it was open"
            )

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
        return ted_fields(self.manifest.fields)

    @property
    def source_arrays(self) -> dict[str, np.ndarray]:
        """Non-step arrays kept from the source file (e.g. D4RL ``metadata/policy/*``).

        Raises:
            CorruptDatasetError: The file is damaged (its CRC, a header or a length), or missing
                where the manifest records its digest (it was written).
        """
        path = self.directory / SOURCE_ARRAYS_FILE
        if not path.is_file():
            self._check_not_replaced()
            if self.manifest.content_digest.get("source_arrays"):  # written, then lost: never "none"
                raise CorruptDatasetError(
                    f"{path} is missing: the manifest records its digest",
                    hint=damage_hint(self.manifest.name),
                )
            return {}
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k.replace("__", "/"): data[k] for k in data.files}
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:  # a CRC, header or length
            self._check_not_replaced()
            raise CorruptDatasetError(
                f"{path} is unreadable: {exc}", hint=damage_hint(self.manifest.name)
            ) from None
        self._check_not_replaced()
        return arrays

    def episode_source_arrays(self) -> dict[str, np.ndarray]:
        """The source arrays a dataset of these episodes, in this order, keeps (what downsampling
        copies): :attr:`source_arrays`, a view's per-episode ones (``<format>/episode_<what>``)
        taken at its episodes' rows of its parent's."""
        view = self.view_parent()
        if view is None:
            return self.source_arrays
        parent, rows = view
        arrays = parent.source_arrays
        return {
            k: v[rows] if is_episode_array(k) and v.ndim and len(v) == parent.num_episodes else v
            for k, v in arrays.items()
        }

    @property
    def source_metadata(self) -> dict[str, Any]:
        """The source file's small facts kept in the manifest's ``source.metadata`` (robomimic's
        ``env_args`` and ``data`` attributes, D4RL's ``metadata/*``, ...); a view has its
        parent's. Empty when there are none."""
        view = self.view_parent()
        if view is not None:
            return view[0].source_metadata
        meta = self.manifest.source.get("metadata")
        return dict(meta) if isinstance(meta, dict) else {}

    def episode_metadata(self, i: int, arrays: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Per-episode source metadata of episode ``i``, as ``{"<format>/<what>": value}``.

        Read from each source array ``<format>/episode_<what>`` at row ``i`` (a view reads its
        parent's row). Text stored as byte ranges into ``<format>/text/<what>`` comes back as
        ``str`` (``None`` where the episode had none); other values as Python scalars or lists.
        E.g. robomimic's ``robomimic/model_file``, ``robomimic/ep_meta``, ``robomimic/lang``.
        ``arrays``: :meth:`episode_source_arrays`, read once for many episodes.

        Raises:
            IndexError: ``i`` is not an episode of this dataset.
        """
        if not -self.num_episodes <= i < self.num_episodes:
            raise IndexError(f"episode {i} is outside dataset {self.name!r} ({self.num_episodes} episodes)")
        row = i % self.num_episodes
        arrays = self.episode_source_arrays() if arrays is None else arrays
        out: dict[str, Any] = {}
        for name, value in arrays.items():
            prefix, _, what = name.rpartition("/")
            if not what.startswith("episode_") or value.ndim == 0 or len(value) != self.num_episodes:
                continue  # (one row per episode: another length is damage, named by the check)
            key = f"{prefix}/{what[len('episode_') :]}" if prefix else what[len("episode_") :]
            blob = arrays.get(text_blob_name(name))
            table = self._episode_text_table(name, value)
            if blob is not None and value.shape[1:] == (2,):
                out[key] = _text_at(value, blob, row)
            elif table is not None:
                out[key] = _text_of(table, int(value[row]))
            else:
                item = value[row]
                out[key] = item.decode("utf-8", "replace") if isinstance(item, bytes) else item.tolist()
        return out

    @property
    def env_spec(self) -> RecordedEnvSpec | None:
        """The recorded environment (id, kwargs, time limit, raw gymnasium spec, origin), or
        ``None``; a view has its parent's. See :mod:`rlds_cli.cache.env_spec`."""
        return dataset_env_spec(self)

    @property
    def episodes(self) -> EpisodeTable:
        """One row per episode (:class:`~rlds_cli.cache.episode_table.EpisodeTable`).

        ``["start"]``, ``["length"]``, ``["source_id"]`` and the other index fields need no read;
        ``["return"]`` (one bounded pass over ``next/reward``), ``["seed"]`` and
        ``["seed_present"]`` are computed on first use and kept. The same object every time for
        this view."""
        table = self._episode_table
        if table is None:
            table = self._episode_table = EpisodeTable(self)
        return table

    @property
    def text_tables(self) -> dict[str, list[str]]:
        """Step keys stored as indices into a table of strings (an RLDS source's text features:
        ``info/language_instruction_index``), key -> its strings (row value ``i`` is ``table[i]``);
        a view has its parent's. Empty when there are none."""
        rlds = self.source_metadata.get("rlds")
        tables = rlds.get("text") if isinstance(rlds, dict) else None
        if not isinstance(tables, dict):
            return {}
        fields = self.stored_fields
        return {
            str(k): [str(t) for t in v]
            for k, v in tables.items()
            if isinstance(v, list) and k in fields and np.dtype(fields[k].dtype).kind in "iu"
        }

    @property
    def instructions(self) -> Instructions | None:
        """The language instruction of each step (:class:`Instructions`), from the first of: an RLDS
        text feature named for one (``language_instruction`` first, then ``*instruction*``, then
        ``*language*`` or ``*task*``), a LeRobot source's tasks, RoboCasa's
        per-episode ``lang``, LIBERO's ``problem_info`` instruction; ``None`` when the source kept
        none."""
        tables = self.text_tables
        # an instruction's feature, by name (RT-1's natural_language_instruction, a "task"); another
        # text (a file path, a scene name) is no instruction
        for words in (("language_instruction",), ("instruction",), ("language", "task")):
            key = next((k for k in tables if any(w in k.rpartition("/")[2] for w in words)), None)
            if key is not None:
                return Instructions(tables[key], key, None)
        meta = self.source_metadata
        lerobot = meta.get("lerobot")
        tasks = lerobot.get("tasks") if isinstance(lerobot, dict) else None
        if isinstance(tasks, dict) and tasks and "info/task_index" in self.stored_fields:
            try:
                table = {int(k): str(v) for k, v in tasks.items()}
            except (TypeError, ValueError):
                table = {}
            if table and min(table) >= 0 and max(table) < 1 << 20:
                return Instructions(
                    [table.get(i, "") for i in range(max(table) + 1)], "info/task_index", None
                )
        langs = self.episode_texts("robomimic/lang")
        if any(lang is not None for lang in langs):
            texts = list(dict.fromkeys(lang or "" for lang in langs))
            order = {t: i for i, t in enumerate(texts)}
            return Instructions(texts, None, np.array([order[lang or ""] for lang in langs], np.int64))
        robomimic = meta.get("robomimic")
        single = robomimic.get("language_instruction") if isinstance(robomimic, dict) else None
        if isinstance(single, str):
            return Instructions([single], None, np.zeros(self.num_episodes, np.int64))
        return None

    def episode_texts(self, key: str) -> list[str | None]:
        """The per-episode text ``key`` (``"robomimic/lang"``, ``"robomimic/model_file"``) of every
        episode in order, as :meth:`episode_metadata` gives one episode's, read at once (``None``
        where an episode has none; all ``None`` when the source kept no such text)."""
        prefix, _, what = key.rpartition("/")
        name = f"{prefix}/episode_{what}" if prefix else f"episode_{what}"
        arrays = self.episode_source_arrays()  # a view's: its episodes' rows of its parent's
        ranges, blob = arrays.get(name), arrays.get(text_blob_name(name))
        if ranges is None or len(ranges) != self.num_episodes:
            return [None] * self.num_episodes
        table = self._episode_text_table(name, ranges)
        if table is not None:
            return [_text_of(table, int(i)) for i in ranges.tolist()]
        if blob is None or ranges.shape[1:] != (2,):
            return [None] * self.num_episodes
        return [_text_at(ranges, blob, row) for row in range(self.num_episodes)]

    def _episode_text_table(self, name: str, value: np.ndarray) -> list[Any] | None:
        """The texts the per-episode array ``name`` (``value``: its rows) numbers, where it is an
        RLDS source's ``episode_metadata`` text (one integer an episode, an index into
        ``source.metadata.rlds.episode_text[name]``); else ``None``."""
        prefix = name.rpartition("/")[0]
        # RLDS is the one format that numbers them (and a view's metadata is a read of its parent)
        if value.ndim != 1 or value.dtype.kind not in "iu" or prefix != "rlds":
            return None
        section = self.source_metadata.get(prefix)
        tables = section.get("episode_text") if isinstance(section, dict) else None
        table = tables.get(name) if isinstance(tables, dict) else None
        return table if isinstance(table, list) else None

    def view_parent(self) -> tuple[Dataset, np.ndarray] | None:
        """For a view (``rlds view``, ``rlds split``): its parent, checked to be the pinned
        version, and the parent position of each view episode (int64, view order); else ``None``.

        Raises:
            CorruptDatasetError: The parent is gone, or was replaced (:func:`pinned_parent`).
        """
        if self.manifest.layout != VIEW_LAYOUT:
            return None
        view = ViewSpec.from_manifest(self.manifest)
        parent_dir, parent = self._parent_manifest(view)  # read and checked now: it may be gone
        return Dataset(parent_dir, parent), view.parent_episodes()

    def recover_environment(self, eval_env: bool = False, **kwargs: Any) -> Any:
        """Make the recorded gymnasium environment, as Minari's ``recover_environment`` does.

        Args:
            eval_env: Make the environment meant for evaluation when the source names one
                (Minari's ``eval_env_spec``), else the recording one.
            **kwargs: Passed to ``gymnasium.make`` (``render_mode="rgb_array"``, ...).

        Raises:
            NoEnvSpecError: The dataset records no environment.
            MissingExtraError: gymnasium or a package the environment needs is not installed.
            EnvironmentUnavailableError: The environment id is not registered with gymnasium.
        """
        return recover_environment(self, eval_env, **kwargs)

    def size_bytes(self) -> int:
        """Allocated bytes of the dataset's directory, as ``du`` counts them
        (:func:`rlds_cli._util.io.tree_bytes`). A view counts only its own directory."""
        return tree_bytes(self.directory)

    def location(self, path: str | os.PathLike[str]) -> str:
        """How messages name ``path``, a file or folder of this dataset: its path here."""
        return str(path)

    def check_files(self) -> list[str]:
        """Check that every stored file exists at full size, without reading data; returns the
        problems found (empty: complete). A view checks its parent's files."""
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
            fmt = spec.frame_format
            if fmt is not None:
                problem = check_frames(directory, key, fmt, rows)
            else:
                problem = self._backend.check_column(directory, key, rows, spec.shape)
            if problem is not None and problem not in problems:  # a group's, once for its keys
                problems.append(problem)
        self._check_not_replaced()
        return problems

    # ------------------------------------------------------------------ raw columns

    def column(self, key: str) -> Any:
        """The stored array for ``key``, opened once and shape/dtype-checked: a memory map, or
        (zarr) a :class:`~rlds_cli.cache.reader.VersionedColumn` that raises
        :class:`DatasetReplacedError` after a read of a replaced version."""
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
            if not getattr(col, "stable_once_open", self._backend.stable_once_open):
                col = VersionedColumn(col, self._check_not_replaced)
            self._columns[key] = col
        return col

    def _open_column(self, key: str, spec: FieldSpec) -> Any:
        """The backend's column, or, for a view, the slice of the parent's column it covers."""
        if self.manifest.layout != VIEW_LAYOUT:
            return self._stored_column(self.directory, key, spec)
        view = ViewSpec.from_manifest(self.manifest)
        parent_dir = self._checked_parent_dir(view)
        column = self._stored_column(parent_dir, key, spec)
        if view.episode_ids is None:
            return SlicedColumn(column, *view.rows(spec.storage, self.num_steps))
        if spec.storage not in self._view_rows:  # the parent's index (checked) places the episodes
            parent_index = Dataset(parent_dir).episode_index
            self._view_rows[spec.storage] = view.gathered_rows(spec.storage, parent_index)
        return GatheredColumn(column, self._view_rows[spec.storage])

    def _stored_column(self, directory: Path, key: str, spec: FieldSpec) -> Any:
        """Column ``key`` as stored under ``directory``: the backend's array, or a frame column."""
        fmt = spec.frame_format
        if fmt is None:
            return self._backend.open_column(directory, key)
        return open_frames(directory, key, fmt, f"{key!r} of dataset {self.name!r}")

    def _checked_parent_dir(self, view: ViewSpec) -> Path:
        """This view's parent directory, checked once to hold the pinned version."""
        if self._parent_checked is None:
            self._parent_checked, _ = self._parent_manifest(view)
        return self._parent_checked

    def _parent_manifest(self, view: ViewSpec) -> tuple[Path, Manifest]:
        """This view's parent directory and manifest, checked to be the pinned version."""
        return pinned_parent(
            self.directory.parent,
            f"view {self.name!r}",
            view.parent,
            view.parent_digest,
            remove_hint=f"remove the view ('rlds rm {self.name} --yes')",
            remake_hint="create the view again ('rlds view' / 'rlds split' with --force)",
        )

    def _expected_rows(self, spec: FieldSpec) -> int:
        return self.num_steps + (self.num_episodes if spec.storage == "flat" else 0)

    def _load_episode_index(self) -> np.ndarray:
        path = self.directory / EPISODES_FILE
        try:
            index = load_npy(path, mmap=False, what="episode index")
        except CorruptDatasetError as exc:
            raise CorruptDatasetError(exc.message, hint=damage_hint(self.manifest.name)) from exc
        except OSError as exc:
            raise CorruptDatasetError(
                f"episode index {path} is unreadable: {exc}", hint=damage_hint(self.manifest.name)
            ) from exc
        # a shuffled or hand-edited index is refused here, never served
        check_episode_index(index, self.num_steps, self.num_episodes, path, name=self.manifest.name)
        self._check_index_digest(index, path)
        return index

    def _check_index_digest(self, index: np.ndarray, path: Path) -> None:
        """The index against its recorded digest (a few bytes an episode): a changed source id or
        final_known passes the structural check, and is data a learner reads."""
        recorded = self.manifest.content_digest
        want = recorded.get("episodes") if isinstance(recorded, Mapping) else None
        if not want:
            return  # an older rlds's dataset
        try:
            algorithm = recorded_algorithm(recorded)
        except ValueError:
            return  # not a pass: rlds verify reports the unknown algorithm
        if array_digest(index, algorithm) != want:
            raise CorruptDatasetError(
                f"episode index {path} is damaged: it changed since it was written (its {algorithm} "
                "digest is not the one recorded)",
                hint=damage_hint(self.manifest.name),
            )

    # ------------------------------------------------------------------ reading

    def episode_of(self, steps: np.ndarray) -> np.ndarray:
        """The episode (position in the dataset) each step index belongs to."""
        return self.episode_bounds.episode_of(steps)

    def reader(self, keys: Iterable[str | tuple[str, ...]] | None = None) -> TedReader:
        """A cached :class:`~rlds_cli.cache.reader.TedReader` of ``keys`` (``None``: all)."""
        wanted = tuple(resolve_keys(self.manifest.fields, keys, self.name))
        reader = self._readers.get(wanted)
        if reader is None:
            reader = self._readers[wanted] = TedReader(
                self.manifest.fields, self.episode_bounds, self.column, wanted
            )
        return reader

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
        out = self.reader(keys).gather(np.where(idx < 0, idx + self.num_steps, idx))
        if self._backend.stable_once_open:  # memory maps read on after a replacement: say so
            self._check_not_replaced()
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
        out = self.reader(keys).episode(i % self.num_episodes)
        if self._backend.stable_once_open:
            self._check_not_replaced()
        return out


def pinned_parent(
    cache_dir: Path, child: str, parent: str, digest: str, *, remove_hint: str, remake_hint: str
) -> tuple[Path, Manifest]:
    """The directory and manifest of ``parent`` in ``cache_dir``, checked against the manifest
    digest a derived dataset pins (``child`` names it in messages: ``"view 'v'"``).

    Raises:
        CorruptDatasetError: The parent is gone (``remove_hint``), or was replaced since the
            child was made (``remake_hint``).
    """
    parent_dir = cache_dir / entry_name(parent)
    try:
        manifest = read_manifest(parent_dir)
    except FileNotFoundError:
        raise CorruptDatasetError(
            f"{child}: its parent dataset {parent!r} is gone", hint=remove_hint
        ) from None
    if manifest.digest() != digest:
        raise CorruptDatasetError(
            f"{child}: its parent {parent!r} was replaced since it was made", hint=remake_hint
        )
    return parent_dir, manifest
