"""A mixed batch over sources whose keys differ: the common schema (widths padded, masks, dtypes),
each source's own transforms, and their ``Normalize`` transforms fused over the padded batch.

**The common schema** of ``MixtureSource(..., pad=True)`` (e.g. robots with 7-, 8- and 14-dim
actions in one batch):

* **Widths.** A key's per-step shape is, on each axis, the largest of the sources'. A source's
  values sit at the start of each axis, the rest zero (a 7-dim action in a 14-dim batch is
  ``[a0 .. a6, 0 .. 0]``). Every source must give the key the same number of axes.
* **Masks.** Every key some source pads gets ``<key>_pad_mask``: bool, the padded per-step shape,
  True where the value is real; none for a key of equal shape everywhere. Each source's mask row
  is taken by the batch's ``source``.
* **Keys only some sources have.** A key in ``keys=`` that a source lacks (after renaming) is
  zeros in its rows with a mask all False (as Octo's ``pad_mask_dict``). ``keys=None`` takes the
  keys every source has; a key no source has is refused.
* **Dtypes.** Different stored dtypes are promoted with ``numpy.result_type`` (float32 + float64:
  float64; uint8 + float32: float32), each source's after its ``Normalize`` (a batch's dtype
  never depends on which sources it holds), then ``float_dtype=`` casts as for one dataset. Only bool,
  integer and floating keys are promoted; others must be equal, or the key is refused.
* **Order.** Each source's rows are renamed, then its own transforms run (at its own width), then
  they are padded into the batch.

:class:`PadSchema` holds the padded shapes, dtypes and mask rows; :meth:`PadSchema.assemble`
writes each source's part into the padded arrays, one copy per key.

**Fused Normalize** (:func:`fuse`). When every source's transforms are ``Normalize`` only, the
padded batch is normalized in one pass per key: each key's statistics become two
``(sources, *padded shape)`` tables (the source's ``mean`` and ``std + eps`` at its width, ``0``
and ``1`` elsewhere), row ``r`` becoming ``(x[r] - mean[source[r]]) / std[source[r]]``: the same
arithmetic in the same dtypes as each source's ``Normalize``, equal bit for bit, padding staying
0. Used only when no key is normalized twice in one source and every normalized key has one
floating dtype in every source, unchanged by ``float_dtype``; otherwise each chain runs on its
source's rows.

**Transforms per source** (``MixtureSource(..., transforms={"a": Normalize(keys=["action"]),
"b": [Normalize(...), f]})``):

* they run on the source's part of each batch after renaming and before padding, with ``index``
  the row's step in that source and ``source`` its index;
* a transform with ``bind(dataset)`` is bound to its source's dataset when the mixture is made; a
  ``Normalize`` reads each renamed key under its stored name (``Normalize.bind``'s ``rename``).
  Other binding transforms are refused on a source that renames keys;
* a binding transform object may serve one source only (refused naming both sources).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlds_cli.cache.buffers import BufferPool
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import MixtureError
from rlds_cli.loader.protocols import Bindable
from rlds_cli.loader.transforms import Normalize, twins

#: The suffix of a padded key's mask (``action`` -> ``action_pad_mask``).
MASK_SUFFIX = "_pad_mask"
#: dtype kinds that numpy promotion mixes (bool, signed, unsigned, floating).
_NUMERIC = frozenset("biuf")


@dataclass(frozen=True)
class PaddedKey:
    """One key of the common schema.

    Attributes:
        shape: Per-step shape in the batch (the widest on each axis).
        dtype: Dtype in the batch before ``float_dtype``: the sources' promoted, after their
            ``Normalize`` (:meth:`PadSchema.expect`).
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
    """The padded common schema of a mixture (rules in the module docstring).

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
        # large arrays reused once nothing holds them, avoiding page faults (cache/buffers.py)
        self._pool = BufferPool()

    def expect(self, chains: Sequence[Sequence[Any]]) -> None:
        """Take each source's ``Normalize`` transforms (``chains[i]``: source ``i``'s) into the
        keys' dtypes: a key one source normalizes (uint8 frames to float32) is that dtype in every
        batch, whichever sources the batch holds."""
        for key, spec in self.keys.items():
            found: list[np.dtype] = []
            for own, chain in zip(spec.dtypes, chains, strict=True):
                if own is None:
                    continue
                dtype = own
                for t in chain:
                    stats = t.stats if isinstance(t, Normalize) and t.stats is not None else {}
                    used = next((k for k in stats if key in twins(k, stats)), None)
                    if used is not None:  # (x - mean) / std: numpy's promotion
                        mean, std = t.pair(used, dtype)
                        dtype = np.dtype(np.result_type(dtype, mean.dtype, std.dtype))
                found.append(dtype)
            promoted = np.dtype(np.result_type(*found))
            if promoted != spec.dtype:
                self.keys[key] = replace(spec, dtype=promoted)

    def assemble(
        self,
        parts: Sequence[tuple[int, Any, Mapping[str, Any]]],
        size: int,
        source: np.ndarray,
        batch_dtype: Callable[[str, np.dtype], np.dtype],
        elsewhere: Collection[str] = (),
    ) -> TedBatch:
        """One batch of ``size`` rows from the sources' parts.

        Args:
            parts: ``(source, rows, part)``: the part's rows go to ``rows`` of the batch (a
                slice for rows grouped by source, else an index array).
            size: Rows in the batch.
            source: The source of each row of the batch (int64, ``size``).
            batch_dtype: ``(key, dtype) -> dtype`` in the batch (``float_dtype``'s cast).
            elsewhere: Keys of the schema the parts do not hold, which the caller adds (frames
                read straight into the batch, :class:`~rlds_cli.loader.mixture_gather.DirectKeys`).
        """
        # plain dicts: TedBatch's lookups join tuple keys, a per-key-and-part cost
        plain: list[tuple[Any, dict[str, Any]]] = [
            (rows, dict(dict.items(part)) if isinstance(part, dict) else dict(part))
            for _, rows, part in parts
        ]
        grouped = all(isinstance(rows, slice) for rows, _ in plain)  # in source order, end to end
        order = list(plain[0][1]) if plain else []
        for _, part in plain[1:]:
            order += [k for k in part if k not in plain[0][1] and k not in order]
        # and every key of the schema, whichever sources this batch holds
        order += [k for k in self.keys if k not in order and k not in elsewhere]
        out = TedBatch()
        for key in order:
            have = [(rows, part[key]) for rows, part in plain if key in part]
            spec = self.keys.get(key)
            if spec is not None and spec.masks is None and len(have) != len(plain):
                names = sorted(self.names[i] for i, _, part in parts if key not in part)
                raise MixtureError(
                    f"key {key!r}, which every source stores, is missing from what the transforms of "
                    f"{names} give",
                    hint="give every source transforms that keep the mixture's keys",
                )
            # the schema's dtype takes part: a batch's dtype never depends on which sources it holds
            dtypes = tuple(v.dtype for _, v in have) + ((spec.dtype,) if spec is not None else ())
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
                self._check_widths(key, spec, parts)
            whole = len(have) == 1 and len(have[0][1]) == size  # one source's rows make the batch
            if whole and have[0][1].shape[1:] == shape and have[0][1].dtype == dtype:
                arr = have[0][1]  # one source's rows, whole: its own (fresh) array
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
                mask = spec.masks.take(source, axis=0)
                for i, rows, given in parts:  # a transform changed the width or dropped the key
                    own = given[key].shape[1:] if key in given else None
                    if own != spec.shapes[i]:
                        mask[rows] = False
                        if own is not None:
                            mask[(rows, *(slice(0, n) for n in own))] = True
                out[key + MASK_SUFFIX] = mask
        return out

    def _check_widths(
        self, key: str, spec: PaddedKey, parts: Sequence[tuple[int, Any, Mapping[str, Any]]]
    ) -> None:
        """Refuse a part whose transforms made ``key`` wider than the batch (or of other axes),
        or, for a key every source stores at one shape (no mask), of another shape."""
        for i, _, part in parts:
            if key not in part:
                continue
            own = tuple(np.shape(part[key])[1:])
            fits = len(own) == len(spec.shape) and all(a <= b for a, b in zip(own, spec.shape, strict=True))
            if own == spec.shape or (fits and spec.masks is not None):
                continue
            raise MixtureError(
                f"the transforms of source {self.names[i]!r} give key {key!r} per-step shape {own}; the "
                f"mixture's batch holds it as {spec.shape}"
                + (" (padded: at most that on each axis)" if spec.masks is not None else ""),
                hint="keep the key within the mixture's shape in the transform, or change it alike in "
                "every source before mixing (rlds preprocess)",
            )


class FusedNormalize:
    """The sources' ``Normalize`` statistics as per-row tables (see the module docstring).

    Args:
        tables: ``{batch key: (means, stds)}``, each ``(sources, *shape)``: a ``next/`` twin has its
            own (each source's statistics for it: its key's, or the twin's own where given).
    """

    def __init__(self, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.tables = tables

    def __call__(self, batch: TedBatch, source: np.ndarray) -> TedBatch:
        """Normalize ``batch`` in place of its keys; ``source``: each row's source."""
        for name, (means, stds) in self.tables.items():
            if name in batch:
                batch[name] = (batch[name] - means.take(source, axis=0)) / stds.take(source, axis=0)
        return batch


def fuse(
    chains: Sequence[Sequence[Any]],
    schema: PadSchema,
    batch_dtype: Callable[[str, np.dtype], np.dtype],
) -> FusedNormalize | None:
    """The chains as one :class:`FusedNormalize`, or ``None`` where that would not give each
    source's own rows exactly (see the module docstring)."""
    if not any(chains) or not all(
        isinstance(t, Normalize) and t.stats is not None for c in chains for t in c
    ):
        return None
    tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    count = len(chains)
    for i, chain in enumerate(chains):
        seen: set[str] = set()
        for t in chain:
            assert t.stats is not None
            for key in t.stats:
                for name in twins(key, t.stats):  # the batch keys this source's Normalize changes
                    if name in seen:
                        return None  # normalized twice in one source: its chain's order matters
                    seen.add(name)
                    spec = schema.keys.get(name)
                    if spec is None:
                        continue  # not in the batch: the source's Normalize skips it too
                    floating = spec.dtype.kind == "f" and batch_dtype(name, spec.dtype) == spec.dtype
                    if not floating or not _one_dtype(schema, name, spec.dtype):
                        return None
                    mean, std = t.pair(key, spec.dtype)
                    if name not in tables:
                        zeros, ones = (
                            np.zeros((count, *spec.shape), mean.dtype),
                            np.ones((count, *spec.shape), std.dtype),
                        )
                        tables[name] = (zeros, ones)
                    means, stds = tables[name]
                    if mean.dtype != means.dtype or std.dtype != stds.dtype:
                        return None
                    own = spec.shapes[i]
                    if own is None:
                        continue  # the source has no such key: its rows stay zeros, as unnormalized
                    at: tuple[Any, ...] = (i, *(slice(0, n) for n in own))
                    means[at], stds[at] = np.broadcast_to(mean, own), np.broadcast_to(std, own)
    return FusedNormalize(tables)


def _one_dtype(schema: PadSchema, key: str, dtype: np.dtype) -> bool:
    """Every source stores ``key`` as ``dtype``: no promotion."""
    return all(d is None or d == dtype for d in schema.keys[key].dtypes)


Transform = Callable[[TedBatch], TedBatch]
#: ``transforms=``: ``{source name: transform or list of transforms}``.
SourceTransforms = Mapping[str, Transform | Sequence[Transform]]


def bind_transforms(
    transforms: SourceTransforms | None,
    names: Sequence[str],
    datasets: Sequence[Dataset],
    renames: Sequence[Mapping[str, str]],
) -> list[list[Transform]]:
    """Per source (in ``names`` order), its chain of transforms, bound (see the module docstring)."""
    if transforms is None:
        return [[] for _ in names]
    if not isinstance(transforms, Mapping):
        raise MixtureError(
            f"transforms= maps source names to transforms ({{name: Normalize(...)}}), got "
            f"{type(transforms).__name__}; for one transform over whole batches use "
            "Loader(MixtureSource(...), transform=...)"
        )
    unknown = sorted(set(transforms) - set(names))
    if unknown:
        raise MixtureError(f"transforms name unknown source(s) {unknown}; sources are {list(names)}")
    owner: dict[int, str] = {}
    chains = []
    for name, ds, rename in zip(names, datasets, renames, strict=True):
        given = transforms.get(name)
        chain = [] if given is None else list(given) if isinstance(given, Sequence) else [given]
        for t in chain:
            if not callable(t):
                raise MixtureError(f"transforms[{name!r}] holds {t!r}, which is not callable")
            renamed = sorted(  # a stored name no key of the batches has (a swap keeps both names)
                k
                for k in (t.keys if isinstance(t, Normalize) else ())
                if k in rename and k not in rename.values()
            )
            if renamed:  # batches carry them under the new names: that Normalize would do nothing
                raise MixtureError(
                    f"the Normalize of source {name!r} names {renamed} as {ds.name!r} stores them; its "
                    f"batches carry them renamed ({', '.join(f'{k} -> {rename[k]}' for k in renamed)})",
                    hint="name keys as the mixture does, after rename=",
                )
            if isinstance(t, Bindable):
                if id(t) in owner:
                    raise MixtureError(
                        f"one {type(t).__name__} is given to sources {owner[id(t)]!r} and {name!r}: it "
                        "binds to one dataset; give each source its own"
                    )
                owner[id(t)] = name
                if isinstance(t, Normalize):
                    try:
                        t.bind(ds, rename=rename)
                    except KeyError as exc:  # a key the source does not store: name the source
                        raise MixtureError(
                            f"Normalize of source {name!r}: {exc.args[0] if exc.args else exc}",
                            hint=f"normalize keys source {name!r} stores, under the mixture's names",
                        ) from None
                    except ValueError:
                        if ds.num_steps:
                            raise
                        raise MixtureError(  # an online buffer not yet written to
                            f"source {name!r} ({ds.name!r}) has no steps yet to compute its Normalize "
                            "statistics of",
                            hint="give them: Normalize(stats=...) (of a dataset like it, or "
                            "NormalizationTable.statistics), or make the mixture once it has steps",
                        ) from None
                elif rename:
                    raise MixtureError(
                        f"transform {type(t).__name__} of source {name!r} reads dataset {ds.name!r} by "
                        "its stored key names, but the source renames keys: bind it yourself and pass "
                        "a plain function"
                    )
                else:
                    t.bind(ds)
        chains.append(chain)
    return chains


def normalized(chain: Sequence[Any]) -> list[tuple[Any, Mapping[str, str], Dataset | None]]:
    """The ``(statistics, stored key names, origin dataset)`` of each ``Normalize`` of a chain
    (what a normalization table holds for the source). The origin is ``None`` where it has grown
    since the statistics were taken: quantiles of it now would not be those of the mean."""
    out: list[tuple[Any, Mapping[str, str], Dataset | None]] = []
    for t in chain:
        if isinstance(t, Normalize) and t.statistics is not None:
            out.append((t.statistics, dict(t.stored_keys), t.origin if t.origin_unchanged() else None))
    return out
