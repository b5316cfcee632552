"""The mixture's sampler: each batch's rows split among the sources with the weights in force
(:class:`MixtureSampler`), and the rules of those weights.

Separate from :mod:`rlds_cli.loader.mixture` because it needs only the sources' sizes: any index
space laid end to end takes it.

**Weights relative to size.** Octo's and OpenVLA's Open X-Embodiment mixes are ``(dataset,
weight)`` lists that ``make_interleaved_dataset(..., balance_weights=True)`` multiplies by each
dataset's transitions before normalizing (weight 1: in proportion to size). Here:

* ``weights="size"``: every source in proportion to its steps (each step equally likely);
* ``weights={"bridge": ("size", 2.0), "fractal": "size"}``: size times a multiplier (``"size"``
  is ``("size", 1.0)``); a source left out weighs 0;
* ``weights=by_size([("fractal", 0.54), ("kuka", 0.83)])`` or ``by_size({"bridge": 2.0})``:
  an Octo-style mix as written;
* plain numbers: shares independent of size. Mixing both kinds in one ``weights`` is refused.

Sizes are the sources' steps when the mixture is made; with ``refresh=`` the weights follow the
sizes of the views in force.

**Over datasets that grow.**

* **Readiness.** A member is *ready* when it has steps and, for a growing dataset,
  ``Dataset.ready`` is true (``min_size`` unprotected and ``min_total`` steps reached). A member
  not ready gets weight 0, the others renormalized (as AMAGO's ``MixtureOfDatasets``): it is
  never served.
* **Annealing** (``anneal=N``). A member ready at the start has its full weight at once. One
  first seen ready before batch ``b0`` has at batch ``b`` the weight ``w * min(1, (b - b0 + 1) /
  N)``, then renormalized over the ready members. ``b0`` is kept if the member stops being ready
  and is ready again.
* **Fixed ratio** (``split="fixed"``). Each batch takes ``w_i * B`` rows from member ``i``,
  largest-remainder rounded (ties to the earlier member; weight 0 gets none): weights ``0.5, 0.5``
  give exactly half and half (RLPD's offline/online batches). ``split="random"`` (default) draws
  the counts from a multinomial.

:class:`MixtureRefresher` is a :class:`~rlds_cli.loader.MixtureLoader`'s ``refresh=N``: the same
hook as :class:`~rlds_cli.loader.refresh.Refresher` (called under the loader's lock before each
batch); every ``N`` batches it refreshes the growing members and, when a view changed, rebuilds
that member's rows and the sampler's sizes and readiness. A batch's indices and rows come from one
view: no index past a member's end, no evicted row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.errors import MixtureError
from rlds_cli.loader.run_state import (
    check_array,
    check_bit_generator,
    check_int,
    check_shard,
    check_shard_fields,
    check_state,
    rank_world,
    run_seed,
    stream_seed,
)
from rlds_cli.loader.samplers import positive_int

if TYPE_CHECKING:
    from rlds_cli.loader.mixture import MixtureSource


SIZE = "size"

#: One entry of ``weights``: a number, ``"size"`` or ``("size", multiplier)``.
Entry = float | str | tuple[str, float]


def by_size(multipliers: Mapping[str, float] | Iterable[tuple[str, float]] | None = None) -> Any:
    """Weights of size times a multiplier per source: ``{name: ("size", m)}`` from a mapping or
    from ``(name, m)`` pairs (an Octo/OpenVLA mix as written); ``None``: ``"size"`` (all sources
    by size alone)."""
    if multipliers is None:
        return SIZE
    pairs = multipliers.items() if isinstance(multipliers, Mapping) else multipliers
    out: dict[str, tuple[str, float]] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise MixtureError(f"by_size takes (name, multiplier) pairs or a mapping, got {pair!r}")
        out[pair[0]] = (SIZE, pair[1])
    return out


def _multiplier(entry: Any) -> float | None:
    """The multiplier of a size-relative entry, ``None`` for anything else."""
    if isinstance(entry, str):
        return 1.0 if entry == SIZE else None
    if isinstance(entry, tuple):
        if len(entry) != 2 or entry[0] != SIZE or isinstance(entry[1], bool):
            raise MixtureError(f"a size-relative weight is ('size', multiplier), got {entry!r}")
        try:
            m = float(entry[1])
        except (TypeError, ValueError):
            raise MixtureError(f"the multiplier of {entry!r} is not a number") from None
        if not np.isfinite(m) or m < 0:
            raise MixtureError(f"the multiplier of {entry!r} must be finite and >= 0")
        return m
    return None


def mixture_weights(
    weights: Any, names: Sequence[str], sizes: Callable[[], Sequence[int]], *, follow: bool
) -> Weights:
    """The sampler's weights from a mixture's ``weights``: numbers or a schedule as given (a
    mapping by name: a missing name weighs 0); weights relative to size (Octo's
    ``balance_weights``) times the sources' steps, as opened (``follow=False``) or in force at
    every batch (``follow=True``: sources that grow).

    Raises:
        MixtureError: A name that is no source, or weights relative to size that are malformed
            (numbers and schedules are checked by :class:`MixtureSampler`).
    """
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise MixtureError(f"weights name unknown source(s) {unknown}; sources are {list(names)}")
    multipliers = _size_multipliers(weights, names)
    if multipliers is None:
        return [weights.get(n, 0.0) for n in names] if isinstance(weights, Mapping) else weights
    if not multipliers.any():
        raise MixtureError(f"weights relative to size give every source a multiplier of 0: {weights!r}")
    if not follow:
        if not any(sizes()):
            raise MixtureError(
                "weights='size' weighs each source by its steps, and no source has any",
                hint="give numbers as weights, or refresh= to follow sources that grow",
            )
        return _sized(multipliers, sizes())
    # sources that grow and have no step yet: weighed by their multipliers until they do (the
    # readiness rules keep an empty source out of the draw meanwhile)
    return lambda step: _sized(multipliers, sizes()) if any(sizes()) else multipliers.tolist()


def _size_multipliers(weights: Any, names: Sequence[str]) -> np.ndarray | None:
    """Per source (in ``names`` order), the multiplier of its size, when ``weights`` is given
    relative to size (``"size"``, or entries ``"size"`` / ``("size", m)``); ``None`` when
    ``weights`` is anything else (numbers, a schedule), left to the usual checks."""
    if callable(weights) and not isinstance(weights, str):
        return None
    if isinstance(weights, str):
        if weights != SIZE:
            raise MixtureError(f"weights given as a string must be 'size', got {weights!r}")
        return np.ones(len(names))
    if isinstance(weights, Mapping):
        entries = [weights.get(n) for n in names]
        given = [(n, e) for n, e in zip(names, entries, strict=True) if e is not None]
    elif isinstance(weights, Sequence):
        given = list(zip(names, weights, strict=False))
        entries = list(weights)
    else:
        return None
    kinds = {n: _multiplier(e) for n, e in given}
    relative = [n for n, m in kinds.items() if m is not None]
    if not relative:
        return None
    plain = [n for n, m in kinds.items() if m is None]
    if plain:
        raise MixtureError(
            f"weights give source(s) {relative} relative to size and {plain} as plain numbers: "
            "use one kind (('size', m) for every source, or numbers for every source)"
        )
    if len(entries) != len(names):
        raise MixtureError(f"weights must be {len(names)} entries, one per source, got {len(entries)}")
    return np.array([0.0 if e is None else _multiplier(e) for e in entries], np.float64)


def _sized(multipliers: np.ndarray, sizes: Sequence[int]) -> list[float]:
    """Each multiplier times its source's steps (normalized later)."""
    return (np.asarray(multipliers, np.float64) * np.asarray(sizes, np.float64)).tolist()


