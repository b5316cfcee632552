"""Our reading of each robomimic-layout fixture against robomimic's own ``SequenceDataset``
(robomimic 0.3.0, installed with ``--no-deps`` by ``make install-test``): the demos and their
order, every key and step of its in-memory cache (float32 where it casts), and every item it
serves (as stored). Skipped where robomimic is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.cache.compose import merge_datasets
from rlds_cli.cache.derive import create_selection, filter_key_episodes, filtered_dataset
from rlds_cli.export import export_dataset
from rlds_cli.sources.convert import convert
from tests.robomimic_fixtures import ALL, IMAGE

pytest.importorskip("robomimic", reason="robomimic is not installed (make install-test installs 0.3.0)")
import robomimic.utils.obs_utils as ObsUtils
from robomimic.utils.dataset import SequenceDataset

DATASET_KEYS = ("actions", "rewards", "dones", "states")


def _sequence_dataset(path: Path, filter_key: str | None) -> tuple[Any, list[str], bool]:
    with h5py.File(path, "r") as f:
        demo = next(iter(f["data"].values()))
        obs_keys = sorted(demo["obs"])
        has_next = "next_obs" in demo
        rgb = [k for k in obs_keys if demo[f"obs/{k}"].ndim == 4]
    specs = {"obs": {"low_dim": [k for k in obs_keys if k not in rgb], "rgb": rgb}}
    ObsUtils.initialize_obs_utils_with_obs_specs(obs_modality_specs=specs)
    seq = SequenceDataset(
        hdf5_path=str(path),
        obs_keys=obs_keys,
        dataset_keys=DATASET_KEYS,
        load_next_obs=has_next,
        hdf5_cache_mode=None,
        filter_by_attribute=filter_key,
    )
    return seq, obs_keys, has_next


def _diffs(path: Path, ds: Any, filter_key: str | None, demos: list[str] | None = None) -> list[str]:
    """Every difference between ``ds`` and what SequenceDataset reads of ``path`` (its demos named
    ``demos``; by default ``demo_<source id>`` of each episode)."""
    seq, obs_keys, has_next = _sequence_dataset(path, filter_key)
    out: list[str] = []
    ours = demos if demos is not None else [f"demo_{i}" for i in ds.episodes["source_id"]]
    if seq.demos != ours:
        return [f"demos {seq.demos} != {ours}"]
    cache = seq.load_dataset_in_memory(seq.demos, seq.hdf5_file, obs_keys, DATASET_KEYS, has_next)
    names = {"actions": "action", "rewards": "next/reward", "dones": "info/dones", "states": "info/states"}
    for i, demo in enumerate(seq.demos):
        ep = ds.episode(i)
        if cache[demo]["attrs"]["num_samples"] != len(ep["action"]):
            out.append(f"{demo}: num_samples")
        if cache[demo]["attrs"].get("model_file") != ds.episode_metadata(i)["robomimic/model_file"]:
            out.append(f"{demo}: model_file")
        for part, prefix in (("obs", "observation"), ("next_obs", "next/observation")):
            for k, want in cache[demo].get(part, {}).items():
                got = ep[f"{prefix}/{k}"]
                if got.dtype != want.dtype or not np.array_equal(got, want):
                    out.append(f"{demo}/{part}/{k}")
        for key, ted in names.items():  # SequenceDataset casts these to float32
            want = cache[demo][key]
            if not np.array_equal(np.asarray(ep[ted], np.float32).reshape(want.shape), want):
                out.append(f"{demo}/{key}")
    # every item it serves (one step each, read from the file as stored): the same step of ours
    rows = ds[:]
    for index in range(len(seq)):
        item = seq[index]
        served = [(key, item[key], names[key]) for key in DATASET_KEYS]
        served += [(f"obs/{k}", item["obs"][k], f"observation/{k}") for k in obs_keys]
        if has_next:
            served += [(f"next_obs/{k}", item["next_obs"][k], f"next/observation/{k}") for k in obs_keys]
        for key, want, ted in served:
            got = np.asarray(rows[ted][index]).reshape(want.shape)
            if got.dtype != want.dtype or not np.array_equal(got, want):
                out.append(f"item {index}: {key}")
    return out


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_sequence_dataset_reads_what_we_read(path: Path) -> None:
    convert(path, "rm")
    assert _diffs(path, open_dataset("rm"), None) == []


@pytest.mark.parametrize("key", ["train", "valid"])
def test_a_filter_key_selects_what_sequence_dataset_selects(key: str) -> None:
    convert(IMAGE, "img")
    assert _diffs(IMAGE, filtered_dataset(open_dataset("img"), key), key) == []


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_sequence_dataset_loads_our_export(path: Path, tmp_path: Path) -> None:
    convert(path, "rm")
    ds = open_dataset("rm")
    out = export_dataset(ds, tmp_path / "exported.hdf5", "robomimic")
    assert _diffs(out, ds, None) == []
    if path == IMAGE:
        assert _diffs(out, filtered_dataset(ds, "valid"), "valid") == []


def test_sequence_dataset_loads_the_export_of_a_merge(tmp_path: Path) -> None:
    """A merge's demos are renamed by position (their source ids repeat); the filter keys follow."""
    convert(IMAGE, "a")
    convert(IMAGE, "b")
    merge_datasets(["a", "b"], "m")
    merged = open_dataset("m")
    out = export_dataset(merged, tmp_path / "merged.hdf5", "robomimic")
    count = len(open_dataset("a").episodes)
    assert _diffs(out, merged, None, [f"demo_{i}" for i in range(2 * count)]) == []
    with h5py.File(IMAGE, "r") as f:
        order = sorted(f["data"], key=lambda demo: int(demo.split("_")[1]))
        valid = sorted(order.index(demo.decode()) for demo in f["mask/valid"][:])
    positions = valid + [count + p for p in valid]
    create_selection("m", "m-valid", filter_key_episodes(merged, "valid"))
    view = open_dataset("m-valid")
    assert _diffs(out, view, "valid", [f"demo_{p}" for p in positions]) == []
