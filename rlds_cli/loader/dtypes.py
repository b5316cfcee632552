"""The loaders' dtype policy: ``float_dtype=`` casts floating keys to the model's dtype.

By default batches keep each array's stored dtype (Minari's MuJoCo datasets store float64
observations and rewards). ``float_dtype`` is:

* a ``torch.dtype`` (e.g. ``torch.float32``): every floating key of every batch (observations,
  rewards, ``next/...``, stacked windows, n-step returns, the prioritized ``weight``) is cast to
  it; integer and bool keys (``index``, ``done``, ``mask``) are left alone;
* a mapping ``{key: torch.dtype}`` (keys as ``"next/reward"`` or ``("next", "reward")``): only
  those keys, whatever their dtype (``{"observation": torch.float32}`` also turns uint8 pixels
  into floats); other keys keep their dtype.

A key already in its target dtype is never copied; a cast key is copied once, while the batch is
still numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.ted import TedBatch, join_key

FloatDtype = torch.dtype | Mapping[Any, torch.dtype] | None

#: torch dtype -> numpy dtype, for the casts done while the batch is numpy
_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}


class DtypePolicy:
    """A checked ``float_dtype`` (see the module docstring), applied to batches by :meth:`cast`."""

    def __init__(self, float_dtype: FloatDtype, keys: Any = None) -> None:
        self.all: torch.dtype | None = None
        self.per_key: dict[str, torch.dtype] = {}
        if isinstance(float_dtype, torch.dtype):
            self.all = _floating("float_dtype", float_dtype)
        elif isinstance(float_dtype, Mapping):
            for key, dtype in float_dtype.items():
                self.per_key[join_key(key)] = _floating(f"float_dtype[{key!r}]", dtype)
        elif float_dtype is not None:
            raise ValueError(
                "float_dtype must be a torch floating dtype (e.g. torch.float32), a mapping "
                f"{{key: torch dtype}}, or None; got {float_dtype!r}"
            )
        if keys is not None and self.per_key:  # the batches' keys, when known up front
            self.check_keys(keys)

    def __bool__(self) -> bool:
        return self.all is not None or bool(self.per_key)

    def target(self, key: str, dtype: Any) -> torch.dtype | None:
        """The dtype ``key`` (now of ``dtype``, numpy or torch) is cast to, or ``None``."""
        if self.per_key:
            return self.per_key.get(key)
        assert self.all is not None
        floating = dtype.is_floating_point if isinstance(dtype, torch.dtype) else np.dtype(dtype).kind == "f"
        return self.all if floating else None

    def numpy_target(self, key: str, dtype: np.dtype) -> np.dtype | None:
        """:meth:`target` as a numpy dtype (``None`` when the key keeps its dtype)."""
        want = self.target(key, dtype)
        if want is None:
            return None
        np_want = _NUMPY[want]
        return None if np_want == dtype else np_want

    def changes_host(self, host: Any) -> bool:
        """Whether a batch of ``host`` (a :class:`~rlds_cli.loader.sources.HostSource`, or
        ``None``: unknown) would have a key cast (the prioritized ``weight`` is float32)."""
        if not self:
            return False
        if self.per_key or host is None:
            return True  # checked and applied per batch
        every = {**{k: host.held_dtype(k) for k in host.keys}, "weight": np.dtype(np.float32)}
        return any(self.numpy_target(key, np.dtype(d)) is not None for key, d in every.items())

    def check_keys(self, keys: Any) -> None:
        """Refuse a per-key mapping that names keys the batches never have."""
        have = {join_key(k) for k in keys}
        missing = sorted(set(self.per_key) - have)
        if missing:
            raise KeyError(f"float_dtype names key(s) {missing} that the batches do not have: {sorted(have)}")

    def cast(self, batch: TedBatch) -> TedBatch:
        """``batch`` with its keys cast (numpy arrays or tensors; no copy of an unchanged key)."""
        if self.per_key:
            self.check_keys(batch.keys())
        out = TedBatch()
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                want = self.target(key, value.dtype)
                out[key] = value if want is None or want == value.dtype else value.to(want)
            else:
                arr = np.asarray(value)
                np_want = self.numpy_target(key, arr.dtype)
                out[key] = arr if np_want is None else arr.astype(np_want)
        return out


def _floating(name: str, dtype: Any) -> torch.dtype:
    # casts happen on numpy batches: only dtypes numpy has (not bfloat16)
    if dtype not in _NUMPY:
        raise ValueError(f"{name} must be torch.float16, torch.float32 or torch.float64, got {dtype!r}")
    return dtype
