"""Load: writer processes append with FIFO eviction while sampling processes read (issue 25).

Every served row must belong to an episode that was committed and, as of the sampler's view,
not evicted; each row carries its episode's uid (``info/episode_uid``) and its step inside the
episode in its observation, so a torn or mixed row shows. Samplers refresh before every batch.

The writers do not fsync. fsync guards against power loss, which no process-level test can
observe; the order in which a commit syncs its entries is checked in tests/write/test_writer_kill.py
(``test_a_segment_commit_is_durable_before_its_record``). Eight writers fsyncing flat out for
60 s also saturate the shared disk's journal: in the full suite every fsync of the other test
worker then waited seconds (the compaction kill tests ran 6x slower, 17.6 s -> 109 s, and a
killed child missed its 60 s bound), and the writers' own last commits outlived the test's
waits. Afterwards nothing is left on disk (no build, no segment the log does not name, nothing
in ``tmp/``), and the samplers' memory did not grow after their first ``WARM_BATCHES``.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli
from rlds_cli.cache import log_checkpoint
from rlds_cli.cache.commit_log import seg_name
from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.cache.layout import COMMIT_LOG_FILE, LOG_CHECKPOINT_FILE, SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.cache.root import CacheRoot
from tests.dataset_fixtures import uid_episode
from tests.waits import HANG_SECONDS, collect, join_all

#: The suite's heaviest disk users run one after another on one test worker (``make test`` runs
#: ``pytest -n 2 --dist loadgroup``): each fsyncs, or churns files, for tens of seconds, and two
#: of them at once starved each other's fsyncs past their hang bounds on 2 shared cores.
pytestmark = pytest.mark.xdist_group("disk-heavy")

WRITERS = 8
SAMPLERS = 2
SECONDS = 60.0  # the load: 8 writer processes and 2 samplers for 60 s
#: Batches each sampler draws at least (while the writers write), however slow the machine.
MIN_BATCHES = 40
CAPACITY = 1_500
#: Each writer's pause after each episode it adds.
PAUSE_SECONDS = 0.002
#: The samplers' memory is taken after this many batches (warm: every module and buffer made)
#: and at the end: it may not grow with the commits, evictions and refreshes in between. A
#: count, not a time: on a busy CI machine a sampler at nice 10 spent most of the 60 s
#: importing torch and opening the dataset, and drew all its batches after that.
WARM_BATCHES = 10


def _rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _yield_the_cpu() -> None:
    """The load's processes run at a lower priority: ten processes flat out on 2 cores left the
    other test worker's tests a sixth of a core (a docs test ran 65 s instead of 15), and this
    test checks what is served, not how fast; alone, they still take the whole machine."""
    os.nice(10)


def _writer(root: str, wid: int, stop: Any, out: Any) -> None:
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)  # a hang shows where, then ends
    _yield_the_cpu()
    rng = np.random.default_rng(wid)
    committed = []
    with rlds_cli.DatasetWriter("load", root=root, mode="append", capacity=CAPACITY, grace_seconds=30) as w:
        n = 0
        while not stop.is_set():
            uid = 1_000 * (wid + 1) + n
            w.add_episode(uid_episode(uid, int(rng.integers(5, 40))))
            committed.append(uid)
            n += 1
            # an actor's pause between episodes (still ~8 x 400 episodes/s, far past the
            # capacity): flat out, the adding thread held the GIL and its commit thread
            # waited, on a busy CI machine for as long as a sampler looked
            time.sleep(PAUSE_SECONDS)
    out.put(("writer", wid, committed))


def _sampler(root: str, sid: int, deadline: float, out: Any) -> None:
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)  # a hang shows where, then ends
    _yield_the_cpu()
    loader = rlds_cli.Loader(
        "load",
        root=root,
        batch_size=128,
        seed=sid,
        refresh=1,
        keys=["observation", "next/observation", "info/episode_uid"],
    )
    fds0 = len(os.listdir("/proc/self/fd"))
    served: set[int] = set()
    problems: list[str] = []
    batches = 0
    warm_rss = None
    log = CacheRoot(root).dataset_dir("load") / COMMIT_LOG_FILE
    seen = {"log_bytes_first": log.stat().st_size, "first_batch_s": time.time() - deadline}
    # past the deadline too while it has not seen the dataset grow: a sampler at nice 10 on a
    # busy CI machine may get its first batch only at the end, while the writers' commit threads
    # wait for their share of the CPU (they write until the samplers end: the growth comes)
    while (
        batches < MIN_BATCHES
        or time.time() < deadline
        or (len(served) <= 10 and time.time() < deadline + HANG_SECONDS)
    ):
        if batches == WARM_BATCHES:
            warm_rss = _rss()
        batch = loader.sample()
        ds = loader.dataset
        assert ds is not None
        live = set(ds.gather(ds.episodes["start"], keys=["info/episode_uid"])["info/episode_uid"].tolist())
        uid = batch["info/episode_uid"].numpy()
        obs, nxt = batch["observation"].numpy(), batch["next/observation"].numpy()
        if (
            not (obs[:, 0] == uid).all()
            or not (nxt[:, 0] == uid).all()
            or not (nxt[:, 1] == obs[:, 1] + 1).all()
        ):
            problems.append(f"batch {batches}: a row mixes episodes or steps")
        if not set(uid.tolist()) <= live:
            problems.append(
                f"batch {batches}: rows of evicted episodes {sorted(set(uid.tolist()) - live)[:5]}"
            )
        if batch["index"].max() >= ds.num_steps:
            problems.append(f"batch {batches}: index past the end")
        served |= set(uid.tolist())
        batches += 1
    # open memory maps hold a file each (Python's mmap keeps a descriptor): one per live
    # segment and key, and none once the loader is gone
    rss = {"warm": warm_rss, "end": _rss()}
    in_use = len(os.listdir("/proc/self/fd")) - fds0
    segments = len(loader.dataset.live_segments())  # type: ignore[union-attr]
    refreshes = loader._refresher.rebuilds if loader._refresher is not None else -1
    del loader, ds
    gc.collect()
    fds = {"in_use": in_use, "segments": segments, "after": len(os.listdir("/proc/self/fd")) - fds0}
    seen |= {"log_bytes_last": log.stat().st_size, "last_batch_s": time.time() - deadline}
    seen["views_followed"] = refreshes
    report = {
        "batches": batches,
        "served": served,
        "problems": problems,
        "fds": fds,
        "rss": rss,
        "seen": seen,
    }
    out.put(("sampler", sid, report))


@pytest.mark.slow
def test_writers_and_samplers_under_load(isolated_cache: Path) -> None:
    root = str(isolated_cache)
    with rlds_cli.DatasetWriter("load", root=root, capacity=CAPACITY, grace_seconds=30) as w:
        w.add_episode(uid_episode(1, 10))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    stop = ctx.Event()
    deadline = time.time() + SECONDS
    writers = [ctx.Process(target=_writer, args=(root, i, stop, out)) for i in range(WRITERS)]
    samplers = [ctx.Process(target=_sampler, args=(root, i, deadline, out)) for i in range(SAMPLERS)]
    procs = writers + samplers
    for p in procs:
        p.start()
    try:
        # the writers write until the samplers end (only then do they report); a slow machine
        # only takes longer: a child that fails ends the wait at once, and one that hangs dumps
        # its stack and exits at tests/waits.py's guard (once, a fixed 120 s wait gave up while
        # the other test worker ran its own processes on the 2 CPUs)
        results = collect(out, procs, SAMPLERS)
    finally:
        stop.set()
    results += collect(out, procs, WRITERS)
    join_all(procs)
    committed = {1}
    for kind, _, value in results:
        if kind == "writer":
            committed |= set(value)
    reports = [value for kind, _, value in results if kind == "sampler"]
    assert len(committed) > 4 * WRITERS
    for s in reports:
        assert s["problems"] == []
        assert s["batches"] >= MIN_BATCHES
        assert s["served"] <= committed  # nothing served that was not committed
        assert len(s["served"]) > 10, s["seen"]  # the samplers saw the dataset grow
        assert s["fds"]["in_use"] <= 2 * s["fds"]["segments"] + 16  # evicted segments' files let go
        assert s["fds"]["after"] <= 4
        # no growth with the commits: generous bounds, no timing (taken after WARM_BATCHES)
        assert s["rss"]["warm"] is not None and s["rss"]["end"] < 1.5 * s["rss"]["warm"] + (50 << 20), s[
            "rss"
        ]
    ds = rlds_cli.open_dataset("load", root)
    assert ds.num_steps <= CAPACITY + 40
    assert rlds_cli.compact("load", root, grace_seconds=0).segments_after == 1
    after = rlds_cli.open_dataset("load", root)
    assert isinstance(after, GrowingDataset) and after.num_steps == ds.num_steps
    # every commit's record readable: a record written across two slots is a commit lost
    assert after.state.invalid == 0
    # nothing leaked on disk: no build, no segment but the one the log names, nothing in tmp/
    directory = Path(root) / "datasets" / "load"
    assert list((directory / SEGMENT_BUILDS_DIR).iterdir()) == []
    live = [seg_name(entry.seg) for entry, _ in after.live_segments()]
    segments = sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir() if p.name != LOG_CHECKPOINT_FILE)
    assert segments == live
    # the checkpoints the writers and readers wrote under the load agree with the whole log
    assert log_checkpoint.verify_log(directory).position == after.log_position
    assert not (Path(root) / "tmp").is_dir() or list((Path(root) / "tmp").iterdir()) == []
