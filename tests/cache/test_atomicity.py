"""Builds are atomic: killed, failed, concurrent or replaced, a dataset is complete or absent.

The subprocess tests run ``tests/_helper_convert.py``, which prints ``advance`` after every
block it appended and can stop after the N-th block until killed, so a test knows for sure
that a build is in progress when it kills it.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlds_cli.formats.d4rl as d4rl_module
from rlds_cli.cache import CacheRoot, DatasetBuilder, open_dataset
from rlds_cli.errors import (
    ConversionError,
    DatasetExistsError,
    DatasetNotFoundError,
    DatasetReplacedError,
)
from rlds_cli.formats.base import StepBlock
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import golden_three_episodes, write_d4rl
from tests.durability import DurabilityTrace, check_durable_publish
from tests.waits import HANG_SECONDS

REPO = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).resolve().parents[1] / "_helper_convert.py"


# ----------------------------------------------------------------------------- helpers


def _long_file(path: Path, n: int = 2000, *, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tout = np.zeros(n, bool)
    tout[99::100] = True
    return write_d4rl(
        path,
        observations=rng.standard_normal((n, 4)).astype(np.float32),
        actions=rng.standard_normal((n, 2)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        terminals=np.zeros(n, bool),
        timeouts=tout,
    )


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)  # carries the test's RLDS_HOME and RLDS_FSYNC
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, str(HELPER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _wait_for_advances(proc: subprocess.Popen[str], count: int) -> None:
    assert proc.stdout is not None
    seen = 0
    while seen < count:
        line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate(timeout=HANG_SECONDS)
            raise AssertionError(f"helper exited early (rc={proc.returncode}): {err}")
        if line.strip() == "advance":
            seen += 1


def _finish(proc: subprocess.Popen[str], timeout: float = HANG_SECONDS) -> Any:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    lines = [line for line in out.splitlines() if line.strip() and line.strip() != "advance"]
    return json.loads(lines[-1])


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=HANG_SECONDS)
    assert proc.returncode == -signal.SIGKILL


def _tmp_entries() -> list[str]:
    tmp = CacheRoot().tmp_dir
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def _lock_is_free(name: str) -> bool:
    lock = CacheRoot().lock(name, timeout=0)
    try:
        lock.acquire()
    except Exception:
        return False
    lock.release()
    return True


@pytest.fixture
def proc_guard() -> Iterator[list[subprocess.Popen[str]]]:
    """Kill (by pid) any helper a failing test left running."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)


# ----------------------------------------------------------------------------- killed writers


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_kill_during_conversion_leaves_nothing_visible(
    tmp_path: Path, backend: str, proc_guard: list[subprocess.Popen[str]]
) -> None:
    source = _long_file(tmp_path / "long.hdf5")
    proc = _spawn(str(source), "big/run-v0", "--backend", backend, "--block-rows", "20", "--hang-after", "3")
    proc_guard.append(proc)
    _wait_for_advances(proc, 3)  # three blocks are on disk in the build directory
    root = CacheRoot()
    (building,) = _tmp_entries()
    assert building.startswith("big--run-v0.") and building.endswith(".incomplete")
    # a live writer's build is not stale: nobody else may remove it
    assert root.clean_stale_builds() == []
    assert _tmp_entries() == [building]
    assert not root.exists("big/run-v0")
    _kill(proc)

    # after the kill: no dataset, anywhere a reader looks
    assert not root.exists("big/run-v0")
    with pytest.raises(DatasetNotFoundError):
        open_dataset("big/run-v0")
    assert list(root.iter_manifests()) == []
    assert not root.dataset_dir("big/run-v0").exists()
    assert _tmp_entries() == [building]  # the garbage is still there...
    assert _lock_is_free("big/run-v0")  # ...but its lock died with the process

    # the next conversion of the same name succeeds and removes the garbage
    result = convert(source, "big/run-v0", backend=backend)
    assert result.reused is False
    assert _tmp_entries() == []
    ds = open_dataset("big/run-v0")
    assert (ds.num_steps, ds.num_episodes) == (2000 - 20, 20)
    assert [m.name for m in root.iter_manifests()] == ["big/run-v0"]


def test_stale_build_is_cleaned_by_a_writer_of_another_name(
    tmp_path: Path, proc_guard: list[subprocess.Popen[str]]
) -> None:
    source = _long_file(tmp_path / "long.hdf5")
    proc = _spawn(str(source), "victim", "--block-rows", "20", "--hang-after", "2")
    proc_guard.append(proc)
    _wait_for_advances(proc, 2)
    _kill(proc)
    assert len(_tmp_entries()) == 1
    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=True), "other")
    assert _tmp_entries() == []
    assert not CacheRoot().exists("victim")


