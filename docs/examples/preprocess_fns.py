"""Example functions for ``rlds preprocess`` (see docs/preprocessing.md).

Use them by path from the repository's root, e.g.
``rlds preprocess pointmass-demo-v0 --fn docs/examples/preprocess_fns.py:returns_to_go --name demo-rtg``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.preprocess import whole_episodes


def scale_observations(batch: Any) -> dict[str, Any]:
    """A per-step function: observations halved (the same transform for ``observation`` and
    ``next/observation``, so they stay observation-like)."""
    out = dict(batch)
    out["observation"] = (batch["observation"] * 0.5).astype(np.float32)
    out["next/observation"] = (batch["next/observation"] * 0.5).astype(np.float32)
    return out


@whole_episodes  # episode-wise: chunks never cut an episode, even with --by step
def returns_to_go(batch: Any, gamma: float = 0.99) -> dict[str, Any]:
    """Discounted returns-to-go of every step, as a new key ``return_to_go`` (float32, [1])."""
    out = dict(batch)
    reward = batch["next/reward"][:, 0].astype(np.float64)
    rtg, start = np.empty_like(reward), 0
    for end in np.flatnonzero(batch["next/done"][:, 0]):
        g = 0.0
        for t in range(end, start - 1, -1):
            g = reward[t] + gamma * g
            rtg[t] = g
        start = end + 1
    out["return_to_go"] = rtg[:, None].astype(np.float32)
    return out


def drop_short_episodes(batch: Any, min_len: int = 50) -> dict[str, Any]:
    """Per episode (``--by episode``): keep episodes of at least ``min_len`` steps."""
    ep, counts = np.unique(batch["episode"], return_counts=True)
    keep = np.isin(batch["episode"], ep[counts >= min_len])
    return {k: v[keep] for k, v in batch.items()}  # keeps `episode`: the output remembers its source
