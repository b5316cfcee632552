"""Cache housekeeping: ``rlds rm``, ``rlds du``, ``rlds gc``, ``rlds path`` and their library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlds_cli.cache.manage import children_of, collect_garbage, disk_usage, remove_dataset
from rlds_cli.cache.manifest import read_manifest, write_manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import DatasetInUseError, DatasetNotFoundError
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import golden_three_episodes

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


@pytest.fixture
def two_datasets(tmp_path: Path) -> CacheRoot:
    """``parent`` and ``child``, where child's lineage names parent."""
    src = golden_three_episodes(tmp_path / "g.hdf5", with_next=True)
    convert(src, "parent")
    convert(src, "child", options={"block_rows": 2})
    cache = CacheRoot()
    directory = cache.dataset_dir("child")
    manifest = read_manifest(directory)
    manifest.lineage = [{"name": "parent", "digest": cache.manifest("parent").digest()}]
    write_manifest(directory, manifest, fsync=False)
    return cache


def test_children_of(two_datasets: CacheRoot) -> None:
    assert children_of(two_datasets, "parent") == ["child"]
    assert children_of(two_datasets, "child") == []


def test_remove_refuses_a_parent_unless_forced(two_datasets: CacheRoot) -> None:
    with pytest.raises(DatasetInUseError, match="'parent' is the parent of child"):
        remove_dataset(two_datasets, "parent")
    assert two_datasets.exists("parent")
    remove_dataset(two_datasets, "parent", force=True)
    assert not two_datasets.exists("parent")
    assert list(two_datasets.tmp_dir.iterdir()) == []  # the trash is gone too


def test_remove_unknown(two_datasets: CacheRoot) -> None:
    with pytest.raises(DatasetNotFoundError, match="no dataset named 'nope'"):
        remove_dataset(two_datasets, "nope")


def test_cli_rm(two_datasets: CacheRoot) -> None:
    result = runner.invoke(app, ["rm", "child", "--yes"])
    assert result.exit_code == 0, result.output
    assert "removed child" in result.stdout
    assert not two_datasets.exists("child")
    # now parent has no children and goes without --force
    assert runner.invoke(app, ["rm", "parent", "--yes"]).exit_code == 0


