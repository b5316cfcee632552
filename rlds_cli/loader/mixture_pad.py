"""A mixture's common schema over sources whose keys differ: widths padded, masks, dtypes.

The rules of ``MixtureSource(..., pad=True)`` (robots with 7-, 8- and 14-dim actions, or
proprioception of different sizes, in one batch), kept here so they can be read on their own:

* **Widths.** A key's per-step shape in the batch is, on each axis, the largest of the sources'
  shapes for it. A source's values sit at the start of each axis and the rest is zero (a 7-dim
  action in a 14-dim batch is ``[a0 .. a6, 0 .. 0]``). Every source that has the key must give
  it the same number of axes (an ``(8,)`` and a ``(2, 4)`` are refused).
* **Masks.** Every key that some source pads gets ``<key>_pad_mask``: bool, the key's padded
  per-step shape, True where the value is real (the 7-dim source's rows: 7 True, 7 False). A key
  of equal shape in every source gets no mask (it would be all True). The masks are each
  source's one row, taken by the batch's ``source``: exact by construction.
* **Keys only some sources have.** A key named in ``keys=`` that a source does not have (after
  renaming) is zeros in that source's rows with a mask all False, as Octo's ``pad_mask_dict``
  marks a missing camera. ``keys=None`` takes only the keys every source has; a key that no
  source has is refused.
* **Dtypes.** A key stored with different dtypes is promoted as numpy promotes
  (``numpy.result_type``): float32 and float64 give float64, int32 and int64 give int64, uint8
  and float32 give float32; ``float_dtype=`` then casts floating keys as it does for one
  dataset. Only bool, integer and floating keys are promoted; others (strings, bytes) must be
  equal, or the key is refused.
* **Order.** Each source's rows are renamed, then its own transforms run on them (its
  ``Normalize`` with its statistics, at its own width), then they are padded into the batch.

:class:`PadSchema` holds the padded shapes, dtypes and mask rows, and :meth:`PadSchema.assemble`
writes each source's part of a batch into the padded arrays: one copy per key, as the
concatenation of equal shapes makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import MixtureError

#: The suffix of a padded key's mask (``action`` -> ``action_pad_mask``).
MASK_SUFFIX = "_pad_mask"
#: dtype kinds that numpy promotion mixes (bool, signed, unsigned, floating).
_NUMERIC = frozenset("biuf")


@dataclass(frozen=True)
class PaddedKey:
    """One key of the common schema.

    Attributes:
        shape: Per-step shape in the batch (the widest on each axis).
        dtype: Stored dtype in the batch before ``float_dtype`` (the sources' promoted).
        shapes: Per source, its per-step shape, or ``None`` where the source lacks the key.
        dtypes: Per source, its stored dtype, or ``None`` where the source lacks the key.
        masks: ``(sources, *shape)`` bool, True where a source's values are real; ``None`` when
            every source has the key at the full shape (no mask).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    shapes: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[np.dtype | None, ...]
    masks: np.ndarray | None


def _promote(key: str, dtypes: list[np.dtype], names: list[str]) -> np.dtype:
    if len(set(dtypes)) == 1:
        return dtypes[0]
    odd = [(n, str(d)) for n, d in zip(names, dtypes, strict=True) if d.kind not in _NUMERIC]
    if odd:
        raise MixtureError(
            f"key {key!r} is {odd[0][1]} in source {odd[0][0]!r} and "
            f"{sorted({str(d) for d in dtypes})} across the sources: only bool, integer and "
            "floating keys are promoted to one dtype",
            hint="store the key with one dtype in every source, or leave it out of keys=",
        )
    return np.dtype(np.result_type(*dtypes))


class PadSchema:
    """The padded common schema of a mixture (module docstring for the rules).

    Args:
        names: The sources' names, in order.
        fields: Per source, ``{common key: (per-step shape, dtype)}`` of the keys it has (after
            renaming).
        keys: The common keys, in order.
        pad: Pad (``True``), or require equal shapes and dtypes in every source (``False``:
            the mixture without padding; no masks).
    """

    def __init__(
        self,
        names: Sequence[str],
        fields: Sequence[dict[str, tuple[tuple[int, ...], Any]]],
        keys: Sequence[str],
        *,
        pad: bool,
    ) -> None:
        self.names = list(names)
        self.keys: dict[str, PaddedKey] = {}
        for key in keys:
            have = [(i, tuple(f[key][0]), np.dtype(f[key][1])) for i, f in enumerate(fields) if key in f]
            if not have:
                raise MixtureError(
                    f"no source of the mixture has key {key!r} (after renaming); sources are {self.names}",
                    hint="name it as the sources store it, or map it with rename=",
                )
            ranks = {len(shape) for _, shape, _ in have}
            if len(ranks) > 1:
                (i, a, _), (j, b, _) = have[0], next(h for h in have if len(h[1]) != len(have[0][1]))
                raise MixtureError(
                    f"key {key!r} is {a} in source {self.names[i]!r} but {b} in source "
                    f"{self.names[j]!r}: padding needs the same number of axes",
                    hint="reshape one of them (rlds preprocess) or leave the key out of keys=",
                )
            shape = tuple(int(max(s[d] for _, s, _ in have)) for d in range(ranks.pop()))
            dtype = _promote(key, [d for _, _, d in have], [self.names[i] for i, _, _ in have])
            shapes: list[tuple[int, ...] | None] = [None] * len(fields)
            dtypes: list[np.dtype | None] = [None] * len(fields)
            for i, s, d in have:
                shapes[i], dtypes[i] = s, d
            masks = None
            if any(own != shape for own in shapes):
                masks = np.zeros((len(fields), *shape), bool)
                for i, own in enumerate(shapes):
                    if own is not None:
                        real: tuple[Any, ...] = (i, *(slice(0, n) for n in own))
                        masks[real] = True
            self.keys[key] = PaddedKey(shape, dtype, tuple(shapes), tuple(dtypes), masks)
        #: (key, the parts' dtypes) -> the batch's dtype (promotion and float_dtype), cached.
        self._dtypes: dict[tuple[str, tuple[np.dtype, ...]], np.dtype] = {}
        # the batch's large arrays (frames) reused once nothing holds them: fresh ones would
        # page-fault on every batch, as a single dataset's gather avoids (cache/buffers.py)
        self._pool = BufferPool()

    def mask_keys(self) -> list[str]:
        """The ``<key>_pad_mask`` keys a batch carries, in key order."""
        return [k + MASK_SUFFIX for k, spec in self.keys.items() if spec.masks is not None]

    def assemble(
        self,
        parts: Sequence[tuple[int, Any, Mapping[str, Any]]],
        size: int,
        source: np.ndarray,
        batch_dtype: Callable[[str, np.dtype], np.dtype],
    ) -> TedBatch:
        """One batch of ``size`` rows from the sources' parts.

        Args:
            parts: ``(source, rows, part)``: the part's rows go to ``rows`` of the batch (a
                slice for rows grouped by source, else an index array).
            size: Rows in the batch.
            source: The source of each row of the batch (int64, ``size``).
            batch_dtype: ``(key, dtype) -> dtype`` in the batch (``float_dtype``'s cast).
        """
        # plain dicts: TedBatch's lookups join tuple keys, a cost paid per key and part otherwise
        plain: list[tuple[Any, dict[str, Any]]] = [
            (rows, dict(dict.items(part)) if isinstance(part, dict) else dict(part))
            for _, rows, part in parts
        ]
        grouped = all(isinstance(rows, slice) for rows, _ in plain)  # in source order, end to end
        order = list(plain[0][1]) if plain else []
        for _, part in plain[1:]:
            order += [k for k in part if k not in plain[0][1] and k not in order]
        out = TedBatch()
        for key in order:
            have = [(rows, part[key]) for rows, part in plain if key in part]
            spec = self.keys.get(key)
            dtypes = tuple(v.dtype for _, v in have)
            dtype = self._dtypes.get((key, dtypes))
            if dtype is None:  # the promoted dtype, then float_dtype's: once per combination
                dtype = self._dtypes[key, dtypes] = batch_dtype(key, np.dtype(np.result_type(*dtypes)))
            if spec is None:  # index, source, or a key the sources' transforms made
                shape = have[0][1].shape[1:]
                if len(have) != len(plain) or any(v.shape[1:] != shape for _, v in have):
                    names = sorted(self.names[i] for i, _, part in parts if key in part)
                    raise MixtureError(
                        f"key {key!r} comes out of the sources' transforms with different shapes "
                        f"or in some sources only ({names})",
                        hint="give every source transforms that make the same keys and shapes",
                    )
            else:
                shape = spec.shape
            whole = len(have) == 1 and len(have[0][1]) == size  # one source's rows make the batch
            if whole and have[0][1].shape[1:] == shape and have[0][1].dtype == dtype:
                arr = have[0][1]  # one source's rows, whole: its own array (a fresh gather)
            elif grouped and len(have) == len(plain) and (spec is None or spec.masks is None):
                # every source, in order, at the full shape: one concatenation into the batch
                arr = np.concatenate([v for _, v in have], out=self._pool.empty((size, *shape), dtype))
            else:
                arr = self._pool.empty((size, *shape), dtype)
                if spec is not None and spec.masks is not None:
                    arr.fill(0)  # the padding (and the rows of sources without the key)
                for rows, value in have:
                    if value.shape[1:] == shape:
                        arr[rows] = value
                    else:  # a narrower source: its values at the start of each axis
                        arr[(rows, *(slice(0, n) for n in value.shape[1:]))] = value
            out[key] = arr
            if spec is not None and spec.masks is not None:
                out[key + MASK_SUFFIX] = spec.masks.take(source, axis=0)
        return out
