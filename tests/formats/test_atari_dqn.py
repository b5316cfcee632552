"""Atari DQN replay logs (``--format atari_dqn``): Dopamine's logged circular buffer, converted.

Sources are written by :mod:`tests.atari_dqn_fixtures`, which re-implements Dopamine's buffer
storage (zero padding, ``add_count``, ``invalid_range``, gzip'd ``np.save``) and batch_rl's
logging rule, and remembers the ground truth of every env step. Each conversion is checked two
ways, neither using the reader's code:

* against :func:`reference`, a row-at-a-time walk over the raw arrays (``np.load`` of each whole
  gzip file) applying the rules of ``docs/formats.md``, key by key and dtype by dtype;
* against the ground truth: every stored step is a real env transition (its frame, action and
  reward are that env step's, its next frame the next env step's), terminated exactly at true
  episode ends, and no env step is stored twice.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import SourceError, SourceFormatError
from rlds_cli.formats import detect_format
from rlds_cli.sources.convert import convert
from tests.atari_dqn_fixtures import (
    STORE_PREFIX,
    DopamineBuffer,
    Run,
    file_name,
    frame_id,
    invalid_range,
    save_array,
    save_checkpoint,
    tagged_frame,
    write_run,
)
from tests.cli_fixtures import download, download_ok
from tests.formats_fixtures import refused as _refused

runner = CliRunner()
SHAPE = (12, 10)  # small frames: the rules do not depend on the frame size


# ----------------------------------------------------------------------------- the reference


@dataclass
class _Row:
    obs: np.ndarray
    action: int
    reward: float
    term: bool
    add: int
    invalid: bool
    link: bool
    pad: bool = False


@dataclass
class Expected:
    """What a conversion must produce, computed from the raw arrays."""

    observation: list[np.ndarray] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    final_known: list[bool] = field(default_factory=list)
    dropped: int = 0
    rows: int = 0


def load_checkpoint(folder: Path, n: int) -> dict[str, Any]:
    """Every array of checkpoint ``n``, read whole the plain way."""

    def arr(name: str) -> np.ndarray:
        with gzip.open(folder / file_name(name, n), "rb") as f:
            return np.load(f, allow_pickle=False)

    out: dict[str, Any] = {k: arr(STORE_PREFIX + k) for k in ("observation", "action", "reward", "terminal")}
    out["add_count"] = int(arr("add_count"))
    out["invalid_range"] = [int(v) for v in arr("invalid_range").reshape(-1)]
    return out


def reference(folder: Path, numbers: list[int], stack_size: int = 4) -> Expected:
    """The rules of docs/formats.md applied row by row to checkpoints ``numbers`` of ``folder``."""
    cks = [load_checkpoint(folder, n) for n in numbers]
    length = [min(ck["add_count"], len(ck["action"])) for ck in cks]
    # checkpoint i continues checkpoint i - 1 when its adds start at or before the other's end
    cont = [False] + [
        length[i - 1] > 0 and cks[i]["add_count"] - length[i] <= cks[i - 1]["add_count"] < cks[i]["add_count"]
        for i in range(1, len(cks))
    ]
    exp = Expected(rows=sum(length))
    rows: list[_Row] = []
    for i, ck in enumerate(cks):
        c, add, n = len(ck["action"]), ck["add_count"], length[i]
        start = add % c if add >= c else 0
        slots = [(start + p) % c for p in range(n)]
        invalid = [s in set(ck["invalid_range"]) for s in slots]
        if cont[i]:  # the cursor between the two checkpoints is bridged: keep the rows named there
            p = 0
            while p < n and invalid[p]:
                invalid[p] = False
                p += 1
        tail_continued = i + 1 < len(cks) and cont[i + 1]
        if tail_continued:
            p = n - 1
            while p >= 0 and invalid[p]:
                invalid[p] = False
                p -= 1
        skip = cks[i - 1]["add_count"] - (add - n) if cont[i] else 0
        exp.dropped += skip
        for p in range(skip, n):
            s = slots[p]
            rows.append(
                _Row(
                    obs=ck["observation"][s],
                    action=int(ck["action"][s]),
                    reward=float(ck["reward"][s]),
                    term=bool(ck["terminal"][s]),
                    add=add - n + p,
                    invalid=invalid[p],
                    link=p < n - 1 or tail_continued,
                )
            )
    last_terminal: int | None = None
    for k, row in enumerate(rows):
        if k == 0 or not rows[k - 1].link:
            last_terminal = None
        expected_pad = row.add < stack_size - 1 or (
            last_terminal is not None and k - last_terminal <= stack_size - 1
        )
        zero = not row.obs.any() and row.action == 0 and row.reward == 0 and not row.term
        row.pad = expected_pad and zero
        if row.term:
            last_terminal = k

    def is_step(k: int) -> bool:
        r = rows[k]
        has_next = r.link and k + 1 < len(rows) and not rows[k + 1].pad
        return not r.pad and not r.invalid and (r.term or has_next)

    run = 0
    for k, r in enumerate(rows):
        if not is_step(k):
            exp.dropped += 1
            continue
        end = r.term or not is_step(k + 1)
        exp.observation.append(r.obs)
        exp.action.append(r.action)
        exp.reward.append(r.reward)
        exp.terminated.append(r.term)
        exp.truncated.append(end and not r.term)
        run += 1
        if end:
            exp.observation.append(r.obs if r.term else rows[k + 1].obs)
            exp.lengths.append(run)
            exp.final_known.append(not r.term)
            run = 0
    return exp


def check_converted(name: str, exp: Expected, *, action_dtype: str = "int32") -> Any:
    """The dataset ``name`` holds exactly ``exp``, key by key and dtype by dtype."""
    ds = open_dataset(name)
    want = {
        "observation": np.array(exp.observation, np.uint8),
        "action": np.array(exp.action, action_dtype),
        "next/reward": np.array(exp.reward, np.float32)[:, None],
        "next/terminated": np.array(exp.terminated, bool)[:, None],
        "next/truncated": np.array(exp.truncated, bool)[:, None],
    }
    assert set(ds.manifest.fields) == set(want)
    for key, value in want.items():
        got = np.asarray(ds.column(key)[:])
        assert got.dtype == value.dtype and got.shape == value.shape, (key, got.dtype, got.shape, value.shape)
        np.testing.assert_array_equal(got, value, err_msg=key)
    assert ds.episodes["length"].tolist() == exp.lengths
    assert ds.episodes["final_known"].tolist() == exp.final_known
    conv = ds.manifest.conversion
    assert conv["rules"] == "atari-dqn-v1"
    assert conv["source_rows"] == exp.rows and conv["dropped_rows"] == exp.dropped
    assert conv["source_rows"] == ds.num_steps + conv["dropped_rows"]
    assert conv["synthesized_final_observations"] == exp.final_known.count(False)
    return ds


def check_truth(name: str, run: Run) -> np.ndarray:
    """Every stored step of ``name`` is a real env transition of ``run``; returns the env step
    ids stored."""
    ds = open_dataset(name)
    ids = frame_id(np.asarray(ds.column("observation")[:]))
    action = np.asarray(ds.column("action")[:])
    reward = np.asarray(ds.column("next/reward")[:])[:, 0]
    term = np.asarray(ds.column("next/terminated")[:])[:, 0]
    where = run.episode_of()
    stored = []
    for e, ep in enumerate(ds.episodes):
        flat = int(ep["start"]) + e
        n = int(ep["length"])
        for t in range(n):
            i, k = int(ep["start"]) + t, int(ids[flat + t])
            true_ep, pos = where[k]  # a KeyError: a frame no env step made (padding, garbage)
            assert action[i] == run.actions[k] and reward[i] == np.float32(run.rewards[k]), k
            last_of_episode = pos == len(run.episodes[true_ep]) - 1
            assert bool(term[i]) == last_of_episode, (k, t, n)
            nxt = int(ids[flat + t + 1])
            if t == n - 1 and not ep["final_known"]:
                assert last_of_episode and nxt == k  # the last frame, repeated
            else:
                assert nxt == k + 1 and where[nxt][0] == true_ep, (k, nxt)
            stored.append(k)
    assert len(stored) == len(set(stored)), "an env step is stored twice"
    return np.array(stored)


def _converted(path: Path, name: str) -> None:
    download_ok(path, name)
    check = runner.invoke(app, ["inspect", name, "--check"])
    assert check.exit_code == 0 and "check passed" in check.output, check.output


def _lengths(seed: int, count: int, lo: int = 3, hi: int = 40) -> list[int]:
    return np.random.default_rng(seed).integers(lo, hi, size=count).tolist()


class _Agent:
    """Plays episodes of the given lengths into a Dopamine buffer as Dopamine's DQN agent stores
    them, and can stop at any ``add_count`` (mid-episode) and go on later; the truth goes to
    ``run``."""

    def __init__(self, buf: DopamineBuffer, lengths: list[int], seed: int = 0) -> None:
        self.buf, self.run = buf, Run()
        self.rng = np.random.default_rng(seed)
        self.plan = [(e, t, n) for e, n in enumerate(lengths) for t in range(n)]
        self.done = 0

    def play(self, until: int | None = None) -> None:
        while self.done < len(self.plan) and (until is None or int(self.buf.add_count) < until):
            e, t, n = self.plan[self.done]
            step = len(self.run.actions)
            if t == 0:
                self.run.episodes.append(np.array([], np.int64))
            self.run.episodes[e] = np.append(self.run.episodes[e], step)
            action, reward = int(self.rng.integers(0, 18)), float(self.rng.choice([-1.0, 0.0, 1.0]))
            self.run.actions.append(action)
            self.run.rewards.append(reward)
            self.buf.add(tagged_frame(step, SHAPE), action, reward, t == n - 1)
            self.done += 1


@pytest.fixture
def logged(tmp_path: Path) -> tuple[Path, Run]:
    """A run folder whose replay_logs hold 5 logged checkpoints of 100 rows and the final one."""
    logs = tmp_path / "Pong" / "1" / "replay_logs"
    run = write_run(logs, capacity=100, episode_lengths=_lengths(1, 22), obs_shape=SHAPE)
    assert run.checkpoints == [0, 1, 2, 3, 4, 5]
    return logs.parent, run


# ----------------------------------------------------------------------------- conversions


def test_a_logged_run_converts_exactly(logged: tuple[Path, Run]) -> None:
    run_dir, run = logged
    logs = run_dir / "replay_logs"
    assert detect_format(run_dir) == detect_format(logs) == "atari_dqn"
    _converted(run_dir, "pong")
    exp = reference(logs, run.checkpoints)
    ds = check_converted("pong", exp)
    stored = check_truth("pong", run)
    # logged checkpoints tile the adds: episodes continue across 0..4; the final log (add_count
    # set to the cursor by log_final_buffer) does not continue checkpoint 4
    meta = ds.manifest.source["metadata"]["atari_dqn"]["checkpoints"]
    assert [c["continues_previous"] for c in meta] == [False, True, True, True, True, False]
    assert [c["add_count"] for c in meta] == [99, 199, 299, 399, 499, meta[-1]["add_count"]]
    assert meta[0]["invalid_range"] == [98, 99, 0, 1, 2] and meta[-1]["add_count"] < 100
    assert sum(c["steps"] for c in meta) == ds.num_steps
    assert any("between checkpoints 4->5" in note for note in ds.manifest.conversion["notes"])
    # three env steps are lost: checkpoint 4's newest row (in invalid_range, not continued), the
    # row at slot C - 1 that only the final log's buffer held (its add_count leaves it out), and
    # the final log's newest row
    assert len(stored) == len(run.actions) - 3
    # the replay_logs folder itself is the same source (same files, same digest)
    _converted(logs, "pong-logs")
    assert open_dataset("pong-logs").manifest.content_digest == ds.manifest.content_digest


@pytest.mark.parametrize("block_rows", [1, 2, 7, 100])
def test_block_size_does_not_change_the_data(logged: tuple[Path, Run], block_rows: int) -> None:
    run_dir, _ = logged
    convert(run_dir, "whole")
    convert(run_dir, "small", options={"block_rows": block_rows})
    assert open_dataset("small").manifest.content_digest == open_dataset("whole").manifest.content_digest


def test_a_wrapped_buffer_is_rotated_by_its_cursor(tmp_path: Path) -> None:
    """A Dopamine checkpoint saved at add_count ~2.5 x capacity: its oldest row is mid-file."""
    logs = tmp_path / "replay_logs"
    agent = _Agent(buf := DopamineBuffer(120, obs_shape=SHAPE), _lengths(2, 60))
    agent.play(until=300)
    run = agent.run
    buf.save(logs, 7)
    assert 300 <= int(buf.add_count) < 304 and 0 < buf.cursor() < 120
    _converted(logs, "wrapped")
    check_converted("wrapped", reference(logs, [7]))
    stored = check_truth("wrapped", run)
    # exactly the env steps of the last 120 adds, less padding, invalid rows and the cut ends
    assert stored.min() > len(run.actions) - 120 and len(stored) > 80


def test_a_buffer_not_yet_full(tmp_path: Path) -> None:
    """add_count < capacity: rows [0, add_count) only; the never-written slots are not read."""
    logs = tmp_path / "replay_logs"
    agent = _Agent(buf := DopamineBuffer(500, obs_shape=SHAPE), _lengths(3, 8))
    agent.play()
    run = agent.run
    buf.save(logs, 0)
    assert int(buf.add_count) < 500
    _converted(logs, "young")
    ds = check_converted("young", reference(logs, [0]))
    stored = check_truth("young", run)
    # every env step but the last one (the newest row is in invalid_range; Dopamine's last episode
    # ends with a terminal, so the row before it ends truncated)
    assert sorted(stored.tolist()) == list(range(len(run.actions) - 1))
    assert ds.manifest.conversion["dropped_rows"] == 3 * len(run.episodes) + 1


def test_terminals_at_the_cursor_edge_and_padding_across_checkpoints(tmp_path: Path) -> None:
    """The first episode ends exactly on checkpoint 0's newest row (in invalid_range); the next
    episode's zero padding opens checkpoint 1."""
    logs = tmp_path / "replay_logs"
    # 3 padding rows + 16 rows: the terminal is add 18, the newest row of checkpoint 0 (add_count 19)
    run = write_run(logs, capacity=20, episode_lengths=[16, 9, 12, 5], obs_shape=SHAPE, final_buffer=False)
    ck0, ck1 = load_checkpoint(logs, 0), load_checkpoint(logs, 1)
    assert ck0["add_count"] == 19 and ck0["terminal"][18] == 1 and 18 in ck0["invalid_range"]
    assert not ck1["observation"][[19, 0, 1]].any() and ck1["add_count"] == 39  # the padding

    convert(logs, "both", options={"checkpoints": "0:2"})
    ds = check_converted("both", reference(logs, [0, 1]))
    check_truth("both", run)
    assert ds.episodes["length"][0] == 16 and not ds.episodes["final_known"][0]
    assert bool(np.asarray(ds.column("next/terminated")[:])[15, 0])
    # checkpoint 0's initial padding is in its invalid_range (counted there); checkpoint 1 opens
    # with the padding after the terminal, and holds one more episode start
    assert ds.manifest.source["metadata"]["atari_dqn"]["dropped"]["padding"] == 3 + 3

    # checkpoint 0 alone: its newest row (the terminal) is cut by the cursor: the episode ends
    # truncated one row earlier, on the real frame of that row
    convert(logs, "first", options={"checkpoints": [0]})
    ds = check_converted("first", reference(logs, [0]))
    check_truth("first", run)
    assert ds.episodes["length"].tolist() == [15] and ds.episodes["final_known"].tolist() == [True]
    assert np.asarray(ds.column("next/truncated")[:])[-1, 0]


