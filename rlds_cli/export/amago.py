"""Export a cached dataset as an AMAGO trajectory folder (one ``.npz`` per episode).

The layout is the one :mod:`rlds_cli.formats.amago` reads (AMAGO's ``FrozenTraj``), so an
export converts back to the same steps. For an episode of ``T`` steps (``L = T + 1``
timesteps): ``_OBS_KEY_<name>`` (``L`` rows: the ``T`` observations and the final one; a single
``observation`` key is ``_OBS_KEY_observation``, ``observation/<name>`` keys are
``_OBS_KEY_<name>``), ``actions`` (``T`` rows), ``rews`` (``T`` rows, float32 columns),
``dones`` (``T`` rows, bool: ``next/terminated``), ``time_idxs`` (``L`` rows, int64: the stored
``time_idx`` when there is one, else ``0 .. T``) and ``rl2s`` (``L`` rows, float32: zeros at
timestep 0, then the previous step's reward and flattened action, as
:class:`~rlds_cli.loader.windows.PrevActionReward` builds them at sample time).
Files are named ``<dataset>_<episode:08d>_0.npz`` under ``buffer/fifo`` (AMAGO reads any name;
the reader sorts paths, so the episode order is kept).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import ExportError
from rlds_cli.export import atomic_target, flat_keys, refuse_unwritten


def _obs_names(dataset: Dataset) -> dict[str, str]:
    """TED observation key -> AMAGO ``_OBS_KEY_`` array name."""
    keys = [k for k in flat_keys(dataset) if k == "observation" or k.startswith("observation/")]
    if not keys:
        raise ExportError(
            f"dataset {dataset.name!r} has no observation key to export to AMAGO",
            hint="AMAGO trajectories need 'observation' or 'observation/<name>' keys",
        )
    return {
        k: "_OBS_KEY_" + ("observation" if k == "observation" else k[len("observation/") :]) for k in keys
    }


def export_amago(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``dataset`` as an AMAGO trajectory folder at ``out`` (see the module docstring)."""
    names = _obs_names(dataset)
    # info/* keys have no place in a FrozenTraj and are left out (docs/formats.md); any other is refused
    refuse_unwritten(
        dataset, "an AMAGO trajectory", lambda k: k in names or k == "time_idx" or k.startswith("info/")
    )
    has_time = "time_idx" in dataset.stored_fields
    flat = [*names, *(["time_idx"] if has_time else [])]
    keys = [*flat, *(f"next/{k}" for k in flat), "action", "next/reward", "next/terminated"]
    with atomic_target(Path(out), overwrite=overwrite, folder="buffer/fifo") as tmp:
        fifo = tmp / "buffer" / "fifo"
        fifo.mkdir(parents=True)
        for i in range(dataset.num_episodes):
            ep = dataset.episode(i, keys)
            t = len(ep["action"])
            arrays: dict[str, np.ndarray] = {}
            for key, name in names.items():
                arrays[name] = np.concatenate([ep[key], ep[f"next/{key}"][-1:]])
            rews = np.asarray(ep["next/reward"], np.float32).reshape(t, -1)
            actions = np.asarray(ep["action"])
            prev = np.concatenate([rews, actions.reshape(t, -1).astype(np.float32)], axis=1)
            rl2s = np.concatenate([np.zeros((1, prev.shape[1]), np.float32), prev])
            if has_time:
                time = np.concatenate([ep["time_idx"], ep["next/time_idx"][-1:]]).astype(np.int64)
            else:
                time = np.arange(t + 1, dtype=np.int64)[:, None]
            dones = np.asarray(ep["next/terminated"], bool).reshape(t, 1)
            arrays.update(actions=actions, rews=rews, dones=dones, time_idxs=time, rl2s=rl2s)
            np.savez(fifo / f"{dataset.name.replace('/', '--')}_{i:08d}_0.npz", **arrays)  # type: ignore[arg-type]
            if progress:
                progress(t)
    return Path(out)
