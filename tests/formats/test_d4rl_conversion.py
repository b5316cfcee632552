"""The D4RL conversion rules (see the docstring of :mod:`rlds_cli.formats.d4rl`).

Hand-written files with exact expected values, a property test against an independent
row-by-row reference implementation, streaming equivalence over tiny block sizes, broken
files, metadata, determinism, reuse, and the bundled demo file.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from rlds_cli.cache import CacheRoot, Dataset, DatasetBuilder, open_dataset
from rlds_cli.errors import (
    DatasetExistsError,
    SourceFormatError,
    SourceNotFoundError,
    UnknownFormatError,
)
from rlds_cli.formats.d4rl import D4RLReader
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import golden_column, golden_three_episodes, write_d4rl

REPO = Path(__file__).resolve().parents[2]
BLOCK_SIZES = (1, 2, 3, 7)


# ----------------------------------------------------------------------------- helpers


def _all(ds: Dataset) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in ds[:].items()}


def _tree_bytes(directory: Path) -> dict[str, bytes]:
    """Every data file of a dataset (arrays and the episode index), by relative path."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            out[path.relative_to(directory).as_posix()] = path.read_bytes()
    return out


def _obs(n: int, dim: int = 2) -> np.ndarray:
    """Row i is [i, 10 i, ...]: every row different."""
    return (np.arange(n)[:, None] * (10.0 ** np.arange(dim))[None, :]).astype(np.float32)


def _simple(
    path: Path,
    *,
    n: int,
    terminals: list[int] = (),  # type: ignore[assignment]
    timeouts: list[int] | None = (),  # type: ignore[assignment]
    next_observations: np.ndarray | None = None,
    **kwargs: Any,
) -> Path:
    term = np.zeros(n, bool)
    term[list(terminals)] = True
    tout = None
    if timeouts is not None:
        tout = np.zeros(n, bool)
        tout[list(timeouts)] = True
    return write_d4rl(
        path,
        observations=_obs(n),
        actions=np.arange(n, dtype=np.float32)[:, None],
        rewards=np.arange(n, dtype=np.float32) + 1,
        terminals=term,
        timeouts=tout,
        next_observations=next_observations,
        **kwargs,
    )


# ----------------------------------------------------------------------------- the rules, by hand


def test_without_next_timeout_terminal_and_file_end(tmp_path: Path) -> None:
    """The golden file: the three ways an episode ends, without next_observations."""
    source = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    convert(source, "g")
    ds = open_dataset("g")
    b = _all(ds)
    # terminal end (rows 0-2): row 2 kept, final obs repeats obs[2], final_known False
    assert b["observation"][:3].tolist() == [[0, 0], [1, 10], [2, 20]]
    assert b["next/observation"][:3].tolist() == [[1, 10], [2, 20], [2, 20]]
    assert b["next/terminated"][:3, 0].tolist() == [False, False, True]
    # timeout end (rows 3-5): row 5 dropped, its observation is step 4's next observation
    assert b["observation"][3:5].tolist() == [[3, 30], [4, 40]]
    assert b["next/observation"][3:5].tolist() == [[4, 40], [5, 50]]
    assert b["next/reward"][3:5, 0].tolist() == [4, 5]
    assert b["next/truncated"][3:5, 0].tolist() == [False, True]
    # end of file (rows 6-7): row 7 dropped, truncated
    assert b["observation"][5:].tolist() == [[6, 60]]
    assert b["next/observation"][5:].tolist() == [[7, 70]]
    assert b["next/truncated"][5:, 0].tolist() == [True]
    assert b["next/terminated"][5:, 0].tolist() == [False]
    assert ds.episodes["final_known"].tolist() == [False, True, True]
    assert ds.episodes["length"].tolist() == [3, 2, 1]
    c = ds.manifest.conversion
    assert (c["dropped_rows"], c["dropped_episodes"], c["synthesized_final_observations"]) == (2, 0, 1)


def test_with_next_every_row_kept(tmp_path: Path) -> None:
    source = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    convert(source, "g")
    ds = open_dataset("g")
    b = _all(ds)
    assert ds.num_steps == 8
    assert b["action"][:, 0].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert b["next/observation"].tolist() == [
        [1, 10],
        [2, 20],
        [102, 0],
        [4, 40],
        [5, 50],
        [105, 0],
        [7, 70],
        [107, 0],
    ]
    assert b["next/terminated"][:, 0].tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 0, 0, 0, 1, 0, 1]
    assert ds.episodes["final_known"].tolist() == [True, True, True]
    assert ds.manifest.conversion["dropped_rows"] == 0


def test_one_row_timeout_episode_is_dropped_and_counted(tmp_path: Path) -> None:
    # rows: 0-1 (timeout at 1), 2 (timeout at 2: one row), 3-5 (terminal at 5), 6 (timeout)
    path = _simple(tmp_path / "f.hdf5", n=7, terminals=[5], timeouts=[1, 2, 6])
    convert(path, "f")
    ds = open_dataset("f")
    b = _all(ds)
    assert ds.num_episodes == 2
    assert b["observation"].tolist() == [[0, 0], [3, 30], [4, 40], [5, 50]]
    assert b["next/observation"].tolist() == [[1, 10], [4, 40], [5, 50], [5, 50]]
    assert b["action"][:, 0].tolist() == [0, 3, 4, 5]
    assert b["next/reward"][:, 0].tolist() == [1, 4, 5, 6]
    assert b["next/terminated"][:, 0].tolist() == [False, False, False, True]
    assert b["next/truncated"][:, 0].tolist() == [True, False, False, False]
    assert b["episode"].tolist() == [0, 1, 1, 1]
    assert ds.episodes["start"].tolist() == [0, 1]
    assert ds.episodes["length"].tolist() == [1, 3]
    assert ds.episodes["final_known"].tolist() == [True, False]
    c = ds.manifest.conversion
    assert c["source_rows"] == 7
    assert c["dropped_rows"] == 3  # rows 1, 2, 6
    assert c["dropped_episodes"] == 2  # the one-row episodes at rows 2 and 6
    assert c["synthesized_final_observations"] == 1
    # with next_observations nothing is dropped
    nxt = np.concatenate([_obs(7)[1:], [[70, 70]]]).astype(np.float32)
    nxt[[1, 2, 5]] += 0.5
    path2 = _simple(tmp_path / "g.hdf5", n=7, terminals=[5], timeouts=[1, 2, 6], next_observations=nxt)
    convert(path2, "g")
    g = open_dataset("g")
    assert g.num_steps == 7
    assert g.episodes["length"].tolist() == [2, 1, 3, 1]
    assert g.manifest.conversion["dropped_episodes"] == 0


