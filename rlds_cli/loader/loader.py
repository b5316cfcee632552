"""The :class:`Loader` front door used by training code: source + sampler + transforms + prefetch.

Per batch: indices from the sampler, their rows gathered from the source (made for a dataset:
a :class:`~rlds_cli.loader.sources.HostSource`, or a :class:`~rlds_cli.loader.device.DeviceSource`
over it; or given, e.g. a :class:`~rlds_cli.loader.mixture.MixtureSource`), the transforms, then
torch (and the device); with ``prefetch``, in a background thread (:mod:`rlds_cli.loader.read_ahead`).
Sources and samplers meet only through :mod:`rlds_cli.loader.protocols`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.reader import stored_keys
from rlds_cli.cache.ted import TedBatch, join_keys
from rlds_cli.frames.device_decode import EncodedRows, device_decode_problem
from rlds_cli.loader.device import DeviceSource, DeviceUniformSampler
from rlds_cli.loader.epoch import check_ranks_field, in_step
from rlds_cli.loader.factory import check_counts, check_source_options, make_sampler, option_defaults
from rlds_cli.loader.image_transforms import ImageTransform
from rlds_cli.loader.opening import open_dataset
from rlds_cli.loader.protocols import (
    Bindable,
    Checkpointable,
    Claiming,
    Elastic,
    Epochal,
    IndexedSource,
    Prioritized,
    Sampler,
    Streamable,
)
from rlds_cli.loader.read_ahead import Prefetcher, Prepared
from rlds_cli.loader.refresh import Refresher
from rlds_cli.loader.run_state import (
    all_gather_objects,
    check_loader_state,
    check_settings,
    check_shard,
    check_uniform_draws,
    dataset_fingerprint,
    rank_world,
    run_seed,
    sources_fingerprint,
    view_state,
)
from rlds_cli.loader.samplers import Draw, Episodes, ViewChange, positive_int, split_draw
from rlds_cli.loader.sizes import auto_in_memory, check_loader_batch
from rlds_cli.loader.sources import HostSource, resolve_keys
from rlds_cli.loader.tensors import DtypePolicy, FloatDtype, TensorDictBatches, to_torch
from rlds_cli.loader.windows import Offsets, with_windows

Transform = Callable[[TedBatch], TedBatch]
_INT64 = np.dtype(np.int64)
logger = logging.getLogger("rlds_cli.loader")


class Loader:
    """Batches of TED transitions sampled from a cached dataset, as torch tensors.

    ``for batch in loader`` is one epoch by default (``epochs=1``): each step once for the
    ``"epoch"`` sampler; with replacement, as many batches as one dataset's worth of steps (per
    rank). ``len(loader)`` is that count. Endless: :meth:`stream`, or ``epochs=None``.

    Example:
        >>> loader = Loader("pointmass-demo-v0", batch_size=256, sampler="uniform", seed=0)  # doctest: +SKIP
        >>> batch = loader.sample()
        >>> batch["next", "reward"].shape
        torch.Size([256, 1])

    Args:
        dataset: A dataset name in the cache, an opened :class:`Dataset`, or a source of rows
            with its own keys and storage (an
            :class:`~rlds_cli.loader.protocols.IndexedSource` such as a
            :class:`~rlds_cli.loader.mixture.MixtureSource`; then ``keys``, ``in_memory``,
            ``pack`` and ``root`` are the source's business, and transforms are not bound).
        batch_size: Steps per batch (slices: ``num_slices * slice_len``); at most a quarter of
            the machine's memory a batch (:mod:`rlds_cli.loader.sizes`).
        sampler: ``"uniform"``, ``"epoch"``, ``"slice"``, ``"prioritized"``, or an object with
            ``sample()`` returning indices or a :class:`~rlds_cli.loader.samplers.Draw`
            (and ideally ``state_dict`` / ``load_state_dict``).
        seed: The run seed of a sampler given by name. ``None`` (default): ``$RLDS_SEED``, else a
            fresh seed, drawn on rank 0 and broadcast when ``torch.distributed`` is initialised
            (then every rank must build the loader); a fresh seed is logged (logger
            ``rlds_cli.loader``, INFO) and kept as :attr:`seed` and in :meth:`state_dict`.
            Each rank draws its own stream (or, for ``"epoch"``, its own shard) from it.
        rank, world_size: This process's data-parallel shard (``None``: from an initialised
            ``torch.distributed``, else 0 and 1).
        keys: TED keys to read (``None``: all); other arrays are never touched.
        device: Where batches go (``None``: stay on the CPU).
        in_memory: ``False``: read the cache (memory maps / zarr) at every batch; ``True``: copy
            the needed columns into RAM once (packed row-wise, see ``pack``); ``"device"``: keep
            them on ``device`` and gather there (uniform indices are drawn there too);
            ``"auto"`` (default): ``True`` for a zarr dataset whose needed columns fit the memory
            budget (``$RLDS_MEMORY_BUDGET``, else a quarter of the free memory, at most 8 GiB),
            else ``False`` (see :mod:`rlds_cli.loader.sizes`); the choice is logged and kept as
            :attr:`in_memory`.
        pack: With ``in_memory``, pack float32/bool columns into one row-major array so a batch
            is one gather.
        prefetch: Batches prepared ahead by a background thread (0: none).
        pin_memory: Pin host batches before the copy to a CUDA ``device`` (``None``: when the
            device is CUDA).
        decode: Where JPEG camera frames are decoded: ``"host"`` on the CPU's threads
            (libjpeg-turbo), ``"device"`` on the CUDA ``device`` (nvJPEG through torchvision,
            see :mod:`rlds_cli.frames.device_decode`; a ``ValueError`` says why where it cannot),
            ``"auto"`` (default) on the device where it can: a CUDA ``device``, torchvision
            installed, JPEG frames, ``in_memory`` not ``"device"`` and no transform but the image
            transforms.
        transform: A callable (or a list, applied in order) on each numpy
            :class:`~rlds_cli.cache.ted.TedBatch` before conversion; objects with a
            ``bind(dataset)`` method are bound first (see :mod:`rlds_cli.loader.transforms`);
            keys the first one produces itself (its ``claim(keys, in_memory=...)``, e.g.
            ``FrameStack``'s stacked keys) are not read by the loader.
        as_tensordict: Return a ``tensordict.TensorDict`` instead of a ``TedBatch``; the
            sampler's ``weight`` and ``mask`` are then under TorchRL's keys, ``priority_weight``
            and ``("collector", "mask")`` (see :mod:`rlds_cli.loader.tensors`).
        float_dtype: Cast floating keys to this torch dtype (``None``: keep the stored dtypes),
            or ``{key: dtype}`` for some keys only (see :mod:`rlds_cli.loader.tensors`).
        epochs: Epochs per ``for batch in loader`` pass (``None``: endless). A pass ends at an
            epoch's end, so a pass resumed from a mid-epoch checkpoint yields the rest of it.
        num_batches: Batches per ``for batch in loader`` pass, whatever the epochs (``None``: use
            ``epochs``).
        refresh: For a growing dataset: follow its commits every ``refresh`` batches (``1``: every
            batch; see :class:`~rlds_cli.loader.refresh.Refresher`). ``None``: the view it was opened with.
        root: Cache root, when ``dataset`` is a name.
        windows: ``{key: offsets}``: each key becomes its values at steps ``t + offset``, with
            ``<key>_is_pad`` where that leaves the episode (LeRobot's ``delta_timestamps``; see
            :mod:`rlds_cli.loader.windows`); applied before ``transform``.
        episodes: Sample only these episodes of ``dataset`` (positions, or a list such as
            ``"0,5,9-20"``): a view made on the fly, never published
            (:func:`rlds_cli.cache.derive.select_episodes`); the batch's ``episode`` and
            indices are then the view's.
        filter_key: Sample only the episodes of this filter key of the dataset (robomimic's
            ``mask/<key>``, e.g. ``"train"``; see :mod:`rlds_cli.cache.views`), a view made
            on the fly as for ``episodes`` (not both). An unknown key is refused, naming the
            dataset's keys.
        cache: For a URL: the folder of its local cache (default ``$RLDS_REMOTE_CACHE``;
            refused with a dataset opened already, as ``cache_limit`` is: give them to
            :func:`~rlds_cli.open_dataset`).
        cache_limit: For a URL: bytes ``cache`` may hold (``"20G"``; default
            ``$RLDS_REMOTE_CACHE_LIMIT``): checked blocks evicted least recently used
            (:mod:`rlds_cli.remote.block_cache`).
        read_ahead: Batches drawn ahead whose blocks a remote dataset with a bounded cache fetches
            in the background (:mod:`rlds_cli.loader.read_ahead`; 0: none; a local dataset has
            nothing to fetch and ignores it).
        **sampler_options: Options of the named sampler (see
            :func:`~rlds_cli.loader.factory.make_sampler`), e.g. ``slice_len=32``.
    """

    def __init__(
        self,
        dataset: str | Dataset | IndexedSource,
        batch_size: int = 256,
        *,
        sampler: str | Sampler = "uniform",
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        keys: Iterable[str | tuple[str, ...]] | None = None,
        device: torch.device | str | None = None,
        in_memory: bool | str = "auto",
        pack: bool = True,
        prefetch: int = 0,
        pin_memory: bool | None = None,
        decode: str = "auto",
        transform: Transform | Sequence[Transform] | None = None,
        as_tensordict: bool = False,
        float_dtype: FloatDtype = None,
        epochs: int | None = 1,
        num_batches: int | None = None,
        refresh: int | None = None,
        root: str | os.PathLike[str] | None = None,
        windows: Mapping[str | tuple[str, ...], Offsets] | None = None,
        episodes: Sequence[int] | str | None = None,
        filter_key: str | None = None,
        cache: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        read_ahead: int = 0,
        **sampler_options: Any,
    ) -> None:
        # a Dataset has what a source of rows has too: it is asked first
        given = None if isinstance(dataset, Dataset) or not isinstance(dataset, IndexedSource) else dataset
        self.dataset: Dataset | None = None
        if given is not None:  # a source of rows, with its own keys and storage
            check_source_options(keys=keys, in_memory=in_memory, pack=pack, root=root)
            if episodes is not None or filter_key is not None:
                raise ValueError(
                    "episodes= and filter_key= select episodes of a dataset, not of a source of rows"
                )
            in_memory = False
        else:
            self.dataset = self._open(
                cast("str | Dataset", dataset), root, cache, cache_limit, episodes, filter_key
            )
        self.batch_size = positive_int("batch_size", batch_size)
        self.device = torch.device(device) if device is not None else None
        check_counts(in_memory=in_memory, prefetch=prefetch, num_batches=num_batches, epochs=epochs)
        self.keys: list[Any] | None = join_keys(keys, "Loader(keys=...)") if keys is not None else None
        self.in_memory = self._plan_memory(in_memory, refresh)
        cuda = self.device is not None and self.device.type == "cuda"
        if pin_memory and not cuda:
            raise ValueError("pin_memory=True needs a CUDA device (device='cuda')")
        self.pin_memory = cuda and pin_memory is not False and self.in_memory != "device"
        self.prefetch, self.as_tensordict = prefetch, bool(as_tensordict)
        self.float_dtype, self._dtypes = float_dtype, DtypePolicy(float_dtype)
        self.num_batches, self.epochs = num_batches, epochs
        self._pass_left: int | None = None  # inside a ``for`` pass: what it still owes
        self._resumed_pass: int | None = None  # from a restored state: the next pass's length
        self.rank, self.world_size = rank_world(rank, world_size)
        # bound first: the first transform may produce keys itself (its claim()), never read
        self.transforms = self._bind(with_windows(windows, transform, given))
        self._td = TensorDictBatches(self.device, checked=bool(self.transforms)) if as_tensordict else None
        check_loader_batch(self, given, sampler, sampler_options)  # before anything is allocated
        self._host: HostSource | None = None
        self._device_source: DeviceSource | None = None
        #: stored frame keys decoded on the device (their batches' values arrive as EncodedRows)
        self._device_decoded = self._plan_decode(decode, given)
        self._pack = pack
        self.source: IndexedSource | HostSource | DeviceSource
        self._gather: Callable[[Any], TedBatch]
        self._episodes: Episodes | None = None
        if given is not None:
            self.source, self.num_steps, self._gather = given, given.num_steps, given.gather
            self._episodes = given.episodes
        else:
            assert self.dataset is not None
            self._open_source(self.dataset)
        # the batch's index is the sampled indices, unless the source writes its own (a mixture's
        # rows say their step in their own dataset)
        self._write_index = not getattr(self.source, "owns_index", False)
        self.seed: int | None = None
        self.sampler = self._make_sampler(sampler, seed, sampler_options)
        self.read_ahead = self._plan_reads(read_ahead, refresh)
        self._refresher = None if refresh is None else Refresher(
            self.dataset, self.sampler, refresh, sampler, world_size=self.world_size,
            prefetch=self.prefetch, follow=self._follow,
        )  # fmt: skip
        self._resolve_paths()
        self._batches_per_epoch = self._epoch_length()
        # the last batch returned ended an epoch, and no pass has moved past it yet: a pass
        # started now (e.g. after a restore) finds that epoch over and yields nothing for it
        self._epoch_end_pending = False
        self._lock = threading.Lock()  # the sampler is shared with the prefetch thread
        self._prefetcher: Prefetcher | None = None
        self.batches_drawn = 0

    def _open(
        self,
        dataset: str | Dataset,
        root: str | os.PathLike[str] | None,
        cache: str | os.PathLike[str] | None,
        cache_limit: int | str | None,
        episodes: Sequence[int] | str | None,
        filter_key: str | None,
    ) -> Dataset:
        """The dataset to sample: opened by name or URL, and narrowed to ``episodes`` or
        ``filter_key`` (a view made on the fly)."""
        if not isinstance(dataset, Dataset):
            dataset = open_dataset(dataset, root, cache=cache, cache_limit=cache_limit)
        elif cache is not None or cache_limit is not None:  # silently read without them
            raise ValueError(
                f"cache= and cache_limit= apply to a URL the Loader opens; dataset {dataset.name!r} "
                "is open already: pass them to rlds_cli.open_dataset(URL, cache=..., cache_limit=...), "
                "or give the Loader the URL"
            )
        if episodes is None and filter_key is None:
            return dataset
        # imported here: the read path of a plain Loader loads no writer code (derive's views)
        from rlds_cli.cache.derive import selection

        return selection(dataset, episodes=episodes, filter_key=filter_key)

    def _plan_memory(self, in_memory: bool | str, refresh: int | None) -> bool | str:
        """``in_memory`` with ``"auto"`` decided (:func:`~rlds_cli.loader.sizes.auto_in_memory`)."""
        if in_memory != "auto":
            return in_memory
        if refresh:
            return False  # a copy in RAM would be made again at every refresh that changes
        assert self.dataset is not None
        return auto_in_memory(self.dataset, resolve_keys(self.dataset, self.keys))

    def _resolve_paths(self) -> None:
        """Per-batch dispatch decided once: the sampler's capabilities (``isinstance`` on a runtime
        Protocol costs ~20 us a call, a sixth of a prioritized sample+update) and whether batches
        take the plain path (host batches to CPU tensors, untransformed)."""
        self._epoch_done = self.sampler.epoch_done if isinstance(self.sampler, Epochal) else None
        self._prioritized = isinstance(self.sampler, Prioritized)
        self._streamable = isinstance(self.sampler, Streamable)
        self._checkpointable = isinstance(self.sampler, Checkpointable)
        self._plain = (
            self._device_source is None
            and self.device is None
            and not self.pin_memory
            and not self.transforms
            and not self._dtypes.changes_host(self._host)
        )

    def _open_source(self, dataset: Any) -> None:
        """Make the source over ``dataset`` (or its new view, after a refresh): the host source,
        and its device copy with ``in_memory="device"``; the gather function resolved once."""
        # float64 columns in RAM: cast once, when loaded, unless a transform reads them (Normalize of
        # a float64 key near 1.7e9 computes in float64; cast first, it served a 4-level staircase)
        f32 = self._dtypes.all == torch.float32 and not self.transforms
        keys = self._unclaimed(self.keys)
        host = HostSource(
            dataset, keys, in_memory=bool(self.in_memory), pack=self._pack, float32=f32,
            device_decoded=self._device_decoded,
        )  # fmt: skip
        self._host, self.source, self.num_steps = host, host, dataset.num_steps
        self._gather = host.gather_function()
        if self.in_memory == "device":
            self.source = self._device_source = DeviceSource(host, self.device or torch.device("cpu"))
            self._gather = self._device_source.gather

    def _plan_decode(self, decode: str, given: IndexedSource | None) -> frozenset[str]:
        """The stored frame keys decoded on the device (see ``decode`` in the class docs)."""
        if decode not in ("auto", "host", "device"):
            raise ValueError(f"decode must be 'auto', 'host' or 'device', not {decode!r}")
        if decode == "host" or (decode == "auto" and (self.device is None or self.device.type != "cuda")):
            return frozenset()
        if given is not None or self.dataset is None:
            if decode == "device":
                raise ValueError("decode='device' decodes a dataset's frame columns, not a source of rows")
            return frozenset()
        # transforms first: only image transforms run on device frames; claim() is not called
        # (a FrameStack's claim copies frames)
        problems: list[str | None] = [
            f"transform {t!r} reads numpy arrays on the host"
            for t in self.transforms
            if not isinstance(t, ImageTransform)
        ]
        fields = self.dataset.stored_fields
        read = resolve_keys(self.dataset, self.keys) if not problems else []
        frames = {
            k: f
            for k in sorted(stored_keys(self.dataset.manifest.fields, read))
            if (f := fields[k].frame_format)
        }
        problems += [device_decode_problem(self.device, fmt) for fmt in frames.values()]
        if not frames:
            problems.append(f"dataset {self.dataset.name!r} has no frame columns among the keys read")
        if self.in_memory == "device":
            problems.append("in_memory='device' holds the frames decoded on the device already")
        problem = next((p for p in problems if p), None)
        if problem is not None:
            if decode == "device":
                raise ValueError(f"cannot decode frames on the device: {problem}")
            return frozenset()
        return frozenset(frames)

    def _follow(self, dataset: Any, change: ViewChange) -> None:
        """Move to a new view of a growing dataset: transforms bound again, the source made over
        it, the sampler moved in place (``change`` ties the new view's rows to the old one's)."""
        for t in self.transforms:
            if isinstance(t, Bindable):
                t.bind(dataset)
        self._open_source(dataset)
        self.sampler.follow(change)  # type: ignore[attr-defined]  # checked by the Refresher
        self._batches_per_epoch = self._epoch_length()

    def _settings(self) -> dict[str, Any]:
        """What a state must be restored with (:func:`~rlds_cli.loader.run_state.check_settings`)."""
        dataset = dataset_fingerprint(self.dataset)
        members = getattr(self.source, "datasets", None) if self.dataset is None else None
        if members is not None:  # a MixtureSource: its members, in order (rows are numbered so)
            dataset = sources_fingerprint(getattr(self.source, "names", []), members)
        return {**self._sampler_settings, "batch_size": self.batch_size, "dataset": dataset}

    def _make_sampler(self, sampler: str | Sampler, seed: int | None, options: dict[str, Any]) -> Sampler:
        # options as given (reprs: JSON- and torch.save-safe, and equal when the values are)
        self._sampler_settings = {
            "sampler": sampler if isinstance(sampler, str) else type(sampler).__name__,
            **{f"sampler option {k}": repr(v) for k, v in sorted(options.items())},
        }
        self._option_defaults = option_defaults(sampler, options) if isinstance(sampler, str) else {}
        #: A sampler of the user's: its draws are checked (a -1 or a float read rows whose keys
        #: came from different steps).
        self._foreign_sampler = not isinstance(sampler, str)
        if isinstance(sampler, str):
            # one run seed for every rank (epoch shards need it); each rank's stream derives from it
            shared = sampler in ("epoch", "blocks")
            self.seed = run_seed(seed, world_size=self.world_size, shared=shared, what="Loader")
            shard = {"rank": self.rank, "world_size": self.world_size}
            if sampler == "uniform" and self._device_source is not None and not options:
                return DeviceUniformSampler(
                    self.num_steps, self.batch_size, self.seed, self._device_source.device, **shard
                )
            episodes = self._episodes if self._episodes is not None else Episodes.of(self.dataset)
            chunked = sampler == "blocks" or options.get("resident_window") is not None
            if chunked and "block_rows" not in options and self.dataset is not None:
                from rlds_cli.loader.block_shuffle import storage_block_rows

                options = {**options, "block_rows": storage_block_rows(self.dataset)}
            return make_sampler(sampler, episodes, self.batch_size, self.seed, **shard, **options)
        if options:
            raise ValueError(f"sampler options {sorted(options)} only apply to a sampler given by name")
        if not isinstance(sampler, Sampler):
            raise ValueError(f"sampler must be a name or an object with sample(), got {sampler!r}")
        self.seed = getattr(sampler, "seed", None)
        return sampler

    def _plan_reads(self, depth: int, refresh: int | None) -> int:
        """Wrap the sampler in a :class:`~rlds_cli.loader.read_ahead.ReadAhead` of ``depth``
        batches when the dataset fetches blocks from a store (a local one: nothing to do)."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"read_ahead must be a whole number of batches >= 0, got {depth!r}")
        fetch = getattr(self.dataset, "prefetch", None)
        if not depth or fetch is None or self._host is None or self.dataset is None:
            return 0
        if refresh is not None or isinstance(self.sampler, Prioritized):
            raise ValueError(
                "read_ahead= draws batches early: it cannot follow refresh= or a prioritized sampler "
                "(their draws depend on what happens after each batch)"
            )
        from rlds_cli.loader.read_ahead import ReadAhead

        keys = self._host.disk_keys
        self.sampler = ReadAhead(self.sampler, depth, lambda steps, stop: fetch(steps, keys, stop=stop))
        return depth

    def _epoch_length(self) -> int:
        """Batches in one epoch: an epoch sampler's own count, else this rank's share of the
        dataset's steps in batches."""
        if isinstance(self.sampler, Epochal):
            return max(1, int(self.sampler.batches_per_epoch))
        per_batch = int(getattr(self.sampler, "batch_size", self.batch_size))
        share = -(-self.num_steps // self.world_size)
        return max(1, -(-share // per_batch))

    @property
    def batches_per_epoch(self) -> int:
        """Batches in one epoch (see the class docstring)."""
        return self._batches_per_epoch

    def _bind(self, transform: Transform | Sequence[Transform] | None) -> list[Transform]:
        chain = (
            [] if transform is None else list(transform) if isinstance(transform, Sequence) else [transform]
        )
        changed: set[str] = set()  # keys a Normalize earlier in the chain changed
        for t in chain:
            if not callable(t):
                raise ValueError(f"transform must be callable, got {t!r}")
            rewrites = getattr(t, "rewrites_raw", None)
            mixed = sorted(k for k in changed if rewrites is not None and rewrites(k))
            if mixed:  # its raw values would sit beside normalized ones in one batch
                raise ValueError(
                    f"{type(t).__name__} after Normalize writes {mixed} anew from the cache's raw values "
                    "(a batch would mix normalized and raw ones): put Normalize after it"
                )
            changes = getattr(t, "changes", None)
            changed |= changes() if callable(changes) else set()
            if isinstance(t, Bindable):
                if self.dataset is None:
                    raise ValueError(
                        f"transform {t!r} binds to a dataset, and a source of several has none: "
                        "bind it to the dataset you mean (t.bind(ds)) and pass a plain function"
                    )
                if self.in_memory == "device" and getattr(t, "needs_host", False):
                    raise ValueError(
                        f"transform {t!r} reads the cache and cannot run with in_memory='device'"
                    )
                t.bind(self.dataset)
        return chain

    def _unclaimed(self, keys: list[str | tuple[str, ...]] | None) -> Sequence[str | tuple[str, ...]] | None:
        """``keys`` less those the first transform produces itself (its ``claim(keys,
        in_memory=...)``, e.g. :class:`~rlds_cli.loader.transforms.FrameStack`); only the first
        is asked, since later ones may read any key."""
        first = self.transforms[0] if self.transforms else None
        if not isinstance(first, Claiming) or self.in_memory == "device" or self.dataset is None:
            return keys
        wanted = resolve_keys(self.dataset, keys)
        mine = set(first.claim(wanted, in_memory=bool(self.in_memory)))
        return [k for k in wanted if k not in mine]

    def _draw(self) -> tuple[TedBatch, bool]:
        """One batch (converted) and whether it ends an epoch."""
        if self._plain:
            return self._draw_plain()
        with self._lock:
            if self._refresher is not None:
                self._refresher.tick()
            indices, extras = self._indices()
            end = self._epoch_done is not None and self._epoch_done()
        batch = self._gather(indices)
        if self._device_decoded:
            for key, value in batch.items():
                if type(value) is EncodedRows:
                    batch[key] = value.to_device(self.device)
        if self._write_index:
            batch["index"] = indices
        if self._device_source is not None:
            for key, value in extras.items():
                batch[key] = torch.as_tensor(value, device=indices.device)
        elif extras:
            batch.update(extras)
        for t in self.transforms:
            batch = t(batch)
        if self._dtypes:  # after the transforms: the keys they make (windows, returns) too
            batch = self._dtypes.cast(batch)
        return self._finish(batch, extras), end

    def _draw_plain(self) -> tuple[TedBatch, bool]:
        """:meth:`_draw` when :attr:`_plain`: the same batch, fewer Python steps (a few
        microseconds are a tenth of a ``sample()``)."""
        with self._lock:
            if self._refresher is not None:  # the view moves before the draw, never between
                self._refresher.tick()
            out = self.sampler.sample()
            end = self._epoch_done is not None and self._epoch_done()
        # identity tests against the canonical int64 dtype (``==`` converts its operand first);
        # anything else takes the general _split
        if type(out) is np.ndarray and out.dtype is _INT64:
            indices, extras = out, None
        elif type(out) is Draw and type(out.indices) is np.ndarray and out.indices.dtype is _INT64:
            indices, extras = out  # the extras are copied into the batch below, never changed
        else:
            indices, extras = self._split(out)  # (checked there)
            out = None
        if out is not None and self._foreign_sampler:
            self._check_draw(indices)
        batch = self._gather(indices)
        if self._write_index:  # else the source wrote it (a mixture: each row's step in its source)
            batch["index"] = indices
        if extras:
            batch.update(extras)
        try:  # every value a numpy array (the usual case): one from_numpy per key
            out = TedBatch(zip(batch.keys(), map(torch.from_numpy, batch.values()), strict=True))
        except TypeError:  # a tensor or a non-array: the general conversion
            out = to_torch(batch)
        return (out if self._td is None else self._td(out, extras)), end

    def _indices(self) -> tuple[Any, dict[str, np.ndarray]]:
        return self._split(self.sampler.sample())

    def _split(self, out: Any) -> tuple[Any, dict[str, np.ndarray]]:
        """Indices and extras of what the sampler's ``sample()`` returned."""
        if isinstance(out, np.ndarray) and out.dtype == np.int64 and self._device_source is None:
            if self._foreign_sampler:
                self._check_draw(out)
            return out, {}  # the common case, without conversions
        if isinstance(out, torch.Tensor):
            return out, {}
        indices, extras = split_draw(out)
        if self._foreign_sampler:
            self._check_draw(indices)
        if self._device_source is not None:
            return torch.from_numpy(indices).to(self._device_source.device), extras
        return indices, extras

    def _check_draw(self, indices: np.ndarray) -> None:
        """Refuse step indices outside ``[0, num_steps)`` from a sampler of the user's (the
        source's own count: a mixture's grows with its refreshed members)."""
        steps = getattr(self.source, "num_steps", self.num_steps)
        if indices.size and (indices.min() < 0 or indices.max() >= steps):
            raise IndexError(
                f"sampler {type(self.sampler).__name__} returned step indices from {indices.min()} to "
                f"{indices.max()}; the loader reads steps 0 to {steps - 1}"
            )

    def _finish(self, batch: TedBatch, extras: Iterable[str] = ()) -> Any:
        if self._device_source is not None and not self.transforms:
            out = batch  # tensors on the device already (the sampler's extras too): nothing to do
        else:
            out = to_torch(batch, self.device, pin_memory=self.pin_memory)
        return out if self._td is None else self._td(out, extras)

    def _prepare(self) -> Prepared:
        state = self._stream_state()
        batch, end = self._draw()
        return Prepared(state, batch, end)

    def _next(self) -> tuple[Any, bool]:
        if self.prefetch == 0:
            batch, end = self._draw_plain() if self._plain else self._draw()
        else:
            if self._prefetcher is None:
                self._prefetcher = Prefetcher(self._prepare, self.prefetch)
            item = self._prefetcher.get()
            batch, end = item.batch, item.end_of_epoch
        self.batches_drawn += 1
        if self._epoch_done is None:  # with replacement: epochs of a fixed number of batches
            end = self.batches_drawn % self._batches_per_epoch == 0
        self._epoch_end_pending = end
        return batch, end

    def sample(self) -> Any:
        """One batch: the TED keys plus ``index`` (the sampled step indices) and the sampler's
        extras (``mask`` for slices, ``weight`` for prioritized; TorchRL's names in a TensorDict)."""
        if self._plain and self.prefetch == 0:  # _next inlined: one call less in every sample()
            batch, end = self._draw_plain()
            self.batches_drawn += 1
            if self._epoch_done is None:
                end = self.batches_drawn % self._batches_per_epoch == 0
            self._epoch_end_pending = end
            return batch
        return self._next()[0]

    def __iter__(self) -> Iterator[Any]:
        """One pass: ``num_batches`` batches if set, else ``epochs`` epochs (endless if None). After
        :meth:`load_state_dict` of a state saved inside a pass, the rest of that pass."""
        resumed, self._resumed_pass = self._resumed_pass, None
        try:
            if self.num_batches is not None:
                left = self.num_batches if resumed is None else resumed
                while left > 0:
                    batch = self._next()[0]
                    left -= 1
                    self._pass_left = left  # batches the pass still owes
                    yield batch
                return
            if self.epochs is None:
                yield from self.stream()
                return
            left = self.epochs if resumed is None else resumed
            if left and self._epoch_end_pending:  # the current epoch is over: it counts, with no batch
                self._epoch_end_pending = False
                left -= 1
            while left > 0:
                batch, end = self._next()
                # epochs the pass still owes, counting this batch's (a state's epoch_end_pending
                # ends it)
                self._pass_left = left
                yield batch
                self._epoch_end_pending = False  # the loop came back for more: it is past that batch
                if end:
                    left -= 1
        finally:
            self._pass_left = None  # the pass ended, or was left (a new ``for`` starts a new one)

    def stream(self) -> Iterator[Any]:
        """An endless stream of batches (epochs follow each other), whatever ``epochs`` says."""
        while True:
            yield self._next()[0]

    def __len__(self) -> int:
        """Batches of a full pass: ``num_batches``, else ``epochs`` times :attr:`batches_per_epoch`."""
        if self.num_batches is not None:
            return self.num_batches
        if self.epochs is None:
            raise TypeError("an endless Loader (epochs=None) has no length; pass epochs= or num_batches=")
        return self.epochs * self._batches_per_epoch

    def update_priority(self, indices: Any, priority: Any, source: Any = None) -> None:
        """Forward new priorities to a prioritized sampler (safe while prefetching).

        Over a :class:`~rlds_cli.loader.MixtureSource` a batch's ``index`` is each row's step in
        its own source: pass the batch's ``source`` too (``update_priority(batch["index"], td,
        source=batch["source"])``); the rows' positions in the mixture are found from both.
        """
        if not self._prioritized:
            raise ValueError(f"the sampler {type(self.sampler).__name__} has no priorities")
        positions = getattr(self.source, "positions", None)  # a MixtureSource's index space
        if positions is not None:
            indices = positions(indices, source)
        elif source is not None:
            raise ValueError("update_priority: source= is for a loader over a MixtureSource")
        with self._lock:
            cast(Prioritized, self.sampler).update_priority(indices, priority)

    def close(self) -> None:
        """Stop the prefetch thread and the read-ahead (batches it made or drew are dropped; the
        sampler is rewound so the stream continues with the first batch never returned)."""
        if self._prefetcher is not None:
            pending = self._prefetcher.stop()
            self._prefetcher = None
            if pending:
                self._load_stream_state(pending[0].state)
        if self.read_ahead:  # rewound too; the blocks it pinned ahead are let go
            self.sampler.close()  # type: ignore[attr-defined]

    def __del__(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            prefetcher.stop()

    def _stream_state(self) -> Any:
        if self._streamable:
            return cast(Streamable, self.sampler).stream_state()
        return cast(Checkpointable, self.sampler).state_dict() if self._checkpointable else None

    def _load_stream_state(self, state: Any) -> None:
        if state is None:  # a sampler without state: nothing to rewind
            return
        if self._streamable:
            cast(Streamable, self.sampler).load_stream_state(state)
        elif self._checkpointable:
            cast(Checkpointable, self.sampler).load_state_dict(state)

    def _sampler_state(self) -> dict[str, Any]:
        if not isinstance(self.sampler, Checkpointable):
            raise TypeError(f"sampler {type(self.sampler).__name__} has no state_dict(); cannot checkpoint")
        return self.sampler.state_dict()

    @property
    def pass_left(self) -> int | None:
        """Inside a ``for batch in loader`` pass: the batches it still owes (``None`` outside one)."""
        return self._pass_left

    def finish_pass(self, left: int | None) -> None:
        """Have the next ``for`` pass give ``left`` batches, what a restored state's pass still
        owed (``None``: a whole pass)."""
        self._resumed_pass = None if left is None else int(left)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state at the first batch not yet returned: a loader restored from it
        continues the same stream (with or without prefetch)."""
        self.close()  # a prefetched batch the caller never saw must come again after a restore
        sampler = self._sampler_state()
        # every rank's progress, so that this checkpoint resumes at any world size (a collective)
        ranks = all_gather_objects(sampler, self.world_size) if isinstance(self.sampler, Elastic) else None
        return {
            **({} if ranks is None else {"ranks": ranks}),
            "sampler": sampler,
            "batches_drawn": self.batches_drawn,
            "epoch_end_pending": self._epoch_end_pending,
            **({} if self._pass_left is None else {"pass_left": self._pass_left}),
            "settings": self._settings(),
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            **view_state(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`: the stream continues exactly (refused from
        another dataset, rank or world size: :class:`~rlds_cli.errors.LoaderStateError`).

        A state that holds every rank's progress (``ranks``: saved under ``torch.distributed``,
        or made by :func:`~rlds_cli.loader.epoch.merge_states`) restores on any rank: at its
        own world size, with every rank at the same batch, each rank continues its own order;
        at another (or with ranks that stopped at different batches), an elastic sampler
        (``"epoch"``, ``"blocks"``) shares the epoch's unconsumed steps over the new ranks."""
        state = dict(check_loader_state(state, self.dataset))  # every field checked before any change
        check_settings(
            state, self._settings(), getattr(self.dataset, "name", "this source"), self._option_defaults
        )
        ranks = check_ranks_field(state)
        if self._sampler_settings.get("sampler") == "uniform":
            saved = ranks[0] if ranks else state.get("sampler")
            check_uniform_draws(saved, on_device=isinstance(self.sampler, DeviceUniformSampler))
        self.close()
        if not isinstance(self.sampler, Checkpointable):
            raise TypeError(f"sampler {type(self.sampler).__name__} has no load_state_dict(); cannot restore")
        elastic = isinstance(self.sampler, Elastic)
        shared = False
        if ranks is not None and len(ranks) == self.world_size and (in_step(ranks) or not elastic):
            self.sampler.load_state_dict(ranks[self.rank])
        elif ranks is not None and isinstance(self.sampler, Elastic):
            self.sampler.resume(ranks)  # another world size, or ranks that stopped apart
            shared = True
        else:
            check_shard(state, self.rank, self.world_size, "Loader")
            self.sampler.load_state_dict(state["sampler"])
        self.batches_drawn = int(state.get("batches_drawn", 0))
        self._epoch_end_pending = bool(state.get("epoch_end_pending", False))
        # the next ``for`` finishes the pass the state was saved in
        self.finish_pass(state.get("pass_left"))
        elastic_left = isinstance(self.sampler, Elastic) and self.sampler.unserved > 0
        if shared and elastic_left and self._epoch_done is not None and self._epoch_done():
            # steps are left, too few for a batch here (drop_last): the epoch is over with no
            # batch, and the resumed pass ends it (it served the next epoch's batches instead);
            # none left (saved after the loop that finished it): the next pass is the next epoch
            self._epoch_end_pending = True
        if state.get("seed") is not None:
            self.seed = int(state["seed"])