def test_terminal_on_the_oldest_rows_of_a_wrapped_buffer(tmp_path: Path) -> None:
    """Rows placed by hand around the cursor of a wrapped buffer (capacity 16, add_count 40):
    a terminal on the oldest row and on the first row after the invalid ones."""
    c, add = 16, 40
    cursor = add % c
    chron: list[tuple[int | None, int, float, bool]] = []  # (frame id, None: padding), oldest first
    chron.append((100, 3, 1.0, True))  # position 0: the cursor row, a terminal (invalid)
    chron += [(None, 0, 0.0, False)] * 3  # its padding (positions 1..3, invalid too)
    chron.append((104, 5, 0.0, True))  # position 4: a one-step episode
    chron += [(None, 0, 0.0, False)] * 3
    chron += [(108 + i, i, float(i), False) for i in range(7)]  # positions 8..14
    chron.append((115, 2, 0.0, True))  # position 15: the newest row, a terminal (invalid)
    store: dict[str, np.ndarray] = {
        "observation": np.zeros((c, *SHAPE), np.uint8),
        "action": np.zeros(c, np.int32),
        "reward": np.zeros(c, np.float32),
        "terminal": np.zeros(c, np.uint8),
    }
    for p, (k, a, r, t) in enumerate(chron):
        s = (cursor + p) % c
        if k is not None:
            store["observation"][s] = tagged_frame(k, SHAPE)
        store["action"][s], store["reward"][s], store["terminal"][s] = a, r, t
    logs = tmp_path / "replay_logs"
    save_checkpoint(logs, 3, store, np.array(add), invalid_range(cursor, c, 4, 1))
    _converted(logs, "edge")
    ds = check_converted("edge", reference(logs, [3]))
    # the one-step episode (terminated, its next frame unknown), then positions 8..14 cut before
    # the newest row: 7 steps truncated on frame 115, which is real
    assert ds.episodes["length"].tolist() == [1, 7]
    assert ds.episodes["final_known"].tolist() == [False, True]
    ids = frame_id(np.asarray(ds.column("observation")[:]))
    assert ids.tolist() == [104, 104, *range(108, 116)]
    meta = ds.manifest.source["metadata"]["atari_dqn"]
    # positions 0..3 are invalid_range (position 0 is never read: nothing there can matter),
    # 5..7 padding, 15 invalid_range
    assert meta["dropped"] == {"padding": 3, "invalid_range": 5, "no_next_frame": 0, "duplicate": 0}