def test_terminal_and_timeout_on_the_same_row(tmp_path: Path) -> None:
    for with_next in (False, True):
        nxt = np.concatenate([_obs(4)[1:], [[9, 9]]]).astype(np.float32) if with_next else None
        path = _simple(
            tmp_path / f"f{with_next}.hdf5", n=4, terminals=[1], timeouts=[1], next_observations=nxt
        )
        convert(path, f"f{with_next}")
        b = _all(open_dataset(f"f{with_next}"))
        # the terminal row is kept either way and flagged both terminated and truncated
        assert b["next/terminated"][:, 0].tolist()[:2] == [False, True]
        assert b["next/truncated"][:, 0].tolist()[:2] == [False, True]
        assert b["next/done"][:, 0].tolist()[:2] == [False, True]


def test_unflagged_reset_becomes_an_inferred_boundary(tmp_path: Path) -> None:
    n = 7
    obs = _obs(n)
    nxt = np.concatenate([obs[1:], [[99, 99]]]).astype(np.float32)
    nxt[2] = [50, 50]  # unflagged reset after row 2 (antmaze v0 style)
    nxt[4] = [60, 60]  # another one after row 4
    path = _simple(tmp_path / "f.hdf5", n=n, terminals=[], timeouts=[5], next_observations=nxt)
    convert(path, "f")
    ds = open_dataset("f")
    b = _all(ds)
    assert ds.episodes["start"].tolist() == [0, 3, 5, 6]
    assert ds.episodes["length"].tolist() == [3, 2, 1, 1]
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 1, 0, 1, 1, 1]
    assert b["next/terminated"][:, 0].tolist() == [0] * 7
    assert b["next/observation"].tolist() == [
        [1, 10],
        [2, 20],
        [50, 50],
        [4, 40],
        [60, 60],
        [6, 60],
        [99, 99],
    ]
    assert ds.manifest.conversion["inferred_boundaries"] == 2
    # a flagged end where next_observations differs is NOT counted as inferred
    assert ds.manifest.conversion["notes"] == []


def test_nan_observations_are_continuous(tmp_path: Path) -> None:
    obs = _obs(4)
    obs[2, 1] = np.nan
    nxt = np.concatenate([obs[1:], [[7, 7]]]).astype(np.float32)
    path = write_d4rl(
        tmp_path / "f.hdf5",
        observations=obs,
        actions=np.zeros((4, 1), np.float32),
        rewards=np.zeros(4, np.float32),
        terminals=np.zeros(4, bool),
        timeouts=np.zeros(4, bool),
        next_observations=nxt,
    )
    convert(path, "f")
    ds = open_dataset("f")
    assert ds.num_episodes == 1
    assert ds.manifest.conversion["inferred_boundaries"] == 0


@pytest.mark.parametrize("timeouts", [[], None], ids=["timeouts", "no_timeouts"])
def test_one_row_file_with_next_observations(tmp_path: Path, timeouts: list[int] | None) -> None:
    # regression: the continuity check compared empty slices and crashed on a 1-row block
    path = _simple(
        tmp_path / "f.hdf5", n=1, timeouts=timeouts, next_observations=np.array([[5, 5]], np.float32)
    )
    convert(path, "f")
    b = _all(open_dataset("f"))
    assert b["observation"].tolist() == [[0, 0]]
    assert b["next/observation"].tolist() == [[5, 5]]
    assert b["next/truncated"].tolist() == [[True]]


def test_last_block_of_one_row_with_next_observations(tmp_path: Path) -> None:
    n = 7
    nxt = np.concatenate([_obs(n)[1:], [[70, 70]]]).astype(np.float32)
    path = _simple(tmp_path / "f.hdf5", n=n, timeouts=[3], next_observations=nxt)
    convert(path, "a", options={"block_rows": 3})  # blocks of 3, 3 and 1 rows
    convert(path, "b")
    assert _all(open_dataset("a")).keys() == _all(open_dataset("b")).keys()
    for key, value in _all(open_dataset("b")).items():
        np.testing.assert_array_equal(_all(open_dataset("a"))[key], value, err_msg=key)
    assert open_dataset("a").episodes["length"].tolist() == [4, 3]


def test_one_row_file_without_next_observations_has_no_transition(tmp_path: Path) -> None:
    from rlds_cli.errors import SourceFormatError

    path = _simple(tmp_path / "f.hdf5", n=1)
    # the only row ends the file, so its next observation is unknown and it is dropped
    with pytest.raises(SourceFormatError, match="no complete transition"):
        convert(path, "f")
    assert not CacheRoot().exists("f")
    assert list(CacheRoot().tmp_dir.iterdir()) == []
    # a terminal row is kept
    convert(_simple(tmp_path / "g.hdf5", n=1, terminals=[0]), "g")
    assert open_dataset("g")[:]["next/observation"].tolist() == [[0, 0]]


# ----------------------------------------------------------------------------- reference + property