#: ``ready_at`` of a member ready when the mixture started: full weight at once.
FROM_START = -1
#: ``ready_at`` of a member never seen ready yet.
NOT_READY = -2

SPLITS = ("random", "fixed")

#: A mixture's weights: one per member, or ``schedule(batches drawn) -> weights``.
Weights = Sequence[float] | Callable[[int], Sequence[float]]


def check_weights(weights: Any, count: int) -> np.ndarray:
    """``weights`` normalized, or a ``ValueError`` unless ``count`` finite non-negative numbers
    with a positive sum."""
    try:
        w = np.asarray(weights, np.float64)
        # True/False are no weights (a mask meant otherwise?), nor are "1", "2" (numpy parses them)
        raw = np.asarray(weights)
        if raw.dtype.kind in "bUS" or (
            raw.dtype.kind == "O" and any(isinstance(x, str | bytes | bool) for x in raw.ravel())
        ):
            w = np.full(count + 1, np.nan)
    except (TypeError, ValueError, OverflowError):  # strings, None, ragged, past float64: not weights
        w = np.full(count + 1, np.nan)
    if w.shape != (count,) or not np.isfinite(w).all() or (w < 0).any() or w.max(initial=0) <= 0:
        raise ValueError(
            f"weights must be {count} finite non-negative numbers with a positive sum, got {weights!r}"
        )
    w = w / w.max()  # finite weights whose sum would overflow (1e308 twice) sum to a number
    return w / w.sum()


