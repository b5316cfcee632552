"""User functions the executor contract runs by ``"module:function"`` reference. Imports no
pytest: worker processes import it."""

from __future__ import annotations

from typing import Any

import numpy as np


def identity(batch: Any) -> Any:
    return batch


def normalize(batch: Any) -> Any:
    """Observation normalization with fixed constants (a cheap vectorized function)."""
    out = dict(batch)
    for key in ("observation", "next/observation"):
        out[key] = ((batch[key] - 1.5) / 2.0).astype(np.float32)
    return out


def raises(batch: Any) -> Any:
    if batch["index"][0] >= 16:  # not in schema inference (which starts at step 0)
        raise ValueError("boom in user code")
    return batch
