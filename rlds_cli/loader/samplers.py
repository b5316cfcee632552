"""Index samplers: each returns step indices, vectorized and seeded with its own generator."""

from __future__ import annotations

from typing import Any

import numpy as np


class UniformSampler:
    """Transitions drawn uniformly at random, with replacement.

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per call to :meth:`sample`.
        seed: Seed of the sampler's own generator.
    """

    def __init__(self, num_steps: int, batch_size: int, seed: int | None = 0) -> None:
        if num_steps <= 0:
            raise ValueError("cannot sample from an empty dataset")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.num_steps = int(num_steps)
        self.batch_size = int(batch_size)
        self._rng = np.random.default_rng(seed)

    def sample(self) -> np.ndarray:
        """One batch of step indices, shape ``[batch_size]``, int64."""
        return self._rng.integers(0, self.num_steps, self.batch_size, dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same stream of indices."""
        return {"bit_generator": self._rng.bit_generator.state, "num_steps": self.num_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`."""
        if int(state["num_steps"]) != self.num_steps:
            raise ValueError(f"state is for a dataset of {state['num_steps']} steps, not {self.num_steps}")
        self._rng.bit_generator.state = state["bit_generator"]