def test_kill_during_forced_rebuild_keeps_the_old_dataset(
    tmp_path: Path, proc_guard: list[subprocess.Popen[str]]
) -> None:
    old_source = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    convert(old_source, "kept")
    before = open_dataset("kept")[:].to_numpy()
    new_source = _long_file(tmp_path / "long.hdf5")
    proc = _spawn(str(new_source), "kept", "--force", "--block-rows", "20", "--hang-after", "3")
    proc_guard.append(proc)
    _wait_for_advances(proc, 3)
    _kill(proc)
    ds = open_dataset("kept")
    assert ds.num_steps == 8
    after = ds[:]
    assert sorted(after) == sorted(before)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    # and the same source converts again as "reused" (the old dataset is intact)
    assert convert(old_source, "kept").reused is True
    assert _tmp_entries() == []


# ----------------------------------------------------------------------------- concurrent writers


def test_two_processes_converting_the_same_name(
    tmp_path: Path, proc_guard: list[subprocess.Popen[str]]
) -> None:
    source = _long_file(tmp_path / "long.hdf5", n=600)
    procs = [_spawn(str(source), "shared", "--block-rows", "50", "--delay", "0.02") for _ in range(2)]
    proc_guard.extend(procs)
    results = [_finish(p) for p in procs]
    assert sorted(r["reused"] for r in results) == [False, True]
    assert [r["num_steps"] for r in results] == [594, 594]
    ds = open_dataset("shared")
    assert (ds.num_steps, ds.num_episodes) == (594, 6)
    assert ds.episodes["length"].tolist() == [99] * 6
    assert ds[:]["next/truncated"].sum() == 6
    assert _tmp_entries() == []
    assert [m.name for m in CacheRoot().iter_manifests()] == ["shared"]


def _expected_batches(tmp_path: Path) -> dict[int, dict[str, np.ndarray]]:
    out = {}
    for with_next in (True, False):
        path = golden_three_episodes(tmp_path / f"ref{with_next}.hdf5", with_next=with_next)
        convert(path, f"ref-{with_next}", root=tmp_path / "ref-root")
        ds = open_dataset(f"ref-{with_next}", root=tmp_path / "ref-root")
        out[ds.num_steps] = {k: np.array(v) for k, v in ds[:].items()}
    assert sorted(out) == [6, 8]
    return out


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_reader_during_forced_rebuilds_sees_old_or_new(
    tmp_path: Path, backend: str, proc_guard: list[subprocess.Popen[str]]
) -> None:
    """Open-and-read in a loop while another process rebuilds the dataset 30 times, switching
    between two sources: every read is exactly one of the two complete datasets. A read that
    races with a replacement may raise DatasetReplacedError (and the reader opens again), but
    never returns a mix or fails any other way."""
    expected = _expected_batches(tmp_path)
    a = golden_three_episodes(tmp_path / "a.hdf5", with_next=True)  # 8 steps
    b = golden_three_episodes(tmp_path / "b.hdf5", with_next=False)  # 6 steps
    convert(a, "flip", backend=backend)
    proc = _spawn(str(a), "flip", "--backend", backend, "--force", "--repeat", "30", "--alternate", str(b))
    proc_guard.append(proc)
    seen = {6: 0, 8: 0}
    replaced = 0
    deadline = time.monotonic() + HANG_SECONDS  # the reads end with the rebuilds
    while proc.poll() is None and time.monotonic() < deadline:
        ds = open_dataset("flip")
        try:
            batch = ds[:]
        except DatasetReplacedError:
            replaced += 1
            continue
        want = expected[ds.num_steps]
        assert sorted(batch) == sorted(want)
        for key, value in want.items():
            np.testing.assert_array_equal(batch[key], value, err_msg=key)
        assert ds.episodes["length"].sum() == ds.num_steps
        assert ds.manifest.conversion["source_rows"] == 8
        seen[ds.num_steps] += 1
    results = _finish(proc)
    assert len(results) == 30
    assert all(r["reused"] is False for r in results)
    assert sum(seen.values()) > 0
    final = open_dataset("flip")
    assert final.num_steps == 6  # the 30th build used the alternate source
    assert _tmp_entries() == []


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_open_dataset_replaced_under_its_reader(tmp_path: Path, backend: str) -> None:
    """The deterministic version: a dataset opened before a forced rebuild never reads the
    new version's files through its old manifest and episode index."""
    a = golden_three_episodes(tmp_path / "a.hdf5", with_next=True)  # 8 steps
    b = golden_three_episodes(tmp_path / "b.hdf5", with_next=False)  # 6 steps
    convert(a, "swap", backend=backend)
    old = open_dataset("swap")
    old_obs = np.array(old.gather([0, 7], keys=["observation"])["observation"])  # opens one column
    pickled = pickle.dumps(old)
    convert(b, "swap", backend=backend, force=True)
    # one behaviour for both backends: zarr reads chunks by path (it must not get the new
    # version's), a memory map would read the old version's file on silently (issue 25)
    assert old_obs.shape == (2, *old.fields["observation"][0])
    with pytest.raises(DatasetReplacedError):
        old.gather([0, 7], keys=["observation"])
    with pytest.raises(DatasetReplacedError):
        old.gather([0], keys=["action"])  # a column first opened after the replacement
    with pytest.raises(DatasetReplacedError):
        old.episode(0)
    with pytest.raises(DatasetReplacedError):
        pickle.loads(pickled)  # a worker process would rebuild it from the new manifest
    assert isinstance(DatasetReplacedError("x"), OSError)
    new = open_dataset("swap")
    assert new.num_steps == 6
    assert new[:]["next/reward"][:, 0].tolist() == [1, 2, 3, 4, 5, 7]
    assert pickle.loads(pickle.dumps(new)).num_steps == 6


