"""One streaming pass over a dataset's stored columns that measures, per episode, what
:mod:`rlds_cli.inspection.audit` judges: idle steps, action changes and jerk, identical
consecutive camera frames, non-finite values, the episode's content digest, its return, and
empty language instructions.

The pass reads the stored arrays of the dataset (of a view: its parent's, only the rows of the
view's episodes) in groups of whole episodes, each group about :attr:`Budget.nbytes
<rlds_cli.cache.blocks.Budget>` of rows (an episode longer than that in pieces, each piece
with the three steps before it as context for its differences), so memory is bounded whatever
the dataset's size; what is kept is O(episodes). Episodes that lie end to end in the stored
arrays are read as one slice per column (a sequential read), and the per-episode reductions
are numpy ``reduceat`` over the group, so low-dim keys go at the disk's speed. Frame columns
(:mod:`rlds_cli.cache.backends.frames`) are compared and digested as the stored image files,
never decoded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlds_cli.cache.backends.memmap import release_pages
from rlds_cli.cache.blocks import Budget
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.manifest import FieldSpec

__all__ = ["EpisodeMeasures", "KeyRoles", "measure"]

#: Steps before a piece of a long episode read with it: the third difference (jerk) needs three.
CONTEXT = 3


@dataclass(frozen=True)
class KeyRoles:
    """What each stored key is to the audit (from its name, storage, dtype and shape)."""

    action: tuple[str, ...]  # per-step keys "action" and "action/..." (numbers)
    state: tuple[str, ...]  # observation-like low-dim number keys
    images: tuple[str, ...]  # frame columns, and uint8 arrays of 2 or more dims per step
    numbers: tuple[str, ...]  # float keys checked for NaN/inf (low-dim, any storage)
    text: dict[str, tuple[int, ...]]  # text index keys -> the indices of empty strings
    low_dim: tuple[str, ...]  # every non-image key (read as arrays)

    @classmethod
    def of(cls, fields: dict[str, FieldSpec], source: dict[str, Any]) -> KeyRoles:
        tables = ((source.get("metadata") or {}).get("rlds") or {}).get("text") or {}
        images = tuple(
            k for k, s in fields.items()
            if s.frame_format is not None or (np.dtype(s.dtype) == np.uint8 and len(s.shape) >= 2)
        )  # fmt: skip
        low = tuple(k for k in fields if k not in images)
        text = {
            k: tuple(i for i, s in enumerate(tables[k]) if not str(s).strip())
            for k in low if k in tables and isinstance(tables[k], list)
        }  # fmt: skip
        num = tuple(k for k in low if np.dtype(fields[k].dtype).kind in "fiu" and k not in text)
        return cls(
            action=tuple(
                k for k in num if fields[k].storage != "flat" and (k == "action" or k.startswith("action/"))
            ),
            state=tuple(k for k in num if fields[k].storage == "flat"),
            images=images,
            numbers=tuple(k for k in low if np.dtype(fields[k].dtype).kind == "f"),
            text=text,
            low_dim=low,
        )


@dataclass
class EpisodeMeasures:
    """What :func:`measure` found, one entry (or row) per episode of the dataset audited."""

    lengths: np.ndarray
    returns: np.ndarray  # float64; NaN where a reward is
    idle_steps: np.ndarray  # steps t >= 1 whose action and state equal step t-1's (within atol)
    first_active: np.ndarray  # first step t >= 1 that is not idle (length: none)
    last_active: np.ndarray  # last step that is not idle (0: none after the first)
    max_action_change: np.ndarray  # (episodes, action dims): max |a_t - a_{t-1}|
    rms_action_change: np.ndarray  # (episodes, action dims)
    mean_abs_jerk: np.ndarray  # (episodes, action dims): mean |third difference of a|
    frozen: dict[
        str, np.ndarray
    ]  # image key -> longest run of steps whose frame equals the one before while not idle
    nonfinite: np.ndarray  # NaN/inf values in float keys
    empty_text: np.ndarray  # steps whose instruction (any text key) is empty
    digests: list[str]  # sha256 of the episode's stored rows, every key
    budget: Budget = field(default_factory=Budget)


@dataclass
class _Piece:
    """Steps ``[a, b)`` of the dataset's episode ``view`` (its stored position ``pos``), read with
    ``ctx`` steps before ``a``."""

    view: int
    pos: int
    a: int
    b: int
    ctx: int


def _groups(lengths: np.ndarray, positions: np.ndarray, max_rows: int) -> Iterator[list[_Piece]]:
    """Pieces of about ``max_rows`` steps: whole episodes together, a longer one alone in pieces."""
    group: list[_Piece] = []
    rows = 0
    for v, (n, p) in enumerate(zip(lengths.tolist(), positions.tolist(), strict=True)):
        if n > max_rows:
            if group:
                yield group
                group, rows = [], 0
            for a in range(0, n, max_rows):
                ctx = min(a, CONTEXT)
                yield [_Piece(v, p, a, min(n, a + max_rows), ctx)]
            continue
        if rows + n > max_rows and group:
            yield group
            group, rows = [], 0
        group.append(_Piece(v, p, 0, n, 0))
        rows += n
    if group:
        yield group


def _row_bytes(spec: FieldSpec, column: Any) -> int:
    """Bytes one row of a key costs to read: a frame column's average stored frame."""
    if spec.frame_format is not None:
        return max(1, int(getattr(column, "size", 0)) // max(1, len(column)))
    return max(1, np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64)))


