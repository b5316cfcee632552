"""Writers in processes of their own (issue 25): what ``rlds inspect`` says of each, and two
writers with different schemas making one dataset at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cli.app import app
from rlds_cli.errors import SchemaMismatchError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.write import segments
from rlds_cli.write.committer import COLLECT_PER_COMMIT
from tests.waits import HANG_SECONDS, collect, join_all
from tests.write.test_writer import assert_identical, episode

_fork = mp.get_context("fork")


def _write_two(root: str, wid: int) -> None:
    with rlds_cli.DatasetWriter("w", root=root, mode="append") as w:
        for k in range(2):
            w.add_episode(episode(2 + wid, 10.0 * wid + k, uid=10 * wid + k))
            w.flush()  # a segment each


def test_inspect_names_each_writer_process(isolated_cache: Path) -> None:
    """One line per writer: host:pid, its segments, episodes and steps; a compaction's segment
    is named by the compacting process, marked (compacted)."""
    root = str(isolated_cache)
    pids = []
    for wid in (1, 2):
        p = _fork.Process(target=_write_two, args=(root, wid))
        p.start()
        join_all([p])
        pids.append(p.pid)
    host = socket.gethostname()
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", "w"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines() if line.strip().startswith("writer ")]
    assert lines == [
        f"writer {host}:{pids[0]}: 2 segments, 2 episodes, 6 steps",
        f"writer {host}:{pids[1]}: 2 segments, 2 episodes, 8 steps",
    ], result.output
    rlds_cli.compact("w", root, grace_seconds=0)
    info = json.loads(runner.invoke(app, ["inspect", "w", "--json"]).stdout)
    writers = info["growing"]["writers"]
    assert writers == {f"{host}:{os.getpid()} (compacted)": {"segments": 1, "episodes": 4, "steps": 14}}
    assert f"writer {host}:{os.getpid()} (compacted): 1 segment, 4 episodes, 14 steps" in (
        runner.invoke(app, ["inspect", "w"]).output
    )


def _other_schema(uid: int) -> dict[str, np.ndarray]:
    ep = episode(3, 50.0, uid=uid)
    ep["action"] = np.zeros((3, 4), np.float32)  # (4,) where the other writer's is (2,)
    return ep


def _race(root: str, uid: int, opened: Any, go: Any, out: Any) -> None:
    """A writer that opens the (not yet made) dataset, says so, waits for the go, then commits
    its episode; reports the errors it got (from the add, the flush or the close), always."""
    errors: list[tuple[str, str]] = []
    try:
        w = rlds_cli.DatasetWriter("race", root=root, mode="append")
        opened.set()
        assert go.wait(HANG_SECONDS)
        for step in ("add", "close"):
            try:
                if step == "add":
                    w.add_episode(episode(3, 10.0, uid=uid) if uid == 1 else _other_schema(uid))
                    w.flush()
                else:
                    w.close()  # a refused episode is not tried again
            except Exception as exc:
                errors.append((type(exc).__name__, str(exc)))
    except BaseException as exc:
        errors.append((type(exc).__name__, str(exc)))
    finally:
        opened.set()
        out.put((uid, errors))


@pytest.mark.parametrize("order", ["in turn", "at once"])
def test_two_writer_processes_with_different_schemas(isolated_cache: Path, order: str) -> None:
    """Two processes open one name for append before it exists, then each commits an episode
    of its own schema: in turn (the first makes the dataset), or released at once (either may
    make it). Exactly one of them gets one SchemaMismatchError naming the key; the dataset is
    the other's, its episode intact."""
    root = str(isolated_cache)
    out = _fork.Queue()
    events = [(_fork.Event(), _fork.Event()) for _ in range(2)]
    procs = [
        _fork.Process(target=_race, args=(root, uid, opened, go, out))
        for uid, (opened, go) in zip((1, 2), events, strict=True)
    ]
    for p in procs:
        p.start()
    for opened, _ in events:
        assert opened.wait(HANG_SECONDS)  # both opened before the dataset exists
    results = {}
    if order == "in turn":
        for uid, (_, go) in zip((1, 2), events, strict=True):
            go.set()  # the next one goes once this one has reported
            ((got_uid, errors),) = collect(out, procs, 1)
            assert got_uid == uid
            results[uid] = errors
    else:
        for _, go in events:
            go.set()
        for got_uid, errors in collect(out, procs, len(procs)):
            results[got_uid] = errors
    join_all(procs)
    failed = [uid for uid, errors in results.items() if errors]
    assert len(failed) == 1 and len(results[failed[0]]) == 1, results
    kind, message = results[failed[0]][0]
    assert kind == SchemaMismatchError.__name__ and "'action'" in message, results
    winner = 3 - failed[0]
    if order == "in turn":
        assert winner == 1
    ds = rlds_cli.open_dataset("race", root)
    assert ds.num_episodes == 1 and check_dataset(ds).ok
    want = episode(3, 10.0, uid=1) if winner == 1 else _other_schema(2)
    got = ds.episode(0)
    assert_identical(want, {key: got[key] for key in want})


