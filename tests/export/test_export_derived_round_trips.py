"""Exports of recorded and derived datasets read back as they are (found by a hostile hunt): no
two keys written under one name, a merge's episode order kept, the ending of a trimmed or
downsampled episode kept, and a recording's 64-bit reset seeds in LeRobot v3.0's statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

import rlds_cli
from rlds_cli.cli.app import app
from tests.formats_fixtures import refused

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("consoles")


def ok(*args: object) -> Result:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def endings(name: str) -> list[bool]:
    ds = rlds_cli.open_dataset(name)
    return [bool(np.asarray(ds.episode(i)["next/terminated"])[-1].any()) for i in range(ds.num_episodes)]


def test_two_keys_of_one_d4rl_name_are_refused(tmp_path: Path) -> None:
    """``goal/x`` and ``info/goal_x`` are both ``infos/goal_x`` in D4RL's layout: one array held the
    other's numbers, exit 0."""
    t = 3
    obs, goal = np.zeros((t + 1, 2), np.float32), np.arange(t + 1, dtype=np.float32)[:, None]
    with rlds_cli.DatasetWriter("clash", mode="create") as writer:
        writer.add_episode({
            "observation": obs[:-1], "next/observation": obs[1:],
            "goal/x": goal[:-1], "next/goal/x": goal[1:],
            "info/goal_x": np.full((t, 1), 1000, np.float32), "action": np.zeros((t, 1), np.float32),
            "next/reward": np.ones((t, 1), np.float32), "next/terminated": np.arange(t) == t - 1,
            "next/truncated": np.zeros(t, bool),
        })  # fmt: skip
    for to, out in (("d4rl", "out.hdf5"), ("npz", "out.npz")):
        result = runner.invoke(app, ["export", "clash", str(tmp_path / out), "--to", to])
        refused(
            result,
            "'info/goal_x' and 'goal/x' are both written as 'infos/goal_x'",
            hint=True,
            published=("clash",),
        )
        assert not (tmp_path / out).exists()


def test_a_merge_exported_to_robomimic_keeps_its_episode_order(tmp_path: Path) -> None:
    """Demos were named by source id (2, 3, 0, 1 for a merge of later and earlier views) and every
    robomimic reader orders demos by number: episode i read back was not episode i."""
    ok("download", FIXTURES / "robomimic" / "robomimic_image.hdf5", "--name", "rm")
    ok("view", "rm", "--episodes", "1:", "--name", "later")
    ok("view", "rm", "--episodes", ":1", "--name", "first")
    ok("merge", "later", "first", "--name", "m")
    ok("export", "m", tmp_path / "m.hdf5", "--to", "robomimic")
    ok("download", tmp_path / "m.hdf5", "--name", "back")
    merged, back = rlds_cli.open_dataset("m"), rlds_cli.open_dataset("back")
    assert list(back.episode_index["length"]) == list(merged.episode_index["length"])
    np.testing.assert_array_equal(back[:]["action"], merged[:]["action"])


def test_the_ending_of_a_trimmed_or_downsampled_episode_is_exported(tmp_path: Path) -> None:
    """robomimic's ``dones`` and LeRobot's ``next.success`` were the source's own columns, which a
    trim or downsample leaves as they were: a truncated end read back terminated, and the reverse."""
    ok("download", FIXTURES / "robomimic" / "robomimic_image.hdf5", "--name", "rm")
    ok("trim", "rm", "--end", "2", "--name", "rmt")
    ok("downsample", "rm", "--every", "2", "--name", "rmd")
    ok("download", FIXTURES / "lerobot-v3-tiny", "--name", "lr")
    ok("downsample", "lr", "--every", "2", "--name", "lrd")
    for name, to in (("rmt", "robomimic"), ("rmd", "robomimic"), ("lrd", "lerobot")):
        out = tmp_path / f"{name}.{'hdf5' if to == 'robomimic' else 'd'}"
        ok("export", name, out, "--to", to)
        ok("download", out, "--name", f"{name}-back")
        assert endings(f"{name}-back") == endings(name), name
    assert endings("lrd") != [False] * len(endings("lrd"))  # the case that flipped: a terminated end


def test_a_recordings_random_reset_seeds_export_to_lerobot_v3(tmp_path: Path) -> None:
    """Seeds of 2**63 and more (a recording without a seed draws 64 bits) made the v3.0 episode
    index's statistics 'unexpected OverflowError'."""
    seeds = np.array([2**64 - 1, 5, 2**63], np.uint64)
    t = 2
    with rlds_cli.DatasetWriter("seeded", mode="create") as writer:
        for seed in seeds:
            writer.add_episode({
                "observation": np.zeros((t, 3), np.float32), "next/observation": np.zeros((t, 3), np.float32),
                "action": np.zeros((t, 2), np.float32), "next/reward": np.zeros(t, np.float32),
                "next/terminated": np.arange(t) == t - 1, "next/truncated": np.zeros(t, bool),
                "reset_seed": np.full(t, seed, np.uint64),
            })  # fmt: skip
    ok("export", "seeded", tmp_path / "out", "--to", "lerobot")
    ok("download", tmp_path / "out", "--name", "back")
    back = rlds_cli.open_dataset("back")[:]
    np.testing.assert_array_equal(np.asarray(back["info/reset_seed"]).ravel(), np.repeat(seeds, t))