def test_a_subset_of_checkpoints_and_a_single_file(logged: tuple[Path, Run]) -> None:
    run_dir, run = logged
    logs = run_dir / "replay_logs"
    convert(run_dir, "mid", options={"checkpoints": "1:3"})
    check_converted("mid", reference(logs, [1, 2]))
    check_truth("mid", run)
    convert(run_dir, "gap", options={"checkpoints": "0,2"})  # 0 and 2 do not continue each other
    ds = check_converted("gap", reference(logs, [0, 2]))
    check_truth("gap", run)
    assert not ds.manifest.source["metadata"]["atari_dqn"]["checkpoints"][1]["continues_previous"]
    one = logs / file_name(STORE_PREFIX + "observation", 2)
    assert detect_format(one) == "atari_dqn"
    _converted(one, "two")
    check_converted("two", reference(logs, [2]))
    assert [f["path"] for f in open_dataset("two").manifest.source["files"]] == [
        file_name(n, 2)
        for n in ("$store$_observation", "$store$_action", "$store$_reward", "$store$_terminal")
    ] + [file_name("add_count", 2), file_name("invalid_range", 2)]


def test_overlapping_checkpoints_are_not_stored_twice(tmp_path: Path) -> None:
    """Dopamine's periodic saves of one buffer overlap: the rows a later checkpoint shares with
    the one before are skipped, and episodes continue."""
    logs = tmp_path / "replay_logs"
    agent = _Agent(buf := DopamineBuffer(100, obs_shape=SHAPE), _lengths(4, 40))
    adds = []
    for k, until in enumerate((60, 150, 230, 260)):
        agent.play(until=until)
        buf.save(logs, k)
        adds.append(int(buf.add_count))
    run = agent.run
    convert(logs, "saves")
    exp = reference(logs, [0, 1, 2, 3])
    ds = check_converted("saves", exp)
    stored = check_truth("saves", run)
    meta = ds.manifest.source["metadata"]["atari_dqn"]
    assert [c["continues_previous"] for c in meta["checkpoints"]] == [False, True, True, True]
    first = [a - min(a, 100) for a in adds]
    assert meta["dropped"]["duplicate"] == sum(adds[i - 1] - first[i] for i in range(1, 4))
    # every env step but the newest (in invalid_range, at the end of the data): nothing lost at the
    # three junctions, nothing twice
    assert sorted(stored.tolist()) == list(range(len(run.actions) - 1))