def test_segments_another_writer_collected_are_forgotten(isolated_cache: Path) -> None:
    """Two writers append with FIFO eviction and no grace: each follows the whole log, so each
    retires every evicted segment, and whichever commits next removes it. What the other one
    removed must leave this one's retired list too; kept, each commit tried again a rename of
    every segment ever evicted (the cost and the memory grew for as long as a writer ran)."""
    options: dict[str, Any] = {"capacity_episodes": 2, "grace_seconds": 0, "commit_interval": 0}
    with (
        rlds_cli.DatasetWriter("two", mode="append", **options) as a,
        rlds_cli.DatasetWriter("two", mode="append", **options) as b,
    ):
        for uid in range(60):
            w = (a, b)[uid % 2]
            w.add_episode(episode(2, float(uid), uid=uid))
            w.flush()
        retired = [len(w._sink._state.retired) for w in (a, b)]
    assert max(retired) <= 2, retired  # the few retired since that writer's last collection
    ds = rlds_cli.open_dataset("two")
    assert [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)] == [58, 59]
    segs = isolated_cache / "datasets" / "two" / "segments"
    assert len(list(segs.iterdir())) <= 4


def test_a_commit_removes_a_few_retired_segments_and_the_rest_later(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit removes at most ``COLLECT_PER_COMMIT`` retired segments, however many are due:
    the commit thread is what a writer's full backlog waits for, and one commit that took on
    thousands of retired segments after a stall held its writer for minutes (the load test on
    a slow CI disk). The rest go, the oldest first, with the commits after it."""
    options: dict[str, Any] = {"capacity_episodes": 1, "grace_seconds": 3600, "commit_interval": 0}
    with rlds_cli.DatasetWriter("few", mode="append", **options) as w:
        for uid in range(12):
            w.add_episode(episode(2, float(uid), uid=uid))
            w.flush()
    segs = isolated_cache / "datasets" / "few" / "segments"
    assert len(list(segs.iterdir())) == 12  # 11 retired, none due within the hour of grace
    real_time = segments.time.time
    monkeypatch.setattr(segments, "time", SimpleNamespace(time=lambda: real_time() + 7200))
    counts = []
    with rlds_cli.DatasetWriter("few", mode="append", **options) as w:
        for uid in range(12, 16):
            w.add_episode(episode(2, float(uid), uid=uid))
            w.flush()
            counts.append(len(list(segs.iterdir())))
    # two hours on, every retired segment is due, the one each commit retires too: a commit
    # adds one segment and removes 4 (12 + 1 - 4 = 9, then 6, 3), and the last takes the 3 left
    assert COLLECT_PER_COMMIT == 4
    assert counts == [9, 6, 3, 1], counts
    ds = rlds_cli.open_dataset("few")
    assert [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)] == [15]
