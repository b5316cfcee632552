"""When a growing dataset is ready (issue 38): ``min_size`` counts the steps ``capacity`` counts
(unprotected: not the demonstrations), ``min_total`` every step; a manifest written before
``min_total`` keeps the readiness it had; bad values are one clear error; ``rlds inspect`` says
what is missing; a 50/50 mixture never serves demonstrations as its online half."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.growing import growing_settings
from rlds_cli.cache.layout import MANIFEST_FILE
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError
from tests.dataset_fixtures import rewrite_manifest, uid_episode

runner = CliRunner()


def _add(name: str, uids: list[int], length: int = 10, **settings: object) -> None:
    with rlds_cli.DatasetWriter(name, mode="append", **settings) as w:  # type: ignore[arg-type]
        for uid in uids:
            w.add_episode(uid_episode(uid, length))


def _growing(isolated_cache: Path, name: str) -> dict[str, object]:
    head = json.loads((isolated_cache / "datasets" / name / MANIFEST_FILE).read_text())
    return head["source"]["growing"]  # type: ignore[no-any-return]


def test_min_size_counts_only_unprotected_steps(isolated_cache: Path) -> None:
    _add("buf", [100, 101], protected=True, capacity=50, min_size=15)  # 20 demonstration steps
    ds = rlds_cli.open_dataset("buf")
    assert ds.num_steps == 20 and not ds.ready  # the old rule said ready: 20 >= 15
    _add("buf", [1])
    ds.refresh()
    assert ds.num_steps == 30 and not ds.ready  # 10 unprotected steps of 15
    _add("buf", [2])
    ds.refresh()
    assert ds.ready
    assert _growing(isolated_cache, "buf") == {
        "capacity": 50,
        "min_size": 15,
        "min_total": 0,
        "grace_seconds": 60.0,
    }


def test_min_total_counts_every_step(isolated_cache: Path) -> None:
    _add("tot", [100, 101], protected=True, min_total=25)
    ds = rlds_cli.open_dataset("tot")
    assert not ds.ready  # 20 of 25
    _add("tot", [1])
    ds.refresh()
    assert ds.ready  # 30 steps, 10 of them unprotected: min_size is 0
    _add("both", [100, 101], protected=True, min_size=5, min_total=25)
    _add("both", [1], length=4)
    both = rlds_cli.open_dataset("both")
    assert both.num_steps == 24 and not both.ready  # min_size met, min_total not
    _add("both", [2], length=1)
    both.refresh()
    assert both.ready


def test_an_empty_dataset_is_not_ready_whatever_its_settings() -> None:
    _add("shape", [1])
    rlds_cli.DatasetWriter("none", schema=rlds_cli.open_dataset("shape").fields).close()  # no episode
    ds = rlds_cli.open_dataset("none")
    assert ds.num_steps == 0 and not ds.ready
    _add("none", [1])
    ds.refresh()
    assert ds.ready  # min_size and min_total 0: one step is enough


def test_a_manifest_without_min_total_keeps_its_readiness(isolated_cache: Path) -> None:
    """Before min_total, min_size counted every step, protected ones included: such a manifest's
    min_size is read as its min_total, so the dataset is ready when it was."""
    _add("old", [100, 101], protected=True, min_size=15)
    path = isolated_cache / "datasets" / "old" / MANIFEST_FILE
    head = json.loads(path.read_text())
    del head["source"]["growing"]["min_total"]
    path.write_text(json.dumps(head))
    rewrite_manifest(path, signed=False)
    ds = rlds_cli.open_dataset("old")
    assert ds.ready  # 20 steps of 15, as before
    assert (ds.settings["min_size"], ds.settings["min_total"]) == (0, 15)
    assert (growing_settings(ds.head)["min_size"], ds.growth()["min_total"]) == (0, 15)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("min_size", None, "min_size must be a whole number of 0 or more, not None"),
        ("min_total", None, "min_total must be a whole number of 0 or more, not None"),
        ("episodes_per_commit", 1.5, "episodes_per_commit must be a whole number of 1 or more, not 1.5"),
        ("episodes_per_commit", True, "episodes_per_commit must be a whole number of 1 or more, not True"),
    ],
)
def test_settings_that_are_no_count_are_one_clear_line(
    isolated_cache: Path, option: str, value: object, message: str
) -> None:
    """``min_size=None`` beside a capacity was a bare TypeError; ``episodes_per_commit=1.5`` was
    taken, then every run printed a TypeError from an atexit callback."""
    with pytest.raises(ValueError, match=message):
        rlds_cli.DatasetWriter("w", capacity=10, **{option: value})  # type: ignore[arg-type]
    assert not (isolated_cache / "datasets" / "w").exists()


@pytest.mark.parametrize("value", [-1, 2.5, "10", True])
def test_a_bad_min_total_is_refused(isolated_cache: Path, value: object) -> None:
    with pytest.raises(ValueError, match="min_total must be a whole number of 0 or more"):
        rlds_cli.DatasetWriter("w", min_total=value)  # type: ignore[arg-type]
    assert not (isolated_cache / "datasets" / "w").exists()
    _add("m", [1])
    path = isolated_cache / "datasets" / "m" / MANIFEST_FILE
    head = json.loads(path.read_text())
    head["source"]["growing"]["min_total"] = value
    path.write_text(json.dumps(head))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match="its manifest's min_total must be"):
        rlds_cli.open_dataset("m")


def test_min_size_over_capacity_is_refused(isolated_cache: Path) -> None:
    """Eviction keeps the unprotected steps within capacity: such a dataset would never be ready
    (a min_total over it only warns: tests/cli/test_argument_errors.py)."""
    with pytest.raises(
        ValueError, match=r"min_size=20 is over capacity=10: .* would never be ready; min_total="
    ):
        rlds_cli.DatasetWriter("w", capacity=10, min_size=20)
    assert not (isolated_cache / "datasets" / "w").exists()


def test_inspect_says_what_readiness_needs() -> None:
    _add("i", [100], protected=True, capacity=50, min_size=20, min_total=40)
    result = runner.invoke(app, ["inspect", "i"])
    assert result.exit_code == 0, result.output
    assert "not ready (needs 20 unprotected steps, 40 steps)" in " ".join(result.output.split())
    info = json.loads(runner.invoke(app, ["inspect", "i", "--json"]).stdout)["growing"]
    assert (info["ready"], info["min_size"], info["min_total"]) == (False, 20, 40)


def test_the_online_half_of_a_mixture_is_never_demonstrations(isolated_cache: Path) -> None:
    """The issue's run, small: demonstrations in the online buffer, min_size of it; a 50/50
    fixed mixture serves offline rows only until actors wrote min_size steps."""
    pytest.importorskip("torch")
    from rlds_cli.loader.mixture import MixtureLoader

    _add("offline", [1, 2, 3])
    _add("online", [100, 101, 102, 103], protected=True, capacity=100, min_size=20)  # 40 demo steps
    mix = MixtureLoader(["offline", "online"], [0.5, 0.5], batch_size=10, seed=0, split="fixed", refresh=1)
    for _ in range(5):
        batch = mix.sample()
        assert np.bincount(batch["source"].numpy(), minlength=2).tolist() == [10, 0]
    _add("online", [7, 8])  # 20 steps an actor wrote: ready at the next batch
    batch = mix.sample()
    assert np.bincount(batch["source"].numpy(), minlength=2).tolist() == [5, 5]


def test_readiness_is_the_same_after_a_compaction() -> None:
    """A compaction merges protected and unprotected runs apart: the view's protected steps,
    and so its readiness, do not change."""
    for uid in (100, 101, 102):  # three protected segments, then online ones past the capacity
        _add("c", [uid], protected=True, capacity=30, min_size=28)
    for uid in range(5):
        _add("c", [uid])
    ds = rlds_cli.open_dataset("c")
    assert (ds.num_steps, ds.ready) == (60, True)  # 30 protected, 30 online
    rlds_cli.compact("c", grace_seconds=0)
    ds.refresh()
    assert ds.growth()["segments"] < 8 and (ds.num_steps, ds.ready) == (60, True)
    _add("c", [9], length=26)  # the newest episode alone: 26 online steps of 28
    ds.refresh()
    # eviction has begun: the buffer holds what its capacity lets whole episodes keep (ready)
    assert (ds.num_steps, ds.ready, ds.growth()["protected_episodes"]) == (56, True, 3)


def test_a_buffer_that_began_evicting_is_ready_whatever_its_min_size(isolated_cache: Path) -> None:
    """capacity=10, min_size=10 and 3-step episodes: eviction keeps 9 steps (whole episodes), so
    min_size was never reached and a mixture never sampled the buffer. Full is ready."""

    def episode() -> dict[str, np.ndarray]:
        obs = np.zeros((4, 2), np.float32)
        return {
            "observation": obs[:-1], "next/observation": obs[1:], "action": np.zeros((3, 1), np.float32),
            "next/reward": np.ones(3, np.float32), "next/terminated": np.array([False, False, True]),
            "next/truncated": np.zeros(3, bool),
        }  # fmt: skip

    seen = []
    with rlds_cli.DatasetWriter("full", mode="create", capacity=10, min_size=10, commit_interval=0) as writer:
        for _ in range(6):
            writer.add_episode(episode())
            writer.flush()
            ds = rlds_cli.open_dataset("full")
            seen.append((ds.num_steps, ds.ready))
    assert seen[:3] == [(3, False), (6, False), (9, False)]  # not full yet: min_size not reached
    assert all(ready for _, ready in seen[3:]) and all(steps <= 10 for steps, _ in seen)