def test_a_buffer_without_padding_needs_stack_size_1(tmp_path: Path) -> None:
    logs = tmp_path / "replay_logs"
    agent = _Agent(buf := DopamineBuffer(200, obs_shape=SHAPE, stack_size=1), _lengths(6, 10))
    agent.play()
    run = agent.run
    buf.save(logs, 0)
    convert(logs, "k1", options={"stack_size": 1})
    check_converted("k1", reference(logs, [0], stack_size=1))
    check_truth("k1", run)
    convert(logs, "k4")  # the default (4) expects padding the buffer does not have: kept, and said
    ds = check_converted("k4", reference(logs, [0], stack_size=4))
    assert any("hold data and were kept" in n for n in ds.manifest.conversion["notes"])


# ----------------------------------------------------------------------------- bad input


def _small_run(tmp_path: Path) -> Path:
    logs = tmp_path / "Breakout" / "2" / "replay_logs"
    run = write_run(logs, capacity=30, episode_lengths=[20, 15, 25, 10], obs_shape=SHAPE)
    assert run.checkpoints == [0, 1, 2]
    return logs


@pytest.mark.parametrize("name", ["$store$_reward", "add_count", "invalid_range"])
def test_a_missing_file_of_a_checkpoint(tmp_path: Path, name: str) -> None:
    logs = _small_run(tmp_path)
    (logs / file_name(name, 1)).unlink()
    _refused(download(logs.parent, "x"), "checkpoint 1 lacks", file_name(name, 1))