def reference_convert(
    obs: np.ndarray,
    act: np.ndarray,
    rew: np.ndarray,
    term: np.ndarray,
    tout: np.ndarray | None,
    nxt: np.ndarray | None,
    max_episode_steps: int | None = None,
) -> dict[str, Any]:
    """The D4RL rules, one row at a time, written independently of the library."""
    n = len(obs)
    term = [bool(x) for x in np.asarray(term).reshape(-1)]
    tout_l = [False] * n if tout is None else [bool(x) for x in np.asarray(tout).reshape(-1)]
    # 1. where episodes end (source rows)
    ends, inferred, t = [], 0, 0
    for i in range(n):
        end = term[i] or tout_l[i]
        if not end:
            if nxt is not None:
                if i + 1 < n and not np.array_equal(nxt[i], obs[i + 1], equal_nan=True):
                    end, inferred = True, inferred + 1
            elif tout is None and t == max_episode_steps - 1:
                end, inferred = True, inferred + 1
        if i == n - 1:
            end = True
        t = 0 if end else t + 1
        if end:
            ends.append(i)
    # 2. the transitions of each episode
    cols: dict[str, list[Any]] = {
        k: []
        for k in ("observation", "next/observation", "action", "next/reward", "term", "trunc", "episode")
    }
    episodes: list[tuple[int, int, bool]] = []
    source_starts = []
    dropped_rows = dropped_episodes = synthesized = 0
    s = 0
    for e in ends:
        source_starts.append(s)
        rows: list[tuple[int, Any, bool, bool]] = []  # (row, next obs, terminated, truncated)
        known = True
        if nxt is not None:
            for i in range(s, e + 1):
                last = i == e
                rows.append((i, nxt[i], term[i], last and (tout_l[i] or not term[i])))
        elif term[e]:
            for i in range(s, e):
                rows.append((i, obs[i + 1], False, False))
            rows.append((e, obs[e], True, tout_l[e]))
            known = False
            synthesized += 1
        else:
            dropped_rows += 1
            if e == s:
                dropped_episodes += 1
            for i in range(s, e):
                rows.append((i, obs[i + 1], False, i == e - 1))
        if rows:
            ep = len(episodes)
            episodes.append((len(cols["action"]), len(rows), known))
            for i, next_obs, te, tr in rows:
                cols["observation"].append(obs[i])
                cols["next/observation"].append(next_obs)
                cols["action"].append(act[i])
                cols["next/reward"].append(np.asarray(rew[i]).reshape(1))
                cols["term"].append([te])
                cols["trunc"].append([tr])
                cols["episode"].append(ep)
        s = e + 1
    return {
        "columns": cols,
        "episodes": episodes,
        "source_starts": source_starts,
        "source_ends": ends,
        "report": {
            "source_rows": n,
            "dropped_rows": dropped_rows,
            "dropped_episodes": dropped_episodes,
            "synthesized_final_observations": synthesized,
            "inferred_boundaries": inferred,
        },
    }


