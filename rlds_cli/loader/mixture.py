"""Mixtures: one batch drawn from several datasets with weights, in a common schema.

A mixture is a source and a sampler that plug into :class:`~rlds_cli.loader.Loader` (prefetch,
transforms, device and checkpoints come from the loader):

* :class:`MixtureSource` puts the datasets end to end in one index space (step ``j`` of source
  ``i`` is index ``offsets[i] + j``), gathers each row from its dataset, renames keys to the
  common schema, and writes each row's origin in ``source`` (int64) and ``index`` (its step in
  that source). Its episodes are the sources' in order, so any sampler works on it (slices never
  cross an episode, hence a source);
* :class:`MixtureSampler` (:mod:`rlds_cli.loader.mixture_sampler`) splits each batch's rows
  among the sources by the current weights (fixed or scheduled by batch count; multinomial, or
  exact with ``split="fixed"``) and draws each part uniformly in its source. Growing sources are
  followed with ``refresh=``; one not ready weighs 0. Weights may be relative to the sizes.

With ``pad=True`` sources whose keys differ (7-, 8- and 14-dim actions) mix: each key padded to
the widest with ``<key>_pad_mask``; ``transforms={name: Normalize(...)}`` normalizes each source
with its own statistics (both: :mod:`rlds_cli.loader.mixture_schema`), exported as one table by
:meth:`MixtureLoader.normalization_table`.

:class:`MixtureLoader` composes both into a loader.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.card import dataset_card, license_conflicts, licenses_of
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.growing import empty_episodes
from rlds_cli.cache.ted import TedBatch, join_key, join_keys
from rlds_cli.errors import LoaderStateError, MixtureError
from rlds_cli.loader.loader import Loader
from rlds_cli.loader.mixture_gather import DirectKeys, PackedKeys
from rlds_cli.loader.mixture_sampler import (
    MixtureRefresher,
    MixtureSampler,
    Weights,
    check_split,
    check_weights,
    mixture_weights,
    starved,
)
from rlds_cli.loader.mixture_schema import (
    MASK_SUFFIX,
    PadSchema,
    SourceTransforms,
    bind_transforms,
    fuse,
    normalized,
)
from rlds_cli.loader.opening import open_dataset
from rlds_cli.loader.run_state import (
    check_int,
    check_settings,
    check_state,
    check_view,
    dataset_fingerprint,
    rank_world,
    run_seed,
)
from rlds_cli.loader.samplers import Episodes, positive_int
from rlds_cli.loader.sources import HostSource
from rlds_cli.loader.tensors import DtypePolicy, FloatDtype, as_numpy
from rlds_cli.loader.windows import PAD_SUFFIX, Windows


class MixtureSource:
    """Several datasets as one source of rows in a common schema.

    Args:
        sources: ``{name: dataset or dataset name}`` (a list uses the datasets' names).
        keys: Keys of the common schema (after renaming); ``None``: those every source has.
        rename: ``{source name: {its key: common key}}``; refused where it would hide or lose
            values (a key the source does not store, two keys onto one, onto a key the source
            keeps, onto ``index``, ``source`` or a ``*_pad_mask``).
        in_memory: Load every source's needed columns into RAM. Either way the small keys
            (one axis at most) are packed into padded tables in RAM when they fit
            (:mod:`rlds_cli.loader.mixture_gather`).
        float_dtype: Cast floating keys to one dtype (or ``{key: dtype}``; see
            :mod:`rlds_cli.loader.tensors`), so float32 and float64 sources mix; rows are cast
            as they are concatenated (no extra copy).
        root: Cache root for names.
        pad: Mix sources whose keys differ in width (and keys only some sources have): each
            key zero-padded to the widest, with ``<key>_pad_mask`` (rules:
            :mod:`rlds_cli.loader.mixture_schema`). ``False``: equal shapes and dtypes required.
        transforms: ``{source name: transform or list}``: run on that source's rows only, after
            renaming and before padding (e.g. each source's own ``Normalize``, bound to its
            dataset's statistics; see :mod:`rlds_cli.loader.mixture_schema`).
    """

    #: A batch's ``index`` is each row's step in its own source (written here, not by the loader).
    owns_index = True

    def __init__(
        self,
        sources: Mapping[str, str | Dataset] | Sequence[str | Dataset],
        *,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        rename: Mapping[str, Mapping[str, str]] | None = None,
        in_memory: bool = False,
        float_dtype: FloatDtype = None,
        root: str | os.PathLike[str] | None = None,
        pad: bool = False,
        transforms: SourceTransforms | None = None,
    ) -> None:
        self._dtypes, self._float_dtype = DtypePolicy(float_dtype), float_dtype
        self.pad = bool(pad)
        if isinstance(sources, str | Dataset):
            raise MixtureError(
                f"sources is one dataset ({sources!r}): a mixture takes several",
                hint="give a list of datasets or names, or {name: dataset}",
            )
        given = sources.values() if isinstance(sources, Mapping) else sources
        odd = [s for s in given if not isinstance(s, str | os.PathLike | Dataset)]
        if odd:
            raise MixtureError(f"sources holds {odd[0]!r}: each source is a dataset or a dataset's name")
        if not isinstance(sources, Mapping):
            opened = [s if isinstance(s, Dataset) else open_dataset(s, root) for s in sources]
            sources = {ds.name: ds for ds in opened}
            if len(sources) < len(opened):  # one dataset twice would be one source, its weight lost
                names = [ds.name for ds in opened]
                twice = sorted({n for n in names if names.count(n) > 1})
                raise MixtureError(
                    f"sources name {twice} more than once",
                    hint="give each dataset once (weights set how often it is drawn), or give "
                    "{name: dataset} with names of your own",
                )
        if not sources:
            raise ValueError("sources must name at least one dataset")
        self.names = list(sources)
        #: Whether this mixture reads the rows of windows (:meth:`like`), for its transforms' errors.
        self.windowed = False
        self.datasets = [s if isinstance(s, Dataset) else open_dataset(s, root) for s in sources.values()]
        rename = dict(rename or {})
        unknown = sorted(set(rename) - set(self.names))
        if unknown:
            raise ValueError(f"rename names unknown source(s) {unknown}; sources are {self.names}")
        self._renames = [
            _checked_rename(n, rename.get(n, {}), ds) for n, ds in zip(self.names, self.datasets, strict=True)
        ]
        self._in_memory = in_memory
        self.keys = self._common_keys(keys)
        clash = next((k for k in self.keys if k in _RESERVED or k.endswith(MASK_SUFFIX)), None)
        if clash is not None:  # the batch's own column would replace the stored one, or the reverse
            holders = [n for n, d, r in zip(self.names, self.datasets, self._renames, strict=True)
                       if clash in {r.get(k, k) for k in d.fields}]  # fmt: skip
            if not holders:
                raise MixtureError(
                    f"keys= names {clash!r}, which a mixture's batch writes itself (each row's index and "
                    "source, and the <key>_pad_mask of a padded key)",
                    hint=f"leave {clash!r} out of keys=: every batch carries it",
                )
            raise MixtureError(
                f"sources {holders} store key {clash!r}, a name a mixture's batch writes itself (each "
                "row's index and source, and the <key>_pad_mask of a padded key)",
                hint=f"rename it (rename={{{holders[0]!r}: {{{clash!r}: 'another name'}}}}) or leave it "
                "out of keys=",
            )
        self.in_memory = bool(in_memory)
        if self._dtypes.per_key:
            self._dtypes.check_keys(self.keys)
        # a growing dataset has its schema from creation, even without steps: every member is
        # checked now
        self._ref: dict[str, Any] = {}  # the first member's keys: the reference
        for i in range(len(self.datasets)):
            self._check_member(i)
        #: The common schema: padded shapes, promoted dtypes, masks (equal shapes without pad).
        self.schema = PadSchema(self.names, [self._member_fields(i) for i in range(len(self.datasets))],
                                self.keys, pad=self.pad)  # fmt: skip
        #: Per source, its transforms (bound to its dataset), run on its rows only.
        self.transforms = bind_transforms(transforms, self.names, self.datasets, self._renames)
        self.schema.expect(self.transforms)
        #: Sources normalized by ``Normalize`` alone: once over the padded batch, with per-row
        #: tables (:mod:`rlds_cli.loader.mixture_schema`); ``None``: each chain on its rows.
        self.fused_normalize = fuse(self.transforms, self.schema, self._in_batch)
        #: Transforms run on each source's part (with its index and source) before padding.
        self._per_part = self.fused_normalize is None and any(self.transforms)
        # frames and other large keys equal in every source: read straight into the batch
        direct = None if in_memory or self._per_part else DirectKeys(
            self.datasets, self._original, self.schema, self._in_batch)  # fmt: skip
        self._direct = direct if direct else None
        # the other keys packed once into padded tables, when they are small and plain: one
        # take a batch instead of one per key and source (mixture_gather.py)
        rest = [k for k in self.keys if self._direct is None or k not in self._direct.plans]
        self._packed = (
            None
            if self._per_part
            else PackedKeys.build(
                self.datasets, self._original, self.schema, rest, self._in_batch, self.fused_normalize
            )
        )
        self._sources = [self._host(i) for i in range(len(self.datasets))]
        # each member's view as last followed (a growing member's log position)
        self._positions = [getattr(ds, "log_position", None) for ds in self.datasets]
        self._index()

    def _host(self, i: int) -> HostSource | None:
        """Member ``i``'s rows (``None`` while it has no steps: a growing dataset, not ready)."""
        ds = self.datasets[i]
        if ds.num_steps == 0 or self._packed is not None:  # packed: nothing read per source
            return None
        have = self._member_fields(i)
        direct = self._direct.plans if self._direct is not None else {}
        keys = [self._original(i, k) for k in self.keys if k in have and k not in direct]
        return HostSource(ds, keys, in_memory=self._in_memory)

    def _index(self) -> None:
        self.sizes = [ds.num_steps for ds in self.datasets]
        #: Where each source starts in the mixture's index space (and, last, its size).
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.num_steps = int(self.offsets[-1])
        lengths = np.concatenate([np.asarray(ds.episode_index["length"], np.int64) for ds in self.datasets])
        # every member may still be empty (growing datasets before their first commit)
        self.episodes = Episodes(lengths) if lengths.size else empty_episodes()

    def ready(self) -> list[bool]:
        """Per member: whether it may be sampled (it has steps and, for a growing dataset,
        ``Dataset.ready``: its ``min_size`` and ``min_total`` reached)."""
        return [ds.num_steps > 0 and bool(getattr(ds, "ready", True)) for ds in self.datasets]

    def refresh(self) -> bool:
        """Refresh every growing member's view (:meth:`GrowingDataset.refresh`); rebuild the
        members whose view changed, and the index space. Returns whether anything changed.
        Indices drawn before a refresh that changed something must not be gathered after it."""
        changed = False
        for i, ds in enumerate(self.datasets):
            refresh = getattr(ds, "refresh", None)
            if refresh is None:
                continue
            refresh()
            # compared with the view followed last, not refresh()'s answer: the dataset's holder
            # (e.g. the user reading ds.ready) may have refreshed it in between
            if ds.log_position == self._positions[i]:  # type: ignore[attr-defined]
                continue
            self._positions[i] = ds.log_position  # type: ignore[attr-defined]
            if self._packed is not None:  # a snapshot of the views opened: per source from now on
                self._packed = None
                self._sources = [self._host(j) for j in range(len(self.datasets))]
            changed = True
            self._sources[i] = self._host(i)
            if self._direct is not None:
                self._direct.reopen(i, ds)
        if changed:
            self._index()
        return changed

    @property
    def fields(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The common schema: each key -> (per-step shape, dtype its rows have in a batch;
        padded: the widest shape and the promoted dtype)."""
        return {k: (s.shape, str(self._in_batch(k, s.dtype))) for k, s in self.schema.keys.items()}

    def _member_fields(self, i: int) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Member ``i``'s keys of the common schema that it has: ``{key: (shape, dtype)}``."""
        fields = self.datasets[i].fields
        out = {}
        for key in self.keys:
            stored = self._original(i, key)
            if stored in fields:
                out[key] = (tuple(fields[stored][0]), fields[stored][1])
        return out

    def like(self, keys: Iterable[str]) -> MixtureSource:
        """A mixture of the same sources, renames, padding, transforms and dtypes over ``keys``
        (what windows gather their offset rows from)."""
        datasets = dict(zip(self.names, self.datasets, strict=True))
        transforms = dict(zip(self.names, self.transforms, strict=True))
        part = MixtureSource(datasets, keys=list(keys), rename=self.renames(), in_memory=self.in_memory,
                             float_dtype=self._float_dtype, pad=self.pad,
                             transforms=transforms)  # fmt: skip
        part.windowed = True
        return part

    def normalization_table(self) -> dict[str, Any]:
        """Each source's normalization statistics (those of its ``Normalize`` transforms) as
        one JSON-ready table: :mod:`rlds_cli.loader.normalization_table`."""
        from rlds_cli.loader.normalization_table import NormalizationTable, source_entry

        entries = {}
        for i, (name, ds, chain) in enumerate(zip(self.names, self.datasets, self.transforms, strict=True)):
            shapes = {key: spec.shapes[i] for key, spec in self.schema.keys.items()}  # its own widths
            entries[name] = source_entry(i, ds.name, normalized(chain), shapes)
        return NormalizationTable.from_sources(entries).to_dict()

    def renames(self) -> dict[str, dict[str, str]]:
        """The ``rename=`` this source was made with (keys joined), to make another like it."""
        return {name: dict(r) for name, r in zip(self.names, self._renames, strict=True) if r}

    def _original(self, source: int, key: str) -> str:
        """The name source ``source`` stores common ``key`` under; ``""`` (no stored key) where it
        renamed its own ``key`` to another name."""
        rename = self._renames[source]
        back = {v: k for k, v in rename.items()}
        return back.get(key, "" if key in rename else key)

    def _common_keys(self, keys: Iterable[str | tuple[str, ...]] | None) -> list[str]:
        wanted = join_keys(keys, "MixtureLoader(keys=...)") if keys is not None else None
        per_source = [{self._renames[i].get(k, k) for k in ds.fields} for i, ds in enumerate(self.datasets)]
        if wanted is None:
            common = set.intersection(*per_source)
            return sorted(common, key=lambda k: (k.startswith("next/"), k))
        return list(dict.fromkeys(wanted))

    def _check_member(self, i: int) -> None:
        """Member ``i`` has every key of the common schema, with the reference's shape and the
        reference's dtype in a batch (equal, or made equal by ``float_dtype``)."""
        have = {self._renames[i].get(k, k) for k in self.datasets[i].fields}
        missing = [k for k in self.keys if k not in have]
        if missing and not self.pad:
            raise KeyError(
                f"source {self.names[i]!r} has no keys {missing} (after renaming); map them with "
                "rename=, or pass pad=True to pad them with a mask of False"
            )
        if self.pad:  # shapes and dtypes: the PadSchema's rules
            return
        if not self._ref:
            self._ref = {k: self.datasets[i].fields[self._original(i, k)] for k in self.keys}
            return
        for key in self.keys:
            got, ref = self.datasets[i].fields[self._original(i, key)], self._ref[key]
            if got[0] == ref[0] and self._in_batch(key, got[1]) == self._in_batch(key, ref[1]):
                continue
            hint = " (pad=True pads keys of different widths)" if got[0] != ref[0] else ""
            if got[0] == ref[0] and {np.dtype(got[1]).kind, np.dtype(ref[1]).kind} == {"f"}:
                hint = " (to mix them, cast every floating key: pass float_dtype=torch.float32)"
            raise ValueError(
                f"key {key!r} is {got} in source {self.names[i]!r} but {ref} in "
                f"{self.names[0]!r}; a common schema needs equal shapes and dtypes{hint}"
            )

    def _in_batch(self, key: str, dtype: Any) -> np.dtype:
        """The dtype rows of ``key`` stored as ``dtype`` have in a batch (``float_dtype``'s
        when it casts them)."""
        stored = np.dtype(dtype)
        if not self._dtypes:
            return stored
        cast = self._dtypes.numpy_target(key, stored)
        return stored if cast is None else cast

    def _part(self, source: int, local: np.ndarray) -> Mapping[str, Any]:
        host = self._sources[source]
        assert host is not None  # a member without steps has no index to be drawn
        got = host.gather(local)
        rename = self._renames[source]
        if not self._per_part:  # the padding takes plain dicts
            return {rename.get(k, k): v for k, v in dict.items(got)} if rename else got
        # its own transforms, on its rows, at its own widths, with its index and source
        part = TedBatch({rename.get(k, k): v for k, v in got.items()})
        part["index"] = local
        part["source"] = np.full(len(local), source, np.int64)
        for t in self.transforms[source]:
            try:
                part = t(part)
            except KeyError as exc:
                if not self.windowed:
                    raise
                missing = exc.args[0] if exc.args else exc
                raise MixtureError(
                    f"a transform of source {self.names[source]!r} reads key {missing!r}, which a "
                    f"window of {self.keys} does not hold: windows run each source's transforms on the "
                    "windowed keys alone",
                    hint="make the transform skip keys the batch lacks ('if key in batch'), or window "
                    "the keys it reads too",
                ) from exc
            if not isinstance(part, Mapping):
                raise MixtureError(
                    f"a transform of source {self.names[source]!r} returned {type(part).__name__}, not "
                    "the batch",
                    hint="return the batch (a mapping of arrays) from every transform",
                )
        return part

    def positions(self, index: Any, source: Any) -> np.ndarray:
        """The mixture positions of rows given as a batch's ``index`` (each row's step in its own
        source) and ``source`` (arrays or tensors of one shape): what a sampler over the mixture
        draws, e.g. to feed priorities back.

        Raises:
            ValueError: ``source`` missing, or not integers of ``index``'s shape within the sources.
        """
        if source is None:
            raise ValueError(
                "update_priority over a mixture: a batch's index is each row's step in its own "
                "source; pass source=batch['source'] too, so the right rows get the priorities"
            )
        local, which = as_numpy(index), as_numpy(source)
        if local.shape != which.shape or which.dtype.kind not in "iu" or local.dtype.kind not in "iu":
            raise ValueError(
                f"update_priority: indices {local.shape} {local.dtype} and source {which.shape} "
                f"{which.dtype} must be integer arrays of one shape (the batch's index and source)"
            )
        if which.size and (which.min() < 0 or which.max() >= len(self.names)):
            raise ValueError(f"update_priority: source holds values outside 0..{len(self.names) - 1}")
        return self.offsets[which] + local

    def gather(self, indices: np.ndarray) -> TedBatch:
        """The rows at mixture ``indices`` (any shape), with ``index`` and ``source`` (and, padded,
        the ``<key>_pad_mask`` keys)."""
        flat = np.asarray(indices, np.int64).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_steps):
            raise IndexError(f"mixture index out of range [0, {self.num_steps})")
        source = np.searchsorted(self.offsets, flat, side="right") - 1
        local = flat - self.offsets.take(source)
        if self._packed is not None:
            batch = self._packed_gather(flat, source, local)
        else:
            batch = self._parts_gather(source, local, flat.size)
        if np.ndim(indices) != 1:
            lead = np.shape(indices)
            batch = TedBatch({k: v.reshape(lead + v.shape[1:]) for k, v in batch.items()})
        return batch

    def _packed_gather(self, flat: np.ndarray, source: np.ndarray, local: np.ndarray) -> TedBatch:
        """:meth:`gather` from the packed tables (and the direct keys)."""
        packed = self._packed
        assert packed is not None
        batch = packed.gather(flat, source)
        if self._direct is not None:
            self._direct.fill(batch, [(i, rows, local[rows]) for i, rows in self._groups(source)], flat.size)
        batch["index"], batch["source"] = local, source.astype(np.int64, copy=False)
        if packed.fused is not None:  # a normalized key outside the packed tables: all at once here
            batch = packed.fused(batch, source)
        return batch

    def _groups(self, source: np.ndarray) -> list[tuple[int, Any]]:
        """``(source, its rows of the batch)``: slices for rows grouped by source (a
        MixtureSampler's), else index arrays."""
        if (np.diff(source) >= 0).all():
            cuts = np.searchsorted(source, np.arange(len(self.names) + 1)).tolist()
            return [(i, slice(a, b)) for i, (a, b) in enumerate(itertools.pairwise(cuts)) if b > a]
        return [(i, np.flatnonzero(source == i)) for i in np.unique(source).tolist()]

    def _parts_gather(self, source: np.ndarray, local: np.ndarray, size: int) -> TedBatch:
        """:meth:`gather` source by source, then padded into the batch."""
        parts = [(i, rows, self._part(i, local[rows])) for i, rows in self._groups(source)]
        # each part is written into the batch's arrays (cast there with float_dtype): one copy
        direct = self._direct.plans if self._direct is not None else ()
        batch = self.schema.assemble(parts, size, source, self._in_batch, elsewhere=direct)
        if self._direct is not None:
            self._direct.fill(batch, [(i, rows, local[rows]) for i, rows, _ in parts], size)
        if not self._per_part:  # written here, once, not gathered per source
            batch["index"], batch["source"] = local, source.astype(np.int64, copy=False)
        if self.fused_normalize is not None:  # each source's Normalize, at once (equal rows, bit for bit)
            batch = self.fused_normalize(batch, source)
        return batch


class MixtureLoader:
    """Uniform transitions from several datasets, mixed with weights: a :class:`Loader` over a
    :class:`MixtureSource` with a :class:`MixtureSampler` (compose those for prefetch or
    transforms).

    Args:
        sources: ``{name: dataset or dataset name}`` (a list uses the datasets' names).
        weights: One weight per source (normalized), ``{source name: weight}`` (a name left
            out weighs 0), or ``schedule(step) -> weights``, called with the number of batches
            drawn so far (e.g. to anneal from offline to new data). Relative to the sources'
            sizes, as Octo writes its mixes: ``"size"``, ``{name: ("size", multiplier)}`` or
            ``by_size([(name, multiplier), ...])`` (:mod:`rlds_cli.loader.mixture_sampler`).
        batch_size: Rows per batch.
        keys: Keys of the common schema (after renaming); ``None``: those every source has.
        rename: ``{source name: {its key: common key}}``; refused where it would hide or lose
            values (a key the source does not store, two keys onto one, onto a key the source
            keeps, onto ``index``, ``source`` or a ``*_pad_mask``).
        seed: The run seed (``None``: ``$RLDS_SEED``, else a fresh one, logged and kept as
            :attr:`seed`); each rank draws its own stream from it.
        rank, world_size: This process's rank (``None``: from ``torch.distributed``, else 0, 1).
        num_batches: Batches per ``for batch in mix`` pass. A mixture has no epochs, so plain
            iteration needs it; :meth:`stream` is the endless alternative.
        in_memory: Load every source's needed columns into RAM.
        device: Where batches go.
        as_tensordict: Return ``tensordict.TensorDict`` batches.
        float_dtype: Cast floating keys to this dtype (or ``{key: dtype}``), e.g.
            ``torch.float32`` to mix float32 and float64 sources (see :class:`MixtureSource`).
        root: Cache root for names.
        windows: Per-key temporal windows (see :class:`~rlds_cli.loader.Loader`); a window never
            runs from one dataset into the next.
        split: ``"random"`` (rows per source drawn from a multinomial) or ``"fixed"`` (exactly
            the weights times ``batch_size`` in every batch, rounded by largest remainder: RLPD's
            half-offline, half-online batches). See :mod:`rlds_cli.loader.mixture_sampler`.
        anneal: Batches over which a source that becomes ready mid-run ramps linearly up to its
            weight (``None``: at once).
        refresh: Follow the growing sources' commits every ``refresh`` batches (``1``: before
            every batch); ``None``: the views they were opened with. A source that is not ready
            (no steps, or short of its ``min_size`` or ``min_total``) is never sampled; the
            others' weights are renormalized.
        pad: Sources whose keys differ in width: each key zero-padded to the widest, with
            ``<key>_pad_mask`` (see :class:`MixtureSource` and :mod:`rlds_cli.loader.mixture_schema`).
        transforms: ``{source name: transform or list}``, e.g. ``{name: Normalize(keys=[...])}``
            per source: each bound to its own dataset's statistics, run on its rows before
            padding (:mod:`rlds_cli.loader.mixture_schema`).
    """

    def __init__(
        self,
        sources: Mapping[str, str | Dataset] | Sequence[str | Dataset],
        weights: Weights | Mapping[str, float],
        batch_size: int = 256,
        *,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        rename: Mapping[str, Mapping[str, str]] | None = None,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        num_batches: int | None = None,
        in_memory: bool = False,
        device: torch.device | str | None = None,
        as_tensordict: bool = False,
        float_dtype: FloatDtype = None,
        root: str | os.PathLike[str] | None = None,
        windows: Mapping[str | tuple[str, ...], Any] | None = None,
        split: str = "random",
        anneal: int | None = None,
        refresh: int | None = None,
        pad: bool = False,
        transforms: SourceTransforms | None = None,
    ) -> None:
        check_split(split, anneal)
        self.source = MixtureSource(
            sources, keys=keys, rename=rename, in_memory=in_memory, float_dtype=float_dtype, root=root,
            pad=pad, transforms=transforms,
        )  # fmt: skip
        self.names, self.datasets, self.keys = self.source.names, self.source.datasets, self.source.keys
        self._licenses: dict[str, list[str]] | None = None
        self.rank, self.world_size = rank_world(rank, world_size)
        batch_size = positive_int("batch_size", batch_size)
        seed = run_seed(seed, world_size=self.world_size, what="MixtureLoader")
        rank, world_size = self.rank, self.world_size
        resolved = mixture_weights(weights, self.names, lambda: self.source.sizes, follow=refresh is not None)
        # what a state must be restored with (run_state.check_settings): weights as given (a
        # schedule cannot be compared), the sources by name and content
        contents = {
            f"dataset {n}": dataset_fingerprint(d) for n, d in zip(self.names, self.datasets, strict=True)
        }
        self._settings = {
            "sources": list(self.names), "batch_size": batch_size, "split": split, "anneal": anneal,
            "weights": _weights_setting(weights), **contents,
        }  # fmt: skip
        if split == "fixed" and not callable(resolved):
            none = starved(check_weights(resolved, len(self.names)), batch_size)
            if none:
                raise MixtureError(
                    f"split='fixed' gives sources {[self.names[i] for i in none]} no row of a batch of "
                    f"{batch_size} (their weight times it rounds to 0): they would never be drawn",
                    hint="raise batch_size or their weight, or use split='random' (rows drawn by weight)",
                )
        self.sampler = MixtureSampler(
            self.source.sizes,
            resolved,
            batch_size,
            seed,
            rank=rank,
            world_size=world_size,
            split=split,
            anneal=anneal,
            ready=self.source.ready(),
        )
        self._refresher = None if refresh is None else MixtureRefresher(self.source, self.sampler, refresh)
        self.loader = Loader(
            self.source,
            batch_size,
            sampler=self.sampler,
            device=device,
            as_tensordict=as_tensordict,
            float_dtype=float_dtype,  # the index, source and any other key the source did not cast
            epochs=None,
            num_batches=num_batches,
            rank=rank,
            world_size=world_size,
            windows=windows,
        )
        # the loader calls it under its lock before each batch, as its own Refresher
        self.loader._refresher = self._refresher  # type: ignore[assignment]
        if self._refresher is not None:  # windows read the members' episodes: they follow too
            bound = [getattr(t, "__self__", None) for t in self.loader.transforms]
            self._refresher.rebind = [w.bind_source for w in bound if isinstance(w, Windows)]
        self.batch_size, self.num_batches = batch_size, num_batches
        self.device, self.as_tensordict = self.loader.device, self.loader.as_tensordict

    @property
    def seed(self) -> int:
        """The run seed (the sampler's)."""
        return self.sampler.seed

    @property
    def batches_drawn(self) -> int:
        """Batches drawn so far."""
        return self.sampler.batches_drawn

    def weights(self) -> np.ndarray:
        """The normalized weights for the next batch."""
        return self.sampler.weights()

    def sample(self) -> Any:
        """One batch in the common schema, plus ``index`` and ``source``."""
        return self.loader.sample()

    def __iter__(self) -> Iterator[Any]:
        """``num_batches`` batches (a mixture has no epochs: without it, a ``TypeError``)."""
        if self.num_batches is None:
            raise TypeError(
                "a MixtureLoader has no epochs: pass num_batches= for finite passes, or iterate "
                "mix.stream() for an endless stream"
            )
        return iter(self.loader)

    def __len__(self) -> int:
        """``num_batches`` (a ``TypeError`` without it)."""
        if self.num_batches is None:
            raise TypeError("a MixtureLoader without num_batches has no length")
        return self.num_batches

    def stream(self) -> Iterator[Any]:
        """An endless stream of batches."""
        return self.loader.stream()

    def report(self) -> dict[str, dict[str, Any]]:
        """Per source: rows drawn, achieved fraction, target fraction (mean of the weights in
        force over the batches drawn), the next batch's effective ``weight`` (after readiness,
        annealing and renormalization), ``ready`` (1 or 0), ``size`` (steps) and ``epochs`` (rows
        drawn over size). When the sources' licences conflict (non-commercial with commercial,
        two share-alike families, no-derivatives: :mod:`rlds_cli.cache.card`), a ``licenses``
        entry gives each source's licence and ``conflicts``, one sentence each."""
        out: dict[str, dict[str, Any]] = dict(self.sampler.report(self.names))
        licenses = self.licenses()
        pairs = [(name, lic) for name, lics in licenses.items() for lic in lics]
        conflicts = license_conflicts(pairs)
        if conflicts:
            out["licenses"] = {
                **{n: ", ".join(v) or "unknown" for n, v in licenses.items()},
                "conflicts": conflicts,
            }
        return out

    def licenses(self) -> dict[str, list[str]]:
        """Each source's licences, as its dataset card declares them (empty: not declared)."""
        if self._licenses is None:
            self._licenses = {
                name: licenses_of(dataset_card(ds))
                for name, ds in zip(self.names, self.datasets, strict=True)
            }
        return self._licenses

    def normalization_table(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Each source's ``Normalize`` statistics as one JSON-ready table, to un-normalize actions
        at inference (read by :class:`~rlds_cli.loader.normalization_table.NormalizationTable`);
        also written to ``path`` as JSON (whole or not at all) when given."""
        table = self.source.normalization_table()
        if path is not None:
            from rlds_cli.loader.normalization_table import NormalizationTable

            NormalizationTable(table).save(path)
        return table

    def state_dict(self) -> dict[str, Any]:
        """Generator, batch count, readiness and the mix so far (and the refresh count): a
        restored loader continues the stream, given the same views of the sources."""
        state = self.sampler.state_dict()
        if self._refresher is not None:
            state["refresh_batches"] = self._refresher.batches
        if self.loader.pass_left is not None:  # inside a ``for`` pass: what it still owes
            state["pass_left"] = self.loader.pass_left
        state["settings"] = dict(self._settings)
        # each growing source's commit-log position: its rows, which evictions move
        sources = zip(self.names, self.datasets, strict=True)
        positions = {n: getattr(ds, "log_position", None) for n, ds in sources}
        state["views"] = {n: p for n, p in positions.items() if p is not None}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another mixture: other sources,
        in another order or with other contents, batch size, weights or split; or from another
        rank or world size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        check_int(check_state(state, "MixtureLoader"), "refresh_batches", "MixtureLoader", required=False)
        check_int(state, "pass_left", "MixtureLoader", required=False)
        check_settings(state, self._settings, "the mixture")
        self._check_views(state.get("views", {}))
        self.sampler.load_state_dict(state)
        self.loader.finish_pass(state.get("pass_left"))  # the next ``for`` finishes the saved pass
        if self._refresher is not None and "refresh_batches" in state:
            self._refresher.batches = int(state["refresh_batches"])

    def _check_views(self, views: Any) -> None:
        """Refuse a state saved on other views of the growing sources (evictions and commits moved
        their rows: the sampler would draw other episodes than the saved run did)."""
        if not isinstance(views, Mapping):
            raise LoaderStateError(f"MixtureLoader state field 'views' must be a mapping, got {views!r}")
        for name, ds in zip(self.names, self.datasets, strict=True):
            check_view(views.get(name), ds, "MixtureLoader", f"growing source {name!r}")


def _weights_setting(weights: Any) -> str:
    """Mixture weights as given, in a form equal for equal weights (a list or tuple of the same
    numbers, a mapping in any order); a schedule is ``"a schedule"``."""
    if callable(weights):
        return "a schedule"
    try:
        if isinstance(weights, Mapping):
            return repr({str(k): float(v) for k, v in sorted(weights.items())})
        return repr([float(w) for w in weights]) if not isinstance(weights, str) else repr(weights)
    except (TypeError, ValueError, OverflowError):  # relative to size ("size", ...) or 10**400: as given
        return repr(weights)


#: Names a batch of a mixture writes itself (and the suffixes of its masks and windows' padding
#: flags): never a rename's target.
_RESERVED = ("index", "source")


def _checked_rename(name: str, mapping: Any, ds: Dataset) -> dict[str, str]:
    """Source ``name``'s ``rename=`` mapping, keys joined, or :class:`MixtureError` naming what
    would hide or lose data: a key the source does not store, two keys onto one, a key onto one
    the source keeps, or onto a name the mixture writes itself."""
    if not isinstance(mapping, Mapping):
        raise MixtureError(f"rename[{name!r}] is {type(mapping).__name__}: give {{its key: common key}}")
    out: dict[str, str] = {}
    for key, target in mapping.items():
        if not isinstance(key, str | tuple) or not isinstance(target, str | tuple):
            raise MixtureError(f"rename[{name!r}] maps {key!r} to {target!r}: keys are names (str or tuple)")
        out[join_key(key)] = join_key(target)
    stored = set(ds.fields)
    missing = sorted(k for k in out if k not in stored)
    if missing:
        raise MixtureError(f"rename[{name!r}] names {missing}, which source {name!r} does not store",
                           hint=f"its keys: {sorted(stored)}")  # fmt: skip
    targets = list(out.values())
    twice = sorted({t for t in targets if targets.count(t) > 1})
    kept = sorted(t for t in targets if t in stored and t not in out)
    reserved = sorted(t for t in targets if t in _RESERVED or t.endswith((MASK_SUFFIX, PAD_SUFFIX)))
    for found, what in ((twice, "two of its keys onto"), (kept, "a key onto one it keeps:"),
                        (reserved, "a key onto a name the mixture writes itself:")):  # fmt: skip
        if found:
            raise MixtureError(f"rename[{name!r}] maps {what} {found}: one would hide the other's values")
    return out