def test_arrays_of_different_lengths(tmp_path: Path) -> None:
    logs = _small_run(tmp_path)
    save_array(logs / file_name("$store$_action", 0), np.zeros(29, np.int32))
    _refused(download(logs, "x"), file_name("$store$_action", 0), "29 rows", "30", "different lengths")


def test_a_truncated_gzip_file(tmp_path: Path) -> None:
    logs = _small_run(tmp_path)
    path = logs / file_name("$store$_observation", 1)
    path.write_bytes(path.read_bytes()[:-300])
    _refused(download(logs, "x"), str(path), "truncated")


def test_a_multi_member_gzip_file_reads_as_the_single_member_one(tmp_path: Path) -> None:
    """Recompressed in two members (what block-parallel gzip tools write): the trailer holds the
    last member's length only, and the file was refused as 'truncated or damaged'."""
    import gzip

    logs = _small_run(tmp_path)
    assert download(logs, "one").exit_code == 0
    path = logs / file_name("$store$_observation", 1)
    raw = gzip.decompress(path.read_bytes())
    zeros = b"\0" * 1000  # padding between and after members, which gzip reads past
    path.write_bytes(
        gzip.compress(raw[: len(raw) // 3]) + zeros + gzip.compress(raw[len(raw) // 3 :]) + zeros
    )
    assert download(logs, "two").exit_code == 0
    one, two = open_dataset("one"), open_dataset("two")
    np.testing.assert_array_equal(
        np.asarray(one.column("observation")[:]), np.asarray(two.column("observation")[:])
    )
    path.write_bytes(path.read_bytes()[: -len(zeros) - 10])  # cut short: refused, by the stream
    _refused(download(logs, "x"), str(path), "truncated", published=["one", "two"])


def test_a_damaged_byte_midway_fails_while_reading(tmp_path: Path) -> None:
    """Damage the trailer's length check cannot see: zlib's CRC check names the file."""
    logs = _small_run(tmp_path)
    path = logs / file_name("$store$_observation", 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    _refused(download(logs, "x"), str(path))


def test_a_file_that_is_not_gzip(tmp_path: Path) -> None:
    logs = _small_run(tmp_path)
    path = logs / file_name("$store$_terminal", 0)
    np.save(path.with_suffix(".npy"), np.zeros(30, np.uint8))
    path.with_suffix(".npy").rename(path)  # a plain .npy under the .gz name
    _refused(download(logs, "x"), str(path), "not a gzip'd .npy file")


def test_a_gzip_that_holds_no_npy(tmp_path: Path) -> None:
    """add_count pickled instead of saved with np.save: refused, never unpickled."""
    logs = _small_run(tmp_path)
    path = logs / file_name("add_count", 0)
    with gzip.open(path, "wb") as f:
        pickle.dump(99, f)
    line = _refused(download(logs, "x"), str(path), "not a gzip'd .npy file")
    assert "magic string" in line


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("$store$_observation", np.zeros((30, 12, 10), np.float32), "Atari DQN frames are uint8"),
        ("$store$_observation", np.zeros((30, 120), np.uint8), "Atari DQN frames are uint8"),
        ("$store$_action", np.zeros((30, 2), np.int32), "one value per row"),
        ("$store$_action", np.zeros(30, np.float32), "one value per row"),
        ("$store$_terminal", np.array(["x"] * 30), "one value per row"),
        ("add_count", np.array([1, 2]), "at most 1 value"),
        ("add_count", np.array(-4), "integer >= 0"),
        ("add_count", np.array(2.5), "integer >= 0"),
        ("invalid_range", np.array([3, 30]), "not a list of slots 0 .. 29"),
    ],
)
def test_wrong_dtype_or_shape(tmp_path: Path, name: str, value: np.ndarray, needle: str) -> None:
    logs = _small_run(tmp_path)
    path = logs / file_name(name, 1)
    save_array(path, value)
    _refused(download(logs, "x"), str(path), needle)


def test_checkpoints_of_different_frame_sizes(tmp_path: Path) -> None:
    logs = _small_run(tmp_path)
    ck = load_checkpoint(logs, 1)
    ck["observation"] = np.zeros((30, 8, 8), np.uint8)
    save_checkpoint(logs, 1, ck, ck["add_count"], np.array(ck["invalid_range"]))
    _refused(download(logs, "x"), "checkpoint 1 holds frames (8, 8)", "checkpoint 0 frames (12, 10)")


def test_a_decompression_bomb_is_refused_before_reading(tmp_path: Path) -> None:
    """A checkpoint declaring 80 MB of frames in a 80 KB file (the ratio rule of untrusted input)."""
    logs = tmp_path / "replay_logs"
    c = 10_000
    store: dict[str, np.ndarray] = {
        "observation": np.zeros((c, 84, 96), np.uint8),
        "action": np.zeros(c, np.int32),
        "reward": np.zeros(c, np.float32),
        "terminal": np.zeros(c, np.uint8),
    }
    save_checkpoint(logs, 0, store, np.array(c), invalid_range(0, c, 4, 1), compresslevel=1)
    _refused(download(logs, "x"), file_name("$store$_observation", 0), "decompression bomb")


def test_bad_options(logged: tuple[Path, Run]) -> None:
    run_dir, _ = logged
    for spec in ("3:1", "a:b", [1.5], "x"):
        with pytest.raises(SourceError, match="checkpoints="):
            convert(run_dir, "o", options={"checkpoints": spec})
    with pytest.raises(SourceFormatError, match=r"no checkpoint \[9\]"):
        convert(run_dir, "o", options={"checkpoints": [4, 9]})
    with pytest.raises(SourceFormatError, match="no checkpoint to convert"):
        convert(run_dir, "o", options={"checkpoints": "40:"})
    with pytest.raises(SourceError, match="stack_size"):
        convert(run_dir, "o", options={"stack_size": 0})
    with pytest.raises(SourceError, match="'checkpoint' does not apply to the atari_dqn format"):
        convert(run_dir, "o", options={"checkpoint": "1:2"})  # a typo is refused, not ignored


def test_other_folders_are_not_detected(tmp_path: Path) -> None:
    from rlds_cli.formats.atari_dqn.plan import sniff

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "observation_ckpt.0.gz").write_bytes(b"x")  # no $store$_ prefix
    (tmp_path / "a" / "notes.gz").write_bytes(b"x")
    assert not sniff(tmp_path / "a") and not sniff(tmp_path / "a" / "notes.gz")
    assert not sniff(tmp_path / "missing") and not sniff(tmp_path)


