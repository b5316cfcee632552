"""Device-resident data: the packed dataset as one tensor on the device, indices drawn there.

For datasets that fit in device memory, every batch is an on-device ``index_select``: no host
work and no host-to-device copy per batch. Layout: :class:`~rlds_cli.loader.sources.HostSource`'s
packed mode (a strided window spanning rows ``r`` and ``r + 1``); other dtypes get one tensor
each. Works on any torch device.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.run_state import check_shard_fields, check_state, rank_world, run_seed, stream_seed
from rlds_cli.loader.samplers import load_shard_state, shard_state
from rlds_cli.loader.sources import HostSource


class DeviceSource:
    """Gathers TED keys on ``device`` from tensors that live there.

    Args:
        host: A packed in-memory :class:`HostSource`: its :attr:`~HostSource.layout` is copied
            to the device (then dropped).
        device: The device.
    """

    def __init__(self, host: HostSource, device: torch.device) -> None:
        layout = host.layout
        self.device = device
        self.keys = list(layout.keys)
        self.dataset = host.dataset
        self._layout = dict(layout.offsets)
        self._dtypes = {k: spec.dtype for k, spec in layout.fields.items()}
        self._storage = {k: spec.storage for k, spec in layout.fields.items()}
        self._shapes = {k: spec.shape for k, spec in layout.fields.items()}
        self._packed = torch.from_numpy(layout.rows).to(device) if layout.rows is not None else None
        self._window = None
        if self._packed is not None:
            rows, width = self._packed.shape
            self._window = torch.as_strided(self._packed, (rows - 1, 2 * width), (width, 1))
        #: Columns held as their signed twin (torch has no index_select for uint32 or uint64): each
        #: key's own torch dtype, which a gathered row is viewed as again (the same bits).
        self._unsigned = {
            k: getattr(torch, v.dtype.name) for k, v in layout.columns.items() if v.dtype in _SIGNED_TWIN
        }
        self._columns = {
            k: torch.from_numpy(np.ascontiguousarray(v).view(_SIGNED_TWIN.get(v.dtype, v.dtype))).to(device)
            for k, v in layout.columns.items()
        }
        self._flags = torch.from_numpy(layout.flags).to(device) if layout.flags is not None else None
        self._flag_plan = list(layout.flag_plan)
        table = layout.episode_of_step
        self._episode = torch.from_numpy(table.astype(np.int64)).to(device) if table is not None else None
        self._wants_next = any(k.startswith("next/") and k[5:] in self._layout for k in self.keys)
        self._widths, self._pieces = self._plan_pieces()

    def _plan_pieces(self) -> tuple[list[int], dict[str, tuple[int, tuple[int, ...], bool]]]:
        """Column widths that cut a gathered block into one piece per key (and the gaps), and per
        key ``(piece, shape, is_bool)``: one ``torch.split`` per batch instead of a slice per key."""
        if self._packed is None:
            return [], {}
        width = self._packed.shape[1]
        entries = []
        for key, (offset, w, storage) in self._layout.items():
            shape, is_bool = tuple(self._shapes[key]), self._dtypes[key] == "bool"
            entries.append((offset, w, key, shape, is_bool))
            if storage == "flat" and self._wants_next:
                entries.append((width + offset, w, f"next/{key}", shape, is_bool))
        widths: list[int] = []
        pieces: dict[str, tuple[int, tuple[int, ...], bool]] = {}
        end = 0
        for start, w, name, shape, is_bool in sorted(entries):
            if start > end:
                widths.append(start - end)  # columns no key reads (e.g. the flags' bytes)
            pieces[name] = (len(widths), shape, is_bool)
            widths.append(w)
            end = start + w
        total = 2 * width if self._wants_next else width
        if total > end:
            widths.append(total - end)
        return widths, pieces

    def gather(self, idx: torch.Tensor) -> TedBatch:
        """The configured keys at ``idx`` (an int64 tensor on the device, any shape)."""
        out = TedBatch()
        lead = tuple(idx.shape)
        flat_idx = idx.reshape(-1)
        episode = self._episode.index_select(0, flat_idx) if self._episode is not None else None
        rows = flat_idx + episode if episode is not None else flat_idx
        flat = len(lead) == 1
        values: dict[str, torch.Tensor] = {}
        if self._pieces:
            source = self._window if self._wants_next else self._packed
            block = cast(torch.Tensor, source).index_select(0, rows)  # pieces exist only with a packed block
            views = torch.split(block, self._widths, 1)
            for name, (i, shape, is_bool) in self._pieces.items():
                value = views[i] if flat and len(shape) == 1 else views[i].reshape(*lead, *shape)
                values[name] = value > 0.5 if is_bool else value
        if self._flags is not None:
            flags = self._flags.index_select(0, flat_idx)
            for name, start, w, shape in self._flag_plan:
                value = flags[:, start : start + w]
                values[name] = value if flat and len(shape) == 1 else value.reshape(*lead, *shape)
        for key in self.keys:
            if key in values:
                out[key] = values[key]
            elif key == "episode":
                out[key] = cast(torch.Tensor, episode).reshape(lead)  # gathered when "episode" is a key
            elif key == "next/done":
                out[key] = self._value("next/terminated", values, flat_idx, rows, lead) | self._value(
                    "next/truncated", values, flat_idx, rows, lead
                )
            else:
                out[key] = self._value(key, values, flat_idx, rows, lead)
        return out

    def _value(
        self, key: str, values: dict[str, torch.Tensor], idx: torch.Tensor, rows: Any, lead: tuple[int, ...]
    ) -> torch.Tensor:
        if key in values:
            return values[key]
        if key.startswith("next/") and key[5:] in self._columns and self._storage.get(key[5:]) == "flat":
            stored, at = key[5:], rows + 1
        else:
            stored = key
            at = rows if self._storage[key] == "flat" else idx
        column = self._columns[stored]
        value = column.index_select(0, at).reshape(*lead, *column.shape[1:])
        unsigned = self._unsigned.get(stored)
        return value if unsigned is None else value.view(unsigned)


#: Unsigned dtypes torch cannot gather, held as the signed dtype of their size.
_SIGNED_TWIN = {np.dtype(np.uint32): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.int64)}


class DeviceUniformSampler:
    """Uniform indices drawn on the device by a seeded ``torch.Generator`` living there.

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per batch.
        seed: The run seed (``None``: ``$RLDS_SEED`` or a fresh one, logged).
        device: Where the generator (and the indices) live.
        rank, world_size: This process's rank: each rank draws its own stream from the seed.
    """

    def __init__(
        self,
        num_steps: int,
        batch_size: int,
        seed: int | None,
        device: torch.device,
        *,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.num_steps, self.batch_size, self.device = int(num_steps), int(batch_size), device
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, what="DeviceUniformSampler")
        self._gen = torch.Generator(device=device)
        self._gen.manual_seed(stream_seed(self.seed, self.rank, self.world_size))

    def follow(self, change: Any) -> None:
        """Draw from a refreshed view of a growing dataset (its size; the generator goes on)."""
        self.num_steps = int(change.num_steps)

    def sample(self) -> torch.Tensor:
        """``batch_size`` indices, an int64 tensor on the device."""
        return torch.randint(
            0, self.num_steps, (self.batch_size,), generator=self._gen, device=self.device, dtype=torch.int64
        )

    def stream_state(self) -> dict[str, Any]:
        """Only the generator's state: what a prefetching loader records per batch."""
        return {"torch_generator": self._gen.get_state()}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Rewind the generator to a :meth:`stream_state`."""
        self._gen.set_state(state["torch_generator"])

    def state_dict(self) -> dict[str, Any]:
        """The generator's state (a CPU byte tensor)."""
        return {"torch_generator": self._gen.get_state(), **shard_state(self, self.num_steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another dataset, rank or world
        size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        what = "DeviceUniformSampler"
        check_shard_fields(check_state(state, what), what)
        if "torch_generator" not in state:
            raise LoaderStateError(f"{what} state has no field 'torch_generator'")
        try:  # on a scratch generator: a refused state leaves this one unchanged
            torch.Generator(device=self.device).set_state(state["torch_generator"])
        except (TypeError, RuntimeError, ValueError) as exc:
            raise LoaderStateError(
                f"{what} state field 'torch_generator' is no generator state ({exc})"
            ) from None
        load_shard_state(self, state, self.num_steps)
        self._gen.set_state(state["torch_generator"])
