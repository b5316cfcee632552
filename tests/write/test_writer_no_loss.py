"""Nothing committed is lost (issue 25): writer processes append with no capacity while
compactions and ``rlds gc``'s collection run on the same dataset, then every episode each
writer added is visible exactly once and the dataset checks whole.

The load test (tests/write/test_writer_load.py) evicts, so it cannot tell a lost commit from an
evicted one; here every commit must stay, through merges, collections and refreshes. (The one
way commits were lost, two writers racing on the commit log, is rare per commit and tested
head-on in tests/cache/test_commit_log_torn.py.)"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.write.compact import remove_retired
from tests.dataset_fixtures import uid_episode
from tests.waits import HANG_SECONDS, collect, join_all

pytestmark = pytest.mark.xdist_group("disk-heavy")

WRITERS = 4
#: Compactions (each followed by gc's collection) made while the writers write; the writers
#: stop after the last one.
ROUNDS = 4
GRACE = 0.5  # retired segments go soon, so collection runs while the writers write
#: Episodes each writer adds at least, whenever the rounds end.
MIN_EPISODES = 50
#: Episodes each writer adds per round. A round starts once every writer has added its share,
#: and the writers run at most two rounds ahead: each compaction merges while commits land, and
#: the work of a round is the same however fast the machine (paced by time, a slow machine
#: merged ever more per round, and the test ran away).
PER_ROUND = 15


def _writer(root: str, wid: int, stop: Any, rounds: Any, counts: Any, out: Any) -> None:
    rng = np.random.default_rng(wid)
    added: list[int] = []
    options: dict[str, Any] = {"grace_seconds": GRACE, "commit_interval": 0.01}
    with rlds_cli.DatasetWriter("s", root=root, mode="append", **options) as w:
        while not stop.is_set() or len(added) < MIN_EPISODES:
            while not stop.is_set() and len(added) >= PER_ROUND * (rounds.value + 2):
                time.sleep(0.005)  # two rounds ahead of the compactions: wait for the next one
            uid = 100_000 * (wid + 1) + len(added)
            w.add_episode(uid_episode(uid, int(rng.integers(2, 10))))
            added.append(uid)
            counts[wid] = len(added)
            time.sleep(0.002)  # an actor's pace
    out.put(added)


def _maintain(root: str, stop: Any, rounds: Any, counts: Any, out: Any) -> None:
    """Compact and collect ``ROUNDS`` times while the writers write, then stop them; reports
    the runs merged."""
    merged = 0
    for r in range(ROUNDS):
        deadline = time.monotonic() + HANG_SECONDS  # a hang guard: the writers' progress ends the wait
        while min(counts[:]) < PER_ROUND * (r + 1):  # this round's commits came in
            assert time.monotonic() < deadline, f"the writers added no {PER_ROUND} episodes each: a hang"
            time.sleep(0.005)
        merged += rlds_cli.compact("s", root, grace_seconds=GRACE).merged_runs
        remove_retired("s", root)
        rounds.value = r + 1
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
    rounds, counts = ctx.Value("i", 0), ctx.Array("i", WRITERS)
    procs = [ctx.Process(target=_writer, args=(root, i, stop, rounds, counts, added)) for i in range(WRITERS)]
    procs.append(ctx.Process(target=_maintain, args=(root, stop, rounds, counts, merged)))
    for p in procs:
        p.start()
    # waits end on the reports (a slow machine only takes longer); a process that fails ends
    # them at once, a hang after tests/waits.py's guard
    (rounds_merged,) = collect(merged, procs, 1)
    assert rounds_merged >= 1  # the compactions merged the writers' segments
    committed = [1]
    for uids in collect(added, procs, WRITERS):
        committed += uids
    join_all(procs)
    ds = rlds_cli.open_dataset("s", root)
    visible = ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"].tolist()
    assert sorted(visible) == sorted(committed), (
        f"lost {len(set(committed) - set(visible))}, "
        f"twice {[u for u, k in Counter(visible).items() if k > 1][:5]}"
    )
    assert ds.state.invalid == 0  # every record of the log readable
    assert check_dataset(ds).ok
