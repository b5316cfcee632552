"""TorchRL / tensordict memmap directories (``TensorDict.memmap`` output, TED layout).

A ``meta.json`` per TensorDict level and one raw ``<key>.memmap`` per tensor (shape and dtype in
``meta.json``; file names encoded as tensordict encodes them). Reads what ``rlds export --to
torchrl`` wrote, a ``TensorDict.memmap`` directory, or a dumped TorchRL replay buffer
(``rb.dumps(path)``: the dump directory or its ``storage/``). Rules (``docs/formats.md``):

* **Filled rows only.** A replay-buffer storage is allocated at capacity; only the
  ``storage_metadata.json`` ``len`` rows are read. A wrapped buffer (``write_count`` over the
  capacity) is read in insertion order, from the write cursor on, then from the start; a cursor
  other than ``write_count % capacity`` is refused.
* **Batch dimensions.** ``[N]`` storages are one stream of steps; ``[B, T]`` storages are ``B``
  streams (or ``T``, time first, as TorchRL's ``ndim=2`` storages): time is the axis along which
  ``next/<key>[t] == <key>[t + 1]`` holds (ties: the last axis for a plain tensordict, the first
  for an ``ndim=2`` replay buffer). Each stream is read in time order; its last step ends an
  episode (truncated unless terminated). More batch dimensions are refused.
* Keys at the root and under ``next/`` (``observation``, ``pixels``, ...) are observation-like:
  stored once, an episode's final observation taken from ``next/``. ``next/reward`` (every column
  of a ``[T, k]`` reward), ``next/terminated``, ``next/truncated`` become the TED step columns
  (``next/done`` alone is read as ``terminated``); root ``done``/``terminated``/``truncated``,
  ``episode``, ``index`` and ``_weight`` are recomputed, not imported; other keys (``action``,
  ``info/...``) are step keys. Text (``NonTensorData``/``NonTensorStack``) and ragged tensors are
  dropped with a note; names go through :mod:`.keys`.
* An episode ends where ``next/done`` is true, ``episode`` changes, a stream ends, or
  ``next/<key>[t] != <key>[t + 1]`` (NaN equals NaN; counted as inferred, like D4RL resets).
* **Zero-filled final observations.** TorchRL zero-fills an unknown final next observation (e.g.
  its RoboSet datasets): an episode whose last ``next/<key>`` is all zeros for every
  observation-like key, while its last observation is not, gets ``final_known = false`` (counted
  in ``synthesized_final_observations``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.rows import insert_rows, rows_equal
from rlds_cli.errors import SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import (
    ConversionReport,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    renamed_note,
    rows_per_block,
)
from rlds_cli.formats.untrusted import declared_bytes, read_json_file, require_numeric, require_shape

_FLAGS = ("done", "terminated", "truncated")
_SKIP_ROOT = {*_FLAGS, "episode", "index", "_weight"}
#: TED keys this reader writes itself: reserved in the key cleaner so no source key takes them.
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")
BLOCK_ROWS = 1 << 16
#: Deepest nesting of sub-tensordicts accepted.
MAX_DEPTH = 32
#: Rows per axis compared when telling the time axis of a ``[B, T]`` storage.
_AXIS_SAMPLE = 64
#: Characters tensordict percent-encodes in file names (``_encode_key_for_filesystem``).
_UNSAFE = set('/<>:"|?*\\ \0%') | {chr(i) for i in range(32)} | {chr(127)}


def _encode(key: str) -> str:
    """tensordict's file name for a key (robust encoding, tensordict >= 0.10)."""
    if not key:
        return "%"
    if key in (".", ".."):
        return "%2E" * len(key)
    return "".join(f"%{ord(c):02X}" if c in _UNSAFE else c for c in key)


def _entry_path(directory: Path, key: str, suffix: str) -> Path:
    """Where tensordict put ``key``: its encoded name, else the raw (legacy) name."""
    encoded = directory / f"{_encode(key)}{suffix}"
    if encoded.exists() or "/" in key or "\\" in key or "\0" in key or key in ("", ".", ".."):
        return encoded
    legacy = directory / f"{key}{suffix}"
    return legacy if legacy.exists() else encoded