# ----------------------------------------------------------------------------- memory


_CAPPED = """
import resource, sys
cap = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from rlds_cli.sources.convert import convert
m = convert(sys.argv[1], "big", root=sys.argv[2], backend="zarr").manifest
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmPeak"))
print(m.num_steps, m.num_episodes, peak * 1024)
"""


def _constant_checkpoint(logs: Path, rows: int, add_count: int, frame: tuple[int, ...]) -> int:
    """A checkpoint of constant frames, the observation file written row block by row block
    through ``gzip.GzipFile`` (the bytes ``np.save`` writes, without the array in memory)."""
    logs.mkdir(parents=True, exist_ok=True)
    header = {"descr": "|u1", "fortran_order": False, "shape": (rows, *frame)}
    block = np.full((4096, *frame), 7, np.uint8)
    with (
        open(logs / file_name("$store$_observation", 0), "wb") as f,
        gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1) as out,
    ):
        np.lib.format.write_array_header_1_0(out, header)
        for lo in range(0, rows, len(block)):
            out.write(block[: min(len(block), rows - lo)].tobytes())
    terminal = np.zeros(rows, np.uint8)
    terminal[::5000] = 1
    cursor = add_count % rows
    for name, value in (
        ("$store$_action", np.ones(rows, np.int32)),
        ("$store$_reward", np.ones(rows, np.float32)),
        ("$store$_terminal", terminal),
        ("add_count", np.array(add_count)),
        ("invalid_range", invalid_range(cursor, rows, 4, 1)),
    ):
        save_array(logs / file_name(name, 0), value, compresslevel=1)
    return rows * int(np.prod(frame))


