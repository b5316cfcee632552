"""Index samplers: each draws step indices, vectorized, from its own seeded generator.

Every sampler has ``sample()`` and ``state_dict()`` / ``load_state_dict()``; a restored state
continues the exact stream. ``sample()`` returns an int64 index array or a :class:`Draw`
(indices plus per-index extras such as a padding ``mask`` or importance ``weight``). A draw is
O(batch) numpy work (plus a ``log`` of the episode count for slices), whatever the dataset's size.

Uniform and slice samplers live here, with their restriction to resident blocks and how a view's
rows map to the next view's; see also
:mod:`rlds_cli.loader.epoch` and :mod:`rlds_cli.loader.prioritized`.

**Padded slices** (AMAGO's ``padded_sampling``). AMAGO (``amago/loading.py``,
``RLData.random_slice``) picks the start ``s`` of a ``length``-step window in an episode of ``L``
steps uniformly from a mode-dependent range, keeps steps ``max(s, 0) .. min(s + length, L) - 1``
and pads the rest at the end of the sequence:

========== ==================================== =====================================
mode       starts ``s`` (each equally likely)   what it adds
========== ==================================== =====================================
``none``   ``0 .. L - length``                  whole windows only
``both``   ``-(length - 1) .. L - 2``           windows cut at both ends
``left``   ``-(length - 1) .. L - length``      windows cut at the episode's start
``right``  ``0 .. L - 2``                       windows cut at the episode's end
========== ==================================== =====================================

and ``s = 0`` whatever the mode when ``L <= length`` (the whole episode, end-padded). A window
cut at the start begins at the episode's step 0. :func:`start_ranges` gives each episode's first
start (negative for a window cut at its start) and number of starts; every start of an episode is
equally likely, as in AMAGO (episode weighting is the sampler's ``weight``).

**Following a growing dataset** (:class:`ViewChange`). A refresh of a
:class:`~rlds_cli.cache.growing.GrowingDataset` appends episodes and evicts unprotected ones
(oldest first, possibly leaving holes), so row ``t`` of two views differs in general. Episodes are
tied by their log number (:attr:`GrowingDataset.episode_ids`: stable across views, increasing
along a view); a surviving episode keeps its length. :class:`ViewChange` lets a sampler carry
per-row state (priorities, an epoch's remaining order) by row identity, never by position. Numpy,
linear in the episodes (and rows carried), computed lazily.

**Resident windows** (``resident_window=``). With chunked storage (zarr shards, an object store
behind a bounded cache) a uniform draw over the whole dataset fetches a chunk per row. A
:class:`ResidentWindow` restricts a sampler with replacement to ``window`` blocks
(:func:`block_starts`, as ``sampler="blocks"``) at a time. Blocks follow one permutation per cycle
(from the run seed and rank); the oldest leaves once as many steps have been drawn since the
window last moved as it holds rows (a slice sampler: windows, or eligible episodes with
``weight="episodes"``, what its draws pick uniformly). Draws are uniform over the window's rows
(windows, episodes), so over a cycle each is drawn about equally often. State: two integers
(position, draws since the last move) beside the sampler's generator."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal, NamedTuple, cast

import numpy as np

from rlds_cli.cache.reader import Episodes
from rlds_cli.loader.run_state import (
    check_bit_generator,
    check_int,
    check_shard,
    check_shard_fields,
    check_state,
    check_steps,
    rank_world,
    run_seed,
    stream_seed,
)
from rlds_cli.loader.sizes import BatchShape, check_batch_memory

Padded = Literal["none", "both", "left", "right"]
PADDED_MODES: tuple[str, ...] = ("none", "both", "left", "right")


def start_ranges(lengths: np.ndarray, slice_len: int, padded: str) -> tuple[np.ndarray, np.ndarray]:
    """``(first, count)`` per episode: window starts ``first .. first + count - 1`` (relative to
    the episode's first step) for slices of ``slice_len`` steps under AMAGO's ``padded`` mode.

    Episodes of at most ``slice_len`` steps have a single start 0 (the sampler's ``short``
    policy then decides whether the shorter ones are padded, skipped or refused).
    """
    lengths = np.asarray(lengths, np.int64)
    n = slice_len
    if padded == "none":
        first, last = np.zeros_like(lengths), lengths - n
    elif padded == "both":
        first, last = np.full_like(lengths, 1 - n), lengths - 2
    elif padded == "left":
        first, last = np.full_like(lengths, 1 - n), lengths - n
    elif padded == "right":
        first, last = np.zeros_like(lengths), lengths - 2
    else:
        raise ValueError(f"padded must be one of {', '.join(map(repr, PADDED_MODES))}; got {padded!r}")
    fits = lengths <= n  # AMAGO: `if len(self) <= length: start = 0`
    first = np.where(fits, 0, first)
    count = np.where(fits, 1, last - first + 1)
    return first, count


def padded_windows(
    starts: np.ndarray, episode_first: np.ndarray, episode_end: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``[n, slice_len]`` and mask of windows starting at the (possibly virtual) global
    steps ``starts`` in episodes spanning ``[episode_first, episode_end)``: the window's steps
    inside its episode come first, and the rest repeats its last one with ``mask`` False."""
    first = np.maximum(starts, episode_first)[:, None]
    last = (np.minimum(starts + offsets.size, episode_end) - 1)[:, None]
    idx = first + offsets
    mask = idx <= last
    return np.minimum(idx, last), mask


ShortPolicy = Literal["pad", "skip", "error"]
Weighting = Literal["steps", "episodes"]


class Draw(NamedTuple):
    """What a sampler returns when indices come with extras.

    Attributes:
        indices: Step indices, int64, shape ``[batch]`` or ``[num_slices, slice_len]``.
        extras: Arrays of the same leading shape added to the batch (``mask``, ``weight``).
    """

    indices: np.ndarray
    extras: dict[str, np.ndarray]


def split_draw(out: np.ndarray | Draw | tuple[Any, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(indices, extras)`` from whatever a sampler's ``sample()`` returned.

    Raises:
        ValueError: The indices are not integers (floats were cut, a bool mask read as steps 0/1).
    """
    raw, extras = (out[0], dict(out[1])) if isinstance(out, tuple) else (out, {})
    indices = np.asarray(raw)
    if indices.size and indices.dtype.kind not in "iu":
        raise ValueError(
            f"a sampler's sample() returned {indices.dtype} indices; step indices are integers (floats "
            "would be cut to other steps, a bool mask read as steps 0 and 1)"
        )
    return indices.astype(np.int64, copy=False), extras


def uniform_ints(rng: np.random.Generator, high: int, n: int) -> np.ndarray:
    """``n`` int64 values uniform in ``[0, high)``: the generator's raw 64-bit words modulo ``high``.

    Half the cost of ``Generator.integers`` (5 us for 256 values). Modulo bias is at most
    ``high / 2**64`` (5e-14 relative at 10^6 steps).
    """
    if high <= 0:
        raise ValueError(f"cannot draw from an empty range [0, {high})")
    words = rng.bit_generator.random_raw(n)
    words %= np.uint64(high)
    return words.view(np.int64)


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int, or a ``ValueError`` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def choice_arg(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else a ``ValueError`` naming the argument."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return str(value)


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """A copy of ``rng``'s bit-generator state (what a sampler's ``state_dict`` records)."""
    return dict(rng.bit_generator.state)  # typed a Mapping; a fresh dict each call already


def shard_state(sampler: Any, num_steps: int) -> dict[str, Any]:
    """The part of a sampler's state that says whose it is: dataset size, seed, rank, world."""
    return {
        "num_steps": int(num_steps),
        "seed": sampler.seed,
        "rank": sampler.rank,
        "world_size": sampler.world_size,
    }


def _check_rng_state(
    state: Any, what: str, rng: np.random.Generator, resident: ResidentWindow | None = None
) -> None:
    """Check a generator+shard sampler state (and its resident window) before any of it is taken."""
    check_shard_fields(check_state(state, what), what)
    check_bit_generator(state, "bit_generator", what, rng)
    if resident is not None:
        resident.check_state(state.get("resident"), what)


def _with_window(state: dict[str, Any], resident: ResidentWindow | None) -> dict[str, Any]:
    """``state`` plus the resident window's, when the sampler has one."""
    if resident is not None:
        state["resident"] = resident.state_dict()
    return state


def _load_window(state: dict[str, Any], resident: ResidentWindow | None, sampler: Any = None) -> None:
    """Load a state's window into ``resident`` (with ``sampler``: reseed its block order)."""
    if resident is not None and "resident" in state:
        resident.load_state_dict(state["resident"])
    if resident is not None and sampler is not None:
        resident.reseed(stream_seed(sampler.seed, sampler.rank, sampler.world_size))


def _no_refresh(resident: ResidentWindow | None) -> None:
    if resident is not None:
        raise ValueError("resident_window= walks the blocks of one view of the dataset: drop refresh=")


def load_shard_state(sampler: Any, state: dict[str, Any], num_steps: int) -> None:
    """Check a state's dataset size, rank and world size against ``sampler``; take its seed."""
    check_steps(state, num_steps)
    check_shard(state, sampler.rank, sampler.world_size, type(sampler).__name__)
    if state.get("seed") is not None:
        sampler.seed = int(state["seed"])


class UniformSampler:
    """Transitions drawn uniformly at random, with replacement.

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per call to :meth:`sample`.
        seed: The run seed (``None``: ``$RLDS_SEED`` or a fresh one, logged; see
            :mod:`rlds_cli.loader.run_state`); kept as :attr:`seed`.
        rank, world_size: This process's rank: each rank draws its own stream from the seed.
        resident_window: Draw only from this many blocks of whole episodes at a time, a window
            that advances as it draws (:mod:`rlds_cli.loader.samplers`); ``None``: everywhere.
        block_rows: Rows per block of the window.
        episode_lengths: The episodes the blocks are made of (needed with ``resident_window``).
    """

    def __init__(
        self,
        num_steps: int,
        batch_size: int,
        seed: int | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        resident_window: int | None = None,
        block_rows: int | None = None,
        episode_lengths: np.ndarray | None = None,
    ) -> None:
        if num_steps <= 0:
            raise ValueError(f"cannot sample from an empty dataset (num_steps={num_steps})")
        self.num_steps = int(num_steps)
        self.batch_size = positive_int("batch_size", batch_size)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what="UniformSampler")
        self._rng = np.random.default_rng(stream_seed(self.seed, self.rank, self.world_size))
        self._raw = self._rng.bit_generator.random_raw  # looked up once, not per batch
        self._high = np.uint64(self.num_steps)
        seed = stream_seed(self.seed, self.rank, self.world_size)
        self.resident = make_resident_window(
            episode_lengths, self.num_steps, resident_window, block_rows, seed
        )

    def follow(self, change: ViewChange) -> None:
        """Draw from a refreshed view of a growing dataset (its size; the generator goes on)."""
        _no_refresh(self.resident)
        self.num_steps = change.num_steps
        self._high = np.uint64(self.num_steps)

    def sample(self, n: int | None = None) -> np.ndarray:
        """One batch of step indices, shape ``[n or batch_size]``, int64."""
        if self.resident is not None:
            n = self.batch_size if n is None else n
            blocks = self.resident.blocks()
            k = uniform_ints(self._rng, int(self.resident.lengths[blocks].sum()), n)
            self.resident.advance(n)
            return self.resident.rows(k, blocks)
        # uniform_ints inlined (same words, same stream): hot path
        words = self._raw(self.batch_size if n is None else n)
        words %= self._high
        return words.view(np.int64)

    def stream_state(self) -> dict[str, Any]:
        """The generator's state only, recorded per batch by a prefetching loader (no size check)."""
        return _with_window({"bit_generator": generator_state(self._rng)}, self.resident)

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Rewind the generator to a :meth:`stream_state`."""
        self._rng.bit_generator.state = state["bit_generator"]
        _load_window(state, self.resident)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same stream of indices."""
        state = {"bit_generator": generator_state(self._rng), **shard_state(self, self.num_steps)}
        return _with_window(state, self.resident)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another dataset, rank or world
        size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        _check_rng_state(state, type(self).__name__, self._rng, self.resident)
        load_shard_state(self, state, self.num_steps)
        self._rng.bit_generator.state = state["bit_generator"]
        _load_window(state, self.resident, self)


class SliceSampler:
    """``num_slices`` sub-trajectories of ``slice_len`` steps that never cross an episode's end.

    With ``padded="none"``, windows of an episode of length ``L`` start at its first
    ``L - slice_len + 1`` steps. Episodes shorter than ``slice_len`` follow ``short``: ``"pad"``
    (the whole episode, end-padded by repeating the last step, ``mask`` False there), ``"skip"``
    (never sampled; counted in :attr:`skipped_episodes`) or ``"error"`` (``ValueError`` here).

    Args:
        episode_lengths: Steps per episode, in dataset order.
        num_slices: Slices per batch.
        slice_len: Steps per slice.
        short: Policy for episodes shorter than ``slice_len``.
        weight: ``"steps"``: every window is equally likely (long episodes are drawn more
            often); ``"episodes"``: an episode uniformly, then a window in it.
        start_aligned: Only windows starting at an episode's first step.
        padded: AMAGO's ``padded_sampling``: ``"none"`` (default: whole windows), or windows
            that may run past the episode's start and end (``"both"``), start only
            (``"left"``) or end only (``"right"``); their steps inside the episode come first
            and the rest is padding (see the module docstring).
        seed: The run seed (``None``: ``$RLDS_SEED`` or a fresh one, logged).
        rank, world_size: This process's rank: each rank draws its own stream from the seed.
        resident_window, block_rows: Draw slices only from a window of this many blocks of
            ``block_rows`` rows (whole episodes) that advances as it draws
            (:mod:`rlds_cli.loader.samplers`); ``None``: from every episode.

    ``sample()`` returns a :class:`Draw`: indices ``[num_slices, slice_len]`` and ``mask``.
    """

    def __init__(
        self,
        episode_lengths: np.ndarray,
        num_slices: int,
        slice_len: int,
        *,
        short: ShortPolicy = "pad",
        weight: Weighting = "steps",
        start_aligned: bool = False,
        padded: Padded = "none",
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        resident_window: int | None = None,
        block_rows: int | None = None,
    ) -> None:
        self.num_slices = positive_int("num_slices", num_slices)
        self.slice_len = positive_int("slice_len", slice_len)
        self.short = choice_arg("short", short, ("pad", "skip", "error"))
        self.weight = choice_arg("weight", weight, ("steps", "episodes"))
        self.start_aligned = bool(start_aligned)
        self.padded = choice_arg("padded", padded, PADDED_MODES)
        if self.start_aligned and self.padded != "none":
            raise ValueError(f"start_aligned=True and padded={padded!r} contradict each other; pick one")
        self._tables(episode_lengths)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what="SliceSampler")
        self._rng = np.random.default_rng(stream_seed(self.seed, self.rank, self.world_size))
        seed_of_blocks = stream_seed(self.seed, self.rank, self.world_size)
        n = self.episodes.num_steps
        self.resident = make_resident_window(
            self.episodes.lengths, n, resident_window, block_rows, seed_of_blocks
        )
        if self.resident is not None:
            # a block stays for as many draws as it holds of what a draw picks uniformly (windows,
            # or eligible episodes), not rows: rows overweighted blocks of short episodes 7x
            per_episode = self._windows if self.weight == "steps" else (self._windows > 0).astype(np.int64)
            before = np.r_[0, np.cumsum(per_episode)]
            first = self.resident.first_episode
            self.resident.sizes = before[first[1:]] - before[first[:-1]]

    def follow(self, change: ViewChange) -> None:
        """Draw from a refreshed view of a growing dataset (tables rebuilt, linear in the
        episodes; the generator goes on)."""
        _no_refresh(self.resident)
        self._tables(change.lengths)

    def _tables(self, episode_lengths: np.ndarray) -> None:
        """The per-episode tables a draw takes from."""
        self.episodes = ep = Episodes(episode_lengths)
        is_short = ep.lengths < self.slice_len
        self.skipped_episodes = int(is_short.sum()) if self.short == "skip" else 0
        if self.short == "error" and is_short.any():
            raise ValueError(
                f"slice_len={self.slice_len} is longer than {int(is_short.sum())} episode(s) "
                f"(the shortest has {int(ep.lengths.min())} steps); use short='pad' or short='skip'"
            )
        # window k of episode e starts _first[e] + k steps after the episode's first step
        first, windows = start_ranges(ep.lengths, self.slice_len, self.padded)
        if self.short == "skip":
            windows = np.where(is_short, 0, windows)
        if self.start_aligned:
            windows = np.minimum(windows, 1)
        self._windows = windows
        self._eligible = np.flatnonzero(windows > 0)
        if self._eligible.size == 0:
            raise ValueError(f"no episode has slice_len={self.slice_len} steps; nothing to sample")
        self._cum_windows = np.cumsum(windows)
        # memory check of a draw's index arrays (a Loader checks the whole batch before this)
        arg = "slice_len" if self.slice_len > int(ep.lengths.max()) else "num_slices"
        batch = BatchShape(self.batch_size, arg, self.slice_len, self.num_slices, extra_bytes=1)  # mask
        check_batch_memory(batch, {}, [], {}, int(ep.lengths.max()))
        self._offsets = np.arange(self.slice_len, dtype=np.int64)
        # window k of episode e starts at step k + _start_shift[e]; its last step is _last[e]
        self._start_shift = ep.starts + first - (self._cum_windows - windows)
        self._first = first
        self._last = ep.ends - 1
        # every episode holds a whole slice: no in-episode window needs padding (mask all True)
        self._all_fit = bool((ep.lengths >= self.slice_len).all())

    @property
    def batch_size(self) -> int:
        """Steps per batch: ``num_slices * slice_len``."""
        return self.num_slices * self.slice_len

    def _starts(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Start step and episode of ``n`` windows."""
        if self.resident is not None:
            return self._resident_starts(n)
        if self.weight == "steps":
            k = uniform_ints(self._rng, int(self._cum_windows[-1]), n)
            e = np.searchsorted(self._cum_windows, k, side="right")
            return k + self._start_shift.take(e), e
        else:
            e = self._eligible[uniform_ints(self._rng, self._eligible.size, n)]
            offset = self._rng.integers(0, self._windows[e], dtype=np.int64)
        return self.episodes.starts[e] + self._first[e] + offset, e

    def _resident_starts(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_starts` restricted to the episodes of the resident blocks."""
        window = cast(ResidentWindow, self.resident)
        before: np.ndarray = np.r_[0, self._cum_windows]  # windows of the episodes before episode e
        first = window.first_episode
        for _ in range(window.num_blocks + window.window):  # past resident blocks with no window
            blocks = window.blocks()
            totals = before[first[blocks + 1]] - before[first[blocks]]
            if totals.sum() > 0:
                break
            window.position, window.drawn = window.position + 1, 0
        window.advance(n)
        if self.weight == "steps":
            ends = np.cumsum(totals)
            k = uniform_ints(self._rng, int(ends[-1]), n)
            b = np.searchsorted(ends, k, side="right")
            k = k - (ends - totals)[b] + before[first[blocks[b]]]
            e = np.searchsorted(self._cum_windows, k, side="right")
            return k + self._start_shift.take(e), e
        spans = [np.arange(first[b], first[b + 1]) for b in blocks]
        eligible = np.concatenate(spans)
        eligible = eligible[self._windows[eligible] > 0]
        e = eligible[uniform_ints(self._rng, eligible.size, n)]
        offset = self._rng.integers(0, self._windows[e], dtype=np.int64)
        return self.episodes.starts[e] + self._first[e] + offset, e

    def start_distribution(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every start the sampler can draw and its probability: ``(episode, start, p)``, with
        ``start`` relative to the episode's first step (negative: a window cut at its start).
        Computed from the tables :meth:`sample` draws with."""
        total = int(self._cum_windows[-1])
        k = np.arange(total, dtype=np.int64)
        e = np.searchsorted(self._cum_windows, k, side="right")
        start = k + self._start_shift.take(e) - self.episodes.starts[e]
        if self.weight == "steps":
            p = np.full(total, 1.0 / total)
        else:
            p = 1.0 / (self._eligible.size * self._windows[e])
        return e, start, p

    def windows(self, starts: np.ndarray, episodes: np.ndarray) -> Draw:
        """Indices and mask of the slices starting at ``starts`` inside ``episodes``."""
        if self.padded != "none":
            idx, mask = padded_windows(
                starts, self.episodes.starts.take(episodes), self._last.take(episodes) + 1, self._offsets
            )
            return Draw(idx, {"mask": mask})
        idx = starts[:, None] + self._offsets
        if self._all_fit:  # same result as the general case when no window runs past its episode
            return Draw(idx, {"mask": np.ones(idx.shape, np.bool_)})
        last = self._last.take(episodes)[:, None]
        mask = idx <= last
        return Draw(np.minimum(idx, last), {"mask": mask})

    def sample(self, n: int | None = None) -> Draw:
        """``n`` (default ``num_slices``) slices: indices ``[n, slice_len]`` and their ``mask``."""
        return self.windows(*self._starts(self.num_slices if n is None else n))

    def stream_state(self) -> dict[str, Any]:
        """The generator's state only, recorded per batch by a prefetching loader (no size check)."""
        return _with_window({"bit_generator": generator_state(self._rng)}, self.resident)

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Rewind the generator to a :meth:`stream_state`."""
        self._rng.bit_generator.state = state["bit_generator"]
        _load_window(state, self.resident)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same stream of slices."""
        state = {"bit_generator": generator_state(self._rng), **shard_state(self, self.episodes.num_steps)}
        return _with_window(state, self.resident)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another dataset, rank or world
        size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        _check_rng_state(state, type(self).__name__, self._rng, self.resident)
        load_shard_state(self, state, self.episodes.num_steps)
        self._rng.bit_generator.state = state["bit_generator"]
        _load_window(state, self.resident, self)


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.cumsum(lengths) - lengths


class ViewChange:
    """Maps rows of an old view to a new view by episode id (see the module docstring).

    Args:
        old_ids, old_lengths: Episode ids (increasing) and lengths of the old view.
        new_ids, new_lengths: The same of the new view.
    """

    def __init__(
        self, old_ids: np.ndarray, old_lengths: np.ndarray, new_ids: np.ndarray, new_lengths: np.ndarray
    ) -> None:
        self.old_ids = np.asarray(old_ids, np.int64)
        self.new_ids = np.asarray(new_ids, np.int64)
        self.old_lengths = np.asarray(old_lengths, np.int64)
        #: Episode lengths of the new view.
        self.lengths = np.asarray(new_lengths, np.int64)
        #: Steps of the new view; ``old_steps``: of the old one.
        self.num_steps = int(self.lengths.sum())
        self.old_steps = int(self.old_lengths.sum())
        n = len(self.old_ids)
        #: Only appends: every old row is the new view's row of the same number.
        self.appended_only = n <= len(self.new_ids) and bool(np.array_equal(self.new_ids[:n], self.old_ids))

    @cached_property
    def _episode_to(self) -> np.ndarray:
        """Each old episode's place in the new view, -1 where it left (evicted)."""
        if not len(self.new_ids):
            return np.full(len(self.old_ids), -1, np.int64)
        at = np.searchsorted(self.new_ids, self.old_ids)
        clipped = np.minimum(at, len(self.new_ids) - 1)
        return np.where(self.new_ids[clipped] == self.old_ids, clipped, -1).astype(np.int64)

    def map_rows(self, rows: np.ndarray) -> np.ndarray:
        """The new view's row of each old row in ``rows`` (any shape), -1 for an evicted one."""
        rows = np.asarray(rows, np.int64)
        if self.appended_only:
            return rows.copy()
        old_starts = _starts(self.old_lengths)
        episode = np.searchsorted(np.cumsum(self.old_lengths), rows, side="right")
        to = self._episode_to[episode]
        new_starts = _starts(self.lengths)
        moved = new_starts[np.maximum(to, 0)] + rows - old_starts[episode]
        return np.where(to >= 0, moved, -1)

    def survivors(self) -> tuple[np.ndarray | slice, np.ndarray | slice]:
        """``(old rows, new rows)`` of every row in both views, in the same order (slices when
        only appends happened)."""
        if self.appended_only:
            return slice(0, self.old_steps), slice(0, self.old_steps)
        kept = np.flatnonzero(self._episode_to >= 0)
        lengths = self.old_lengths[kept]
        total = int(lengths.sum())
        within = np.arange(total, dtype=np.int64) - np.repeat(_starts(lengths), lengths)
        old = np.repeat(_starts(self.old_lengths)[kept], lengths) + within
        new = np.repeat(_starts(self.lengths)[self._episode_to[kept]], lengths) + within
        return old, new

    def carry(self, values: np.ndarray, fill: float) -> np.ndarray:
        """Per-row ``values`` of the old view as the new view's: a surviving row keeps its value,
        a new row gets ``fill``."""
        out = np.full(self.num_steps, fill, np.asarray(values).dtype)
        old, new = self.survivors()
        out[new] = np.asarray(values)[old]
        return out


def block_starts(episodes: Episodes, block_rows: int) -> np.ndarray:
    """First step of each block: episodes grouped by the ``block_rows``-row chunk their first step
    falls in (whole episodes; a chunk where no episode starts adds no block)."""
    chunk = episodes.starts // block_rows
    first = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
    return episodes.starts[first]


class ResidentWindow:
    """``window`` blocks of episodes that a sampler draws from, advancing as it draws.

    Args:
        episodes: The dataset's episodes.
        block_rows: Rows per block (see :func:`block_starts`).
        window: Blocks resident at once (all of them when there are fewer).
        seed: The seed of the block order (a rank's stream seed: ranks walk different orders).
    """

    def __init__(self, episodes: Episodes, block_rows: int, window: int, seed: int) -> None:
        self.starts = block_starts(episodes, block_rows)
        self.num_blocks = len(self.starts)
        self.lengths = np.diff(np.r_[self.starts, episodes.num_steps])
        #: Each block's first episode; block ``k`` holds episodes ``[first[k], first[k + 1])``.
        bounds = np.r_[self.starts, episodes.num_steps]
        self.first_episode = np.asarray(np.searchsorted(episodes.starts, bounds), np.int64)
        self.window = min(int(window), self.num_blocks)
        self.block_rows = int(block_rows)
        self.seed = int(seed)
        #: Draws each block stays resident for: its rows (a draw picks a row), or what else a
        #: sampler's draw picks uniformly (a slice sampler's windows).
        self.sizes = self.lengths
        self.position = 0  # sequence index of the oldest resident block
        self.drawn = 0  # draws since the window last moved
        self._cycles: dict[int, np.ndarray] = {}

    def _block_at(self, q: int) -> int:
        cycle = q // self.num_blocks
        perm = self._cycles.get(cycle)
        if perm is None:
            self._cycles = {c: p for c, p in self._cycles.items() if c >= cycle - 1}  # at most two kept
            perm = self._cycles[cycle] = np.random.default_rng([self.seed, cycle]).permutation(
                self.num_blocks
            )
        return int(perm[q % self.num_blocks])

    def reseed(self, seed: int) -> None:
        """Walk the block order of another seed (a restored run's)."""
        self.seed, self._cycles = int(seed), {}

    def blocks(self) -> np.ndarray:
        """The resident blocks (distinct; fewer than ``window`` for a moment when the window
        spans two cycles and meets a block twice)."""
        ids = [self._block_at(q) for q in range(self.position, self.position + self.window)]
        return np.unique(np.array(ids, np.int64))

    def advance(self, n: int) -> None:
        """Count ``n`` draws; the oldest block leaves when its :attr:`sizes` worth have been."""
        self.drawn += int(n)
        while self.drawn >= (size := int(self.sizes[self._block_at(self.position)])):
            self.drawn -= size
            self.position += 1

    def rows(self, k: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Rows of the ``k``-th steps (in ``[0, rows of blocks)``) of ``blocks`` laid end to end."""
        lengths = self.lengths[blocks]
        ends = np.cumsum(lengths)
        b = np.searchsorted(ends, k, side="right")
        return self.starts[blocks][b] + k - (ends - lengths)[b]

    def state_dict(self) -> dict[str, int]:
        """The window's position and the steps drawn since it last moved."""
        return {"position": self.position, "drawn": self.drawn}

    def check_state(self, state: Any, what: str) -> None:
        """Refuse a malformed window state (a :class:`~rlds_cli.errors.LoaderStateError`): ``drawn``
        is below the rows of the largest block, as :meth:`advance` leaves it (which block is at
        ``position`` depends on the state's seed; a larger one made the next draw walk the blocks
        one by one, 2**62 of them)."""
        state = check_state(state, f"{what} resident window")
        check_int(state, "position", f"{what} resident window")
        check_int(state, "drawn", f"{what} resident window", high=max(int(self.sizes.max()) - 1, 0))

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Take a state :meth:`check_state` accepted."""
        self.position, self.drawn = int(state["position"]), int(state["drawn"])


def make_resident_window(
    episode_lengths: Any, num_steps: int, window: Any, block_rows: Any, seed: int
) -> ResidentWindow | None:
    """The :class:`ResidentWindow` a sampler's ``resident_window=`` asks for (``None``: none),
    its arguments checked (``ValueError`` naming them)."""
    if window is None:
        if block_rows is not None:
            raise ValueError("block_rows= sizes the blocks of resident_window=; pass resident_window too")
        return None
    for name, value in (("resident_window", window), ("block_rows", block_rows)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0
        ):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    lengths = np.asarray([num_steps] if episode_lengths is None else episode_lengths, np.int64)
    episodes = Episodes(lengths)
    if episodes.num_steps != num_steps:
        raise ValueError(f"episode lengths sum to {episodes.num_steps} steps, not the sampler's {num_steps}")
    return ResidentWindow(
        episodes, DEFAULT_RESIDENT_ROWS if block_rows is None else int(block_rows), int(window), seed
    )


#: Rows of a ``resident_window=`` block when neither the caller nor the Loader (the storage's
#: chunk rows) sizes it.
DEFAULT_RESIDENT_ROWS = 4096
