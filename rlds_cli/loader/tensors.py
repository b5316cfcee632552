"""A batch of numpy arrays as torch tensors or a TensorDict, in the dtypes asked: the last step
of every loader.

Separate from the loader so the torch adapters and TorchRL interop share it without importing it.

**Extras.** Samplers add ``weight`` (importance weights) and ``mask`` (``False`` on slice
padding). Native batches (:class:`~rlds_cli.cache.ted.TedBatch`) keep those names; TensorDict
batches (``as_tensordict=True``) carry them where TorchRL (0.14) losses read them, as TorchRL's
``PrioritizedSampler`` and ``SliceSampler(pad_output=True)`` write them: ``"priority_weight"``
(``tensor_keys.priority_weight`` of DQN, DDPG, TD3, TD3+BC, SAC, discrete SAC, TQC) and
``("collector", "mask")`` (``LossModule.loss_mask_key="auto"``, read through ``_reduce_loss``
by IQL, CQL, discrete CQL, TD3+BC, DQN, ...). No ``set_keys`` needed.

**The dtype policy** (:class:`DtypePolicy`, ``float_dtype=``): floating keys cast to the model's
dtype. By default batches keep each array's stored dtype (Minari's MuJoCo datasets store float64
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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.errors import import_extra

#: rlds extra -> the TED key (``"/"``-joined) a TensorDict batch carries it under
TORCHRL_KEYS = {"weight": "priority_weight", "mask": "collector/mask"}


def torchrl_paths(keys: Iterable[str], extras: Iterable[str]) -> list[str]:
    """The TED paths a TensorDict batch carries ``keys`` under: the sampler's ``extras`` among
    ``weight``/``mask`` at TorchRL's keys, every other key (a dataset's own ``weight`` or
    ``mask`` included) unchanged."""
    moved = {name for name in extras if name in TORCHRL_KEYS}
    return [TORCHRL_KEYS[k] if k in moved else k for k in keys]


def drop_padding(td: Any) -> Any:
    """The real steps of a TensorDict batch of slices: its rows where ``("collector", "mask")``
    is True, as a one-dimensional batch (a copy; a batch without the mask is returned unchanged).

    For losses that miss the mask: TorchRL 0.14.1's ``IQLLoss.qvalue_loss`` reduces over a
    ``select`` that drops it, so ``loss_qvalue`` counts the padding. Importance weights travel
    with their rows.
    """
    mask = td.get(("collector", "mask"), None)
    return td if mask is None else td[mask].exclude(("collector", "mask"))


def to_torch(
    batch: TedBatch, device: torch.device | str | None = None, *, pin_memory: bool = False
) -> TedBatch:
    """Numpy arrays -> torch tensors (no copy), optionally pinned and moved without blocking.

    Tensors already on ``device`` pass through.
    """
    if device is None and not pin_memory:  # common CPU case: zero-copy views
        values = batch.values()
        if values and type(next(iter(values))) is np.ndarray:
            try:  # builtin map: ~3 us a batch less than a loop
                return TedBatch(zip(batch.keys(), map(torch.from_numpy, values), strict=True))
            except TypeError:  # a tensor or a non-array further on: the loop below
                pass
        return TedBatch(
            {
                key: value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
                for key, value in batch.items()
            }
        )
    out = TedBatch()
    target = torch.device(device) if device is not None else None
    for key, value in batch.items():
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
        if pin_memory and tensor.device.type == "cpu":
            tensor = tensor.pin_memory()  # page-locked: the copy below is asynchronous
        if target is not None and tensor.device != target:
            tensor = tensor.to(target, non_blocking=True)
        out[key] = tensor
    return out


#: One level of a TensorDict's nesting, in the order of first appearance: ``(name, position of
#: its value in the batch)`` for a tensor, ``(name, the level below)`` for a sub-TensorDict.
Level = list[tuple[str, "int | Level"]]


def to_tensordict(batch: TedBatch, device: torch.device | str | None = None) -> Any:
    """A :class:`tensordict.TensorDict` with the batch's nested keys (needs ``tensordict``): its
    batch size the shape of ``index``, else the rows of the first key.

    Non-tensor values, and any batch for a ``device``, go through the ``TensorDict`` constructor;
    the rest are assembled by :class:`TensorDictBatches` (a value with other leading dimensions
    is a ``ValueError`` naming its key).
    """
    if device is not None:
        lead = tuple(batch["index"].shape) if "index" in batch else (batch.batch_size,)
        return _tensordict_class()(batch.nested(), batch_size=lead, device=device)
    return TensorDictBatches(checked=True)(batch)


class TensorDictBatches:
    """Makes a loader's TensorDict batches at the cost of one object per nesting level.

    The ``TensorDict`` constructor's per-key checks cost ~20 us for 9 keys, half or more of a
    plain batch's time. Here each key layout's nesting (extras under TorchRL's keys:
    :func:`torchrl_paths`) is computed once and batches are made with
    ``TensorDict._new_unsafe``, which stores the values as given.

    Guarantees: the keys, nesting, order, dtypes, batch size (the shape of ``index``, else the
    rows of the first key) and device of ``TensorDict(nested, batch_size=..., device=device)``.
    Values must be torch tensors on ``device``. With ``checked`` (set when transforms run), a
    value with other leading dimensions is a ``ValueError`` naming its key, and non-tensor
    values go through the constructor.
    """

    #: Key layouts kept at most (a loader has one or two; more means keys that change every batch).
    MAX_LAYOUTS = 64

    def __init__(self, device: torch.device | str | None = None, *, checked: bool = True) -> None:
        self.cls = _tensordict_class()
        self.device = where = torch.device(device) if device is not None else None
        # the constructor indexes an unindexed device ("cuda": the current CUDA device)
        self._unindexed = where is not None and where.index is None and where.type not in ("cpu", "meta")
        self.checked = checked
        self._new: Any = getattr(self.cls, "_new_unsafe", None)  # tensordict's own fast constructor
        self._layouts: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Level, int | None]] = {}

    def __call__(self, batch: TedBatch, extras: Iterable[str] | None = None) -> Any:
        """``batch`` (torch tensors) as a TensorDict, the sampler's ``extras`` under TorchRL's keys."""
        keys, names = tuple(batch), tuple(extras) if extras else ()
        layout = self._layouts.get((keys, names))
        if layout is None:
            layout = self._learn(keys, names)
        level, at = layout
        values = list(batch.values())
        if not values:
            return self.cls({}, batch_size=(0,), device=self.device)
        lead = values[at].shape if at is not None else values[0].shape[:1]
        device = self.device
        if self._unindexed and device is not None:  # per batch, as the constructor: it may change
            device = torch.device(device.type, torch.cuda.current_device() if device.type == "cuda" else 0)
        if self.checked and not _fits(values, lead):
            _check_rows(keys, values, lead)  # tensors that do not fit are refused by name
            return self.cls(_dicts(level, values), batch_size=tuple(lead), device=device)
        if self._new is None:  # tensordict without _new_unsafe: the constructor
            return self.cls(_dicts(level, values), batch_size=lead, device=device)
        return self._build(level, values, lead, device)

    def _learn(self, keys: tuple[str, ...], names: tuple[str, ...]) -> tuple[Level, int | None]:
        if len(self._layouts) >= self.MAX_LAYOUTS:
            self._layouts.clear()
        layout = (nesting(torchrl_paths(keys, names)), keys.index("index") if "index" in keys else None)
        self._layouts[keys, names] = layout
        return layout

    def _build(self, level: Level, values: list[Any], lead: torch.Size, device: torch.device | None) -> Any:
        return self._new(
            {
                name: values[at] if isinstance(at, int) else self._build(at, values, lead, device)
                for name, at in level
            },
            batch_size=lead,
            device=device,
            nested=False,
        )


def nesting(paths: Sequence[str]) -> Level:
    """The nesting of ``"/"``-joined TED ``paths`` (``"next/reward"``: ``reward`` in ``next``),
    in the order of :meth:`~rlds_cli.cache.ted.TedBatch.nested`.

    Raises:
        ValueError: One path is a tensor and the parent of another (``"a"`` and ``"a/b"``): a
            TensorDict cannot hold both.
    """
    root: dict[str, Any] = {}
    for pos, path in enumerate(paths):
        *parents, leaf = path.split("/")
        node = root
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(_clash("/".join(parents[: depth + 1]), path))
        if isinstance(node.get(leaf), dict):
            raise ValueError(_clash(path, next(p for p in paths if p.startswith(path + "/"))))
        node[leaf] = pos

    def level(node: dict[str, Any]) -> Level:
        return [(name, at if isinstance(at, int) else level(at)) for name, at in node.items()]

    return level(root)


def _clash(key: str, child: str) -> str:
    return (
        f"batch key {key!r} is a tensor and the parent of {child!r}: a TensorDict cannot hold "
        "both; rename one of them (a transform's output, or the loader's keys=)"
    )


def _dicts(level: Level, values: list[Any]) -> dict[str, Any]:
    """``level`` with the batch's ``values`` as nested dicts (for the ``TensorDict`` constructor)."""
    return {name: values[at] if isinstance(at, int) else _dicts(at, values) for name, at in level}