def _random_file(path: Path, seed: int, mode: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A random D4RL file. ``mode``: ``timeouts`` / ``next`` / ``next_no_timeouts`` /
    ``max_steps`` (no timeouts, no next_observations)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    obs = np.stack([np.arange(n), np.full(n, seed), rng.integers(0, 5, n)], axis=1).astype(np.float32)
    act = rng.standard_normal((n, 2)).astype(np.float32)
    rew = rng.standard_normal(n).astype(np.float32)
    p_term, p_tout = rng.uniform(0, 0.3), rng.uniform(0, 0.4)
    term = rng.random(n) < p_term
    tout = rng.random(n) < p_tout
    if rng.random() < 0.3:  # runs of one-row timeout episodes
        tout[rng.integers(0, n, 3)] = True
    nxt = None
    exempt_rows: set[int] = set()
    if mode in ("next", "next_no_timeouts"):
        nxt = np.concatenate([obs[1:], obs[-1:]]).copy()
        ended = term | tout if mode == "next" else term
        resets = rng.random(n) < rng.uniform(0, 0.2)
        for i in range(n):
            if ended[i] or resets[i] or i == n - 1:
                nxt[i] = [-1 - i, seed, 0.5]  # never any row's observation
        if rng.random() < 0.3 and n > 1:
            # a flagged end whose next observation continues anyway is still an end (the
            # file itself then says the next observation is the next row's: not checked below)
            nxt[0] = obs[1]
            exempt_rows.add(0)
    tout_written = None if mode in ("next_no_timeouts", "max_steps") else tout
    shaped = rng.random() < 0.3
    kwargs = {
        "observations": obs,
        "actions": act,
        "rewards": rew[:, None] if shaped else rew,
        "terminals": (term[:, None] if shaped else term).astype(rng.choice([bool, np.float32, np.uint8])),
        "timeouts": tout_written,
        "next_observations": nxt,
    }
    options: dict[str, Any] = {}
    if mode == "max_steps":
        options["max_episode_steps"] = int(rng.integers(2, 8))
    if rng.random() < 0.5:
        options["block_rows"] = int(rng.choice([1, 2, 3, 5, 7, 11]))
    write_d4rl(path, **kwargs)
    ref = reference_convert(
        obs, act, rew, term, tout_written, nxt, max_episode_steps=options.get("max_episode_steps")
    )
    ref["exempt_rows"] = exempt_rows
    return path, ref, options


MODES = ("timeouts", "next", "next_no_timeouts", "max_steps")


@pytest.mark.parametrize("mode", MODES)
def test_random_files_match_the_reference(tmp_path: Path, mode: str) -> None:
    checked = 0
    for seed in range(40):
        path, ref, options = _random_file(tmp_path / f"r{seed}.hdf5", seed, mode)
        name = f"r{seed}"
        cols = ref["columns"]
        if not cols["action"]:  # nothing kept: the builder refuses an empty dataset
            from rlds_cli.errors import ConversionError

            with pytest.raises(ConversionError):
                convert(path, name, options=options)
            assert not CacheRoot().exists(name)
            continue
        convert(path, name, options=options)
        ds = open_dataset(name)
        b = _all(ds)
        ctx = f"seed={seed} mode={mode} options={options}"
        np.testing.assert_array_equal(b["observation"], np.array(cols["observation"]), err_msg=ctx)
        np.testing.assert_array_equal(b["next/observation"], np.array(cols["next/observation"]), err_msg=ctx)
        np.testing.assert_array_equal(b["action"], np.array(cols["action"]), err_msg=ctx)
        np.testing.assert_array_equal(b["next/reward"], np.array(cols["next/reward"]), err_msg=ctx)
        np.testing.assert_array_equal(b["next/terminated"], np.array(cols["term"], bool), err_msg=ctx)
        np.testing.assert_array_equal(b["next/truncated"], np.array(cols["trunc"], bool), err_msg=ctx)
        np.testing.assert_array_equal(
            b["next/done"], np.array(cols["term"], bool) | np.array(cols["trunc"], bool), err_msg=ctx
        )
        np.testing.assert_array_equal(b["episode"], np.array(cols["episode"]), err_msg=ctx)
        assert ds.episodes[["start", "length", "final_known"]].tolist() == ref["episodes"], ctx
        conv = ds.manifest.conversion
        assert {k: conv[k] for k in ref["report"]} == ref["report"], ctx

        # The property: no transition's next observation is the first observation of another
        # (source) episode, and next/done is exactly the last step of each episode.
        firsts = {i: obs_row for i, obs_row in enumerate(_source_first_obs(path, ref["source_starts"]))}
        source_episode_of_step = _source_episode_of_steps(ref)
        for t in range(ds.num_steps):
            if int(b["observation"][t, 0]) in ref["exempt_rows"]:
                continue
            own = source_episode_of_step[t]
            for j, first in firsts.items():
                if j != own:
                    assert not np.array_equal(b["next/observation"][t], first), (ctx, t, j)
        last_steps = ds.episodes["start"] + ds.episodes["length"] - 1
        assert np.flatnonzero(b["next/done"][:, 0]).tolist() == last_steps.tolist(), ctx
        checked += 1
    assert checked >= 30


def _source_first_obs(path: Path, starts: list[int]) -> list[np.ndarray]:
    with h5py.File(path, "r") as f:
        obs = f["observations"][()]
    return [obs[s] for s in starts]


def _source_episode_of_steps(ref: dict[str, Any]) -> list[int]:
    """For each converted step, the number of the source episode its row came from."""
    out = []
    rows_in = [
        (s, e) for s, e in zip(ref["source_starts"], ref["source_ends"], strict=True)
    ]  # source episode spans
    obs_rows = [int(o[0]) for o in ref["columns"]["observation"]]  # observation[0] is the row
    for row in obs_rows:
        out.append(next(j for j, (s, e) in enumerate(rows_in) if s <= row <= e))
    return out


# ----------------------------------------------------------------------------- streaming


def _streaming_file(path: Path, *, with_next: bool) -> Path:
    rng = np.random.default_rng(3)
    n = 97
    obs = rng.standard_normal((n, 3)).astype(np.float32)
    term = np.zeros(n, bool)
    tout = np.zeros(n, bool)
    term[[4, 5, 30, 61]] = True
    tout[[0, 9, 10, 11, 20, 44, 45, 70, 96]] = True
    nxt = None
    if with_next:
        nxt = np.concatenate([obs[1:], obs[-1:]]).copy()
        nxt[[4, 5, 30, 61, 0, 9, 10, 11, 20, 44, 45, 70, 96, 50, 51]] += 100.0  # 50, 51: resets
    return write_d4rl(
        path,
        observations=obs,
        actions=rng.standard_normal((n, 2)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=term,
        timeouts=tout,
        next_observations=nxt,
        infos={"qpos": rng.standard_normal((n, 4)).astype(np.float32)},
    )


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
@pytest.mark.parametrize("with_next", [False, True], ids=["no_next", "with_next"])
def test_tiny_blocks_give_byte_identical_arrays(tmp_path: Path, backend: str, with_next: bool) -> None:
    path = _streaming_file(tmp_path / "s.hdf5", with_next=with_next)
    convert(path, "default", backend=backend)
    reference = open_dataset("default")
    ref_bytes = _tree_bytes(reference.directory)
    assert "episodes.npy" in ref_bytes
    for k in BLOCK_SIZES:
        convert(path, f"b{k}", backend=backend, options={"block_rows": k})
        ds = open_dataset(f"b{k}")
        assert _tree_bytes(ds.directory) == ref_bytes, f"block_rows={k}"
        # the report does not depend on the block size either
        assert ds.manifest.conversion == reference.manifest.conversion, f"block_rows={k}"
        assert ds.manifest.source["options"] == {"block_rows": k}


def test_reader_blocks_respect_block_rows_and_feed_a_builder(tmp_path: Path) -> None:
    path = _streaming_file(tmp_path / "s.hdf5", with_next=True)
    convert(path, "default")
    with D4RLReader(path, block_rows=7) as reader:
        assert reader.total_rows() == 97
        seen: list[int] = []
        with DatasetBuilder("manual") as builder:
            for block in reader.blocks(seen.append):
                assert block.num_steps <= 7
                builder.append(block)
            builder.commit(conversion=reader.report.to_dict())
        assert seen == [7] * 13 + [6]
    assert _tree_bytes(open_dataset("manual").directory) == _tree_bytes(open_dataset("default").directory)


def test_default_block_rows_are_bounded(tmp_path: Path) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    with D4RLReader(path) as reader:
        assert 1024 <= reader.block_rows <= 1 << 18


# ----------------------------------------------------------------------------- no timeouts


def test_no_timeouts_with_next_uses_continuity(tmp_path: Path) -> None:
    n = 6
    obs = _obs(n)
    nxt = np.concatenate([obs[1:], [[70, 70]]]).astype(np.float32)
    nxt[2] = [50, 50]  # reset after row 2
    nxt[4] = [55, 55]  # terminal row 4 (its next observation differs too)
    path = _simple(tmp_path / "f.hdf5", n=n, terminals=[4], timeouts=None, next_observations=nxt)
    convert(path, "f")
    ds = open_dataset("f")
    b = _all(ds)
    assert ds.episodes["start"].tolist() == [0, 3, 5]
    assert ds.episodes["length"].tolist() == [3, 2, 1]
    assert b["next/terminated"][:, 0].tolist() == [0, 0, 0, 0, 1, 0]
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 1, 0, 0, 1]
    assert b["next/observation"].tolist() == [[1, 10], [2, 20], [50, 50], [4, 40], [55, 55], [70, 70]]
    conv = ds.manifest.conversion
    assert conv["inferred_boundaries"] == 1
    assert len(conv["notes"]) == 1
    assert "no 'timeouts'" in conv["notes"][0]


def test_no_timeouts_no_next_needs_max_episode_steps(tmp_path: Path) -> None:
    path = _simple(tmp_path / "f.hdf5", n=10, terminals=[4], timeouts=None)
    with pytest.raises(SourceFormatError, match="timeouts") as info:
        convert(path, "f")
    assert "--max-episode-steps" in info.value.hint
    assert not CacheRoot().exists("f")
    assert list(CacheRoot().tmp_dir.iterdir()) == []


# rows 0-2 cut at row 2 (t = 2 = limit - 1), rows 3-4 end at the terminal, rows 5-7 cut at 7,
# rows 8-9 end with the file. Cut rows and the file's last row are dropped.
NO_TIMEOUT_EXPECTED = {
    "observation": [[0, 0], [1, 10], [3, 30], [4, 40], [5, 50], [6, 60], [8, 80]],
    "next/observation": [[1, 10], [2, 20], [4, 40], [4, 40], [6, 60], [7, 70], [9, 90]],
    "action": [[0], [1], [3], [4], [5], [6], [8]],
    "next/terminated": [[0], [0], [0], [1], [0], [0], [0]],
    "next/truncated": [[0], [1], [0], [0], [0], [1], [1]],
    "episode": [0, 0, 1, 1, 2, 2, 3],
}


@pytest.mark.parametrize("block_rows", [None, *BLOCK_SIZES])
def test_no_timeouts_cut_every_max_episode_steps(tmp_path: Path, block_rows: int | None) -> None:
    path = _simple(tmp_path / "f.hdf5", n=10, terminals=[4], timeouts=None)
    options = {"max_episode_steps": 3, "block_rows": block_rows}
    convert(path, "f", options=options)
    ds = open_dataset("f")
    b = _all(ds)
    for key, expected in NO_TIMEOUT_EXPECTED.items():
        np.testing.assert_array_equal(b[key], np.asarray(expected).astype(b[key].dtype), err_msg=key)
    assert ds.episodes["start"].tolist() == [0, 2, 4, 6]
    assert ds.episodes["length"].tolist() == [2, 2, 2, 1]
    assert ds.episodes["final_known"].tolist() == [True, False, True, True]
    conv = ds.manifest.conversion
    assert conv["inferred_boundaries"] == 2
    assert conv["dropped_rows"] == 3
    assert "max_episode_steps" in conv["notes"][0]
    assert ds.manifest.source["options"] == {k: v for k, v in options.items() if v is not None}


def test_max_episode_steps_is_ignored_when_the_file_has_timeouts(tmp_path: Path) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    convert(path, "a")
    convert(path, "b", options={"max_episode_steps": 2})
    assert _tree_bytes(open_dataset("a").directory) == _tree_bytes(open_dataset("b").directory)


# ----------------------------------------------------------------------------- shapes and dtypes


@pytest.mark.parametrize("variant", ["column_vectors", "float_flags", "uint8_flags", "float64_rewards"])
def test_flag_and_reward_shapes_and_dtypes(tmp_path: Path, variant: str) -> None:
    golden = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    with h5py.File(golden, "r") as f:
        data = {k: f[k][()] for k in ("observations", "actions", "rewards", "terminals", "timeouts")}
    if variant == "column_vectors":
        for key in ("rewards", "terminals", "timeouts"):
            data[key] = data[key][:, None]
    elif variant == "float_flags":
        data["terminals"] = data["terminals"].astype(np.float32)
        data["timeouts"] = data["timeouts"].astype(np.float64)
    elif variant == "uint8_flags":
        data["terminals"] = data["terminals"].astype(np.uint8)
    elif variant == "float64_rewards":
        data["rewards"] = data["rewards"].astype(np.float64)
    path = write_d4rl(tmp_path / "v.hdf5", **data, infos={"qpos": np.arange(8, dtype=np.float32) * -1})
    convert(golden, "golden")
    convert(path, "variant")
    a, b = _all(open_dataset("golden")), _all(open_dataset("variant"))
    for key in a:
        if key == "next/reward" and variant == "float64_rewards":
            assert b[key].dtype == np.float64
            np.testing.assert_array_equal(b[key], a[key].astype(np.float64))
            continue
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert open_dataset("variant").stored_fields["next/terminated"].dtype == "bool"
    assert open_dataset("variant").stored_fields["next/reward"].shape == (1,)


def test_rewards_of_two_values_per_row_are_refused(tmp_path: Path) -> None:
    path = _simple(tmp_path / "f.hdf5", n=4, timeouts=[3])
    with h5py.File(path, "r+") as f:
        del f["rewards"]
        f["rewards"] = np.zeros((4, 2), np.float32)
    with pytest.raises(SourceFormatError, match="rewards"):
        convert(path, "f")


def test_multi_dimensional_observations_and_actions(tmp_path: Path) -> None:
    n = 5
    obs = np.arange(n * 2 * 3, dtype=np.float64).reshape(n, 2, 3)
    path = write_d4rl(
        tmp_path / "f.hdf5",
        observations=obs,
        actions=np.arange(n * 4, dtype=np.int16).reshape(n, 2, 2),
        rewards=np.ones(n, np.float32),
        terminals=np.zeros(n, bool),
        timeouts=np.array([0, 0, 1, 0, 0], bool),
    )
    convert(path, "f")
    ds = open_dataset("f")
    b = _all(ds)
    assert ds.stored_fields["observation"].shape == (2, 3)
    assert ds.stored_fields["observation"].dtype == "float64"
    assert ds.stored_fields["action"].dtype == "int16"
    np.testing.assert_array_equal(b["observation"], obs[[0, 1, 3]])
    np.testing.assert_array_equal(b["next/observation"], obs[[1, 2, 4]])
    np.testing.assert_array_equal(b["action"], np.arange(n * 4, dtype=np.int16).reshape(n, 2, 2)[[0, 1, 3]])


# ----------------------------------------------------------------------------- broken files


@pytest.mark.parametrize("missing", ["observations", "actions", "rewards", "terminals"])
def test_missing_required_key(tmp_path: Path, missing: str) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=False)
    with h5py.File(path, "r+") as f:
        del f[missing]
    with pytest.raises(SourceFormatError, match=f"'{missing}'"):
        convert(path, "g", format="d4rl")
    with pytest.raises(SourceFormatError, match=f"'{missing}'"):
        D4RLReader(path)
    assert not CacheRoot().exists("g")


