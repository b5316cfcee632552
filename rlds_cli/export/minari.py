"""Export to a Minari HDF5 dataset directory (``<out>/data/main_data.hdf5`` + ``metadata.json``).

Each episode becomes an ``episode_{i}`` group: ``observations`` with T+1 rows (the episode's
observations and its final one), ``actions``, ``rewards``, ``terminations`` and ``truncations``
with T rows, and an ``infos`` group (``info/<k>`` keys). Nested observation keys
(``observation/<k>``) become a Dict space. Spaces are serialised with Minari's own serializer,
so ``minari`` (and gymnasium) must be installed. Load the result with
``MINARI_DATASETS_PATH=<out's parent> minari.load_dataset("<out's name>")``, or convert it back
with ``rlds download <out>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import ExportError, MissingExtraError
from rlds_cli.export._common import atomic_target, flat_keys, step_keys

_ID = re.compile(r"^[A-Za-z0-9_.-]+-v\d+$")


def _space(gym: Any, shape: tuple[int, ...], dtype: np.dtype, values: Any = None) -> Any:
    if dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, shape, dtype)
    if dtype.kind in "iu" and shape == () and values is not None:
        return gym.spaces.Discrete(int(np.max(values)) + 1)
    if dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else np.iinfo(np.uint8)
        return gym.spaces.Box(info.min, info.max, shape, dtype if dtype.kind != "b" else np.uint8)
    raise ExportError(f"dtype {dtype} has no Minari space")


def _observation_space(gym: Any, dataset: Dataset) -> Any:
    flats = [k for k in flat_keys(dataset) if k == "observation" or k.startswith("observation/")]
    specs = dataset.stored_fields
    if flats == ["observation"]:
        return _space(gym, specs["observation"].shape, np.dtype(specs["observation"].dtype))
    tree: dict[str, Any] = {}
    for key in flats:
        *parents, leaf = key.split("/")[1:]
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _space(gym, specs[key].shape, np.dtype(specs[key].dtype))

    def build(node: dict[str, Any]) -> Any:
        return gym.spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(tree)


def export_minari(
    dataset: Dataset,
    out: Path,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    dataset_id: str | None = None,
) -> Path:
    """Write ``dataset`` as a Minari HDF5 dataset directory at ``out``."""
    try:
        import gymnasium as gym
        import minari
        from minari.serialization import serialize_space
    except ImportError:
        raise MissingExtraError(
            "exporting to Minari needs minari and gymnasium, which are not installed",
            hint="pip install 'minari[hdf5]' gymnasium",
        ) from None
    import h5py

    dataset_id = dataset_id or (out.name if _ID.match(out.name) else None)
    if dataset_id is None:
        raise ExportError(
            f"{out.name!r} is not a Minari dataset id (NAME-vN)",
            hint="name the output directory like 'my-dataset-v0'; Minari loads it by that name",
        )
    observation_keys = [k for k in flat_keys(dataset) if k == "observation" or k.startswith("observation/")]
    info_keys = [k for k in [*flat_keys(dataset), *step_keys(dataset)] if k.startswith("info/")]
    actions = np.asarray(dataset.column("action"))
    with atomic_target(out, overwrite=overwrite) as tmp:
        data_dir = tmp / "data"
        data_dir.mkdir(parents=True)
        with h5py.File(data_dir / "main_data.hdf5", "w") as f:
            for i in range(dataset.num_episodes):
                ep = dataset.episode(i)
                length = len(ep["action"])
                group = f.create_group(f"episode_{i}")
                group.attrs["id"] = i
                group.attrs["total_steps"] = length
                for key in observation_keys:
                    rows = np.concatenate([ep[key], ep[f"next/{key}"][-1:]])
                    name = "observations" if key == "observation" else "observations/" + key.split("/", 1)[1]
                    group.create_dataset(name, data=rows)
                group.create_dataset("actions", data=ep["action"])
                group.create_dataset("rewards", data=ep["next/reward"].reshape(length))
                group.create_dataset("terminations", data=ep["next/terminated"].reshape(length))
                group.create_dataset("truncations", data=ep["next/truncated"].reshape(length))
                infos = group.create_group("infos")
                for key in info_keys:
                    value = ep[key]
                    if f"next/{key}" in ep:  # T+1 infos: the reset info plus one per step
                        value = np.concatenate([value, ep[f"next/{key}"][-1:]])
                    infos.create_dataset(key.split("/", 1)[1], data=value)
                if progress:
                    progress(length)
        spec = dataset.stored_fields["action"]
        metadata = {
            "dataset_id": dataset_id,
            "total_episodes": dataset.num_episodes,
            "total_steps": dataset.num_steps,
            "data_format": "hdf5",
            "observation_space": serialize_space(_observation_space(gym, dataset)),
            "action_space": serialize_space(_space(gym, spec.shape, np.dtype(spec.dtype), actions)),
            "algorithm_name": "exported by rlds-cli",
            "author": ["rlds-cli export"],
            "author_email": ["none@example.invalid"],
            "code_permalink": "https://pypi.org/project/rlds-cli/",
            "description": f"rlds dataset {dataset.name!r} exported to Minari",
            # Minari checks this against the versions it can read: name the installed one
            "minari_version": str(minari.__version__),
        }
        (data_dir / "metadata.json").write_text(json.dumps(metadata))
    return out