@pytest.mark.slow
def test_memory_stays_bounded_under_an_address_space_cap(tmp_path: Path) -> None:
    """1.34 GB of decoded frames, rotated (two passes over the file), converted under a 900 MB
    address-space cap: reading the observation file whole could not fit."""
    logs = tmp_path / "replay_logs"
    rows, cap = 190_000, 900 << 20
    cursor = rows // 3
    decoded = _constant_checkpoint(logs, rows, add_count=2 * rows + cursor, frame=(84, 84))
    assert decoded > 1.4 * cap
    env = {**os.environ, "RLDS_SOURCE_MAX_RATIO": "100000", "MALLOC_ARENA_MAX": "1"}  # see test_vd4rl
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CAPPED), str(logs), str(tmp_path / "home"), str(cap)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    steps, episodes, peak = (int(v) for v in out.stdout.split())
    assert peak < cap, peak
    # dropped: the 5 invalid_range rows (4 at the oldest end, 1 at the newest); one episode per
    # terminal outside them, and the last one cut before the newest row
    positions = (np.arange(0, rows, 5000) - cursor) % rows
    assert steps == rows - 5
    assert episodes == int(np.count_nonzero((positions > 3) & (positions < rows - 1))) + 1
    meta = json.loads((tmp_path / "home" / "datasets" / "big" / "manifest.json").read_text())
    assert meta["conversion"]["source_rows"] == rows and meta["conversion"]["dropped_rows"] == 5


