"""The loader's argument checks: :func:`make_sampler` and the checks that need no dataset.

Each bad value is one ``ValueError`` naming the argument and what it accepts, raised before
anything is opened or read."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rlds_cli.loader.block_shuffle import BlockSampler
from rlds_cli.loader.epoch import EpochSampler
from rlds_cli.loader.prioritized import PrioritizedSampler, PrioritizedSliceSampler
from rlds_cli.loader.protocols import Sampler
from rlds_cli.loader.samplers import Episodes, SliceSampler, UniformSampler, positive_int


def _count(value: Any) -> bool:
    """An integer >= 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_counts(*, in_memory: Any, prefetch: Any, num_batches: Any, epochs: Any) -> None:
    """``in_memory`` one of its four values; ``prefetch`` a count; ``num_batches`` and
    ``epochs`` a count or ``None``."""
    if in_memory not in (False, True, "device", "auto"):
        raise ValueError(f"in_memory must be False, True, 'device' or 'auto', got {in_memory!r}")
    if not _count(prefetch):
        raise ValueError(f"prefetch must be an integer >= 0, got {prefetch!r}")
    if num_batches is not None and not _count(num_batches):
        raise ValueError(f"num_batches must be an integer >= 0 or None, got {num_batches!r}")
    if epochs is not None and not _count(epochs):
        raise ValueError(f"epochs must be an integer >= 0, or None for an endless stream; got {epochs!r}")


def check_source_options(
    *, keys: Iterable[Any] | None, in_memory: Any, pack: bool, root: str | os.PathLike[str] | None
) -> None:
    """Refuse dataset-only options (keys, storage) given with a source: the source has its own."""
    dataset_only = {"keys": keys is not None, "in_memory": in_memory != "auto", "pack": not pack}
    misplaced = [name for name, set_here in dataset_only.items() if set_here] + (["root"] if root else [])
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)} apply to a dataset; give them to the source instead")


SAMPLERS = ("uniform", "epoch", "blocks", "slice", "prioritized")
_OPTIONS = {
    "uniform": {"resident_window", "block_rows"},
    "epoch": {"drop_last", "shuffle"},
    "blocks": {"block_rows", "shuffle_window"},
    "slice": {
        "slice_len",
        "num_slices",
        "short",
        "weight",
        "start_aligned",
        "padded",
        "resident_window",
        "block_rows",
    },
    "prioritized": {"alpha", "beta", "eps", "fanout", "compiled", "slice_len", "num_slices", "short"},
}


def option_defaults(name: str, options: Mapping[str, Any]) -> dict[str, str]:
    """``{"sampler option <k>": repr(default)}`` for the options of sampler ``name`` that have a
    default (``options``: those given, which pick plain or slice prioritized sampling): a state
    recorded without an option restores into a loader given it at its default, and back."""
    if name not in _OPTIONS:
        return {}
    prioritized = PrioritizedSliceSampler if "slice_len" in options else PrioritizedSampler
    kind = {"uniform": UniformSampler, "epoch": EpochSampler, "blocks": BlockSampler, "slice": SliceSampler,
            "prioritized": prioritized}[name]  # fmt: skip
    params = inspect.signature(kind).parameters
    return {
        f"sampler option {k}": repr(params[k].default)
        for k in _OPTIONS[name]
        if k in params and params[k].default is not inspect.Parameter.empty and params[k].default is not None
    }


def _slices(batch_size: int, options: dict[str, Any]) -> tuple[int, int]:
    """``(num_slices, slice_len)`` from the options; ``batch_size`` counts steps."""
    if "slice_len" not in options:
        raise ValueError("slice sampling needs slice_len (steps per slice)")
    slice_len = positive_int("slice_len", options.pop("slice_len"))
    if "num_slices" in options:
        return positive_int("num_slices", options.pop("num_slices")), slice_len
    if batch_size % slice_len:
        raise ValueError(
            f"batch_size={batch_size} is not a multiple of slice_len={slice_len}; "
            "pass num_slices, or a batch_size that slice_len divides"
        )
    return batch_size // slice_len, slice_len


def make_sampler(
    name: str,
    episodes: Episodes,
    batch_size: int,
    seed: int | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    **options: Any,
) -> Sampler:
    """A sampler by name over a dataset with these ``episodes``.

    Args:
        name: ``"uniform"``, ``"epoch"``, ``"blocks"``, ``"slice"`` or ``"prioritized"``.
        episodes: The dataset's episode boundaries.
        batch_size: Steps per batch (for slices: ``num_slices * slice_len``).
        seed: The run seed (``None``: ``$RLDS_SEED`` or a fresh one, logged).
        rank, world_size: This process's shard: epoch samplers take one shard of each epoch,
            the others draw a stream of their own from ``(seed, rank)``.
        **options: Sampler options: ``epoch``: drop_last, shuffle; ``blocks``: block_rows,
            shuffle_window; ``uniform``: resident_window, block_rows;
            ``slice``: slice_len, num_slices, short, weight, start_aligned, padded, resident_window,
            block_rows; ``prioritized``:
            alpha, beta, eps, fanout, compiled, and slice_len / num_slices / short for slices.

    Raises:
        ValueError: Unknown sampler or option, or a bad value (the message names it).
    """
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(map(repr, SAMPLERS))}")
    unknown = sorted(set(options) - _OPTIONS[name])
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS[name])) or "none"
        raise ValueError(f"sampler {name!r} has no option(s) {', '.join(unknown)}; its options: {allowed}")
    batch_size = positive_int("batch_size", batch_size)
    opts = dict(options)
    n = episodes.num_steps
    if name == "uniform":
        return UniformSampler(
            n, batch_size, seed, rank=rank, world_size=world_size, episode_lengths=episodes.lengths, **opts
        )
    if name == "epoch":
        return EpochSampler(n, batch_size, seed, rank=rank, world_size=world_size, **opts)
    if name == "blocks":
        return BlockSampler(episodes.lengths, batch_size, seed, rank=rank, world_size=world_size, **opts)
    if name == "slice":
        num_slices, slice_len = _slices(batch_size, opts)
        return SliceSampler(
            episodes.lengths, num_slices, slice_len, seed=seed, rank=rank, world_size=world_size, **opts
        )
    if "slice_len" in opts:
        num_slices, slice_len = _slices(batch_size, opts)
        return PrioritizedSliceSampler(
            episodes.lengths, num_slices, slice_len, seed=seed, rank=rank, world_size=world_size, **opts
        )
    if "short" in opts or "num_slices" in opts:
        raise ValueError("short and num_slices apply to prioritized slices: pass slice_len too")
    return PrioritizedSampler(n, batch_size, seed=seed, rank=rank, world_size=world_size, **opts)
