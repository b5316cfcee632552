"""The shard scan: every record of a shard checked against ``features.json`` (framing, CRCs,
value counts) before any of it is decoded, and each episode cut into pieces for the workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.rlds_tfrecord.columns import _Column, _Plan
from rlds_cli.formats.rlds_tfrecord.decode import (
    _REDOWNLOAD,
    _check_kind,
    _feature,
    _parse,
    _PieceRef,
    _tensor_rows,
    _text_rows,
    _Unit,
    _values_per_step,
)
from rlds_cli.formats.rlds_tfrecord.layout import (
    INFO_FILE,
    _Shard,
)
from rlds_cli.formats.tfds_features import IMAGE, TEXT
from rlds_cli.formats.tfrecord_io import (
    FramingError,
    RecordInfo,
    count_values,
    scan_records,
)
from rlds_cli.formats.untrusted import check_declared

#: Decoded bytes of steps per worker task (a piece of an episode, or several small episodes).
UNIT_BYTES = 8 << 20
#: Side assumed for an image dimension features.json leaves unknown (-1), when planning pieces.
UNKNOWN_SIDE = 512


class _ShardScan:
    """The scanning half of :class:`~rlds_cli.formats.rlds_tfrecord.reader.RldsTFRecordReader`:
    walks the shards in order and plans the worker tasks. The reader sets the state below in its
    constructor."""

    block_rows: int | None
    columns: list[_Column]
    episode_columns: list[_Column]
    declared: list[int] | None
    plan: _Plan
    shards: list[_Shard]
    single: bool
    _episode_values: dict[int, dict[str, Any]]

    def _step_bytes(self, counts: dict[str, int], steps: int) -> int:
        """Decoded bytes of one step (images of unknown size planned at :data:`UNKNOWN_SIDE`)."""
        total = 0
        for col in self.columns:
            leaf = col.leaf
            if leaf.kind == IMAGE:
                sides = [d if d >= 0 else UNKNOWN_SIDE for d in leaf.shape]
                total += sides[0] * sides[1] * sides[2] * np.dtype(str(leaf.dtype)).itemsize
            elif leaf.kind == TEXT:
                total += 8
            else:
                itemsize = np.dtype(str(leaf.dtype)).itemsize
                per = counts.get(leaf.name, 0) // steps if steps else leaf.known_values
                total += max(per, leaf.known_values) * itemsize
        return max(total, 1)

    def _where(self, shard: _Shard, rec: RecordInfo) -> str:
        return f"{shard.path}: record {rec.index} (byte {rec.offset})"

    def _scan_record(self, shard: _Shard, rec: RecordInfo, buf: memoryview, episode: int) -> tuple[int, int]:
        """Check one record against features.json: every feature present, of the right kind and
        count. Returns its steps and the decoded bytes of one step; keeps its episode values."""
        where = self._where(shard, rec)
        feats = _parse(buf, where)
        counts: dict[str, int] = {}
        steps: int | None = None
        for col in self.columns:
            raw = _feature(feats, col.leaf, where)
            _check_kind(col.leaf, raw, where)
            counts[col.leaf.name] = count_values(buf, raw)
            if steps is None and not (col.leaf.kind == "tensor" and any(d < 0 for d in col.leaf.shape)):
                per = col.leaf.known_values
                if per == 0:
                    continue
                if counts[col.leaf.name] % per:
                    raise SourceFormatError(
                        f"{where}: feature {col.leaf.name!r} holds {counts[col.leaf.name]} values, not a "
                        f"multiple of the {per} per step features.json declares"
                    )
                steps = counts[col.leaf.name] // per
        steps = steps or 0
        for col in self.columns:
            _values_per_step(col.leaf, counts[col.leaf.name], steps, where)
        values: dict[str, Any] = {}
        for col in self.episode_columns:
            raw = _feature(feats, col.leaf, where)
            if col.text:
                values[col.key] = _text_rows(buf, raw, col.leaf, 1, 0, 1, where)[0]
            else:
                values[col.key] = _tensor_rows(buf, raw, col.leaf, 1, 0, 1, where)[0]
        self._episode_values[episode] = values
        del feats
        return steps, self._step_bytes(counts, steps)

    def _scan_shard(
        self, shard: _Shard, position: int, first_episode: int
    ) -> list[tuple[RecordInfo, int, int]]:
        """Every record of a shard checked (framing, CRCs, counts), with its steps and step bytes,
        before any of it is decoded."""
        out: list[tuple[RecordInfo, int, int]] = []
        with open(shard.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            try:
                for rec, mapped in scan_records(fh.fileno(), shard.path, size=size):
                    steps, row_bytes = self._scan_record(shard, rec, mapped.view, first_episode + len(out))
                    out.append((rec, steps, row_bytes))
            except FramingError as exc:
                raise SourceFormatError(str(exc), hint=_REDOWNLOAD) from None
            except OSError as exc:  # a read or mapping that fails (I/O error, out of address space)
                raise SourceFormatError(f"{shard.path} cannot be read: {exc}") from None
        slot = shard.index if self.single else position
        if self.declared is not None and slot < len(self.declared):
            declared = self.declared[slot]
            if declared != len(out):
                raise SourceFormatError(
                    f"{shard.path} holds {len(out)} records, but {INFO_FILE} gives it {declared} "
                    "(shardLengths)",
                    hint="the shard is truncated or not the one the dataset lists: download it again",
                )
        # untrusted input: a small shard cannot make rlds write far more than it stores
        decoded = sum(steps * row_bytes for _, steps, row_bytes in out)
        check_declared(shard.path, "steps", decoded, size, how="stores")
        return out

    def _pieces(
        self, shard: _Shard, rec: RecordInfo, steps: int, row_bytes: int, episode: int
    ) -> list[_PieceRef]:
        """One episode cut into pieces of about :data:`UNIT_BYTES` (or ``block_rows`` steps); the
        last piece keeps at least two steps, so the last-step rule sees its step ``T - 2`` too."""
        rows = self.block_rows or max(1, UNIT_BYTES // row_bytes)
        starts = list(range(0, steps, rows)) or [0]
        if len(starts) > 1 and steps - starts[-1] == 1:
            starts.pop()
        stops = [*starts[1:], steps]
        return [
            _PieceRef(str(shard.path), rec.index, rec.offset, rec.length, steps, a, b, episode)
            for a, b in zip(starts, stops, strict=True)
        ]

    def _units(self) -> Iterator[_Unit]:
        """Worker tasks in shard order, each about :data:`UNIT_BYTES` of decoded steps."""
        pending: list[_PieceRef] = []
        size = rows = 0
        episode = 0
        for position, shard in enumerate(self.shards):
            for rec, steps, row_bytes in self._scan_shard(shard, position, episode):
                for piece in self._pieces(shard, rec, steps, row_bytes, episode):
                    pending.append(piece)
                    size += (piece.stop - piece.start) * row_bytes
                    rows += piece.stop - piece.start
                    if size >= UNIT_BYTES or (self.block_rows and rows >= self.block_rows):
                        yield _Unit(self.plan, pending)
                        pending, size, rows = [], 0, 0
                episode += 1
        if pending:
            yield _Unit(self.plan, pending)
