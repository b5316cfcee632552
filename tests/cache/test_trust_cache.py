"""The cache under faults: damaged zarr chunks, durability order, full and read-only disks,
bad cache locations and names, and user functions that exit or print.

The full-disk and read-only cases mount a small tmpfs (as root; skipped elsewhere), so the
errors come from a real filesystem, not from a mock.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache import CacheRoot, DatasetBuilder, open_dataset
from rlds_cli.cache.backends import ALL_CHUNKS_ATTR
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError
from rlds_cli.formats.base import StepBlock
from rlds_cli.sources.download import download
from tests.dataset_fixtures import make_dataset
from tests.durability import DurabilityTrace, check_durable_publish

REPO = Path(__file__).resolve().parents[2]
FNS = "tests.preprocess_fns"


def rlds(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The real command in a subprocess (file descriptors, exit codes and all)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlds_cli.cli.app", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ----------------------------------------------------------------------------- zarr chunks


@pytest.fixture
def zarr_demo() -> rlds_cli.Dataset:
    download("demo", name="dz", backend="zarr")
    return open_dataset("dz")


def _chunk(ds: rlds_cli.Dataset, key: str) -> Path:
    (chunk,) = (p for p in (ds.directory / "arrays" / key / "c").rglob("*") if p.is_file())
    return chunk


def test_every_zarr_chunk_is_written_even_all_zero_ones() -> None:
    n = 20
    term = np.zeros(n, bool)
    term[-1] = True
    block = StepBlock(
        steps={
            "action": np.zeros((n, 1), np.float32),  # all zeros: the fill value
            "next/reward": np.ones(n, np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(n, bool),  # all False: the fill value
        },
        observations={"observation": np.ones((n + 1, 2), np.float32)},
        ends=np.array([n - 1]),
    )
    with DatasetBuilder("zeros", backend="zarr") as builder:
        builder.append(block)
        builder.commit()
    arrays = open_dataset("zeros").directory / "arrays"
    for key in ("action", "next/truncated"):
        assert list((arrays / key / "c").rglob("0")), f"the all-zero chunk of {key} was left out"
        assert json.loads((arrays / key / "zarr.json").read_text())["attributes"][ALL_CHUNKS_ATTR] is True


def test_a_missing_zarr_chunk_is_damage_not_zeros(zarr_demo: rlds_cli.Dataset) -> None:
    chunk = _chunk(zarr_demo, "next/reward")
    chunk.unlink()
    with pytest.raises(CorruptDatasetError, match="is missing"):
        open_dataset("dz")[np.array([0, 1])]
    with pytest.raises(CorruptDatasetError, match="is missing"):
        rlds_cli.Loader("dz", batch_size=8, seed=0).sample()
    assert open_dataset("dz").check_files() == [f"zarr chunk {chunk} is missing"]
    check = rlds("inspect", "dz", "--check")
    assert check.returncode == 1 and f"zarr chunk {chunk} is missing" in check.stdout + check.stderr
    verify = rlds("verify", "dz", "--json")
    assert verify.returncode == 1
    (files,) = [c for c in json.loads(verify.stdout)["manifest"] if c["check"] == "cache files complete"]
    assert not files["ok"] and "next/reward" in files["actual"]


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_verify_and_check_pass_on_complete_datasets_and_catch_a_missing_file(backend: str) -> None:
    download("demo", name="d", backend=backend)
    assert rlds("verify", "d").returncode == 0
    assert rlds("inspect", "d", "--check").returncode == 0
    victim = next(
        p
        for p in sorted((open_dataset("d").directory / "arrays").rglob("*"))
        if p.is_file() and "action" in str(p)
    )
    victim.unlink()
    assert rlds("verify", "d").returncode == 1
    assert rlds("inspect", "d", "--check").returncode == 1


def test_bytes_appended_to_an_array_file_are_damage() -> None:
    """A ``.npy`` file longer than its header says (bytes appended: no rlds write leaves any)
    passed ``verify``, ``inspect --check`` and every read."""
    download("demo", name="d", backend="memmap")
    victim = open_dataset("d").directory / "arrays" / "action.npy"
    with victim.open("ab") as fh:
        fh.write(b"\0" * 8)
    for command in (["verify", "d"], ["inspect", "d", "--check"]):
        result = rlds(*command)
        assert result.returncode == 1 and "8 bytes follow the shape" in result.stdout + result.stderr, command
    with pytest.raises(CorruptDatasetError, match=r"action\.npy is damaged: 8 bytes follow"):
        rlds_cli.Loader("d", batch_size=8, seed=0).sample()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_zarr_chunk_is_one_clear_error(zarr_demo: rlds_cli.Dataset, damage: str) -> None:
    chunk = _chunk(zarr_demo, "observation")
    data = chunk.read_bytes()
    garbage = np.random.default_rng(0).bytes(len(data))
    chunk.write_bytes({"garbage": garbage, "truncated": data[: len(data) // 3], "empty": b""}[damage])
    with pytest.raises(CorruptDatasetError, match=r"arrays/observation is damaged"):
        rlds_cli.Loader("dz", batch_size=8, seed=0).sample()
    assert "observation is damaged" in one_error_line(rlds("inspect", "dz", "--check"))


def test_every_kind_of_garbage_chunk_is_one_clear_error(zarr_demo: rlds_cli.Dataset) -> None:
    """Random bytes make the codec fail in many ways (a SystemError for a negative size in the
    Blosc header was one that escaped): 128 fixed payloads, with and without a valid header."""
    chunk = _chunk(zarr_demo, "observation")
    data = chunk.read_bytes()
    escaped = {}
    for keep in (0, 16):  # 16: Blosc's header kept, a garbage body
        for seed in range(64):
            chunk.write_bytes(data[:keep] + np.random.default_rng(seed).bytes(len(data) - keep))
            try:
                rlds_cli.Loader("dz", batch_size=64, seed=0).sample()
                escaped[(keep, seed)] = "no error"
            except CorruptDatasetError:
                pass
            except Exception as exc:  # anything else is what this test is for
                escaped[(keep, seed)] = f"{type(exc).__name__}: {exc}"
    assert not escaped


def test_zarr_arrays_written_before_the_marker_read_as_before(zarr_demo: rlds_cli.Dataset) -> None:
    """Arrays of older caches may omit all-zero chunks: without the marker, a missing chunk is
    the fill value, as zarr reads it (the cache format stays readable)."""
    meta_path = zarr_demo.directory / "arrays" / "next" / "reward" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    del meta["attributes"][ALL_CHUNKS_ATTR]
    meta_path.write_text(json.dumps(meta))
    _chunk(zarr_demo, "next/reward").unlink()
    assert not open_dataset("dz")[:]["next", "reward"].any()
    assert open_dataset("dz").check_files() == []


def test_a_flipped_byte_in_the_marker_is_damage_not_an_older_array(zarr_demo: rlds_cli.Dataset) -> None:
    """One bit flipped in the attribute's name made the array an older rlds's: a missing shard
    then read as zeros (exit 0) and verify said 'files complete'."""
    meta_path = zarr_demo.directory / "arrays" / "next" / "reward" / "zarr.json"
    meta_path.write_text(meta_path.read_text().replace(ALL_CHUNKS_ATTR, "rlds^all_chunks_written"))
    _chunk(zarr_demo, "next/reward").unlink()
    with pytest.raises(CorruptDatasetError, match=r"zarr metadata .*next/reward/zarr.json is damaged"):
        open_dataset("dz")[:]
    assert any("is damaged: its attributes are" in problem for problem in open_dataset("dz").check_files())
    result = CliRunner().invoke(app, ["verify", "dz"])
    assert result.exit_code == 1 and "files complete" in result.output, result.output


# ----------------------------------------------------------------------------- durability order


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_every_file_is_synced_before_the_manifest_commits_it(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Order of durability: every data file, then every directory (deepest first), then the
    manifest and its folder, then the rename into place, then the parent directory."""
    monkeypatch.setenv("RLDS_FSYNC", "1")
    trace = DurabilityTrace(monkeypatch)
    n = 40
    term = np.zeros(n, bool)
    term[[9, 39]] = True
    block = StepBlock(
        steps={
            "action": np.ones((n, 2), np.float32),
            "next/reward": np.ones(n, np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(n, bool),
        },
        observations={"observation": np.ones((n + 2, 3), np.float32)},
        ends=np.array([9, 39]),
    )
    with DatasetBuilder("durable", backend=backend) as builder:
        builder.append(block)
        build = builder.build_dir.resolve()
        builder.commit()
    final = CacheRoot().dataset_dir("durable")
    check_durable_publish(trace, final)
    # and, beyond what durability needs: no directory before the last data file
    files = {build / p.relative_to(final) for p in final.rglob("*") if p.is_file()}
    dirs = {build / p.relative_to(final) for p in final.rglob("*") if p.is_dir()} | {build}
    synced = [path for _, path in trace.fsyncs()]
    last_file = max(i for i, p in enumerate(synced) if p in files and p.name != "manifest.json")
    first_dir = min(i for i, p in enumerate(synced) if p in dirs)
    assert last_file < first_dir, "a directory was synced before the files in it"


# ----------------------------------------------------------------------------- locations, names


def test_cache_root_that_is_a_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for command in (["list"], ["download", "demo"], ["gc"]):
        line = one_error_line(rlds(*command, env={"RLDS_HOME": str(not_a_dir)}))
        assert f"the cache root {not_a_dir} is a file" in line


@pytest.mark.parametrize("name", ["", "a" * 300, "x/" * 80 + "y"])
def test_names_that_cannot_be_cache_entries(name: str) -> None:
    line = one_error_line(rlds("download", "demo", "--name", name))
    assert "dataset name" in line
    assert not CacheRoot().datasets_dir.exists() or not list(CacheRoot().datasets_dir.iterdir())


# ----------------------------------------------------------------------------- full and read-only disks


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted for the test (needs root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _big_d4rl(path: Path, rows: int) -> Path:
    from tests.d4rl_fixtures import write_d4rl

    rng = np.random.default_rng(0)
    timeouts = np.zeros(rows, bool)
    timeouts[99::100] = True
    return write_d4rl(
        path,
        observations=rng.standard_normal((rows, 16)).astype(np.float32),
        actions=rng.standard_normal((rows, 4)).astype(np.float32),
        rewards=rng.standard_normal(rows).astype(np.float32),
        terminals=np.zeros(rows, bool),
        timeouts=timeouts,
    )


def test_conversion_into_a_full_disk(small_disk: Path, tmp_path: Path) -> None:
    source = _big_d4rl(tmp_path / "big.hdf5", 60_000)  # ~5 MB of arrays for a 4 MiB disk
    line = one_error_line(rlds("download", str(source), "--format", "d4rl", "--root", str(small_disk)))
    assert "no space left on the device" in line
    root = CacheRoot(small_disk)
    assert not root.datasets_dir.exists() or not list(root.datasets_dir.iterdir())
    assert not root.tmp_dir.exists() or not list(root.tmp_dir.iterdir()), "the failed build was left behind"


def test_preprocess_into_a_full_disk_fails_before_any_work(small_disk: Path) -> None:
    """Output columns are reserved on disk first: no SIGBUS from a memory map half way."""
    make_dataset("src", [500] * 6)  # in the test's own cache
    shutil.copytree(CacheRoot().path, small_disk, dirs_exist_ok=True)
    fn = f"{FNS}:add_features"
    # fill the disk so that the source fits and the output does not
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, free - 40_000))
    proc = rlds("preprocess", "src", "--fn", fn, "--name", "out", "--root", str(small_disk), "--workers", "1")
    line = one_error_line(proc)
    assert "bytes" in line and ("free" in line or "space" in line), line
    assert not CacheRoot(small_disk).exists("out")