def _tensordict_type(directory: Path) -> str | None:
    try:
        meta = read_json_file(directory / "meta.json")
    except SourceFormatError:
        return None
    return str(meta.get("_type", "")) if isinstance(meta, dict) else None


def storage_dir(path: Path) -> Path | None:
    """The tensordict directory of ``path``: itself, or the ``storage/`` of a replay-buffer dump."""
    for candidate in (path, path / "storage"):
        if (candidate / "meta.json").is_file() and "TensorDict" in (_tensordict_type(candidate) or ""):
            return candidate
    return None


def is_tensordict_memmap(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``TensorDict.memmap`` (or a replay-buffer dump)."""
    return storage_dir(path) is not None


def sniff(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``TensorDict.memmap`` or a replay-buffer dump."""
    return path.is_dir() and is_tensordict_memmap(path)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads (hashed into the manifest): the tensordict directory's files and,
    for a replay-buffer dump, its writer metadata (the write cursor decides the row order)."""
    out: list[Path] = []
    for p in paths:
        storage = storage_dir(p) if p.is_dir() else None
        if storage is None:
            out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            continue
        out += sorted(q for q in storage.rglob("*") if q.is_file())
        writer = storage.parent / "writer" / "metadata.json"
        if storage.name == "storage" and writer.is_file():
            out.append(writer)
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at ``path``; ``None`` where there is no file or it holds no object."""
    data = read_json_file(path) if path.is_file() else None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class TorchRLOptions(ReaderOptions):
    """Options of :class:`TorchRLMemmapReader` (its keyword arguments)."""

    block_rows: int | None = None


class TorchRLMemmapReader(Reader):
    """Streams a tensordict memmap directory (or a replay-buffer dump) in TED layout."""

    format_name = "torchrl"
    expected_files = "a TensorDict memmap folder (meta.json), or a replay-buffer dump holding storage/"
    Options = TorchRLOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(self, path: str | Path, *, block_rows: int | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise SourceNotFoundError(f"source {self.path} does not exist")
        storage = storage_dir(self.path)
        if storage is None:
            raise SourceFormatError(
                f"{self.path} is not a tensordict memmap directory (no TensorDict meta.json)",
                hint="pass the directory TensorDict.memmap wrote, or a replay buffer's dumps() directory",
            )
        self.storage = storage
        self.block_rows: int = block_rows or BLOCK_ROWS
        self.report = ConversionReport(rules="torchrl-memmap-v2")
        meta = _read_json(storage / "meta.json") or {}
        self.batch_shape = require_shape(storage / "meta.json", "shape", meta.get("shape", []))
        if not 1 <= len(self.batch_shape) <= 2:
            raise SourceFormatError(
                f"{storage}: batch shape {list(self.batch_shape)}; rlds imports [N] (steps) or [B, T] "
                "(trajectories) tensordicts",
                hint="reshape the tensordict to [N] or [B, T] before TensorDict.memmap",
            )
        raw: dict[tuple[str, ...], np.ndarray] = {}
        self._walk(storage, (), raw)
        self._plan_keys(raw)
        self._plan_rows()
        self.report.source_rows = self.n
        if not block_rows:  # about BLOCK_BYTES of source rows per block, at most BLOCK_ROWS rows
            arrays = [*self.steps.values(), self.reward, *(a for pair in self.flat.values() for a in pair)]
            row_bytes = sum(declared_bytes(a.shape[1:], a.dtype) for a in arrays)
            self.block_rows = rows_per_block(row_bytes, 1, BLOCK_ROWS)

    # ------------------------------------------------------------------ layout

    def _walk(self, directory: Path, prefix: tuple[str, ...], out: dict[tuple[str, ...], np.ndarray]) -> None:
        if len(prefix) >= MAX_DEPTH:  # a sub-tensordict directory linking back to its parent
            raise SourceFormatError(f"{directory}: tensordicts nested more than {MAX_DEPTH} levels deep")
        meta = _read_json(directory / "meta.json")
        if meta is None:
            raise SourceFormatError(f"{directory / 'meta.json'} is missing or not a JSON object")
        for key, entry in meta.items():
            if not isinstance(entry, dict) or key in ("shape", "device", "_type", "names"):
                continue
            parts = (*prefix, key)
            name = "/".join(parts)
            kind = entry.get("type")
            if kind is not None:
                sub = _entry_path(directory, key, "")
                sub_type = _tensordict_type(sub) or str(kind)
                if "NonTensor" in sub_type or "NonTensor" in str(kind):
                    self.report.notes.append(
                        f"{name}: text/Python values (NonTensorData) are not stored (the cache holds "
                        "numeric arrays only); column dropped"
                    )
                elif "TensorDict" in sub_type:
                    self._walk(sub, parts, out)
                else:
                    self.report.notes.append(f"{name}: a {kind} entry is not a tensor; not imported")
                continue
            if "dtype" not in entry:
                continue
            if entry.get("is_nested"):
                self.report.notes.append(f"{name}: a nested (ragged) tensor is not stored; column dropped")
                continue
            torch_dtype = str(entry["dtype"]).removeprefix("torch.")
            try:
                dtype = np.dtype(torch_dtype)
            except (TypeError, ValueError, SyntaxError):
                raise SourceFormatError(
                    f"{directory / 'meta.json'}: {name!r} has dtype {entry['dtype']}, which numpy cannot "
                    "hold",
                    hint="convert it (e.g. td[key] = td[key].float()) and write the tensordict again",
                ) from None
            # untrusted input: numbers (or bools) only, and a shape of sizes (no int64 wrap-around)
            require_numeric(directory / "meta.json", name, dtype)
            shape = require_shape(directory / "meta.json", name, entry.get("shape"))
            if shape[: len(self.batch_shape)] != self.batch_shape:
                raise SourceFormatError(
                    f"{directory}: {name!r} has shape {list(shape)}, not the tensordict's batch shape "
                    f"{list(self.batch_shape)} first"
                )
            file = _entry_path(directory, key, ".memmap")
            expected = declared_bytes(shape, dtype)
            if expected and (not file.is_file() or file.stat().st_size < expected):  # 0 bytes: no file
                raise SourceFormatError(f"{file} is missing or shorter than its meta.json says")
            if expected == 0:
                out[parts] = np.zeros(shape, dtype)
            else:
                out[parts] = np.memmap(file, dtype=dtype, mode="r", shape=shape)

    def _plan_keys(self, raw: dict[tuple[str, ...], np.ndarray]) -> None:
        """Sort the tensors into observation-like, step and flag columns; clean their names."""
        if ("next", "reward") not in raw:
            raise SourceFormatError(f"{self.storage}: TED data needs a next/reward tensor")
        if ("action",) not in raw:
            raise SourceFormatError(f"{self.storage}: TED data needs an 'action' tensor")
        flat = [p for p in raw if p[0] != "next" and ("next", *p) in raw and not _skipped(p)]
        if not flat:
            raise SourceFormatError(f"{self.storage}: no key is present both at the root and under next/")
        paired = {("next", *p) for p in flat}
        steps = [
            p
            for p in raw
            if p not in flat
            and p not in paired
            and not _skipped(p)
            and not (len(p) == 2 and p[0] == "next" and p[1] in (*_FLAGS, "reward"))
        ]
        labels = {"/".join(p): p for p in (*flat, *steps)}
        if len(labels) != len(flat) + len(steps):
            raise SourceFormatError(f"{self.storage}: two keys differ only by a '/' inside a key name")
        wanted: dict[str, tuple[str, ...]] = {f"\0{k}": tuple(k.split("/")) for k in _FIXED}
        wanted.update(labels)
        cleaned = clean_keys(wanted)
        source = {k: v for k, v in wanted.items() if not k.startswith("\0")}
        renamed = renamed_note({k: cleaned[k] for k in source}, source)
        if renamed:
            self.report.notes.append(renamed)
        batch = int(np.prod(self.batch_shape))
        flatten = lambda a: a.reshape(batch, *a.shape[len(self.batch_shape) :])  # noqa: E731
        #: TED key -> (root rows, next rows) of each observation-like key
        self.flat = {cleaned["/".join(p)]: (flatten(raw[p]), flatten(raw[("next", *p)])) for p in flat}
        self.steps = {cleaned["/".join(p)]: flatten(raw[p]) for p in steps}
        clash = sorted(set(self.steps) & {f"next/{k}" for k in self.flat})
        if clash:
            raise SourceFormatError(
                f"{self.storage}: step key {clash[0]!r} is also the next/ twin of an observation-like key",
                hint="rename one of the two keys in the tensordict and write it again",
            )
        self.reward = flatten(raw[("next", "reward")])
        self.flags = {f: flatten(raw[("next", f)]) for f in _FLAGS if ("next", f) in raw}
        self.episode = flatten(raw[("episode",)]) if ("episode",) in raw else None

    def _plan_rows(self) -> None:
        """Which storage rows to read, in which order, and where each stream of steps ends."""
        dump = self.storage.parent if self.storage.name == "storage" else None
        storage_meta = _read_json(self.storage / "storage_metadata.json")
        writer = _read_json(dump / "writer" / "metadata.json") if dump is not None else None
        cap0 = self.batch_shape[0]
        inner = self.batch_shape[1] if len(self.batch_shape) == 2 else 1
        filled0, start0 = self._filled(storage_meta, writer, cap0, inner)
        if filled0 == 0 or inner == 0:
            raise SourceFormatError(
                f"{self.storage} holds no steps (batch shape {list(self.batch_shape)}, {filled0} filled rows)"
            )
        # dim-0 rows in insertion order (a wrapped buffer starts at its write cursor)
        rows0 = (start0 + np.arange(filled0)) % cap0
        if len(self.batch_shape) == 1:
            self._order: np.ndarray | None = None if start0 == 0 else rows0.astype(np.int64)
            self.n = filled0
            self._stream_ends = np.array([filled0 - 1], np.int64)
            return
        # TorchRL's ndim=2 storages put time first; a [B, T] TED tensordict puts it last
        time_first = self._time_axis(rows0, default_first=self._by_elements)
        grid = rows0[:, None] * inner + np.arange(inner)[None, :]  # [filled0, inner] flat indices
        streams = grid.T if time_first else grid  # one stream of steps per row
        self._order = np.ascontiguousarray(streams).reshape(-1).astype(np.int64)
        self.n = int(streams.size)
        length = streams.shape[1]
        self._stream_ends = np.arange(length - 1, self.n, length, dtype=np.int64)
        self.report.notes.append(
            f"[{', '.join(map(str, self.batch_shape))}] storage read as {streams.shape[0]} streams of "
            f"{length} steps (time along dimension {0 if time_first else 1}); each stream's last step "
            "ends an episode"
        )

    def _len_counts_elements(self, storage_meta: dict[str, Any] | None, cap0: int, inner: int) -> bool:
        """Whether ``len`` counts elements (a TorchRL ``ndim=2`` storage) rather than dim-0 rows (an
        ``ndim=1`` storage of ``[cap0, T]`` trajectories). Past ``cap0`` it must; at or below, both
        readings fit, and the rows between ``len // inner`` and ``len`` tell: unwritten (all zero)
        in an ``ndim=2`` storage, written in an ``ndim=1`` one.

        Raises:
            SourceFormatError: Some of those rows hold data and some do not: no reading fits.
        """
        length = (storage_meta or {}).get("len")
        if not isinstance(length, int) or inner <= 1 or length % inner:
            return False
        if length > cap0:
            return True
        tail = np.unique(np.linspace(length // inner, length - 1, num=_AXIS_SAMPLE).astype(np.int64))
        written = [self._row_written(int(r)) for r in tail if length // inner <= r < length]
        if not any(written):
            return True  # taken for rows, these unwritten rows would be all-zero steps
        if all(written):
            return False
        raise SourceFormatError(
            f"{self.storage / 'storage_metadata.json'}: len {length} of a storage of shape "
            f"{list(self.batch_shape)} counts neither its rows nor its elements (rows past "
            f"{length // inner} are partly written)",
            hint="pass the whole dump directory (with writer/metadata.json)",
        )

    def _row_written(self, row: int) -> bool:
        """Whether dim-0 row ``row`` holds anything but zeros in some tensor."""
        inner = self.batch_shape[1]
        cells = slice(row * inner, (row + 1) * inner)
        tensors = [self.reward, *self.flags.values(), *self.steps.values()]
        tensors += [t for pair in self.flat.values() for t in pair]
        return any(np.asarray(t[cells]).any() for t in tensors)

    def _filled(
        self, storage_meta: dict[str, Any] | None, writer: dict[str, Any] | None, cap0: int, inner: int
    ) -> tuple[int, int]:
        """(rows filled along dimension 0, the oldest row) from the dump's metadata."""
        # TorchRL's ndim=2 storages count elements in len (past cap0 only they must)
        length = (storage_meta or {}).get("len")
        self._by_elements = isinstance(length, int) and inner > 1 and length > cap0
        if storage_meta is None:  # a plain TensorDict.memmap: every row holds data
            return cap0, 0
        length = storage_meta.get("len")
        if not isinstance(length, int) or length < 0:
            raise SourceFormatError(f"{self.storage / 'storage_metadata.json'}: 'len' is {length!r}")
        count = writer.get("write_count") if writer else None
        cursor = writer.get("cursor") if writer else None
        if isinstance(count, int) and isinstance(cursor, int):
            if count <= cap0:
                return count, 0
            if cursor != count % cap0:
                raise SourceFormatError(
                    f"{self.storage.parent}: the buffer wrapped around (write_count {count} > capacity "
                    f"{cap0}) but its write cursor {cursor} is not write_count % capacity, so the "
                    "insertion order is unknown",
                    hint="a writer that ranks rows (TensorDictMaxValueWriter) keeps no insertion order: "
                    "re-create the buffer with a RoundRobinWriter, or export it with its rows in order",
                )
            self.report.notes.append(
                f"the replay buffer wrapped around ({count} writes into {cap0} rows): read in insertion "
                f"order from its write cursor {cursor}; the oldest episode may start mid-way"
            )
            return cap0, cursor
        # no writer metadata: len alone (elements for an ndim=2 storage, else dim-0 rows)
        self._by_elements = self._len_counts_elements(storage_meta, cap0, inner)
        rows = length // inner if self._by_elements else length
        if rows > cap0 or (inner > 1 and rows * inner != length and rows != length):
            raise SourceFormatError(
                f"{self.storage / 'storage_metadata.json'}: len {length} does not fit a storage of shape "
                f"{list(self.batch_shape)}",
                hint="pass the whole dump directory (with writer/metadata.json)",
            )
        if rows == cap0:
            self.report.notes.append(
                "full replay-buffer storage without writer metadata: rows read in storage order (if the "
                "buffer wrapped around, pass the dump directory holding writer/metadata.json)"
            )
        return rows, 0

    def _time_axis(self, rows0: np.ndarray, *, default_first: bool) -> bool:
        """Whether time runs along dimension 0 of a ``[D0, D1]`` storage: the axis along which
        ``next/<key>[t] == <key>[t + 1]`` holds on a sample of rows."""
        inner = self.batch_shape[1]
        rows = rows0[:_AXIS_SAMPLE]
        cols = np.arange(min(inner, _AXIS_SAMPLE))
        idx = (rows[:, None] * inner + cols[None, :]).reshape(-1)
        shape = (len(rows), len(cols))
        done = np.zeros(len(idx), bool)
        for flag in self.flags.values():
            done |= np.asarray(flag[idx]).reshape(len(idx), -1).any(axis=1)
        done = done.reshape(shape)
        bad = [0, 0]  # continuity breaks (outside episode ends) with time along dimension 0, 1
        for root, nxt in self.flat.values():
            size = int(np.prod(root.shape[1:], dtype=np.int64))
            cur = np.asarray(root[idx]).reshape(*shape, size)
            new = np.asarray(nxt[idx]).reshape(*shape, size)
            along0 = rows_equal(new[:-1].reshape(-1, size), cur[1:].reshape(-1, size))
            along1 = rows_equal(new[:, :-1].reshape(-1, size), cur[:, 1:].reshape(-1, size))
            bad[0] += int((~along0 & ~done[:-1].reshape(-1)).sum())
            bad[1] += int((~along1 & ~done[:, :-1].reshape(-1)).sum())
        if bad[0] == bad[1]:
            return default_first
        return bad[0] < bad[1]

    # ------------------------------------------------------------------ reading

    def close(self) -> None:
        self.flat.clear()
        self.steps.clear()

    def total_rows(self) -> int:
        return self.n

    def source_metadata(self) -> dict[str, Any]:
        return {
            "torchrl": {
                "batch_shape": list(self.batch_shape),
                "keys": sorted([*self.flat, *self.steps]),
                "rows": self.n,
            }
        }

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def _rows(self, array: np.ndarray, start: int, stop: int) -> np.ndarray:
        if self._order is None:
            return np.asarray(array[start:stop])
        return np.asarray(array[self._order[start:stop]])

    def _flag(self, name: str, start: int, stop: int) -> np.ndarray:
        value = self.flags.get(name)
        if value is None:
            return np.zeros(stop - start, bool)
        return np.asarray(self._rows(value, start, stop).reshape(stop - start, -1).any(axis=1))

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the filled rows, in insertion and time order, as blocks."""
        has_split = "terminated" in self.flags or "truncated" in self.flags
        for start in range(0, self.n, self.block_rows):
            stop = min(start + self.block_rows, self.n)
            look = min(stop + 1, self.n)
            rows = stop - start
            term = self._flag("terminated" if has_split else "done", start, stop)
            trunc = self._flag("truncated", start, stop)
            end = term | trunc | self._flag("done", start, stop)
            forced = np.zeros(rows, bool)
            stream_ends = self._stream_ends[(self._stream_ends >= start) & (self._stream_ends < stop)]
            forced[stream_ends - start] = True
            # unflagged boundaries: the episode id changes, or next/obs is not the next row's obs
            jump = np.zeros(rows, bool)
            if self.episode is not None:
                ep = self._rows(self.episode, start, look).reshape(look - start, -1)[:, 0]
                jump[: len(ep) - 1] |= ep[1:] != ep[:-1]
            roots = {k: self._rows(r, start, look) for k, (r, _) in self.flat.items()}
            nexts = {k: self._rows(x, start, stop) for k, (_, x) in self.flat.items()}
            for key in self.flat:
                same = rows_equal(nexts[key][: look - start - 1], roots[key][1:])
                jump[: len(same)] |= ~same
            inferred = jump & ~end & ~forced
            self.report.inferred_boundaries += int(inferred.sum())
            end |= inferred | forced
            trunc = trunc | (end & ~term)
            ends = np.flatnonzero(end)
            steps: dict[str, np.ndarray] = {
                "next/reward": _reward_columns(self._rows(self.reward, start, stop)),
                "next/terminated": term[:, None],
                "next/truncated": trunc[:, None],
            }
            for key, value in self.steps.items():
                steps[key] = self._rows(value, start, stop)
            # TorchRL's zero fill is of the whole observation: every key's final next/<key> all
            # zeros while the last observation is not (one key at zero, a bool flag False, is data)
            next_zero, last_zero = np.ones(len(ends), bool), np.ones(len(ends), bool)
            for key in self.flat:
                next_zero &= _all_zero(nexts[key][ends])
                last_zero &= _all_zero(roots[key][ends])
            known = ~(next_zero & ~last_zero)
            self.report.synthesized_final_observations += int((~known).sum())
            observations = {key: insert_rows(roots[key][:rows], ends, nexts[key][ends]) for key in self.flat}
            yield StepBlock(
                steps=steps, observations=observations, ends=ends, final_known=None if known.all() else known
            )
            if progress is not None:
                progress(rows)
        if self.report.synthesized_final_observations:
            self.report.notes.append(
                f"{self.report.synthesized_final_observations} episode(s) end with an all-zero next "
                "observation (TorchRL's fill for an unknown final observation): final_known = false"
            )


def _skipped(parts: tuple[str, ...]) -> bool:
    """Bookkeeping rlds recomputes (root flags, ``episode``, ``index``, ``_weight``) and a
    collector's ``collector/*`` (its ``traj_ids`` restart in every dump: kept, TorchRL's
    ``SliceSampler`` took them for the trajectories of a merge), as recording drops them."""
    return (len(parts) == 1 and parts[0] in _SKIP_ROOT) or parts[0] == "collector"


def _reward_columns(reward: np.ndarray) -> np.ndarray:
    """TED's ``[N, k]`` reward: a ``[N]`` reward gains the column axis, ``[N, k]`` keeps all k."""
    return reward[:, None] if reward.ndim == 1 else reward


def _all_zero(rows: np.ndarray) -> np.ndarray:
    return np.asarray(~rows.reshape(len(rows), -1).any(axis=1)) if rows.size else np.ones(len(rows), bool)
