"""Windows on the LeRobot fixture written by lerobot 0.4.4 (``tests/fixtures/lerobot-v3-tiny``:
3 episodes of 20/25/30 frames at 10 fps), against LeRobot's ``delta_timestamps`` rule.

lerobot itself does not run here (its dataset class needs ``datasets`` and a video decoder the
test environment lacks), so the reference is its rule, stated as its code reads
(``lerobot_dataset.py``): ``delta_indices[key] = [round(t * fps) for t in delta_timestamps[key]]``;
for the frame at parquet row ``idx``, in an episode spanning rows ``[ep_start, ep_end)``,
``batch[key][j]`` is the row ``max(ep_start, min(ep_end - 1, idx + delta_indices[key][j]))`` and
``batch[f"{key}_is_pad"][j]`` is ``idx + delta < ep_start or idx + delta >= ep_end``. The
statement reads the fixture's parquet with pyarrow, never the converted cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.loader import Loader
from rlds_cli.loader.windows import lerobot_names
from rlds_cli.sources.convert import convert

pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("av")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot-v3-tiny"
DELTA_TIMESTAMPS = {
    "observation.state": [-0.1, 0.0],  # two observations, as ACT / diffusion policies ask
    "action": [i / 10 for i in range(50)],  # a chunk of 50 actions
}


def test_act_batch_matches_lerobots_rule_on_its_own_fixture(tmp_path: Path) -> None:
    src = tmp_path / "lerobot-v3-tiny"
    shutil.copytree(FIXTURE, src)
    convert(src, "lr", format="lerobot")
    ds = open_dataset("lr")
    windows = {k.replace(".", "/"): v for k, v in DELTA_TIMESTAMPS.items()}  # seconds: 10 fps recorded
    loader = Loader(ds, batch_size=64, sampler="uniform", seed=0, windows=windows,
                    keys=["observation/state", "action"])  # fmt: skip
    batch = lerobot_names(loader.sample())
    assert sorted(batch) == sorted(
        ["index", "observation.state", "observation.state_is_pad", "action", "action_is_pad"]
    )
    parquet = pq.read_table(FIXTURE / "data/chunk-000/file-000.parquet").to_pydict()
    episode = np.asarray(parquet["episode_index"])
    fps = 10
    delta = {k: [round(t * fps) for t in v] for k, v in DELTA_TIMESTAMPS.items()}
    state_dim = len(parquet["observation.state"][0])
    action_dim = len(parquet["action"][0])
    assert batch["observation.state"].shape == (64, 2, state_dim)
    assert batch["action"].shape == (64, 50, action_dim)
    assert batch["action_is_pad"].shape == (64, 50) and str(batch["action_is_pad"].dtype) == "torch.bool"
    for i, idx in enumerate(batch["index"].tolist()):
        rows = np.flatnonzero(episode == episode[idx])
        ep_start, ep_end = int(rows[0]), int(rows[-1]) + 1
        for key in DELTA_TIMESTAMPS:
            want = [parquet[key][max(ep_start, min(ep_end - 1, idx + d))] for d in delta[key]]
            pad = [idx + d < ep_start or idx + d >= ep_end for d in delta[key]]
            np.testing.assert_array_equal(batch[key][i].numpy(), np.asarray(want, np.float32), err_msg=key)
            assert batch[f"{key}_is_pad"][i].tolist() == pad, key


def test_same_batch_as_lerobots_own_dataset_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where lerobot runs (it is not a dependency; e.g. ``pip install lerobot``): every frame of
    the fixture through ``LeRobotDataset(delta_timestamps=...)`` and torch's default collate,
    against one windowed batch of all the frames in order, key for key and value for value.
    Videos are left out on both sides (``_query_videos`` answers nothing): the windows of the
    state and the actions are what is compared."""
    lerobot_dataset = pytest.importorskip("lerobot.datasets.lerobot_dataset")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    src = tmp_path / "lerobot-v3-tiny"
    shutil.copytree(FIXTURE, src)
    for p in src.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    monkeypatch.setattr(lerobot_dataset.LeRobotDataset, "_query_videos", lambda self, *a: {})
    theirs = lerobot_dataset.LeRobotDataset(
        "local/lerobot-v3-tiny", root=src, delta_timestamps=DELTA_TIMESTAMPS
    )
    convert(src, "lr", format="lerobot")
    n = open_dataset("lr").num_steps
    assert len(theirs) == n
    windows = {k.replace(".", "/"): v for k, v in DELTA_TIMESTAMPS.items()}
    ours = Loader("lr", batch_size=n, sampler="epoch", shuffle=False, seed=0, windows=windows,
                  keys=["observation/state", "action"])  # fmt: skip
    batch = lerobot_names(ours.sample())
    import torch.utils.data

    want = torch.utils.data.default_collate([theirs[i] for i in range(n)])
    keys = ["observation.state", "action", "observation.state_is_pad", "action_is_pad"]
    for key in keys:
        assert batch[key].shape == want[key].shape and batch[key].dtype == want[key].dtype, key
        assert torch.equal(batch[key], want[key]), key
    assert torch.equal(batch["index"], want["index"])