@pytest.mark.parametrize("key", ["actions", "rewards", "terminals", "timeouts", "next_observations"])
def test_mismatched_lengths(tmp_path: Path, key: str) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    with h5py.File(path, "r+") as f:
        data = f[key][()]
        del f[key]
        f[key] = data[:6]
    with pytest.raises(SourceFormatError, match=f"'{key}' has 6 rows but 'observations' has 8"):
        convert(path, "g")
    assert not CacheRoot().exists("g")


def test_next_observations_of_another_shape(tmp_path: Path) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    with h5py.File(path, "r+") as f:
        del f["next_observations"]
        f["next_observations"] = np.zeros((8, 3), np.float32)
    with pytest.raises(SourceFormatError, match="next_observations"):
        convert(path, "g")


def test_empty_file(tmp_path: Path) -> None:
    path = write_d4rl(
        tmp_path / "e.hdf5",
        observations=np.zeros((0, 2), np.float32),
        actions=np.zeros((0, 1), np.float32),
        rewards=np.zeros(0, np.float32),
        terminals=np.zeros(0, bool),
        timeouts=np.zeros(0, bool),
    )
    with pytest.raises(SourceFormatError, match="empty"):
        convert(path, "e")
    assert not CacheRoot().exists("e")


def _big_valid_file(path: Path) -> Path:
    rng = np.random.default_rng(5)
    n = 20_000
    tout = np.zeros(n, bool)
    tout[999::1000] = True
    return write_d4rl(
        path,
        observations=rng.standard_normal((n, 8)).astype(np.float32),
        actions=rng.standard_normal((n, 3)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=np.zeros(n, bool),
        timeouts=tout,
        next_observations=rng.standard_normal((n, 8)).astype(np.float32),
    )


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.3, 0.6, 0.95, 0.9999])
def test_truncated_hdf5_file(tmp_path: Path, fraction: float) -> None:
    path = _big_valid_file(tmp_path / "big.hdf5")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(SourceFormatError):
        convert(path, "big", format="d4rl")
    assert not CacheRoot().exists("big")
    tmp = CacheRoot().tmp_dir
    assert not tmp.exists() or list(tmp.iterdir()) == []


