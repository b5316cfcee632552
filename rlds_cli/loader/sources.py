"""Where a batch's rows come from: the cache on disk, the dataset in RAM, or on a device.

A source turns step indices (any shape) into a :class:`~rlds_cli.cache.ted.TedBatch` of the
requested TED keys, reading exactly the rows it needs. The flat layout stores an observation-like
key once, ``N + E`` rows: ``observation[t] = flat[t + e(t)]``, ``next/observation[t] =
flat[t + e(t) + 1]``, ``e(t)`` the step's episode (see :mod:`rlds_cli.cache.reader`, whose
:class:`~rlds_cli.cache.reader.TedReader` reads every unpacked key).

:class:`HostSource` with ``in_memory=True, pack=True`` copies every float32 column into one
row-major float32 array aligned with the flat rows (row ``t + e(t)`` holds step ``t``'s
observation, action and reward; the next row its next observation): a batch is one ``take`` of
rows ``r`` and ``r + 1`` instead of one gather per key. Bool step columns (plus a precomputed
``next/done``) are packed in one bool array whose bytes also ride in trailing float32 columns of
the packed rows, so the same ``take`` brings them (without float32 keys they get their own
``take``). Every key of the batch is a view of that block. :attr:`HostSource.layout` exposes the
packing as a :class:`PackedLayout` (copied by :mod:`rlds_cli.loader.device`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.cache import reader
from rlds_cli.cache.backends.frames import FramesColumn
from rlds_cli.cache.buffers import BufferPool, gather_into, in_range
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.manifest import FieldSpec
from rlds_cli.cache.reader import Episodes, TedReader, stored_keys
from rlds_cli.cache.ted import TedBatch
from rlds_cli.frames.device_decode import DeviceFrames

#: Minimum interval between checks that a memory-mapped dataset was not replaced
#: (see :meth:`HostSource.gather_function`).
REPLACED_CHECK_NS = 2_000_000
#: The clock of that check (module-level so a test can drive it).
_clock_ns = time.monotonic_ns

#: dtypes copied into the packed float32 array; bool step columns go to a packed flags array.
_PACKABLE = (np.dtype(np.float32),)


def resolve_keys(dataset: Dataset, keys: Iterable[str | tuple[str, ...]] | None) -> list[str]:
    """The TED keys to read: ``keys`` checked against the dataset (``None``: all)."""
    return reader.resolve_keys(dataset.manifest.fields, keys, dataset.name)


#: Datasets up to this many steps keep a step -> episode table in RAM (4 bytes a step) instead of
#: a binary search over episode ends per batch (which costs more than a gather on 256 rows).
EPISODE_TABLE_MAX_STEPS = 1 << 24
#: Up to this many steps the disk path's table is int64 too (at most 32 MB), avoiding an
#: ``astype`` per batch.
EPISODE_TABLE_INT64_MAX_STEPS = 1 << 22


@dataclass(frozen=True)
class PackedLayout:
    """What an in-memory :class:`HostSource` holds, for a copy of it elsewhere
    (:class:`~rlds_cli.loader.device.DeviceSource` copies it to a device).

    Attributes:
        keys: The TED keys the source reads.
        fields: The dataset's stored fields.
        rows: The packed float32 block, ``(N + E, width)``, aligned with the flat rows (step
            ``t``'s values at row ``t + e(t)``), or ``None``.
        offsets: Stored key -> ``(first column, width, storage)`` of its values in ``rows``.
        flags: Bool step columns (and ``next/done``) side by side, ``(N, flag width)``, or ``None``.
        flag_plan: ``(name, first column, width, shape)`` of each key in ``flags``.
        columns: The other stored columns the keys need, by key.
        episode_of_step: The step -> episode table, when the source keeps one.
    """

    keys: tuple[str, ...]
    fields: Mapping[str, FieldSpec]
    rows: np.ndarray | None
    offsets: Mapping[str, tuple[int, int, str]]
    flags: np.ndarray | None
    flag_plan: tuple[tuple[str, int, int, tuple[int, ...]], ...]
    columns: Mapping[str, Any]
    episode_of_step: np.ndarray | None


class HostSource:
    """Gathers TED keys from a dataset into numpy arrays (CPU memory).

    Keys that are not packed are read by one :class:`~rlds_cli.cache.reader.TedReader` over the
    dataset's columns (memory maps, versioned zarr columns) or their copies in RAM.

    Args:
        dataset: An opened dataset.
        keys: TED keys to read (``None``: all).
        in_memory: Copy the needed columns into RAM once (else read the memory maps / zarr).
        pack: With ``in_memory``, pack float32 and bool columns (see the module docs).
        float32: With ``in_memory``, hold float64 columns as float32 (cast once, in the copy to
            RAM; packed with the float32 ones), for ``float_dtype=torch.float32``.
        reuse_buffers: Gather large outputs (256 KiB or more) into arrays reused once nothing
            references them, avoiding page faults (see :mod:`rlds_cli.cache.buffers`). A kept
            batch is never overwritten.
        device_decoded: Stored JPEG frame keys read undecoded for a device: a gather gives their
            rows as :class:`~rlds_cli.frames.device_decode.EncodedRows` (the loader decodes them
            on its device).
    """

    def __init__(
        self,
        dataset: Dataset,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        *,
        in_memory: bool = False,
        pack: bool = True,
        float32: bool = False,
        reuse_buffers: bool = True,
        device_decoded: frozenset[str] = frozenset(),
    ) -> None:
        if dataset.num_steps == 0:  # a growing dataset before its first commit
            raise ValueError(
                f"dataset {dataset.name!r} has no steps yet: sample it once it is ready "
                "(Dataset.ready, after Dataset.refresh())"
            )
        self.dataset = dataset
        self.pool = BufferPool() if reuse_buffers else None
        self._float32 = bool(float32) and bool(in_memory)
        self.keys = resolve_keys(dataset, keys)
        # next/done last, so that it reuses the flags when those are read too
        self._order = sorted(self.keys, key=lambda k: k == "next/done")
        self.in_memory = bool(in_memory)
        self._device_decoded = device_decoded
        fields = dataset.manifest.fields
        stored = stored_keys(fields, self.keys)
        packs = stored if self.in_memory and pack else set()
        packable = {k for k in packs if self._held_dtype(fields[k].dtype) in _PACKABLE}
        flags = {k for k in packs if fields[k].dtype == "bool" and fields[k].storage == "step"}
        # the packed block is aligned with the flat rows: its keys need the episode too
        flat_needed = bool(packable) or any(fields[k].storage == "flat" for k in stored)
        self._need_episode = flat_needed or "episode" in self.keys
        self.episode_bounds = Episodes(dataset.episode_index["length"], table=self._table_dtype())
        self._packed: np.ndarray | None = None
        self._layout: dict[str, tuple[int, int, str]] = {}
        self._flags: np.ndarray | None = None
        self._flag_plan: list[tuple[str, int, int, tuple[int, ...]]] = []
        self._flag_bytes = -1  # byte offset of the flags inside a packed row, when they are there
        if flags:
            self._pack_flags(sorted(flags))
        if packable:
            self._pack(sorted(packable))  # with the flags' bytes at the end of each row
        self._columns = {k: self._open(k) for k in sorted(stored - flags - packable)}
        self._packed_plan = self._plan_packed()
        self._wants_window = any(start >= self._width for _, start, _, _, _ in self._packed_plan)
        self._packed_views = self._plan_views()
        # (name, first byte, end byte, shape or None) of each flag inside a packed row
        self._flag_views = [
            (name, self._flag_bytes + start, self._flag_bytes + start + w, shape if len(shape) != 1 else None)
            for name, start, w, shape in self._flag_plan
        ]
        self._block_plan = self._plan_block_reads()
        from_blocks = {p[0] for p in self._block_plan} | {p[0] for p in self._flag_plan}
        # every key comes from the packed block (or is the episode): gather reads nothing else
        self._blocks_only = self._packed is not None and len(self._block_plan) == len(self._order)
        # the keys no block holds (all of them on the disk path, or with pack=False)
        rest = [k for k in self._order if k not in from_blocks]
        self._reader = TedReader(fields, self.episode_bounds, self._columns.__getitem__, rest, self.pool)
        self._unpacked = not self._block_plan and not self._flag_plan

    @property
    def layout(self) -> PackedLayout:
        """What this source holds in RAM, as a public value (see :class:`PackedLayout`)."""
        return PackedLayout(
            keys=tuple(self.keys),
            fields=self.dataset.manifest.fields,
            rows=self._packed,
            offsets=dict(self._layout),
            flags=self._flags,
            flag_plan=tuple(self._flag_plan),
            columns=dict(self._columns),
            episode_of_step=self.episode_bounds.table,
        )

    def _plan_block_reads(self) -> list[tuple[str, int, int, int, tuple[int, ...] | None]]:
        """``(name, half, start, end, shape)`` of each key a packed gather returns, in output order:
        ``half`` 0/1 picks rows ``r`` / ``r + 1`` of the float32 block (columns ``start:end``), -1
        the flags' bytes of rows ``r`` (``start:end`` in bytes), -2 the episode."""
        where: dict[str, tuple[int, int, int, tuple[int, ...] | None]] = {}
        for name, half, col, end, shape in self._packed_views:
            where[name] = (half, col, end, shape)
        if self._flag_bytes >= 0:
            for name, start, end, shape in self._flag_views:
                where[name] = (-1, start, end, shape)
        if where:
            where["episode"] = (-2, 0, 0, None)
        return [(key, *where[key]) for key in self._order if key in where]

    # ------------------------------------------------------------------ set-up

    def held_dtype(self, key: str) -> np.dtype:
        """The dtype of ``key`` (a TED key this source reads) in its batches."""
        return self._held_dtype(self.dataset.fields[key][1])

    def _held_dtype(self, stored: str) -> np.dtype:
        """The dtype a column stored as ``stored`` has in this source."""
        dtype = np.dtype(stored)
        return np.dtype(np.float32) if self._float32 and dtype == np.float64 else dtype

    def _open(self, key: str) -> Any:
        column = self.dataset.column(key)
        if self._float32 and np.dtype(column.dtype) == np.float64:
            return np.asarray(column).astype(np.float32)  # in RAM, cast in the one copy
        if isinstance(column, np.ndarray):
            # plain ndarray view: np.memmap's subclass hooks cost more than a small gather
            return np.array(column) if self.in_memory else np.asarray(column).view(np.ndarray)
        if self.dataset.manifest.fields[key].codec != "raw":
            # frames are never decoded whole: in RAM, a column's stored bytes (a view's or a
            # growing dataset's frames are read from their files)
            loaded = getattr(column, "loaded", None)
            column = loaded() if self.in_memory and loaded is not None else column
            # stored columns only: a view's or merge's rows are not the stored rows (host decode)
            device = key in self._device_decoded and isinstance(column, FramesColumn)
            return DeviceFrames(column) if device else column
        return np.asarray(column) if self.in_memory else column

    def _table_dtype(self) -> Any:
        """The dtype of the step -> episode table, or ``None`` (a binary search per batch): int64
        in RAM mode and up to :data:`EPISODE_TABLE_INT64_MAX_STEPS`, else int32."""
        ds = self.dataset
        if not self._need_episode or not (self.in_memory or ds.num_steps <= EPISODE_TABLE_MAX_STEPS):
            return None
        wide = self.in_memory or ds.num_steps <= EPISODE_TABLE_INT64_MAX_STEPS
        return np.int64 if wide or ds.num_episodes >= 2**31 else np.int32

    def _pack_flags(self, keys: list[str]) -> None:
        """Pack bool step columns (plus ``next/done`` when wanted) side by side in one
        ``(N, width)`` bool array."""
        fields = self.dataset.manifest.fields
        columns: list[tuple[str, np.ndarray]] = [(k, np.asarray(self.dataset.column(k))) for k in keys]
        have = dict(columns)
        if "next/done" in self.keys and {"next/terminated", "next/truncated"} <= set(have):
            columns.append(("next/done", have["next/terminated"] | have["next/truncated"]))
        offset, parts = 0, []
        for name, data in columns:
            shape = fields[name].shape if name in fields else fields["next/terminated"].shape
            width = int(np.prod(shape, dtype=np.int64))
            parts.append(data.reshape(len(data), width))
            if name in self.keys or name == "next/done":
                self._flag_plan.append((name, offset, width, shape))
            offset += width
        self._flags = np.ascontiguousarray(np.concatenate(parts, axis=1))

    def _pack(self, keys: list[str]) -> None:
        ds = self.dataset
        fields = ds.manifest.fields
        n, e = ds.num_steps, ds.num_episodes
        widths = {k: int(np.prod(fields[k].shape, dtype=np.int64)) for k in keys}
        width = sum(widths.values())
        # flags ride as raw bytes in trailing float32 columns (never read as floats): one gather
        # brings them, not a second cache-missing one
        flag_width = self._flags.shape[1] if self._flags is not None else 0
        packed = np.zeros((n + e, width + -(-flag_width // 4)), np.float32)
        step_rows = self.episode_bounds.flat_rows(np.arange(n, dtype=np.int64))
        offset = 0
        for key in keys:
            spec, w = fields[key], widths[key]
            data = np.asarray(ds.column(key)).reshape(-1, w)
            if spec.storage == "flat":
                packed[:, offset : offset + w] = data
            else:  # step rows sit at t + e(t); each episode's final row holds zeros here
                packed[step_rows, offset : offset + w] = data
            self._layout[key] = (offset, w, spec.storage)
            offset += w
        if self._flags is not None:
            packed.view(np.uint8)[step_rows, 4 * width : 4 * width + flag_width] = self._flags.view(np.uint8)
            self._flag_bytes = 4 * width
        self._packed = packed

    @property
    def _width(self) -> int:
        return self._packed.shape[1] if self._packed is not None else 0

    def _plan_packed(self) -> list[tuple[str, int, int, tuple[int, ...], bool]]:
        """``(name, first column, width, shape, is_bool)`` of each key read from the packed block:
        root columns at their offset, ``next/`` ones one packed row further (``width`` on)."""
        fields = self.dataset.manifest.fields
        plan = []
        for key, (offset, w, storage) in self._layout.items():
            spec = fields[key]
            names = [(key, offset)]
            if storage == "flat":
                names.append((f"next/{key}", self._width + offset))
            for name, start in names:
                if name in self.keys or name in ("next/terminated", "next/truncated"):
                    plan.append((name, start, w, spec.shape, spec.dtype == "bool"))
        return plan

    def _plan_views(self) -> list[tuple[str, int, int, int, tuple[int, ...] | None]]:
        """``(name, half, first column, end column, shape)`` of each packed key: ``half`` picks row
        ``r`` or ``r + 1`` of the gathered block; ``shape`` is ``None`` when no reshape is needed."""
        views = []
        for name, start, w, shape, _ in self._packed_plan:
            half, col = divmod(start, self._width)
            views.append((name, half, col, col + w, shape if len(shape) != 1 else None))
        return views

    # ------------------------------------------------------------------ reading

    def episode_of(self, idx: np.ndarray) -> np.ndarray:
        """The episode of each step index."""
        return self.episode_bounds.episode_of(idx)

    def take_rows(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (positions in the stored array, any shape) of the stored, unpacked key
        ``key`` (flat key: step ``t`` is row ``t + episode_of(t)``), shape ``rows.shape + row
        shape``: into ``out`` when given (C-contiguous, that shape, the key's dtype), else a new
        array. From a numpy array or memory map: one gather, no intermediate copy.
        """
        column = self._columns[key]
        rows = np.asarray(rows, np.int64)
        shape = rows.shape + tuple(column.shape[1:])
        if out is None:
            out = np.empty(shape, column.dtype)
        elif out.shape != shape or out.dtype != column.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {column.dtype} array of shape {shape}")
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= len(column)):
            raise IndexError(f"rows of {key!r} out of range [0, {len(column)})")
        if isinstance(column, np.ndarray):
            # mode="clip" (rows checked above): "raise" gathers into a temporary, then copies
            column.take(rows.reshape(-1), axis=0, out=out.reshape(-1, *column.shape[1:]), mode="clip")
        elif hasattr(column, "read_into"):  # a versioned column: decodes into `out`, then checks
            column.read_into(rows, out)
        else:
            out[...] = column[rows]
        return out

    @property
    def disk_keys(self) -> list[str]:
        """The stored fields a gather reads from the dataset's files (not from RAM)."""
        return sorted(self._columns)

    def gather_function(self) -> Callable[[np.ndarray], TedBatch]:
        """:meth:`gather`, or the method it dispatches to for this layout.

        Read from memory maps, it raises :class:`~rlds_cli.errors.DatasetReplacedError` after a
        batch once the dataset was replaced (as zarr columns do). The check is one ``stat``, at
        most every :data:`REPLACED_CHECK_NS` (a stat per 45 us batch costs a tenth of a low-dim
        batch); batches in between come whole from the mapped version, never torn. A copy in RAM
        is a snapshot of one version and reads on."""
        gather = self._reader.gather if self._unpacked else self.gather
        if self.in_memory or not getattr(self.dataset._backend, "stable_once_open", False):
            return gather
        check = self.dataset._check_not_replaced
        due = [0]  # the clock reading from which the next batch checks

        def checked(idx: np.ndarray) -> TedBatch:
            out = gather(idx)
            now = _clock_ns()
            if now >= due[0]:
                check()
                due[0] = now + REPLACED_CHECK_NS
            return out

        return checked

    def gather(self, idx: np.ndarray) -> TedBatch:
        """The configured keys at step indices ``idx`` (int64, any shape, in range), as numpy."""
        if self._unpacked:
            return self._reader.gather(idx)
        episode = self.episode_bounds.episode_of(idx) if self._need_episode else None
        rows = idx + episode if episode is not None else idx
        if self._blocks_only:  # in-memory packed: views of the blocks, nothing else to read
            return self._gather_packed(rows, episode)
        packed = self._gather_packed(rows, episode) if self._block_plan else TedBatch()
        if self._flag_plan and self._flag_bytes < 0:
            packed.update(self._gather_flags(idx))
        rest = self._reader.gather_located(idx, episode, rows)
        out = TedBatch()
        for key in self._order:
            value = packed.get(key)
            out[key] = value if value is not None else rest[key]
        return out

    def _gather_flags(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        assert self._flags is not None
        block = self._flags.take(idx, axis=0)
        lead = idx.shape
        out = {}
        for name, start, w, shape in self._flag_plan:
            value = block[..., start : start + w]
            out[name] = value if len(shape) == 1 else value.reshape(*lead, *shape)
        return out

    def _gather_packed(self, rows: np.ndarray, episode: np.ndarray | None) -> TedBatch:
        """The keys of :meth:`_plan_block_reads` at flat rows ``rows``, as views of one gather."""
        packed = self._packed
        assert packed is not None
        lead = rows.shape
        flat_rows = rows.reshape(-1)
        n = len(flat_rows)
        # a block too small to pool is a plain take (no bounds check)
        taken = 2 * n if self._wants_window else n
        pool = self.pool
        if pool is not None and taken * packed.strides[0] < pool.min_bytes:
            pool = None
        # rows of in-range steps are in range (r + 1 too): one check, not a take's
        checked = pool is not None and in_range(flat_rows, len(packed) - 1)
        if self._wants_window:
            # rows r and r + 1 in one take (np.take beats fancy indexing ~2x on random rows);
            # root values from the first n rows, next/ ones from the last n
            block = gather_into(packed, np.concatenate([flat_rows, flat_rows + 1]), pool, checked=checked)
        else:
            block = gather_into(packed, flat_rows, pool, checked=checked)
        flags = block.view(np.bool_)  # the flags' bytes, at the end of rows r
        # each key is one 2-D slice of the block, reshaped only when batch or key is multi-dim
        flat = len(lead) == 1
        out = TedBatch()
        for name, half, start, end, shape in self._block_plan:
            if half >= 0:
                value = block[half * n : (half + 1) * n, start:end]
            elif half == -1:
                value = flags[:n, start:end]
            else:
                out[name] = episode
                continue
            if not flat or shape is not None:
                value = value.reshape(*lead, *(shape if shape is not None else (end - start,)))
            out[name] = value
        return out
