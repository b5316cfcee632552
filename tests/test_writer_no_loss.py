"""Nothing committed is lost (issue 25): writer processes append with no capacity while
compactions and ``rlds gc``'s collection run on the same dataset, then every episode each
writer added is visible exactly once and the dataset checks whole.

The load test (tests/test_writer_load.py) evicts, so it cannot tell a lost commit from an
evicted one; here every commit must stay, through merges, collections and refreshes. (The one
way commits were lost, two writers racing on the commit log, is rare per commit and tested
head-on in tests/test_commit_log_torn.py.)"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.validate import check_dataset
from rlds_cli.write.compact import remove_retired
from tests.dataset_fixtures import uid_episode

pytestmark = pytest.mark.xdist_group("disk-heavy")

WRITERS = 4
#: Compactions (each followed by gc's collection) made while the writers write; the writers
#: stop after the last one.
ROUNDS = 4
GRACE = 0.5  # retired segments go soon, so collection runs while the writers write
#: Episodes each writer adds at least, whenever the rounds end.
MIN_EPISODES = 50


def _writer(root: str, wid: int, stop: Any, out: Any) -> None:
    rng = np.random.default_rng(wid)
    added: list[int] = []
    options: dict[str, Any] = {"grace_seconds": GRACE, "commit_interval": 0.01}
    with rlds_cli.DatasetWriter("s", root=root, mode="append", **options) as w:
        while not stop.is_set() or len(added) < MIN_EPISODES:
            uid = 100_000 * (wid + 1) + len(added)
            w.add_episode(uid_episode(uid, int(rng.integers(2, 10))))
            added.append(uid)
            time.sleep(0.002)  # an actor's pace: the dataset stays small enough to merge often
    out.put(added)


def _maintain(root: str, stop: Any, out: Any) -> None:
    """Compact and collect ``ROUNDS`` times while the writers write, then stop them; reports
    the runs merged."""
    merged = 0
    for _ in range(ROUNDS):
        time.sleep(0.3)  # let commits come in between
        merged += rlds_cli.compact("s", root, grace_seconds=GRACE).merged_runs
        remove_retired("s", root)
    stop.set()
    out.put(merged)


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_every_commit_stays_while_compactions_and_gc_run(isolated_cache: Path, storage: str) -> None:
    root = str(isolated_cache)
    with rlds_cli.DatasetWriter("s", root=root, storage=storage, grace_seconds=GRACE) as w:
        w.add_episode(uid_episode(1, 3))
    ctx = mp.get_context("fork")
    added, merged, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_writer, args=(root, i, stop, added)) for i in range(WRITERS)]
    procs.append(ctx.Process(target=_maintain, args=(root, stop, merged)))
    for p in procs:
        p.start()
    committed = [1]
    for _ in range(WRITERS):
        committed += added.get(timeout=300)
    assert merged.get(timeout=60) >= 1  # the compactions merged the writers' segments
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ds = rlds_cli.open_dataset("s", root)
    visible = ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"].tolist()
    assert sorted(visible) == sorted(committed), (
        f"lost {len(set(committed) - set(visible))}, "
        f"twice {[u for u, k in Counter(visible).items() if k > 1][:5]}"
    )
    assert ds.state.invalid == 0  # every record of the log readable
    assert check_dataset(ds).ok
