"""DatasetWriter: create, append, read back exactly, refresh, eviction, readiness (issue 25)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import rlds_cli
from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.errors import CommitFailedError, DatasetExistsError, SchemaMismatchError
from rlds_cli.inspection.validate import check_dataset
from tests.dataset_fixtures import make_dataset


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8) if a.dtype.kind == "f" else a


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert np.array_equal(_bits(np.asarray(a[key])), _bits(np.asarray(b[key]))), key


def episode(
    length: int, start: float = 0.0, *, uid: int = 0, terminated: bool = True
) -> dict[str, np.ndarray]:
    """A hand-made episode: observation t = [start + t, -(start + t)], final one included."""
    obs = (start + np.arange(length + 1, dtype=np.float32))[:, None] * np.array([1, -1], np.float32)
    flags = np.zeros((length, 1), bool)
    flags[-1] = True
    return {
        "observation": obs[:-1],
        "next/observation": obs[1:],
        "action": np.full((length, 2), start, np.float32),
        "next/reward": np.ones((length, 1), np.float32),
        "next/terminated": flags if terminated else np.zeros_like(flags),
        "next/truncated": np.zeros_like(flags) if terminated else flags,
        "info/episode_uid": np.full(length, uid, np.int64),
    }


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_copy_every_episode_round_trips_exactly(isolated_cache: Path, backend: str) -> None:
    make_dataset("src", [3, 5, 1, 7, 4], backend=backend)
    src = rlds_cli.open_dataset("src")
    with rlds_cli.DatasetWriter("copy", storage=backend) as w:
        for i in range(src.num_episodes):
            w.add_episode(src.episode(i))
    copy = rlds_cli.open_dataset("copy")
    assert isinstance(copy, GrowingDataset)
    assert (copy.num_steps, copy.num_episodes) == (src.num_steps, src.num_episodes)
    for i in range(src.num_episodes):
        assert_identical(src.episode(i), copy.episode(i))
    idx = np.random.default_rng(0).integers(0, src.num_steps, (7, 9))
    assert_identical(src.gather(idx), copy.gather(idx))
    assert_identical(src[:], copy[:])
    assert copy.check_files() == []


def test_torch_tensordict_and_nested_keys(isolated_cache: Path) -> None:
    from tensordict import TensorDict

    ep = episode(4, 1.0)
    nested = {
        "observation": torch.from_numpy(ep["observation"]),
        "action": torch.from_numpy(ep["action"]),
        "info": {"episode_uid": ep["info/episode_uid"]},
        "next": {
            "observation": ep["next/observation"],
            "reward": ep["next/reward"],
            "terminated": ep["next/terminated"],
            "truncated": ep["next/truncated"],
        },
    }
    td = TensorDict(
        {
            ("next", "reward"): torch.from_numpy(ep["next/reward"]),
            **{k: torch.from_numpy(v) for k, v in ep.items() if k != "next/reward"},
        },
        batch_size=[4],
    )
    with rlds_cli.DatasetWriter("g") as w:
        w.add_episode(ep)
        w.add_episode(nested)
        w.add_episode(td)
    ds = rlds_cli.open_dataset("g")
    assert ds.num_episodes == 3
    for i in range(3):
        got = ds.episode(i)
        for key, value in ep.items():
            assert np.array_equal(got[key].reshape(value.shape), value), (i, key)


def test_add_step_and_extend(isolated_cache: Path) -> None:
    ep = episode(5, 2.0, terminated=False)
    with rlds_cli.DatasetWriter("s") as w:
        for t in range(5):
            w.add_step(
                observation=ep["observation"][t],
                action=ep["action"][t],
                reward=1.0,
                terminated=False,
                truncated=bool(t == 4),
                next_observation=ep["next/observation"][t],
                info={"episode_uid": np.int64(0)},
            )
        # two episodes and a half in one batch, the rest in the next (TorchRL's root flags ignored)
        a, b, c = episode(3, 10.0, uid=1), episode(2, 20.0, uid=2), episode(4, 30.0, uid=3)
        run = {k: np.concatenate([a[k], b[k], c[k]]) for k in a}
        run["done"] = np.zeros((9, 1), bool)
        assert w.extend({k: v[:7] for k, v in run.items()}) == 2
        assert w.extend({k: v[7:] for k, v in run.items()}) == 1
    ds = rlds_cli.open_dataset("s")
    assert ds.num_episodes == 4 and list(ds.episodes["length"]) == [5, 3, 2, 4]
    assert np.array_equal(ds.episode(0)["observation"], ep["observation"])
    assert ds.episode(0)["next/truncated"][-1, 0] and ds.episode(0)["next/reward"].dtype == np.float32
    assert np.array_equal(ds.episode(3)["next/observation"], c["next/observation"])
    from typer.testing import CliRunner

    from rlds_cli.cli.app import app

    shown = CliRunner().invoke(app, ["inspect", "s", "--no-stats"]).stdout
    line = next(row for row in shown.splitlines() if row.startswith("source"))
    assert line.startswith("source  rlds-writer: written on ") and "by rlds-cli" in line  # was empty


@pytest.mark.parametrize("per_commit", [1, 3])
def test_a_buffered_episode_does_not_change_with_the_callers_arrays(
    isolated_cache: Path, per_commit: int
) -> None:
    """An actor that reuses one set of arrays for every episode: what was added is what is
    committed, also when it waits in the writer for a later commit (a copy is kept then; seven
    episodes, three commits)."""
    buf = episode(4, 1.0, uid=1)
    uids = range(1, 8)
    with rlds_cli.DatasetWriter("reuse", episodes_per_commit=per_commit) as w:
        for uid in uids:
            fresh = episode(4, float(uid), uid=uid)
            for key, value in fresh.items():
                buf[key][...] = value  # refilled in place, as a recorder with fixed buffers does
            w.add_episode(buf)
    ds = rlds_cli.open_dataset("reuse")
    assert ds.num_episodes == len(uids) and check_dataset(ds).ok
    for i, uid in enumerate(uids):
        want, got = episode(4, float(uid), uid=uid), ds.episode(i)
        assert_identical(want, {key: got[key] for key in want})


def test_a_failed_commit_leaves_the_next_commits_copies_intact(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that fails (here: its segment cannot be written) drops its episodes, and the
    writer's next call says so; the episodes added after it, from the caller's refilled buffer,
    are committed exactly."""
    from rlds_cli.write import segments

    buf = episode(4, 0.0, uid=0)
    real = segments.commit_segment
    calls = {"n": 0}

    def flaky(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk unplugged")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(segments, "commit_segment", flaky)
    with rlds_cli.DatasetWriter("flaky", episodes_per_commit=2) as w:
        for uid in range(1, 7):
            for key, value in episode(4, float(uid), uid=uid).items():
                buf[key][...] = value
            w.add_episode(buf)
            if uid == 4:  # the second commit, on the commit thread
                told = r"2 episode\(s\) \(8 steps\) failed.*disk unplugged"
                with pytest.raises(CommitFailedError, match=told):
                    w.flush()
            elif uid % 2 == 0:
                w.flush()
    ds = rlds_cli.open_dataset("flaky")
    uids = ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"]
    assert list(uids) == [1, 2, 5, 6]
    for i, uid in enumerate((1, 2, 5, 6)):
        want, got = episode(4, float(uid), uid=uid), ds.episode(i)
        assert_identical(want, {key: got[key] for key in want})
    assert check_dataset(ds).ok


def test_extend_keeps_its_own_copy_of_an_open_episode(isolated_cache: Path) -> None:
    """The steps after the last episode end of an ``extend`` wait for the next batch: a caller
    that refills its batch buffer in place meanwhile (a collector's reused rollout) does not
    change them."""
    a, b, c = episode(3, 10.0, uid=1), episode(4, 20.0, uid=2), episode(3, 30.0, uid=3)
    run = {k: np.concatenate([a[k], b[k], c[k]]) for k in a}
    buf = {k: v[:5].copy() for k, v in run.items()}  # episode a and two steps of b
    with rlds_cli.DatasetWriter("tail") as w:
        assert w.extend(buf) == 1
        for k, v in run.items():
            buf[k][...] = v[5:]  # the buffer refilled whole: the rest of b, then c
        assert w.extend(buf) == 2
    ds = rlds_cli.open_dataset("tail")
    for i, want in enumerate((a, b, c)):
        got = ds.episode(i)
        assert_identical(want, {key: got[key] for key in want})


def test_add_step_with_the_same_arrays_refilled_every_step(isolated_cache: Path) -> None:
    """An env that hands out one observation array, refilled in place at every step: the
    steps kept until the episode ends are the values of each step, not the last one."""
    obs, nxt = np.zeros(2, np.float32), np.zeros(2, np.float32)
    with rlds_cli.DatasetWriter("refilled") as w:
        for t in range(3):
            obs[:], nxt[:] = t, t + 1
            w.add_step(
                observation=obs,
                action=np.zeros(1, np.float32),
                reward=0.0,
                terminated=t == 2,
                truncated=False,
                next_observation=nxt,
            )
    got = rlds_cli.open_dataset("refilled").episode(0)
    assert got["observation"][:, 0].tolist() == [0, 1, 2]
    assert got["next/observation"][:, 0].tolist() == [1, 2, 3]


@pytest.mark.parametrize("per_commit", [1, 4])
def test_digests_hashed_beside_the_caller_are_those_of_the_stored_columns(
    isolated_cache: Path, per_commit: int
) -> None:
    """Episodes of frames mixed with small ones, one or several a commit: every segment's
    recorded digests match its columns."""
    rng = np.random.default_rng(0)
    with rlds_cli.DatasetWriter("frames", episodes_per_commit=per_commit) as w:
        for length in (40, 1, 30, 2, 3, 50, 1):
            frames = rng.integers(0, 255, (length + 1, 84, 84, 3), dtype=np.uint8)  # 21 KB each
            flags = np.zeros((length, 1), bool)
            flags[-1] = True
            w.add_episode(
                {
                    "observation": frames[:-1],
                    "next/observation": frames[1:],
                    "action": rng.standard_normal((length, 2)).astype(np.float32),
                    "next/reward": np.ones((length, 1), np.float32),
                    "next/terminated": flags,
                    "next/truncated": np.zeros_like(flags),
                }
            )
    ds = rlds_cli.open_dataset("frames")
    assert isinstance(ds, GrowingDataset) and ds.num_episodes == 7
    report = check_dataset(ds)
    assert "digest" in report.checks and report.ok, [str(v) for v in report.violations]


def test_append_refresh_and_snapshot(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("grow") as w:
        w.add_episode(episode(3))
    reader = rlds_cli.open_dataset("grow")
    assert reader.num_steps == 3
    assert reader.refresh() is False
    with rlds_cli.DatasetWriter("grow", mode="append") as w:
        w.add_episode(episode(4, 5.0, uid=1))
        assert reader.num_steps == 3  # the view moves only on refresh
    assert reader.refresh() is True
    assert reader.num_steps == 7 and reader.num_episodes == 2
    assert reader.episode(1)["observation"][0, 0] == 5.0
    with pytest.raises(DatasetExistsError):
        rlds_cli.DatasetWriter("grow")


def test_schema_mismatch_is_one_clear_error(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("sch") as w:
        w.add_episode(episode(3))
    bad = episode(3)
    bad["action"] = np.zeros((3, 3), np.float32)
    with (
        rlds_cli.DatasetWriter("sch", mode="append") as w,
        pytest.raises(SchemaMismatchError, match="'action'"),
    ):
        w.add_episode(bad)
    other = episode(3)
    del other["info/episode_uid"]
    with (
        pytest.raises(SchemaMismatchError, match="info/episode_uid"),
        rlds_cli.DatasetWriter("sch", mode="append") as w,
    ):
        w.add_episode(other)
    assert rlds_cli.open_dataset("sch").num_episodes == 1
    make_dataset("conv", [2])
    with pytest.raises(SchemaMismatchError, match="not a growing one"):
        rlds_cli.DatasetWriter("conv", mode="append")
    with pytest.raises(SchemaMismatchError, match="stored as memmap"):
        rlds_cli.DatasetWriter("sch", mode="append", storage="zarr")


def test_fifo_capacity_protected_and_ready(isolated_cache: Path) -> None:
    # min_total counts the protected steps too (min_size, the unprotected ones, is at most capacity)
    with rlds_cli.DatasetWriter("demo-set", protected=True, capacity=10, min_total=12) as demo:
        demo.add_episode(episode(6, 100.0, uid=100))
    ds = rlds_cli.open_dataset("demo-set")
    assert not ds.ready
    with rlds_cli.DatasetWriter("demo-set", mode="append") as w:
        for uid in range(6):
            w.add_episode(episode(4, 10.0 * uid, uid=uid))
    ds.refresh()
    uids = ds[:]["info/episode_uid"]
    # protected demo episode kept, then the newest 4-step episodes within 10 steps
    assert list(dict.fromkeys(uids.tolist())) == [100, 4, 5]
    assert ds.num_steps == 6 + 8 and ds.ready
    assert ds.episode(0)["observation"][0, 0] == 100.0


def test_capacity_in_episodes_keeps_the_newest(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("ce", capacity_episodes=2, episodes_per_commit=2) as w:
        for uid in range(7):
            w.add_episode(episode(2 + uid, uid=uid))
    ds = rlds_cli.open_dataset("ce")
    assert sorted(set(ds[:]["info/episode_uid"].tolist())) == [5, 6]


def test_loader_reads_a_growing_dataset(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("ld") as w:
        for uid in range(5):
            w.add_episode(episode(3 + uid, uid=uid))
    loader = rlds_cli.Loader("ld", batch_size=16, seed=0)
    batch = next(iter(loader))
    assert batch["observation"].shape == (16, 2)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_compact_merges_and_keeps_every_row(isolated_cache: Path, backend: str) -> None:
    with rlds_cli.DatasetWriter("cp", storage=backend, capacity_episodes=6) as w:
        for uid in range(9):
            w.add_episode(episode(2 + uid % 3, 10.0 * uid, uid=uid))
            w.flush()  # a segment each
    with rlds_cli.DatasetWriter("cp", mode="append", protected=True) as w:
        w.add_episode(episode(5, 500.0, uid=500))
    with rlds_cli.DatasetWriter("cp", mode="append") as w:
        w.add_episode(episode(3, 900.0, uid=9))
    old = rlds_cli.open_dataset("cp")
    before = old[:]
    report = rlds_cli.compact("cp", grace_seconds=3600)
    assert report.segments_before > report.segments_after == 3  # unprotected, protected, unprotected
    new = rlds_cli.open_dataset("cp")
    assert_identical(before, new[:])
    assert_identical(before, old[:])  # the old view still reads its (retired, kept) segments
    assert new.check_files() == []
    # nothing left to merge: a second compaction changes nothing
    again = rlds_cli.compact("cp", grace_seconds=0)
    assert again.merged_runs == 0 and again.removed  # retired files removed now
    assert_identical(before, rlds_cli.open_dataset("cp")[:])
    assert old.refresh() and old.num_steps == new.num_steps


def test_one_compacted_segment_reads_the_segment_columns(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("one") as w:
        for uid in range(4):
            w.add_episode(episode(3, uid=uid))
    rlds_cli.compact("one")
    ds = rlds_cli.open_dataset("one")
    assert isinstance(ds.column("action"), np.ndarray)  # the memory map itself, no concatenation


def test_compact_keeps_retired_files_for_the_grace_period(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("gr", grace_seconds=3600) as w:
        for uid in range(3):
            w.add_episode(episode(2, uid=uid))
            w.flush()  # a segment each
    old = rlds_cli.open_dataset("gr")
    report = rlds_cli.compact("gr")
    assert report.removed == [] and report.segments_after == 1
    assert old.growth()["segments_on_disk"] == 4 and old[:]["info/episode_uid"].tolist() == [0, 0, 1, 1, 2, 2]


def test_cli_compact_and_inspect(isolated_cache: Path) -> None:
    import json

    from typer.testing import CliRunner

    from rlds_cli.cli.app import app

    with rlds_cli.DatasetWriter("cli", min_size=50, capacity=50) as w:
        for uid in range(3):
            w.add_episode(episode(2, uid=uid))
            w.flush()  # a segment each
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", "cli", "--check"])
    assert result.exit_code == 0, result.output
    assert "3 segments" in result.output and "not ready" in result.output and "check passed" in result.output
    result = runner.invoke(app, ["compact", "cli", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["segments_after"] == 1
    info = json.loads(runner.invoke(app, ["inspect", "cli", "--json"]).stdout)
    assert info["growing"]["segments"] == 1 and info["growing"]["ready"] is False
    result = runner.invoke(app, ["compact", "cli", "--grace", "0"])  # the 3 merged ones go now
    assert result.exit_code == 0 and "1 segment -> 1 " in result.stdout, result.output
    assert result.stdout.rstrip().endswith("; 3 retired segments removed"), result.stdout
    make_dataset("conv", [2])
    result = runner.invoke(app, ["compact", "conv"])
    assert result.exit_code == 1 and "not a growing dataset" in result.output
    for grace in ("-1", "nan", "inf"):  # would remove files readers of older views still read
        result = runner.invoke(app, ["compact", "cli", "--grace", grace])
        assert result.exit_code == 1, (grace, result.output)
        assert result.stderr.startswith("error: --grace must be a number of 0 or more seconds"), result.stderr


def test_loader_refresh_follows_commits_and_evictions(isolated_cache: Path) -> None:
    with rlds_cli.DatasetWriter("lr", capacity_episodes=3) as w:
        w.add_episode(episode(3, 0.0, uid=0))
    loader = rlds_cli.Loader("lr", batch_size=64, seed=1, refresh=1, keys=["info/episode_uid", "observation"])
    assert set(loader.sample()["info/episode_uid"].tolist()) == {0}
    with rlds_cli.DatasetWriter("lr", mode="append") as w:
        for uid in range(1, 6):
            w.add_episode(episode(3, 10.0 * uid, uid=uid))
    batch = loader.sample()  # refreshed before drawing: the view of uids 3, 4, 5
    assert set(batch["info/episode_uid"].tolist()) == {3, 4, 5}
    assert batch["index"].max() < 9 and loader.num_steps == 9
    slices = rlds_cli.Loader("lr", batch_size=8, seed=1, refresh=2, sampler="slice", slice_len=2)
    for _ in range(4):
        b = slices.sample()
        assert (
            b["info/episode_uid"].reshape(-1, 2)[:, 0] == b["info/episode_uid"].reshape(-1, 2)[:, 1]
        ).all()


def test_loader_refresh_needs_a_growing_dataset_and_a_sampler_by_name(isolated_cache: Path) -> None:
    make_dataset("conv", [3, 4])
    with pytest.raises(ValueError, match="growing dataset"):
        rlds_cli.Loader("conv", refresh=1)
    with rlds_cli.DatasetWriter("g2") as w:
        w.add_episode(episode(3))
    own = rlds_cli.loader.UniformSampler(3, 4, seed=0)
    with pytest.raises(ValueError, match="sampler given by name"):
        rlds_cli.Loader("g2", refresh=1, sampler=own)
    with pytest.raises(ValueError, match="world_size=1"):
        rlds_cli.Loader("g2", refresh=1, sampler="epoch", seed=0, rank=0, world_size=2)
    with pytest.raises(ValueError, match=">= 1"):
        rlds_cli.Loader("g2", refresh=0)


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_refreshed_view_reads_what_a_fresh_open_reads(isolated_cache: Path, backend: str) -> None:
    """The in-RAM tail of small segments follows commits, evictions and compactions; views taken
    before keep reading their own rows."""
    rng = np.random.default_rng(3)
    with rlds_cli.DatasetWriter("tv", storage=backend, capacity=40) as w:
        w.add_episode(episode(3, uid=0))
    reader = rlds_cli.open_dataset("tv")
    olds: list[tuple[GrowingDataset, dict[str, np.ndarray]]] = []
    uid = 1
    for round_ in range(12):
        # a protected writer now and then: its segments stay live before the eviction front
        with rlds_cli.DatasetWriter("tv", mode="append", protected=round_ in (2, 9)) as w:
            for _ in range(int(rng.integers(1, 4))):
                w.add_episode(episode(int(rng.integers(1, 9)), 10.0 * uid, uid=uid))
                uid += 1
        if round_ == 6:
            rlds_cli.compact("tv", grace_seconds=3600)
        reader.refresh()  # kept from the last view (appends, evictions) or rebuilt (compaction)
        fresh = rlds_cli.open_dataset("tv")
        assert_identical(reader[:], fresh[:])
        assert np.array_equal(reader.episode_index, fresh.episode_index)
        assert np.array_equal(reader.episode_bounds.ends, fresh.episode_bounds.ends)
        parts = [ds.directory for ds in reader.segment_datasets()]
        assert parts == [ds.directory for ds in fresh.segment_datasets()]
        snapshot = rlds_cli.open_dataset("tv")
        olds.append((snapshot, snapshot[:]))
    for old, rows in olds:
        assert_identical(old[:], rows)


def test_push_of_a_growing_dataset_takes_one_view(isolated_cache: Path, tmp_path: Path) -> None:
    from rlds_cli.remote.pull import pull
    from rlds_cli.remote.push import push

    with rlds_cli.DatasetWriter("pu", capacity_episodes=3, grace_seconds=3600) as w:
        for uid in range(5):
            w.add_episode(episode(2 + uid, 10.0 * uid, uid=uid))
    expected = rlds_cli.open_dataset("pu")[:]
    url = (tmp_path / "store" / "pu").as_uri()
    push("pu", url)
    with rlds_cli.DatasetWriter("pu", mode="append") as w:  # appended after the push: not in it
        w.add_episode(episode(2, 99.0, uid=99))
    pull(url, name="pulled")
    pulled = rlds_cli.open_dataset("pulled")
    assert isinstance(pulled, GrowingDataset)
    assert_identical(pulled[:], expected)
    assert pulled.check_files() == []
    leftovers = list((isolated_cache / "tmp").iterdir()) if (isolated_cache / "tmp").is_dir() else []
    assert [p for p in leftovers if p.name.startswith("pu.")] == []


def test_schema_given_up_front(isolated_cache: Path) -> None:
    make_dataset("src2", [3, 2])
    src = rlds_cli.open_dataset("src2")
    with rlds_cli.DatasetWriter("given", schema=src.fields) as w:
        assert rlds_cli.open_dataset("given").num_steps == 0  # created at once, empty
        with pytest.raises(ValueError, match="no steps yet"):
            rlds_cli.Loader("given")
        bad = dict(src.episode(0))
        bad["action"] = bad["action"].astype(np.float64)
        with pytest.raises(SchemaMismatchError, match="'action'"):
            w.add_episode(bad)
        w.add_episode(src.episode(1))
    got, want = rlds_cli.open_dataset("given").episode(0), src.episode(1)
    assert want.pop("episode").tolist() == [1, 1] and got.pop("episode").tolist() == [0, 0]
    assert_identical(got, want)
    with pytest.raises(SchemaMismatchError, match="info/qpos"):
        rlds_cli.DatasetWriter(
            "given", mode="append", schema={k: v for k, v in src.fields.items() if k != "info/qpos"}
        )
    with pytest.raises(rlds_cli.errors.EpisodeFormatError, match="missing key 'action'"):
        rlds_cli.DatasetWriter(
            "other", schema={"observation": ((2,), "float32"), "next/observation": ((2,), "float32")}
        )


def test_a_pickled_view_is_the_same_view(isolated_cache: Path) -> None:
    import pickle

    with rlds_cli.DatasetWriter("pk") as w:
        w.add_episode(episode(3, uid=0))
    ds = rlds_cli.open_dataset("pk")
    with rlds_cli.DatasetWriter("pk", mode="append") as w:
        w.add_episode(episode(2, uid=1))
    copy = pickle.loads(pickle.dumps(ds))  # a worker process gets the view, not the latest
    assert isinstance(copy, GrowingDataset) and copy.num_steps == 3
    assert_identical(copy[:], ds[:])


def test_refresh_keeps_the_loaders_float_dtype_cast_in_ram(isolated_cache: Path) -> None:
    """A rebuilt in-RAM source casts float64 columns once, as the loader's first one did."""

    def as_float64(ep: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in ep.items()}

    with rlds_cli.DatasetWriter("f64") as w:
        w.add_episode(as_float64(episode(3, 0.0, uid=0)))
    loader = rlds_cli.Loader(
        "f64", batch_size=16, seed=1, refresh=1, in_memory=True, float_dtype=torch.float32
    )
    assert loader.sample()["observation"].dtype == torch.float32
    with rlds_cli.DatasetWriter("f64", mode="append") as w:
        w.add_episode(as_float64(episode(4, 10.0, uid=1)))
    batch = loader.sample()  # refreshed: the new host source holds float32 columns already
    assert loader.num_steps == 7 and batch["observation"].dtype == torch.float32
    assert not loader._dtypes.changes_host(loader._host)
    expected = torch.tensor(rlds_cli.open_dataset("f64").gather(batch["index"].numpy())["observation"])
    assert torch.equal(batch["observation"], expected.float())