def _fits(values: list[Any], lead: tuple[int, ...]) -> bool:
    """Whether every value is a torch tensor whose leading dimensions are ``lead``."""
    n = len(lead)
    return all(type(v) is torch.Tensor and v.shape[:n] == lead for v in values)


def _check_rows(keys: Sequence[str], values: list[Any], lead: tuple[int, ...]) -> None:
    """Raise ``ValueError`` naming the first value whose leading dimensions are not ``lead``."""
    for key, value in zip(keys, values, strict=True):
        shape = tuple(getattr(value, "shape", lead))
        if shape[: len(lead)] != tuple(lead):
            raise ValueError(
                f"batch key {key!r} has shape {shape}, not the batch's leading dimensions "
                f"{tuple(lead)}: a transform must give every key the batch's rows"
            )


def _tensordict_class() -> Any:
    """``tensordict.TensorDict``, or :class:`MissingExtraError` saying what to install."""
    return import_extra("tensordict", "as_tensordict=True", hint="pip install 'rlds-cli[torchrl]'").TensorDict


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


def as_numpy(value: Any) -> np.ndarray:
    """A numpy view of an array-like or a (CPU or device) torch tensor."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and not value.requires_grad:
            return value.numpy()  # a view: .detach().cpu() would make two more tensor objects
        return value.detach().cpu().numpy()
    if hasattr(value, "detach"):  # another tensor type
        value = value.detach().cpu().numpy()
    return np.asarray(value)