def test_preprocess_by_episode_into_a_full_disk_names_the_job(small_disk: Path) -> None:
    """Per episode the output's size is known only as chunks finish: a full disk was 'no space
    left on the device: (unknown file)'."""
    make_dataset("src", [500] * 6)
    shutil.copytree(CacheRoot().path, small_disk, dirs_exist_ok=True)
    proc = rlds(
        "preprocess", "src", "--fn", f"{FNS}:adds_a_big_key", "--by", "episode", "--name", "out",
        "--root", str(small_disk), "--workers", "1", "--chunk-steps", "500",
    )  # fmt: skip
    line = one_error_line(proc)
    assert "no space left on the device writing the preprocessing job's files in" in line, line
    assert "(unknown file)" not in proc.stderr and "--resume" in proc.stderr
    assert not CacheRoot(small_disk).exists("out")


def test_read_only_cache(small_disk: Path) -> None:
    assert download("demo", root=small_disk).manifest.num_steps == 5000
    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True)
    if remount.returncode != 0:
        pytest.skip("cannot remount read-only here")
    root = ["--root", str(small_disk)]
    assert rlds("inspect", "pointmass-demo-v0", *root).returncode == 0  # reading still works
    for command in (
        ["download", "demo", "--force"],
        ["rm", "pointmass-demo-v0", "--yes"],
        ["view", "pointmass-demo-v0", "--name", "v", "--episodes", "0:3"],
        ["preprocess", "pointmass-demo-v0", "--fn", f"{FNS}:identity", "--name", "p"],
    ):
        line = one_error_line(rlds(*command, *root))
        assert "read-only filesystem" in line, (command, line)
    assert open_dataset("pointmass-demo-v0", small_disk).num_steps == 5000


