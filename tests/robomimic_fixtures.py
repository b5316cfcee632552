"""The robomimic-layout fixtures (tests/fixtures/robomimic) and the comparisons of a converted
dataset with a file: robomimic's plain h5py walk, demo by demo in its order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from rlds_cli.cache.dataset import Dataset

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "robomimic"
IMAGE = FIXTURES / "robomimic_image.hdf5"
LIBERO = FIXTURES / "libero.hdf5"
ROBOCASA = FIXTURES / "robocasa.hdf5"
ALL = (IMAGE, LIBERO, ROBOCASA)


def robomimic_demos(f: h5py.File, filter_key: str | None = None) -> list[str]:
    """The demos robomimic's ``SequenceDataset.load_demo_info`` reads, in its order."""
    if filter_key is not None:
        demos = [elem.decode("utf-8") for elem in np.array(f[f"mask/{filter_key}"][:])]
    else:
        demos = list(f["data"].keys())
    inds = np.argsort([int(elem[5:]) for elem in demos])
    return [demos[i] for i in inds]


def _datasets(group: h5py.Group) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    group.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
    return out


def differences(ds: Dataset, path: Path, filter_key: str | None = None) -> list[str]:
    """Every difference between ``ds`` and the file at ``path`` (its ``filter_key`` demos), over
    every dataset, step and demo attribute: what a demo holds against what the episode reads."""
    out: list[str] = []
    with h5py.File(path, "r") as f:
        demos = robomimic_demos(f, filter_key)
        if len(demos) != ds.num_episodes:
            return [f"{len(demos)} demos, {ds.num_episodes} episodes"]
        for i, demo in enumerate(demos):
            group = f[f"data/{demo}"]
            ep = ds.episode(i)
            meta = ds.episode_metadata(i)
            arrays = _datasets(group)
            has_next = any(k.startswith("next_obs/") for k in arrays)
            if int(ds.episodes["source_id"][i]) != int(demo[5:]):
                out.append(f"{demo}: source id {ds.episodes['source_id'][i]}")
            if bool(ds.episodes["final_known"][i]) != has_next:
                out.append(f"{demo}: final_known {ds.episodes['final_known'][i]}")
            for key, want in arrays.items():
                got: Any
                if key == "actions":
                    got = ep["action"]
                elif key == "rewards":
                    got = ep["next/reward"].reshape(want.shape)
                elif key.startswith("obs/"):
                    got = ep[f"observation/{key[4:]}"]
                elif key.startswith("next_obs/"):
                    got = ep[f"next/observation/{key[9:]}"]
                else:
                    got = ep[f"info/{key}"]
                if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
                    out.append(f"{demo}/{key}: {got.dtype}{got.shape} differs from {want.dtype}{want.shape}")
            for key in (k for k in arrays if k.startswith("obs/")):
                # the next observation inside a demo is the following step's
                nxt = ep[f"next/observation/{key[4:]}"]
                if not np.array_equal(nxt[:-1], arrays[key][1:]):
                    out.append(f"{demo}/{key}: next observation is not the following step's")
            dones = arrays["dones"]
            if bool(ep["next/terminated"][-1, 0]) != bool(dones[-1]) or ep["next/terminated"][:-1].any():
                out.append(f"{demo}: terminated flags")
            for attr, value in group.attrs.items():
                got = meta.get(f"robomimic/{attr}")
                same = got == value if isinstance(value, str) else np.array_equal(np.asarray(got), value)
                if not same:
                    out.append(f"{demo}@{attr}: {got!r} differs from {value!r}")
    return out