def test_a_tar_of_the_run_folder(logged: tuple[Path, Run], tmp_path: Path) -> None:
    run_dir, _ = logged
    archive = tmp_path / "pong-1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(run_dir, arcname="1")  # <run>/replay_logs/...
    _converted(archive, "packed")
    convert(run_dir, "plain")
    packed, plain = open_dataset("packed").manifest, open_dataset("plain").manifest
    assert packed.content_digest == plain.content_digest


# ----------------------------------------------------------------------------- registry


def test_registry_file_is_generated_and_matches_torchrl(tmp_path: Path) -> None:
    """scripts/gen_registry.py --family atari_dqn writes TorchRL's
    ``AtariDQNExperienceReplay.available_datasets``
    as ids (the committed registry/atari_dqn.toml is its output), each a file set that expands
    to the six files of checkpoints 0..50 under Dopamine's names."""
    import urllib.parse

    from rlds_cli.catalog import registry

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "atari_dqn.toml"
    script = repo / "scripts" / "gen_registry.py"
    subprocess.run([sys.executable, str(script), "--family", "atari_dqn", "--out", str(tmp_path)], check=True)
    assert out.read_text() == (repo / "registry" / "atari_dqn.toml").read_text()
    registry._load.cache_clear()
    entries = [e for e in registry.entries() if e.format == "atari_dqn"]
    assert len(entries) == 250
    for e in entries[:: len(entries) // 7]:
        game_run = e.id.removeprefix("atari_dqn/")
        assert e.extra["url_status"] == "constructed" and e.extra["ids"]["torchrl"] == game_run
        assert [f.name for f in e.files] == [
            f"replay_logs/{name}_ckpt.{n}.gz"
            for n in range(51)
            for name in (
                *(STORE_PREFIX + a for a in ("observation", "action", "reward", "terminal")),
                "add_count",
                "invalid_range",
            )
        ]
        for f in e.files:
            (url,) = f.urls
            assert f.sha256 is None and f.size is None and "$" not in url
            path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
            assert path == f"/atari-replay-datasets/dqn/{game_run}/{f.name}", url
    torchrl_datasets = pytest.importorskip("torchrl.data.datasets")
    assert {e.id for e in entries} == {
        f"atari_dqn/{i}" for i in torchrl_datasets.AtariDQNExperienceReplay.available_datasets
    }