def test_cli_rm_parent_needs_force(two_datasets: CacheRoot) -> None:
    result = runner.invoke(app, ["rm", "parent", "--yes"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: dataset 'parent' is the parent of child"
    assert "--force" in result.stderr.splitlines()[1]
    assert runner.invoke(app, ["rm", "parent", "--yes", "--force"]).exit_code == 0


def test_cli_rm_asks(two_datasets: CacheRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlds_cli.cli.manage._can_ask", lambda: True)
    declined = runner.invoke(app, ["rm", "child"], input="n\n")
    assert declined.exit_code == 1
    assert two_datasets.exists("child")
    accepted = runner.invoke(app, ["rm", "child"], input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert not two_datasets.exists("child")


def test_cli_rm_without_terminal_needs_yes(two_datasets: CacheRoot) -> None:
    result = runner.invoke(app, ["rm", "child"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: refusing to remove 'child' without confirmation"
    assert two_datasets.exists("child")


def test_cli_rm_unknown() -> None:
    result = runner.invoke(app, ["rm", "nope", "--yes"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no dataset named 'nope'")


def test_disk_usage(two_datasets: CacheRoot) -> None:
    usage = disk_usage(two_datasets)
    assert set(usage.datasets) == {"parent", "child"}
    # allocated blocks, as du counts them (see tests/cli/test_cli_conventions.py for sparse files)
    files = [p for p in two_datasets.dataset_dir("parent").rglob("*") if p.is_file()]
    expected = sum(p.stat().st_blocks * 512 for p in files)
    assert usage.datasets["parent"] == expected
    assert usage.tmp == 0
    (two_datasets.tmp_dir / "x.abc.incomplete").mkdir(parents=True)
    (two_datasets.tmp_dir / "x.abc.incomplete" / "f").write_bytes(b"12345")
    small = (two_datasets.tmp_dir / "x.abc.incomplete" / "f").stat().st_blocks * 512
    assert disk_usage(two_datasets).tmp == small
    assert disk_usage(two_datasets).total == usage.total + small


def test_cli_du_json(two_datasets: CacheRoot) -> None:
    result = runner.invoke(app, ["du", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert set(data["datasets"]) == {"parent", "child"}
    assert (
        data["total_bytes"]
        == sum(data["datasets"].values()) + data["tmp_bytes"] + data["raw_bytes"] + data["other_bytes"]
    )
    human = runner.invoke(app, ["du"])
    assert "parent" in human.stdout and "total" in human.stdout


def test_gc_removes_stale_builds_and_unpublished_dirs(two_datasets: CacheRoot) -> None:
    stale = two_datasets.tmp_dir / "ghost.0123456789ab.incomplete"
    stale.mkdir(parents=True)
    junk = two_datasets.datasets_dir / "half-written"
    junk.mkdir()
    (junk / "arrays").mkdir()
    assert sorted(collect_garbage(two_datasets, dry_run=True)) == sorted([stale, junk])
    assert stale.exists() and junk.exists()
    assert sorted(collect_garbage(two_datasets)) == sorted([stale, junk])
    assert not stale.exists() and not junk.exists()
    assert two_datasets.exists("parent") and two_datasets.exists("child")
    assert collect_garbage(two_datasets) == []


def test_gc_keeps_a_live_build(two_datasets: CacheRoot) -> None:
    live = two_datasets.tmp_dir / "busy.0123456789ab.incomplete"
    live.mkdir(parents=True)
    with two_datasets.lock("busy"):
        assert collect_garbage(two_datasets) == []
    assert live.exists()


def test_cli_gc(two_datasets: CacheRoot) -> None:
    (two_datasets.tmp_dir / "ghost.0123456789ab.incomplete").mkdir(parents=True)
    dry = runner.invoke(app, ["gc", "--dry-run", "--json"])
    assert json.loads(dry.stdout)["removed"] == [str(two_datasets.tmp_dir / "ghost.0123456789ab.incomplete")]
    result = runner.invoke(app, ["gc"])
    assert result.exit_code == 0
    assert "removed" in result.stdout
    assert "nothing to remove" in runner.invoke(app, ["gc"]).stdout


def test_cli_path(two_datasets: CacheRoot) -> None:
    result = runner.invoke(app, ["path", "parent"])
    assert result.exit_code == 0
    assert result.stdout == f"{two_datasets.dataset_dir('parent')}\n"
    missing = runner.invoke(app, ["path", "nope"])
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: no dataset named 'nope'")


def test_gc_jobs_only_when_asked_and_never_a_running_one(two_datasets: CacheRoot) -> None:
    job = two_datasets.tmp_dir / "out.job-0123abcd0123abcd"
    (job / "chunks").mkdir(parents=True)
    assert collect_garbage(two_datasets) == []  # kept for --resume
    with two_datasets.lock("out"):
        assert collect_garbage(two_datasets, jobs=True) == []  # running
    assert collect_garbage(two_datasets, jobs=True, dry_run=True) == [job]
    assert job.exists()
    result = runner.invoke(app, ["gc", "--jobs", "--json"])
    assert json.loads(result.stdout)["removed"] == [str(job)]
    assert not job.exists()


def test_gc_raw_removes_only_orphaned_download_folders(two_datasets: CacheRoot) -> None:
    raw = two_datasets.path / "raw"
    used, orphan, busy = raw / "used-v0", raw / "gone-v0", raw / "busy-v0"
    for folder in (used, orphan, busy):
        folder.mkdir(parents=True)
        (folder / "f.hdf5").write_bytes(b"x")
    directory = two_datasets.dataset_dir("child")
    manifest = read_manifest(directory)
    manifest.source["raw_dir"] = str(used)
    write_manifest(directory, manifest, fsync=False)
    from filelock import FileLock

    from rlds_cli.net.layout import lock_path

    lock = lock_path(busy, "f.hdf5")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):  # a download in progress
        assert collect_garbage(two_datasets) == []
        assert collect_garbage(two_datasets, raw=True) == [orphan]
    assert used.exists() and busy.exists() and not orphan.exists()


def test_gc_raw_keeps_a_folder_whose_download_holds_its_lock(two_datasets: CacheRoot) -> None:
    """The lock a running download holds, where net/fetch.py takes it (gc once looked for the
    old ``.<file>.lock`` only, and removed folders with a download in progress)."""
    from filelock import FileLock

    from rlds_cli.net.layout import lock_path

    busy = two_datasets.path / "raw" / "busy-v0"
    busy.mkdir(parents=True)
    (busy / "f.hdf5").write_bytes(b"x")
    lock = lock_path(busy, "sub/f.hdf5")
    lock.parent.mkdir(parents=True)
    with FileLock(str(lock)):
        assert collect_garbage(two_datasets, raw=True) == []
    assert busy.exists()
    assert collect_garbage(two_datasets, raw=True) == [busy]


def test_registry_aliases_name_their_cached_dataset() -> None:
    from rlds_cli.sources.download import download

    download("demo")
    path = runner.invoke(app, ["path", "demo"])
    assert path.exit_code == 0
    assert path.stdout == f"{CacheRoot().dataset_dir('pointmass-demo-v0')}\n"
    info = runner.invoke(app, ["inspect", "demo", "--json", "--no-stats"])
    assert json.loads(info.stdout)["name"] == "pointmass-demo-v0"


def test_gc_keeps_a_live_build_of_a_name_holding_the_job_mark(isolated_cache: Path) -> None:
    """A build of 'a.job-b' was taken for a job directory of 'a' (whose lock was free) and removed
    under its writer, which then failed with 'unexpected FileNotFoundError'."""
    from rlds_cli.cache.layout import tmp_owner

    cache = CacheRoot()
    with cache.lock("a.job-b"):
        build = cache.new_build_dir("a.job-b")
        assert tmp_owner(build) == "a.job-b"
        assert collect_garbage(cache) == [] and build.is_dir()
        assert cache.layout.job_dirs() == []
    job = cache.layout.job_dir("a.job-b", "0123456789abcdef")
    job.mkdir()
    assert tmp_owner(job) == "a.job-b" and cache.layout.job_dirs() == [job]


def test_gc_raw_keeps_a_download_folder_while_its_files_convert(isolated_cache: Path) -> None:
    """The files' own locks are released once fetched: gc --raw removed the folder (hashes.json
    included) while the conversion read it ('unexpected FileNotFoundError')."""
    from rlds_cli.net.layout import in_use, url_dir

    cache = CacheRoot()
    folder = url_dir(cache, "http://127.0.0.1:1/data.hdf5")
    folder.mkdir(parents=True)
    (folder / "data.hdf5").write_bytes(b"x")
    with in_use(folder):
        assert collect_garbage(cache, raw=True) == [] and (folder / "data.hdf5").is_file()
    assert collect_garbage(cache, raw=True) == [folder] and not folder.exists()