def test_windows_in_seconds_follow_a_derived_datasets_rate(tmp_path: Path) -> None:
    """A downsampled dataset's windows in seconds were converted at its source's rate (10 fps,
    not its 5: every window twice as long as asked), and a view's had no rate at all: both now
    take the card's, carried through views and divided by downsampling."""
    from rlds_cli.cache.card import dataset_fps
    from rlds_cli.cache.compose import downsample_dataset
    from rlds_cli.cache.derive import create_view

    src = tmp_path / "lerobot-v3-tiny"
    shutil.copytree(FIXTURE, src)
    convert(src, "lr", format="lerobot")
    downsample_dataset("lr", "lr2", every=2)
    create_view("lr", "lrv", (0, 2))
    assert [dataset_fps(open_dataset(n)) for n in ("lr", "lr2", "lrv")] == [10.0, 5.0, 10.0]
    for name, steps in (("lr2", 1), ("lrv", 2)):  # 0.2 s: 1 step at 5 fps, 2 at 10
        ds = open_dataset(name)
        index = ds.episode_index
        ends = index["start"] + index["length"]
        action = ds.column("action")[:]
        batch = Loader(ds, batch_size=16, seed=0, windows={"action": [0.0, 0.2]}, keys=["action"]).sample()
        for i, idx in enumerate(batch["index"].tolist()):
            end = int(ends[np.searchsorted(index["start"], idx, side="right") - 1])
            want = action[min(idx + steps, end - 1)]
            np.testing.assert_array_equal(batch["action"][i, 1].numpy(), want, err_msg=name)


def test_a_merge_of_different_rates_has_none(tmp_path: Path) -> None:
    """A merge of a 10 fps dataset and its 5 fps downsample exported at 10 fps (the source's,
    which downsample kept in the source metadata), as did windows in seconds: it has no rate, so
    windows need fps= and the LeRobot export is refused in one line."""
    from rlds_cli.cache.card import dataset_fps
    from rlds_cli.cache.compose import downsample_dataset, merge_datasets
    from rlds_cli.errors import ExportError
    from rlds_cli.export import export_dataset

    src = tmp_path / "lerobot-v3-tiny"
    shutil.copytree(FIXTURE, src)
    convert(src, "lr", format="lerobot")
    downsample_dataset("lr", "lr2", every=2)
    merge_datasets(["lr", "lr2"], "mixed")
    downsample_dataset("lr", "lr2b", every=2)
    merge_datasets(["lr2", "lr2b"], "same")
    mixed = open_dataset("mixed")
    assert dataset_fps(mixed) is None and dataset_fps(open_dataset("same")) == 5.0
    with pytest.raises(ValueError, match="no frame rate"):
        Loader(mixed, batch_size=4, windows={"action": [0.0, 0.1]}, keys=["action"])
    Loader(mixed, batch_size=4, windows={"action": [0, 1]}, keys=["action"]).sample()  # steps: fine
    with pytest.raises(ExportError, match="mixed's episodes have no one frame rate"):
        export_dataset(mixed, tmp_path / "out", "lerobot")
    downsample_dataset("mixed", "mixed2", every=2)
    assert dataset_fps(open_dataset("mixed2")) is None
    merge_datasets(["mixed", "mixed2"], "merged_twice")  # both parents without a rate: still none
    assert dataset_fps(open_dataset("merged_twice")) is None