@pytest.mark.parametrize("suffix", [".hdf5", ".h5"])
def test_non_hdf5_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"text{suffix}"
    path.write_text("observations,actions\n1,2\n")
    with pytest.raises(SourceFormatError, match="HDF5"):
        convert(path, "t")
    with pytest.raises(SourceFormatError):
        convert(path, "t", format="d4rl")
    assert not CacheRoot().exists("t")


def test_unknown_suffix_and_missing_file(tmp_path: Path) -> None:
    golden = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    other = tmp_path / "g.bin"
    other.write_bytes(golden.read_bytes())
    with pytest.raises(UnknownFormatError):
        convert(other, "g")
    convert(other, "g", format="d4rl")  # an explicit format works whatever the suffix
    assert open_dataset("g").num_steps == 8
    with pytest.raises(SourceNotFoundError):
        convert(tmp_path / "nope.hdf5", "n")
    with pytest.raises(UnknownFormatError):
        convert(golden, "x", format="rlds-nope")


def test_hdf5_without_d4rl_keys_is_not_detected(tmp_path: Path) -> None:
    path = tmp_path / "other.hdf5"
    with h5py.File(path, "w") as f:
        f["something"] = np.zeros(3)
    with pytest.raises(UnknownFormatError):
        convert(path, "o")
    with pytest.raises(SourceFormatError, match="'observations'"):
        convert(path, "o", format="d4rl")


# ----------------------------------------------------------------------------- infos and metadata