class _Reader:
    """Reads one group's rows of one stored column: runs of pieces that lie end to end in the
    column as one slice each, joined; flat keys with each piece's final row where it ends its
    episode (kept apart for the digest)."""

    def __init__(self, ds: Dataset, key: str, starts: np.ndarray, lengths_by_pos: np.ndarray) -> None:
        self.key = key
        self.spec = ds.stored_fields[key]
        self.flat = self.spec.storage == "flat"
        self.column = ds.column(key)
        self.starts, self.lens = starts, lengths_by_pos
        self.held: list[np.ndarray] = []

    def release(self) -> None:
        """Drop the pages of the rows read last from the process's memory (see
        :func:`~rlds_cli.cache.backends.memmap.release_pages`)."""
        for part in self.held:
            release_pages(part)
        self.held = []

    def rows(self, piece: _Piece) -> tuple[int, int]:
        """The column's rows of a piece: its steps (and context), and its final row if it ends
        the episode (flat keys)."""
        base = int(self.starts[piece.pos]) + (piece.pos if self.flat else 0)
        end = base + piece.b + (1 if self.flat and piece.b == int(self.lens[piece.pos]) else 0)
        return base + piece.a - piece.ctx, end

    def spans(self, group: list[_Piece]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for piece in group:
            lo, hi = self.rows(piece)
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out

    def read(self, group: list[_Piece], budget: Budget) -> tuple[np.ndarray, list[np.ndarray]]:
        """(the steps' rows of the group, in order, with context; the raw rows of each piece
        without context, finals included: what the digest covers)."""
        spans = self.spans(group)
        parts = [np.asarray(self.column[lo:hi]) for lo, hi in spans]
        raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
        for part in parts:
            budget.note(part)
        self.held = parts
        per_piece: list[np.ndarray] = []
        finals: list[int] = []
        at = 0
        for piece in group:
            lo, hi = self.rows(piece)
            per_piece.append(raw[at + piece.ctx : at + hi - lo])
            if self.flat and piece.b == int(self.lens[piece.pos]):
                finals.append(at + hi - lo - 1)
            at += hi - lo
        steps = np.delete(raw, finals, axis=0) if finals else raw
        return steps, per_piece


def _frames_same(column: Any, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Whether each stored frame ``rows[i]`` is byte for byte the frame ``rows[i] - 1`` (where
    ``valid``): equal sizes first, then the bytes of those only; no frame decoded."""
    ends = column.ends
    starts = column.starts
    size = ends[rows] - starts[rows]
    prev = np.maximum(rows - 1, 0)
    same = valid & (size == ends[prev] - starts[prev])
    for i in np.flatnonzero(same).tolist():
        r = int(rows[i])
        same[i] = bytes(column.frame_bytes(r)) == bytes(column.frame_bytes(r - 1))
    return same


def _run_lengths(mask: np.ndarray, carry: int) -> np.ndarray:
    """Length of the run of trues ending at each row (0 at a false), the first run continuing
    one of ``carry`` rows before."""
    if mask.size == 0:
        return np.zeros(0, np.int64)
    c = np.cumsum(mask, dtype=np.int64)
    base = np.maximum.accumulate(np.where(~mask, c, 0))
    runs = c - base
    runs[base == 0] += carry
    return np.where(mask, runs, 0)


def measure(ds: Dataset, *, atol: float = 1e-5, budget: Budget | None = None) -> EpisodeMeasures:
    """Measure every episode of ``ds`` in one bounded pass (see the module docstring).

    Args:
        ds: The dataset (a view reads its parent's rows of its episodes).
        atol: A step is idle when every element of its action and state is within ``atol`` of
            the step before's.
        budget: Bytes of rows per group (default: 16 MiB).
    """
    budget = budget if budget is not None else Budget(16 << 20)
    found = ds.view_parent()
    base, positions = found if found is not None else (ds, np.arange(ds.num_episodes, dtype=np.int64))
    roles = KeyRoles.of(base.stored_fields, base.manifest.source)
    starts = base.episode_index["start"].astype(np.int64)
    lens_by_pos = base.episode_index["length"].astype(np.int64)
    lengths = lens_by_pos[positions]
    n = len(positions)
    readers = {k: _Reader(base, k, starts, lens_by_pos) for k in base.stored_fields}
    adims = [int(np.prod(base.stored_fields[k].shape, dtype=np.int64)) for k in roles.action]
    ad = int(sum(adims))
    m = EpisodeMeasures(
        lengths=lengths,
        returns=np.zeros(n, np.float64),
        idle_steps=np.zeros(n, np.int64),
        first_active=lengths.copy(),
        last_active=np.zeros(n, np.int64),
        max_action_change=np.zeros((n, ad), np.float64),
        rms_action_change=np.zeros((n, ad), np.float64),
        mean_abs_jerk=np.zeros((n, ad), np.float64),
        frozen={k: np.zeros(n, np.int64) for k in roles.images},
        nonfinite=np.zeros(n, np.int64),
        empty_text=np.zeros(n, np.int64),
        digests=[""] * n,
        budget=budget,
    )
    sumsq = np.zeros((n, ad), np.float64)
    jerk_sum = np.zeros((n, ad), np.float64)
    diffs = np.zeros(n, np.int64)
    jerks = np.zeros(n, np.int64)
    hashers: dict[int, Any] = {}
    carry_frozen = {k: 0 for k in roles.images}
    step_bytes = sum(_row_bytes(r.spec, r.column) for r in readers.values())
    max_rows = max(CONTEXT + 1, budget.nbytes // step_bytes)
    for group in _groups(lengths, positions, max_rows):
        _measure_group(
            group, readers, roles, m, budget, atol, sumsq, jerk_sum, diffs, jerks, hashers, carry_frozen
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        m.rms_action_change = np.sqrt(sumsq / np.maximum(diffs, 1)[:, None])
        m.mean_abs_jerk = jerk_sum / np.maximum(jerks, 1)[:, None]
    return m


def _measure_group(
    group: list[_Piece],
    readers: dict[str, _Reader],
    roles: KeyRoles,
    m: EpisodeMeasures,
    budget: Budget,
    atol: float,
    sumsq: np.ndarray,
    jerk_sum: np.ndarray,
    diffs: np.ndarray,
    jerks: np.ndarray,
    hashers: dict[int, Any],
    carry_frozen: dict[str, int],
) -> None:
    sizes = np.array([p.b - p.a + p.ctx for p in group], np.int64)
    views = np.array([p.view for p in group], np.int64)
    ep = np.repeat(np.arange(len(group)), sizes)  # each row's piece
    t = np.concatenate([np.arange(p.a - p.ctx, p.b, dtype=np.int64) for p in group])
    own = np.concatenate([np.arange(-p.ctx, p.b - p.a) >= 0 for p in group])
    d1 = np.zeros(len(t), bool)
    d1[1:] = ep[1:] == ep[:-1]
    d3 = np.zeros(len(t), bool)
    d3[3:] = ep[3:] == ep[:-3]
    still = d1.copy()  # idle until something changes
    arrays: dict[str, np.ndarray] = {}
    for key in roles.low_dim:
        steps, raw = readers[key].read(group, budget)
        arrays[key] = steps.reshape(len(steps), -1)
        for piece, part in zip(group, raw, strict=True):
            _hash(hashers, piece, key, part)

    for key in (*roles.action, *roles.state):
        x = arrays[key]
        if len(x) > 1:
            close = np.zeros(len(x), bool)
            close[1:] = (
                (np.abs(x[1:] - x[:-1]) <= atol).all(axis=1)
                if x.dtype.kind == "f"
                else (x[1:] == x[:-1]).all(axis=1)
            )
            still &= close
    if not roles.action and not roles.state:
        still[:] = False
    cut = lambda v: v[own]  # noqa: E731
    own_ep = cut(ep)
    bounds = np.searchsorted(own_ep, np.arange(len(group)))
    own_t = cut(t)
    active = cut(~still) & (own_t >= 1)
    m.idle_steps[views] += np.add.reduceat(cut(still).astype(np.int64), bounds)
    big = np.iinfo(np.int64).max
    m.first_active[views] = np.minimum(
        m.first_active[views], np.minimum.reduceat(np.where(active, own_t, big), bounds)
    )
    m.last_active[views] = np.maximum(
        m.last_active[views], np.maximum.reduceat(np.where(active, own_t, 0), bounds)
    )
    if roles.action:
        a = np.concatenate([arrays[k].astype(np.float64, copy=False) for k in roles.action], axis=1)
        d = np.zeros_like(a)
        d[1:] = a[1:] - a[:-1]
        d[~d1] = 0.0
        ad = np.abs(d)
        j = np.zeros_like(a)
        if len(a) > 3:
            j[3:] = a[3:] - 3 * a[2:-1] + 3 * a[1:-2] - a[:-3]
        j[~d3] = 0.0
        ad, j = np.nan_to_num(ad[own]), np.nan_to_num(np.abs(j[own]))
        m.max_action_change[views] = np.maximum(
            m.max_action_change[views], np.maximum.reduceat(ad, bounds, axis=0)
        )
        sumsq[views] += np.add.reduceat(ad * ad, bounds, axis=0)
        jerk_sum[views] += np.add.reduceat(j, bounds, axis=0)
        diffs[views] += np.add.reduceat(cut(d1).astype(np.int64), bounds)
        jerks[views] += np.add.reduceat(cut(d3).astype(np.int64), bounds)
    if "next/reward" in arrays:
        r = arrays["next/reward"][own].astype(np.float64).sum(axis=1)
        m.returns[views] += np.add.reduceat(r, bounds)
    for key in roles.numbers:
        bad = (~np.isfinite(arrays[key][own])).sum(axis=1)
        m.nonfinite[views] += np.add.reduceat(bad.astype(np.int64), bounds)
    for key, empty in roles.text.items():
        if empty:
            hit = np.isin(arrays[key][own], empty).any(axis=1)
            m.empty_text[views] += np.add.reduceat(hit.astype(np.int64), bounds)
    for key in roles.images:
        same = _image_same(readers[key], group, d1, budget, hashers)
        frozen = (same & ~still)[own]
        for g, piece in enumerate(group):
            lo = int(bounds[g])
            hi = int(bounds[g + 1]) if g + 1 < len(group) else len(own_ep)
            runs = _run_lengths(frozen[lo:hi], carry_frozen[key] if piece.a > 0 else 0)
            if len(runs):
                m.frozen[key][piece.view] = max(int(m.frozen[key][piece.view]), int(runs.max()))
                carry_frozen[key] = int(runs[-1])
    for reader in readers.values():
        reader.release()
    for piece in group:
        length = int(m.lengths[piece.view])
        if piece.b == length:
            keys = hashers.pop(piece.view)
            m.digests[piece.view] = hashlib.sha256(
                "".join(f"{k}:{keys[k].hexdigest()};" for k in sorted(keys)).encode()
            ).hexdigest()


def _hash(hashers: dict[int, Any], piece: _Piece, key: str, part: Any) -> None:
    """Add a piece's rows of ``key`` to its episode's digest: one sha256 per key, joined in the
    manifest's order when the episode ends (:func:`_digest`), so pieces digest as the whole."""
    keys = hashers.setdefault(piece.view, {})
    data = np.ascontiguousarray(part)
    h = keys.get(key)
    if h is None:
        h = keys[key] = hashlib.sha256(f"{data.dtype}:".encode())
    h.update(data.reshape(-1).view(np.uint8).data)


def _image_same(
    reader: _Reader, group: list[_Piece], d1: np.ndarray, budget: Budget, hashers: dict[int, Any]
) -> np.ndarray:
    """Whether each step's frame of an image key equals the step before's (within the episode);
    a frame column is compared (and digested) as its stored bytes, never decoded."""
    column = reader.column
    if hasattr(column, "frame_bytes") and hasattr(column, "ends"):
        for piece in group:
            lo, hi = reader.rows(piece)
            lo += piece.ctx
            first, last = int(column.starts[lo]), int(column.ends[hi - 1])
            stored = column.fetch([first], [last])(0)
            budget.total += last - first
            _hash(hashers, piece, reader.key, stored)
            _hash(hashers, piece, reader.key + "@ends", column.ends[lo:hi] - first)
        rows = np.concatenate([np.arange(*_step_rows(reader, p), dtype=np.int64) for p in group])
        return _frames_same(column, rows, d1)
    steps, raw = reader.read(group, budget)
    for piece, part in zip(group, raw, strict=True):
        _hash(hashers, piece, reader.key, part)
    flat = steps.reshape(len(steps), -1)
    same = np.zeros(len(flat), bool)
    if len(flat) > 1:
        same[1:] = (flat[1:] == flat[:-1]).all(axis=1)
    return same & d1


def _step_rows(reader: _Reader, piece: _Piece) -> tuple[int, int]:
    """The column's rows of a piece's steps (context included, final row left out)."""
    lo, hi = reader.rows(piece)
    if reader.flat and piece.b == int(reader.lens[piece.pos]):
        hi -= 1
    return lo, hi
