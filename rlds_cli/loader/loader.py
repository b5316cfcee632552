"""The :class:`Loader` front door used by training code."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.dataset import Dataset, open_dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.loader.samplers import UniformSampler


def to_torch(batch: TedBatch, device: torch.device | str | None = None) -> TedBatch:
    """Turn a numpy batch into torch tensors, moved to ``device`` without blocking."""
    out = TedBatch()
    for key, value in batch.items():
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        out[key] = tensor.to(device, non_blocking=True) if device is not None else tensor
    return out


class Loader:
    """Batches of TED transitions, sampled from a cached dataset.

    Example:
        >>> loader = Loader("pointmass-demo-v0", batch_size=256, seed=0)  # doctest: +SKIP
        >>> batch = loader.sample()
        >>> batch["next", "reward"].shape
        torch.Size([256, 1])

    Args:
        dataset: A dataset name in the cache, or an opened :class:`Dataset`.
        batch_size: Transitions per batch.
        sampler: ``"uniform"`` or a sampler object with ``sample() -> indices``.
        seed: Seed of the default sampler.
        keys: TED keys to read (``None``: all); other arrays are never touched.
        device: Where batches go (``None``: stay on the CPU).
        root: Cache root, when ``dataset`` is a name.
        num_batches: Length of one pass of ``for batch in loader`` (``None``: endless).
    """

    def __init__(
        self,
        dataset: str | Dataset,
        batch_size: int = 256,
        *,
        sampler: str | Any = "uniform",
        seed: int | None = 0,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        device: torch.device | str | None = None,
        root: str | os.PathLike[str] | None = None,
        num_batches: int | None = None,
    ) -> None:
        self.dataset = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, root)
        self.batch_size = batch_size
        if sampler == "uniform":
            sampler = UniformSampler(self.dataset.num_steps, batch_size, seed)
        elif isinstance(sampler, str):
            raise ValueError(f"unknown sampler {sampler!r}; this version has 'uniform'")
        self.sampler = sampler
        self.keys = list(keys) if keys is not None else None
        self.device = torch.device(device) if device is not None else None
        self.num_batches = num_batches

    def sample(self) -> TedBatch:
        """One batch: TED keys plus ``index`` (the sampled step indices), as torch tensors."""
        indices = self.sampler.sample()
        batch = self.dataset.gather(indices, self.keys)
        batch["index"] = indices
        return to_torch(batch, self.device)

    def __iter__(self) -> Iterator[TedBatch]:
        count = 0
        while self.num_batches is None or count < self.num_batches:
            yield self.sample()
            count += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless Loader has no length; pass num_batches")
        return self.num_batches

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state, so a resumed run continues the same stream."""
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