def test_open_dataset_retries_while_a_replacement_is_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the two renames of a replacement the name has no directory for a moment; a
    reader that opens right then waits for the new version instead of reporting it missing."""
    import rlds_cli.cache.opening as dataset_module

    convert(golden_three_episodes(tmp_path / "a.hdf5", with_next=True), "gap")
    root = CacheRoot()
    final = root.dataset_dir("gap")
    root.tmp_dir.mkdir(parents=True, exist_ok=True)
    trash = root.tmp_dir / "gap.0123456789ab.trash"
    os.replace(final, trash)  # the first rename of publish(): the name is gone for now
    real_sleep = time.sleep
    sleeps: list[float] = []

    def sleep_then_finish(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3 and trash.exists():  # the second rename happens while the reader waits
            os.replace(trash, final)
        real_sleep(seconds)

    monkeypatch.setattr(dataset_module.time, "sleep", sleep_then_finish)
    ds = open_dataset("gap")
    assert ds.num_steps == 8
    assert len(sleeps) == 3
    # without a replacement in progress, a missing dataset is reported at once
    sleeps.clear()
    with pytest.raises(DatasetNotFoundError):
        open_dataset("never-there")
    assert sleeps == []
    # a stale trash directory (its writer was killed) delays the answer only a little
    (root.tmp_dir / "ghost.0123456789ab.trash").mkdir()
    t0 = time.monotonic()
    with pytest.raises(DatasetNotFoundError):
        open_dataset("ghost")
    assert time.monotonic() - t0 < 2
    assert len(sleeps) == dataset_module._OPEN_ATTEMPTS - 1


# ----------------------------------------------------------------------------- builder checks


def _block(
    n: int,
    ends: list[int],
    *,
    terminated: list[int] | None = None,
    obs_rows: int | None = None,
    action_rows: int | None = None,
    obs_dtype: Any = np.float32,
    action_dim: int = 1,
    extra: dict[str, np.ndarray] | None = None,
    drop: tuple[str, ...] = (),
    obs_key: str = "observation",
) -> StepBlock:
    term = np.zeros((n, 1), bool)
    term[ends if terminated is None else terminated] = True
    steps = {
        "action": np.zeros((n if action_rows is None else action_rows, action_dim), np.float32),
        "next/reward": np.ones(n, np.float32),
        "next/terminated": term,
        "next/truncated": np.zeros((n, 1), bool),
        **(extra or {}),
    }
    for key in drop:
        steps.pop(key)
    rows = n + len(ends) if obs_rows is None else obs_rows
    return StepBlock(
        steps=steps,
        observations={obs_key: np.zeros((rows, 2), obs_dtype)},
        ends=np.asarray(ends, np.int64),
    )


def _assert_nothing_left(name: str) -> None:
    root = CacheRoot()
    assert not root.exists(name)
    assert not root.dataset_dir(name).exists()
    assert _tmp_entries() == []
    assert _lock_is_free(name)


def test_builder_accepts_episodes_spanning_blocks() -> None:
    with DatasetBuilder("ok") as builder:
        builder.append(_block(3, []))  # an episode that goes on
        builder.append(_block(0, []))  # empty blocks are ignored
        builder.append(_block(4, [1, 3]))
        manifest = builder.commit()
    assert (manifest.num_steps, manifest.num_episodes) == (7, 2)
    ds = open_dataset("ok")
    assert ds.episodes["start"].tolist() == [0, 5]
    assert ds.episodes["length"].tolist() == [5, 2]
    assert ds.episodes["final_known"].tolist() == [True, True]
    assert ds[:]["next/reward"].shape == (7, 1)  # 1-D rewards get their trailing dimension
    assert _tmp_entries() == []


def test_source_arrays_keep_names_that_np_savez_would_take_as_its_own() -> None:
    """``np.savez(path, **arrays)`` took an array named ``allow_pickle`` as its flag (the array
    vanished from source_metadata.npz) and raised TypeError for one named ``file``."""
    arrays = {"allow_pickle": np.arange(3), "file": np.ones(2), "meta/x": np.zeros((2, 2), np.float32)}
    with DatasetBuilder("named") as builder:
        builder.append(_block(4, [3]))
        builder.commit(source_arrays=arrays)
    got = open_dataset("named").source_arrays
    assert sorted(got) == ["allow_pickle", "file", "meta/x"]
    for key, value in arrays.items():
        np.testing.assert_array_equal(got[key], value)
        assert got[key].dtype == value.dtype


BAD_BLOCKS: dict[str, list[StepBlock]] = {
    "done_before_end": [_block(4, [3], terminated=[1, 3])],
    "done_missing_at_end": [_block(4, [3], terminated=[])],
    "done_without_end": [_block(4, [], terminated=[2])],
    "step_rows": [_block(4, [3], action_rows=3)],
    "obs_rows_missing_final": [_block(4, [3], obs_rows=4)],
    "obs_rows_extra": [_block(4, [3], obs_rows=6)],
    "ends_unsorted": [_block(4, [3, 1])],
    "ends_outside": [_block(4, [4], terminated=[])],
    "ends_negative": [_block(4, [-1], terminated=[3])],
    "missing_required_key": [_block(4, [3], drop=("next/truncated",))],
    "next_prefixed_observation": [_block(4, [3], obs_key="next/observation")],
    "schema_new_key": [_block(2, [1]), _block(2, [1], extra={"info/x": np.zeros(2)})],
    "schema_dropped_key": [_block(2, [1], extra={"info/x": np.zeros(2)}), _block(2, [1])],
    "schema_dtype": [_block(2, [1]), _block(2, [1], obs_dtype=np.float64)],
    "schema_shape": [_block(2, [1]), _block(2, [1], action_dim=2)],
}


@pytest.mark.parametrize("case", sorted(BAD_BLOCKS))
def test_builder_rejects_inconsistent_blocks(case: str) -> None:
    blocks = BAD_BLOCKS[case]
    with pytest.raises(ConversionError), DatasetBuilder("bad") as builder:
        for block in blocks:
            builder.append(block)
        builder.commit()
    _assert_nothing_left("bad")


def test_builder_rejects_block_without_observations() -> None:
    block = _block(2, [1])
    block.observations = {}
    with pytest.raises(ConversionError, match="observation"), DatasetBuilder("bad") as builder:
        builder.append(block)
    _assert_nothing_left("bad")


def test_builder_rejects_unclosed_last_episode() -> None:
    with pytest.raises(ConversionError, match="never closed"), DatasetBuilder("open") as builder:
        builder.append(_block(3, [0]))
        builder.append(_block(2, []))
        builder.commit()
    _assert_nothing_left("open")


@pytest.mark.parametrize("blocks", [0, 1], ids=["no_blocks", "empty_block"])
def test_builder_rejects_empty_dataset(blocks: int) -> None:
    with pytest.raises(ConversionError, match="no transitions"), DatasetBuilder("empty") as builder:
        for _ in range(blocks):
            builder.append(_block(0, []))
        builder.commit()
    _assert_nothing_left("empty")


def test_builder_refuses_to_replace_without_replace(tmp_path: Path) -> None:
    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=True), "taken")
    with pytest.raises(DatasetExistsError), DatasetBuilder("taken") as builder:
        assert builder.existing is not None
        assert builder.existing.num_steps == 8
        builder.append(_block(2, [1]))
        builder.commit()
    assert open_dataset("taken").num_steps == 8
    assert _tmp_entries() == []
    with DatasetBuilder("taken", replace=True) as builder:
        builder.append(_block(2, [1]))
        builder.commit()
    assert open_dataset("taken").num_steps == 2
    assert _tmp_entries() == []


def test_builder_outside_with_block() -> None:
    builder = DatasetBuilder("x")
    with pytest.raises(RuntimeError):
        _ = builder.build_dir


# ----------------------------------------------------------------------------- failed conversions


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_reader_failing_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc_type: type[BaseException]
) -> None:
    source = _long_file(tmp_path / "long.hdf5", n=500)
    original = d4rl_module.D4RLReader.blocks
    yielded = []

    def failing_blocks(self: Any, progress: Any = None) -> Iterator[StepBlock]:
        for i, block in enumerate(original(self, progress)):
            if i == 3:
                raise exc_type("boom")
            yielded.append(i)
            yield block

    monkeypatch.setattr(d4rl_module.D4RLReader, "blocks", failing_blocks)
    with pytest.raises(exc_type, match="boom"):
        convert(source, "half", options={"block_rows": 50})
    assert yielded == [0, 1, 2]
    _assert_nothing_left("half")
    assert list(CacheRoot().iter_manifests()) == []
    # a failed forced rebuild keeps the old dataset
    monkeypatch.setattr(d4rl_module.D4RLReader, "blocks", original)
    convert(source, "half", options={"block_rows": 50})
    monkeypatch.setattr(d4rl_module.D4RLReader, "blocks", failing_blocks)
    other = _long_file(tmp_path / "other.hdf5", n=500, seed=1)
    with pytest.raises(exc_type):
        convert(other, "half", options={"block_rows": 50}, force=True)
    assert open_dataset("half").manifest.source["path"] == str(source.resolve())
    assert open_dataset("half").num_steps == 495
    assert _tmp_entries() == []


def test_source_error_midway_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlds_cli.errors import SourceFormatError

    source = _long_file(tmp_path / "long.hdf5", n=500)
    original = d4rl_module.D4RLReader._read
    calls = {"n": 0}

    def flaky_read(self: Any, key: str, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        if key == "actions" and start >= 200:
            raise d4rl_module.read_error(self.path, key, OSError("Can't read data"))
        calls["n"] += 1
        return original(self, key, start, stop, out)

    monkeypatch.setattr(d4rl_module.D4RLReader, "_read", flaky_read)
    with pytest.raises(SourceFormatError, match="'actions'"):
        convert(source, "flaky", options={"block_rows": 100})
    assert calls["n"] > 0
    _assert_nothing_left("flaky")


# ----------------------------------------------------------------------------- fsync


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_conversion_with_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    trace = DurabilityTrace(monkeypatch)
    source = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    monkeypatch.setenv("RLDS_FSYNC", "0")
    convert(source, "nosync", backend=backend)
    assert trace.fsyncs() == []
    monkeypatch.setenv("RLDS_FSYNC", "1")
    result = convert(source, "synced", backend=backend)
    assert result.reused is False
    check_durable_publish(trace, CacheRoot().dataset_dir("synced"))
    a, b = open_dataset("nosync")[:], open_dataset("synced")[:]
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert _tmp_entries() == []
    # fsync is the default when the variable is unset
    monkeypatch.delenv("RLDS_FSYNC")
    trace.events.clear()
    convert(source, "default", backend=backend)
    check_durable_publish(trace, CacheRoot().dataset_dir("default"))


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_the_fsync_order_check_fails_without_directory_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """The check above can fail: with every directory fsync gone (wherever the writers import
    ``fsync_dir`` from) the files are still synced, and it must still object."""
    from rlds_cli._util import io as _io

    real = _io.fsync_dir
    for name, module in list(sys.modules.items()):
        if name.startswith("rlds_cli") and getattr(module, "fsync_dir", None) is real:
            monkeypatch.setattr(module, "fsync_dir", lambda path: None)
    trace = DurabilityTrace(monkeypatch)
    monkeypatch.setenv("RLDS_FSYNC", "1")
    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=True), "synced", backend=backend)
    assert trace.fsyncs(), "the files are still fsynced"
    with pytest.raises(AssertionError, match="never fsynced"):
        check_durable_publish(trace, CacheRoot().dataset_dir("synced"))
