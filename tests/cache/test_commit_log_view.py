"""The commit log's view (``LogState``) kept incrementally equals the view computed from scratch.

A growing dataset's readers and writers ask for the live segments after every commit; the view
is kept with a front that only moves forward and a walk that resumes where it stopped, so a
refresh costs the segments past the front, not every segment ever added. These tests replay
random logs (appends, protected segments, FIFO evictions, compactions, duplicates, stale
records) and compare every step with a reference written the obvious way.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli.cache.commit_log import ADD, COMPACT, EVICT, PROTECTED, LogState, Record, SegmentEntry


def reference_live(state: LogState) -> list[tuple[bytes, int]]:
    """The live segments by the definition: unprotected episodes are evicted oldest first."""
    out, remaining = [], state.evicted
    for s in state.segments:
        skip = 0
        if not s.protected:
            skip = min(remaining, s.episodes)
            remaining -= skip
        if skip < s.episodes:
            out.append((s.seg, max(skip, s.dropped)))
    return out


def random_log(rng: np.random.Generator, n: int) -> list[Record]:
    records: list[Record] = []
    segs: list[tuple[bytes, int, bool]] = []  # added so far: id, episodes, protected
    live_ids: list[bytes] = []
    evicted = 0
    for i in range(n):
        roll = rng.random()
        if roll < 0.6 or not segs:
            seg = i.to_bytes(16, "little")
            episodes = int(rng.integers(1, 5))
            protected = bool(rng.random() < 0.15)
            segs.append((seg, episodes, protected))
            live_ids.append(seg)
            records.append(
                Record(ADD, seg, episodes=episodes, steps=10 * episodes, flags=PROTECTED * protected, time=i)
            )
        elif roll < 0.85:
            unprotected = sum(e for _, e, p in segs if not p)
            if unprotected > evicted + 1:
                evicted += int(rng.integers(1, unprotected - evicted))
            records.append(
                Record(EVICT, count=evicted if rng.random() < 0.9 else max(0, evicted - 2), time=i)
            )
        elif roll < 0.92 and len(live_ids) >= 2:
            a = int(rng.integers(0, len(live_ids) - 1))
            b = min(len(live_ids) - 1, a + int(rng.integers(1, 4)))
            first, last = live_ids[a], live_ids[b]
            merged = (10_000 + i).to_bytes(16, "little")
            # the compacted segment keeps its logical episodes; its files hold the live ones
            episodes = sum(e for s, e, _ in segs if s in live_ids[a : b + 1])
            records.append(
                Record(COMPACT, merged, first, last, episodes=max(1, episodes - 1), steps=5, time=i)
            )
            live_ids[a : b + 1] = [merged]
        else:
            dup = segs[int(rng.integers(0, len(segs)))]
            records.append(Record(ADD, dup[0], episodes=dup[1], steps=10, time=i))  # a duplicate: ignored
    return records


@pytest.mark.parametrize("seed", range(12))
def test_the_kept_view_equals_the_view_from_scratch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    state = LogState()
    for k, rec in enumerate(random_log(rng, 300)):
        state.apply(rec)
        if rng.random() < 0.5 or k % 37 == 0:  # asked at some positions only: the walk resumes
            want = reference_live(state)
            assert [(s.seg, skip) for s, skip in state.live()] == want, f"record {k}"
            live = {seg for seg, _ in want}
            assert {s.seg for s in state.fully_evicted()} == {
                s.seg for s in state.segments if s.seg not in live
            }
        copy = state.copy() if k % 50 == 0 else None
        if copy is not None:
            assert [(s.seg, skip) for s, skip in copy.live()] == reference_live(state)


def test_segments_evicted_whole_are_retired_once_with_the_time_of_their_eviction() -> None:
    state = LogState()
    for i in range(4):
        state.apply(Record(ADD, bytes([i]) * 16, episodes=2, steps=20, time=float(i)))
    state.apply(Record(EVICT, count=3, time=10.0))  # segment 0 whole, one episode of segment 1
    assert state.retired == {bytes([0]) * 16: 10.0}
    state.retired.pop(bytes([0]) * 16)  # its files collected: it is not retired again
    state.apply(Record(EVICT, count=4, time=11.0))
    assert state.retired == {bytes([1]) * 16: 11.0}
    assert [(s.seg[0], skip) for s, skip in state.live()] == [(2, 0), (3, 0)]


def test_a_protected_segment_before_the_front_stays_live() -> None:
    state = LogState()
    state.apply(Record(ADD, b"p" * 16, episodes=3, steps=30, flags=PROTECTED, time=0.0))
    for i in range(3):
        state.apply(Record(ADD, bytes([i]) * 16, episodes=1, steps=10, time=1.0 + i))
    state.apply(Record(EVICT, count=2, time=5.0))
    assert [(s.seg[:1], skip) for s, skip in state.live()] == [(b"p", 0), (bytes([2]), 0)]
    assert [s.seg[:1] for s in state.fully_evicted()] == [bytes([0]), bytes([1])]


def test_a_walk_resumes_only_over_unchanged_segments() -> None:
    state = LogState([SegmentEntry(bytes([i]) * 16, False, 1, 10) for i in range(5)])
    assert len(state.live()) == 5
    state.apply(Record(ADD, b"n" * 16, episodes=1, steps=10, time=1.0))
    assert len(state.live()) == 6
    state.apply(Record(COMPACT, b"c" * 16, bytes([1]) * 16, bytes([3]) * 16, episodes=3, steps=30, time=2.0))
    assert [s.seg[:1] for s, _ in state.live()] == [bytes([0]), b"c", bytes([4]), b"n"]
