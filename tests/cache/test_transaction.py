"""``CacheTransaction``: the steps every writer of the cache shares (the writers themselves, and
a kill at each step, are tested in test_atomicity.py and test_kill_at_every_step.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from rlds_cli.cache.episodes import build_index, write_index
from rlds_cli.cache.manifest import FieldSpec, Manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.transaction import CacheTransaction
from rlds_cli.errors import DatasetExistsError, LockTimeoutError


def _manifest(name: str) -> Manifest:
    """A dataset of one episode of two steps whose manifest declares the TED keys (opening checks
    them) but whose columns are never read: the transaction's rules need no data."""
    declared = [("observation", "flat"), ("action", "step"), ("next/reward", "step")]
    declared += [("next/terminated", "step"), ("next/truncated", "step")]
    fields = {key: FieldSpec(key, (1,), "float32", storage) for key, storage in declared}
    return Manifest(name=name, backend="memmap", num_steps=2, num_episodes=1, fields=fields)


def _write(name: str, *, replace: bool = False) -> Path:
    with CacheTransaction(name, replace=replace) as txn:
        build = txn.new_build_dir()
        write_index(build, build_index(np.array([1]), np.array([-1]), np.array([True])), fsync=txn.fsync)
        return txn.commit(_manifest(name))


def test_a_commit_publishes_the_build_and_the_index_names_its_episodes() -> None:
    published = _write("a/b")
    assert published == CacheRoot().dataset_dir("a/b") and published.name == "a--b"
    episodes = open_dataset("a/b").episode_index
    assert episodes.tolist() == [(0, 2, 0, True)]  # the unknown source id became the position
    assert not list(CacheRoot().tmp_dir.iterdir())


def test_a_taken_name_is_refused_without_replace_and_the_build_is_removed() -> None:
    _write("d")
    with pytest.raises(DatasetExistsError, match="'d' already exists"):
        _write("d")
    assert not list(CacheRoot().tmp_dir.iterdir())
    _write("d", replace=True)
    assert open_dataset("d").num_steps == 2


def test_an_adopted_build_survives_an_abort_and_a_fresh_one_does_not(tmp_path: Path) -> None:
    kept = CacheRoot().tmp_dir / "d.job-0123456789abcdef" / "out"
    kept.mkdir(parents=True)
    with pytest.raises(RuntimeError), CacheTransaction("d") as txn:
        txn.adopt(kept)
        raise RuntimeError("the job failed")
    assert kept.is_dir()  # --resume continues from it
    with pytest.raises(RuntimeError), CacheTransaction("d") as txn:
        fresh = txn.new_build_dir()
        raise RuntimeError("the conversion failed")
    assert not fresh.exists()


def test_a_held_name_times_out_with_what_is_written_in_the_message() -> None:
    with CacheTransaction("d"), pytest.raises(LockTimeoutError, match=r"^dataset 'd' is being written by"):
        CacheTransaction("d", lock_timeout=0).__enter__()
    url_lock = FileLock(str(CacheRoot().layout.lock_file(".preprocess-x")), timeout=0)
    CacheRoot().locks_dir.mkdir(parents=True, exist_ok=True)
    held = FileLock(str(CacheRoot().layout.lock_file(".preprocess-x")))
    with held, pytest.raises(LockTimeoutError, match=r"^s3://b/d is being written by another process"):
        CacheTransaction("d", lock=url_lock, what="s3://b/d").__enter__()


def test_a_foreign_lock_leaves_the_builds_of_a_live_writer_of_the_name() -> None:
    """A job whose output goes to a URL holds the URL's lock, not the name's: a conversion of a
    dataset of the same name, running meanwhile, keeps its build."""
    cache = CacheRoot()
    with CacheTransaction("d") as writer:
        build = writer.new_build_dir()
        url_lock = FileLock(str(cache.layout.lock_file(".preprocess-x")), timeout=0)
        with CacheTransaction("d", lock=url_lock, what="s3://b/d"):
            assert build.is_dir()
    # once no writer holds the name, its leftovers are stale
    (cache.tmp_dir / build.name).mkdir()
    with CacheTransaction("d", lock=FileLock(str(cache.layout.lock_file(".preprocess-x")), timeout=0)):
        assert not (cache.tmp_dir / build.name).exists()