def test_infos_become_info_step_keys(tmp_path: Path) -> None:
    n = 6
    path = _simple(
        tmp_path / "f.hdf5",
        n=n,
        terminals=[2],
        timeouts=[5],
        infos={
            "qpos": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
            "goal/xy": np.arange(n * 2, dtype=np.float64).reshape(n, 2),
            "flag": np.array([1, 0, 1, 0, 1, 0], bool),
            "q vel": np.arange(n, dtype=np.int32),
        },
    )
    with h5py.File(path, "r+") as f:
        f["per_row_extra"] = np.arange(n, dtype=np.int64) * 7  # a root per-row dataset
        f["virtual/observations"] = np.zeros((n, 2), np.float32)  # ignored
    convert(path, "f")
    ds = open_dataset("f")
    fields = {k: (s.shape, s.dtype, s.storage) for k, s in ds.stored_fields.items() if k.startswith("info/")}
    assert fields == {
        "info/qpos": ((3,), "float32", "step"),
        "info/goal/xy": ((2,), "float64", "step"),
        "info/flag": ((), "bool", "step"),
        "info/q_vel": ((), "int32", "step"),
        "info/per_row_extra": ((), "int64", "step"),
    }
    b = _all(ds)
    kept = [0, 1, 2, 3, 4]  # row 5 (timeout) dropped
    np.testing.assert_array_equal(b["info/qpos"], np.arange(n * 3, dtype=np.float32).reshape(n, 3)[kept])
    np.testing.assert_array_equal(b["info/goal/xy"], np.arange(n * 2, dtype=np.float64).reshape(n, 2)[kept])
    assert b["info/flag"].tolist() == [True, False, True, False, True]
    assert b["info/q_vel"].tolist() == [0, 1, 2, 3, 4]
    assert b["info/per_row_extra"].tolist() == [0, 7, 14, 21, 28]
    assert "next/info/qpos" not in ds.fields  # info keys are per step, not observation-like
    assert any("virtual" in note for note in ds.manifest.conversion["notes"])
    assert not any(k.startswith(("info/virtual", "virtual")) for k in ds.fields)