def fixed_counts(weights: np.ndarray, batch_size: int) -> np.ndarray:
    """Rows per member for one batch of ``batch_size`` with normalized ``weights``: the
    largest-remainder rounding of ``weights * batch_size`` (see the module docstring)."""
    exact = np.asarray(weights, np.float64) * batch_size
    counts = np.floor(exact).astype(np.int64)
    short = int(batch_size - counts.sum())
    if short > 0:
        remainder = exact - counts
        remainder[np.asarray(weights) <= 0] = -1.0  # a member of weight 0 never gets a row
        order = np.argsort(-remainder, kind="stable")  # largest first, ties to the earlier member
        counts[order[:short]] += 1
    return counts


def starved(weights: np.ndarray, batch_size: int) -> list[int]:
    """Members of positive weight that :func:`fixed_counts` gives no row of a batch of
    ``batch_size`` (``split="fixed"`` would never draw them)."""
    counts = fixed_counts(weights, batch_size)
    return np.flatnonzero((np.asarray(weights) > 0) & (counts == 0)).tolist()


def refuse_starved(weights: np.ndarray, batch_size: int, where: str = "") -> None:
    """A ``ValueError`` (prefixed ``where``) when :func:`starved` finds members."""
    members = starved(weights, batch_size)
    if members:
        raise ValueError(
            f"{where}split='fixed' gives members {members} (of weight > 0) no row of a batch of "
            f"{batch_size}: raise batch_size or their weight, or use split='random'"
        )


def ready_since(ready_at: np.ndarray, ready: np.ndarray, batch: int) -> np.ndarray:
    """``ready_at`` after the members ``ready`` now were seen ready before batch ``batch``."""
    return np.where((ready_at == NOT_READY) & ready, batch, ready_at).astype(np.int64)


def effective_weights(
    base: np.ndarray, ready: np.ndarray, ready_at: np.ndarray, batch: int, anneal: int | None
) -> np.ndarray:
    """The weights batch ``batch`` is drawn with: ``base`` (normalized), times each member's
    anneal ramp, zero where not ``ready``, renormalized (see the module docstring). All zero when
    no ready member has a positive weight."""
    if anneal is None:
        ramp = np.ones(len(base))
    else:
        ramp = np.clip((batch - ready_at + 1) / anneal, 0.0, 1.0)
        ramp[ready_at == FROM_START] = 1.0
    w = np.where(ready & (ready_at != NOT_READY), base * ramp, 0.0)
    total = w.sum()
    return w / total if total > 0 else w