# ----------------------------------------------------------------------------- user functions


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sys_exit_in_a_user_function_is_a_user_error(workers: str) -> None:
    make_dataset("src", [30] * 8)
    proc = rlds(
        "preprocess",
        "src",
        "--fn",
        f"{FNS}:calls_exit",
        "--name",
        "out",
        "--chunk-steps",
        "40",
        "-w",
        workers,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)  # never the function's own 0
    assert "unexpected" not in proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "calls_exit" in line and "sys.exit(0)" in line
    assert not CacheRoot().exists("out")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_what_a_user_function_prints_never_corrupts_json(workers: str) -> None:
    make_dataset("src", [30] * 8)
    proc = rlds(
        "preprocess",
        "src",
        "--fn",
        f"{FNS}:chatty",
        "--name",
        "out",
        "--chunk-steps",
        "40",
        "-w",
        workers,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout is the JSON document and nothing else
    assert result["name"] == "out"
    assert "raw write to fd 1" in proc.stderr and "chunk starting at 0" in proc.stderr
    dry = rlds("preprocess", "src", "--fn", f"{FNS}:chatty", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["by"] == "step"


def test_gc_names_failed_jobs_and_collects_them_with_jobs() -> None:
    make_dataset("src", [30] * 8)
    failed = rlds(  # past its schema inference (a function failing there leaves no job folder)
        "preprocess", "src", "--fn", f"{FNS}:raises", "--name", "out", "--chunk-steps", "40", "-w", "1"
    )
    assert failed.returncode == 1
    (job,) = CacheRoot().tmp_dir.glob("out.job-*")
    shown = rlds("gc")
    assert shown.returncode == 0
    assert (
        "kept 1 failed or interrupted preprocess job(s)" in shown.stdout and "rlds gc --jobs" in shown.stdout
    )
    assert json.loads(rlds("gc", "--json").stdout)["kept_jobs"] == [str(job)]
    assert json.loads(rlds("gc", "--jobs", "--json").stdout)["removed"] == [str(job)]
    assert not job.exists()


def test_a_function_file_edited_within_one_process_runs_its_new_code(tmp_path: Path) -> None:
    """The lineage records the file's sha256: the function that runs must be that file's."""
    from rlds_cli import preprocess

    make_dataset("src", [5, 5])
    fn_file = tmp_path / "fns.py"
    fn_file.write_text(
        "def f(batch):\n    out = dict(batch)\n    out['mark'] = batch['action'] * 0 + 1\n    return out\n"
    )
    first = preprocess.run("src", f"{fn_file}:f", "one", workers=1)
    fn_file.write_text(
        "def f(batch):\n    out = dict(batch)\n    out['mark'] = batch['action'] * 0 + 2\n    return out\n"
    )
    second = preprocess.run("src", f"{fn_file}:f", "two", workers=1)
    assert np.all(open_dataset("one")[:]["mark"] == 1)
    assert np.all(open_dataset("two")[:]["mark"] == 2), "the edited file's function did not run"
    assert first.manifest.lineage[0]["fn_sha256"] != second.manifest.lineage[0]["fn_sha256"]