def test_metadata_scalars_and_arrays(tmp_path: Path) -> None:
    weight = np.arange(40, dtype=np.float32).reshape(8, 5)
    path = _simple(
        tmp_path / "f.hdf5",
        n=6,
        terminals=[2],
        timeouts=[5],
        metadata={
            "algorithm": b"SAC",
            "iteration": np.int32(3),
            "policy/fc0/bias": np.arange(5, dtype=np.float32),
            "policy/fc0/weight": weight,
            "env_kwargs/names": np.array([b"a", b"b"]),
        },
    )
    with h5py.File(path, "r+") as f:
        f.attrs["env_name"] = "hopper-medium-v2"
        f["metadata"].attrs["max_episode_steps"] = 1000
        f["unrelated_table"] = np.arange(100, dtype=np.int16)  # not per row: kept as an array
    convert(path, "f")
    ds = open_dataset("f")
    meta = ds.manifest.source["metadata"]
    assert meta == {
        "metadata/algorithm": "SAC",
        "metadata/iteration": 3,
        "metadata/policy/fc0/bias": [0.0, 1.0, 2.0, 3.0, 4.0],
        "metadata/env_kwargs/names": ["a", "b"],
        "metadata@max_episode_steps": 1000,
        "@env_name": "hopper-medium-v2",
    }
    arrays = ds.source_arrays
    assert sorted(arrays) == ["metadata/policy/fc0/weight", "unrelated_table"]
    np.testing.assert_array_equal(arrays["metadata/policy/fc0/weight"], weight)
    assert arrays["metadata/policy/fc0/weight"].dtype == np.float32
    np.testing.assert_array_equal(arrays["unrelated_table"], np.arange(100, dtype=np.int16))
    # the golden file has scalars only: no npz written
    golden = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    with h5py.File(golden, "r+") as f:  # numbers JSON has no form for are kept as their text
        f.attrs["ref_score"], f.attrs["bounds"] = np.nan, np.array([-np.inf, np.inf])
    convert(golden, "g")
    assert open_dataset("g").source_arrays == {}
    assert not (open_dataset("g").directory / "source_metadata.npz").exists()
    meta = open_dataset("g").source_metadata
    assert (meta["@ref_score"], meta["@bounds"]) == ("nan", ["-inf", "inf"])
    text = (open_dataset("g").directory / "manifest.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"manifest.json holds {name}, not JSON"))


# ----------------------------------------------------------------------------- determinism and reuse


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_converting_twice_is_byte_identical(tmp_path: Path, backend: str) -> None:
    path = _streaming_file(tmp_path / "s.hdf5", with_next=False)
    convert(path, "one", backend=backend)
    convert(path, "two", backend=backend)
    a = _tree_bytes(open_dataset("one").directory)
    b = _tree_bytes(open_dataset("two").directory)
    assert a == b
    assert any(k.startswith("arrays/") for k in a)
    # removing and converting again gives the same bytes too
    CacheRoot().remove("one")
    convert(path, "one", backend=backend)
    assert _tree_bytes(open_dataset("one").directory) == a


def test_same_source_same_name_is_reused(tmp_path: Path) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    first = convert(path, "g")
    assert first.reused is False
    files = {p: p.stat().st_mtime_ns for p in first.path.rglob("*")}
    second = convert(path, "g")
    assert second.reused is True
    assert second.path == first.path
    assert second.manifest.to_dict() == first.manifest.to_dict()
    assert {p: p.stat().st_mtime_ns for p in first.path.rglob("*")} == files  # nothing rewritten
    # a copy of the same bytes elsewhere is the same source
    copy = tmp_path / "copy.hdf5"
    copy.write_bytes(path.read_bytes())
    assert convert(copy, "g").reused is True


def test_different_source_same_name_refused_then_forced(tmp_path: Path) -> None:
    a = golden_three_episodes(tmp_path / "a.hdf5", with_next=True)
    b = golden_three_episodes(tmp_path / "b.hdf5", with_next=False)
    convert(a, "g")
    with pytest.raises(DatasetExistsError, match="already exists"):
        convert(b, "g")
    assert open_dataset("g").num_steps == 8  # untouched
    # other options on the same source are another conversion too
    with pytest.raises(DatasetExistsError):
        convert(a, "g", options={"block_rows": 2})
    forced = convert(b, "g", force=True)
    assert forced.reused is False
    ds = open_dataset("g")
    assert ds.num_steps == 6
    assert ds.manifest.source["path"] == str(b.resolve())
    assert ds[:]["next/observation"].tolist() == golden_column(False, "next/observation").tolist()
    # force on an identical source rebuilds instead of reusing
    again = convert(b, "g", force=True)
    assert again.reused is False
    root = CacheRoot()
    assert [m.name for m in root.iter_manifests()] == ["g"]
    assert list(root.tmp_dir.iterdir()) == []


def test_force_can_change_backend(tmp_path: Path) -> None:
    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    convert(path, "g", backend="memmap")
    convert(path, "g", backend="zarr", force=True)
    ds = open_dataset("g")
    assert ds.manifest.backend == "zarr"
    assert not (ds.directory / "arrays" / "observation.npy").exists()
    assert ds[:]["next/reward"][:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_expected_sha256_is_checked(tmp_path: Path) -> None:
    from rlds_cli.errors import ChecksumMismatchError

    path = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ChecksumMismatchError):
        convert(path, "g", expected_sha256="0" * 64)
    assert not CacheRoot().exists("g")
    result = convert(path, "g", expected_sha256=digest.upper(), source_info={"id": "golden-v0"})
    assert result.manifest.source["sha256"] == digest
    assert result.manifest.source["size"] == path.stat().st_size
    assert result.manifest.source["id"] == "golden-v0"
    assert list(result.manifest.source)[:5] == ["format", "path", "sha256", "size", "files"]


def test_a_wrong_file_is_named_as_such_even_when_it_does_not_convert(tmp_path: Path) -> None:
    """The source is hashed beside the conversion: when the bytes are not the expected ones,
    the error says so (the hint is about the download), not why the reader choked on them,
    and nothing is published or left behind."""
    from rlds_cli.errors import ChecksumMismatchError

    path = tmp_path / "portal.hdf5"
    path.write_bytes(b"<html>captive portal</html>" * 1000)
    with pytest.raises(ChecksumMismatchError, match="has sha256"):
        convert(path, "g", expected_sha256="0" * 64, format="d4rl")
    assert not CacheRoot().exists("g") and not any(CacheRoot().tmp_dir.iterdir())


def test_progress_events(tmp_path: Path) -> None:
    path = _streaming_file(tmp_path / "s.hdf5", with_next=True)
    events: list[tuple[str, int]] = []
    convert(path, "s", options={"block_rows": 40}, progress=lambda e, k: events.append((e, k)))
    # the source is hashed beside the conversion: its event comes when the digest is checked,
    # before the commit
    assert events == [
        ("start", 97),
        ("advance", 40),
        ("advance", 40),
        ("advance", 17),
        ("hash", path.stat().st_size),
    ]


# ----------------------------------------------------------------------------- the bundled demo


def test_bundled_demo_file_is_regenerated_exactly(tmp_path: Path) -> None:
    from rlds_cli._util.io import sha256_file
    from tests.scripts import load_script

    script = load_script("make_demo_dataset")
    bundled_path, simulate, write_d4rl_file = script.bundled_path, script.simulate, script.write_d4rl_file

    shipped = bundled_path()
    assert shipped == REPO / "rlds_cli" / "data" / "pointmass-demo-v0.hdf5"
    fresh = tmp_path / "pointmass-demo-v0.hdf5"
    write_d4rl_file(fresh, simulate())
    registry = tomllib.loads((REPO / "registry" / "demo.toml").read_text())
    (entry,) = [d for d in registry["dataset"] if d["id"] == "pointmass-demo-v0"]
    (file,) = entry["files"]
    assert sha256_file(fresh) == sha256_file(shipped) == file["sha256"]
    assert fresh.stat().st_size == shipped.stat().st_size == file["size"]
    # and the numbers the entry states about it
    result = convert(shipped, "demo")
    m = result.manifest
    assert m.conversion["source_rows"] == entry["source_rows"] == 5000
    assert m.num_episodes == entry["num_episodes"]
    assert m.num_steps == 5000  # next_observations: every row kept
    assert m.conversion["inferred_boundaries"] == 0
    assert m.source["metadata"]["metadata/env"] == entry["env"] == "PointMass2D-v0"
    assert m.source["metadata"]["metadata@max_episode_steps"] == entry["max_episode_steps"]
    lengths = open_dataset("demo").episodes["length"]
    assert int(lengths.max()) <= entry["max_episode_steps"]


@pytest.mark.parametrize("dtype", ["float32", "float16", ">f8", "complex64"])
def test_nan_counts_per_key(tmp_path: Path, dtype: str) -> None:
    # NaNs are counted only where the column's minimum says it holds one: infinities are no NaN
    obs = np.arange(12, dtype=np.float64).reshape(6, 2)
    obs[1, 0] = obs[4, 1] = np.nan
    obs[2, 1] = -np.inf
    actions = np.full((6, 1), np.inf)
    path = write_d4rl(
        tmp_path / "f.hdf5",
        observations=obs.astype(dtype),
        actions=actions.astype(dtype),
        rewards=np.zeros(6, np.float32),
        terminals=np.zeros(6, bool),
        timeouts=np.array([0, 0, 1, 0, 0, 1], bool),
    )
    convert(path, "f")
    counts = open_dataset("f").manifest.source["checks"]["nan_counts"]
    assert counts["observation"] == 2 and counts["action"] == 0 and counts["next/reward"] == 0