def check_split(split: str, anneal: int | None) -> None:
    """A ``ValueError`` for a ``split`` or ``anneal`` argument that is not one of ours."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if anneal is not None and (isinstance(anneal, bool) or not isinstance(anneal, int) or anneal < 1):
        raise ValueError(f"anneal must be a number of batches >= 1 or None, got {anneal!r}")


class MixtureRefresher:
    """Refreshes a mixture's growing members every ``every`` batches (see the module docstring).

    Args:
        source: The mixture's source; ``sampler``: its sampler; ``every``: batches between
            refreshes (``1``: before every batch).
    """

    def __init__(self, source: MixtureSource, sampler: MixtureSampler, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"refresh must be a number of batches >= 1, got {every!r}")
        if not any(hasattr(ds, "refresh") for ds in source.datasets):
            raise ValueError(
                f"refresh= follows growing datasets (written with DatasetWriter); none of "
                f"{source.names} is one"
            )
        self.source = source
        self.sampler = sampler
        self.every = every
        #: Batches seen (the count ``every`` divides), kept in the loader's state.
        self.batches = 0
        #: What else follows a changed view (the windows' ``bind_source``), given the source.
        self.rebind: list[Any] = []

    def tick(self) -> None:
        """Before each batch (under the loader's lock): refresh when due, resize when changed."""
        self.batches += 1
        if self.batches % self.every:
            return
        if self.source.refresh():
            self.sampler.set_sizes(self.source.sizes, self.source.ready())
            for rebind in self.rebind:
                rebind(self.source)


class MixtureSampler:
    """Mixture indices: each batch's rows split among the sources with the weights in force,
    each part uniform in its source (rows grouped by source, in source order).

    The weights in force follow the module docstring's rules (readiness, annealing).

    Args:
        sizes: Steps of each source (:attr:`MixtureSource.sizes`; 0 for a source not ready).
        weights: One weight per source (normalized), or ``schedule(step) -> weights``, called
            with the number of batches drawn so far.
        batch_size: Rows per batch.
        seed: The run seed (``None``: ``$RLDS_SEED``, else a fresh one, logged).
        rank, world_size: This process's rank: each rank draws its own stream from the seed.
        split: ``"random"``: the rows per source are a multinomial draw with the weights;
            ``"fixed"``: exactly the weights times ``batch_size``, rounded by largest remainder.
        anneal: Batches over which a source that becomes ready mid-run ramps up to its weight
            (``None``: its full weight at once).
        ready: Per source, whether it is ready now (``None``: all are).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Weights,
        batch_size: int,
        seed: int | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        split: str = "random",
        anneal: int | None = None,
        ready: Sequence[bool] | None = None,
    ) -> None:
        check_split(split, anneal)
        self.split, self.anneal = split, anneal
        self.batch_size = positive_int("batch_size", batch_size)
        self._schedule = weights if callable(weights) else None
        self._count = len(sizes)
        self._fixed = None if callable(weights) else check_weights(weights, len(sizes))
        if split == "fixed" and self._fixed is not None:
            refuse_starved(self._fixed, self.batch_size)
        self._steady: np.ndarray | None = None  # the weights while nothing changes (_weights)
        self._marked = False  # ready_at holds every source ready under the steady weights
        self.set_sizes(sizes, [True] * len(sizes) if ready is None else ready)
        #: Per source: the batch it was first seen ready before (FROM_START, NOT_READY).
        self.ready_at = np.where(self._ready, FROM_START, NOT_READY).astype(np.int64)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what="MixtureSampler")
        self._rng = np.random.default_rng(stream_seed(self.seed, self.rank, self.world_size))
        self.batches_drawn = 0
        self.counts = np.zeros(len(self.sizes), np.int64)  # rows drawn per source
        self.target = np.zeros(len(self.sizes), np.float64)  # rows the weights asked for

    def set_sizes(self, sizes: Sequence[int], ready: Sequence[bool]) -> None:
        """New sizes and readiness of the sources (their views changed: a refresh)."""
        sizes = [int(n) for n in sizes]
        if len(sizes) != len(ready) or len(sizes) != self._count or any(n < 0 for n in sizes):
            raise ValueError(f"sizes must be one non-negative count per source, got {sizes}")
        self.sizes = sizes
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._sizes_u64 = np.asarray(self.sizes, np.uint64)
        # a source without steps is never ready, whatever it says
        self._ready = np.asarray(ready, bool) & (np.asarray(self.sizes) > 0)
        self._steady, self._marked = None, False

    def _base(self) -> np.ndarray:
        if self._schedule is not None:
            given = self._schedule(self.batches_drawn)
            try:
                weights = check_weights(given, len(self.sizes))
            except ValueError as exc:
                raise ValueError(f"the weight schedule at batch {self.batches_drawn}: {exc}") from None
            if self.split == "fixed":  # as fixed weights: those members would silently get no row
                refuse_starved(
                    weights, self.batch_size, f"the weight schedule at batch {self.batches_drawn}: "
                )
            return weights
        assert self._fixed is not None
        return self._fixed

    def weights(self) -> np.ndarray:
        """The normalized weights for the next batch (all zero when no source is ready)."""
        return self._weights().copy()

    def _weights(self) -> np.ndarray:
        if self._steady is not None:
            return self._steady
        since = ready_since(self.ready_at, self._ready, self.batches_drawn)
        w = effective_weights(self._base(), self._ready, since, self.batches_drawn, self.anneal)
        if self._schedule is None and self.anneal is None:
            # fixed weights without a ramp: cached until set_sizes or a state load (~15 us a batch)
            self._steady = w
        return w

    def sample(self) -> np.ndarray:
        """One batch of mixture indices, int64, grouped by source."""
        w = self._weights()
        if not w.any():
            raise ValueError(
                "no dataset of the mixture is ready (none has steps and its min_size, or the ready "
                "ones weigh 0): sample once one is (Dataset.ready)"
            )
        if not self._marked:  # steady weights: the ready sources were marked at the first batch
            self.ready_at = ready_since(self.ready_at, self._ready, self.batches_drawn)
            self._marked = self._steady is not None
        if self.split == "fixed":
            counts = fixed_counts(w, self.batch_size)
        else:
            counts = self._rng.multinomial(self.batch_size, w)
        # one raw draw for the batch, each row modulo its source's size: the same indices as
        # one uniform_ints per source in turn
        words = self._rng.bit_generator.random_raw(self.batch_size)
        words %= self._sizes_u64.repeat(counts)
        self.counts += counts
        self.target += w * self.batch_size
        self.batches_drawn += 1
        return words.view(np.int64) + self.offsets[:-1].repeat(counts)

    def report(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        """Per source (by ``names``): rows drawn, the achieved fraction, the target fraction
        (the mean of the weights in force over the batches drawn), the ``weight`` in force for
        the next batch (after readiness, annealing and renormalization), ``ready`` (1 or 0), its
        ``size`` (steps in the view in force) and ``epochs`` (rows drawn over its size)."""
        total = max(int(self.counts.sum()), 1)
        now = self.weights()
        return {
            name: {
                "rows": int(self.counts[i]),
                "achieved": float(self.counts[i] / total),
                "target": float(self.target[i] / total),
                "weight": float(now[i]),
                "ready": float(self._ready[i]),
                "size": float(self.sizes[i]),
                "epochs": float(self.counts[i] / self.sizes[i]) if self.sizes[i] else 0.0,
            }
            for i, name in enumerate(names)
        }

    def state_dict(self) -> dict[str, Any]:
        """Generator, batch count, when each source became ready, and the mix so far: a restored
        sampler continues the stream (given the same views of the sources)."""
        return {
            "bit_generator": self._rng.bit_generator.state,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "batches_drawn": self.batches_drawn,
            "counts": self.counts.copy(),
            "target": self.target.copy(),
            "ready_at": self.ready_at.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another rank or world size:
        :class:`~rlds_cli.errors.LoaderStateError`)."""
        what, k = "MixtureLoader", len(self.sizes)
        check_shard_fields(check_state(state, what), what, num_steps=False)
        check_bit_generator(state, "bit_generator", what, self._rng)
        check_int(state, "batches_drawn", what)
        check_array(state, "counts", what, kind="iu", length=k)
        check_array(state, "target", what, kind="iuf", length=k)
        check_array(state, "ready_at", what, kind="iu", length=k, low=NOT_READY, required=False)
        check_shard(state, self.rank, self.world_size, what)
        if state.get("seed") is not None:
            self.seed = int(state["seed"])
        self._rng.bit_generator.state = state["bit_generator"]
        self.batches_drawn = int(state["batches_drawn"])
        self.counts = np.asarray(state["counts"], np.int64).copy()
        self.target = np.asarray(state["target"], np.float64).copy()
        if "ready_at" in state:  # optional field
            self.ready_at = np.asarray(state["ready_at"], np.int64).copy()
        self._steady, self._marked = None, False
