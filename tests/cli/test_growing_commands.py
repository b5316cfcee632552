"""Commands on a growing dataset that a hostile-input hunt found broken (issue 25): a view or a
split made views that never opened; a preprocess job failed on a missing episode index (or an
IndexError on an empty dataset); an export of a dataset with no episode wrote files no reader
takes back; ``rlds verify`` skipped the segments' content digests and said "verified"; a pulled
growing dataset could not be appended to (no ``building/``); a writer whose dataset was removed
failed with a bare ENOENT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.layout import SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import CommitFailedError
from rlds_cli.remote.pull import pull
from rlds_cli.remote.push import push
from tests.dataset_fixtures import uid_episode

runner = CliRunner()


def _grow(name: str, episodes: int = 4) -> None:
    with rlds_cli.DatasetWriter(name, commit_interval=0) as w:
        for uid in range(episodes):
            w.add_episode(uid_episode(uid, 5))
            w.flush()


@pytest.mark.parametrize(
    "command", [["view", "g", "--episodes", "1:3", "--name", "v"], ["split", "g", "--val", "0.5"]]
)
def test_a_view_of_a_growing_dataset_is_refused_in_one_line(isolated_cache: Path, command: list[str]) -> None:
    _grow("g")
    result = runner.invoke(app, command)
    assert result.exit_code == 1, result.output
    assert "growing dataset" in result.output and "rlds export g" in result.output
    assert sorted(p.name for p in (isolated_cache / "datasets").iterdir()) == ["g"]


@pytest.mark.parametrize("episodes", [4, 0])
def test_a_preprocess_job_on_a_growing_dataset_is_refused_in_one_line(
    isolated_cache: Path, episodes: int
) -> None:
    if episodes:
        _grow("g", episodes)
    else:  # a writer with a schema makes the dataset before any episode
        schema = {k: (v.shape[1:], v.dtype) for k, v in uid_episode(0, 3).items()}
        rlds_cli.DatasetWriter("g", schema=schema).close()
    for dry in ([], ["--dry-run"]):
        result = runner.invoke(
            app, ["preprocess", "g", "--fn", "tests.preprocess_fns:identity", "--name", "out", *dry]
        )
        assert result.exit_code == 1 and "growing dataset" in result.output, result.output
        assert "unexpected" not in result.output
    assert not CacheRoot().exists("out") and not list(isolated_cache.glob("tmp/*job*"))


def test_an_export_of_a_dataset_without_episodes_is_refused(isolated_cache: Path, tmp_path: Path) -> None:
    schema = {k: (v.shape[1:], v.dtype) for k, v in uid_episode(0, 3).items()}
    rlds_cli.DatasetWriter("e", schema=schema).close()
    for to in ("d4rl", "npz", "minari"):
        result = runner.invoke(app, ["export", "e", str(tmp_path / to), "--to", to])
        assert result.exit_code == 1 and "holds no episode yet" in result.output, result.output
        assert not (tmp_path / to).exists()


def test_verify_checks_the_segments_content_digests(isolated_cache: Path) -> None:
    _grow("g")
    ok = runner.invoke(app, ["verify", "g"])
    assert ok.exit_code == 0 and "(growing): verified" in ok.output, ok.output
    assert "content digests: the digests of 6 arrays of its 4 segments" in ok.output
    segment = sorted((isolated_cache / "datasets" / "g" / SEGMENTS_DIR).iterdir())[1]
    (action,) = segment.rglob("action.npy")
    data = np.load(action, mmap_mode="r+")
    data[0] += 1  # one value changed on disk, same size
    data.flush()
    del data
    bad = runner.invoke(app, ["verify", "g"])
    assert bad.exit_code == 1 and "content digest of action" in bad.output, bad.output


def test_a_pulled_growing_dataset_takes_more_episodes(isolated_cache: Path, tmp_path: Path) -> None:
    _grow("g", 3)
    push("g", str(tmp_path / "store"))
    result = pull(str(tmp_path / "store"), "copy")
    assert result.digests_checked
    copy = CacheRoot().dataset_dir("copy")
    if (copy / SEGMENT_BUILDS_DIR).exists():  # what a copy of the files may lack: an empty folder
        (copy / SEGMENT_BUILDS_DIR).rmdir()
    with rlds_cli.DatasetWriter("copy", mode="append", commit_interval=0) as w:
        w.add_episode(uid_episode(7, 4))
    assert rlds_cli.open_dataset("copy").num_episodes == 4


def test_a_pulled_growing_dataset_grows_under_its_readers_and_from_empty(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """A pull left out the empty ``building/`` (and ``segments/`` of a dataset with no episode
    yet): the first writer's mkdir changed the folder's ctime, so every open reader died with
    'was replaced while it was open', and a schema-only dataset could never take a commit."""
    _grow("g", 3)
    schema = rlds_cli.open_dataset("g").fields
    with rlds_cli.DatasetWriter("empty", schema=schema):
        pass
    for name in ("g", "empty"):
        push(name, str(tmp_path / name))
        pull(str(tmp_path / name), f"{name}-copy")
        copy = CacheRoot().dataset_dir(f"{name}-copy")
        assert (copy / SEGMENTS_DIR).is_dir() and (copy / SEGMENT_BUILDS_DIR).is_dir()
        reader = rlds_cli.open_dataset(f"{name}-copy")
        before = reader.num_episodes
        with rlds_cli.DatasetWriter(f"{name}-copy", mode="append", commit_interval=0) as w:
            w.add_episode(uid_episode(7, 4))
        reader.refresh()
        assert reader.num_episodes == before + 1, name


def test_a_writer_whose_dataset_was_removed_says_so(isolated_cache: Path) -> None:
    _grow("g", 1)
    w = rlds_cli.DatasetWriter("g", mode="append", commit_interval=0)
    assert runner.invoke(app, ["rm", "g", "--yes"]).exit_code == 0
    w.add_episode(uid_episode(9, 3))
    with pytest.raises(CommitFailedError, match="was removed while a writer was open"):
        w.close()


@pytest.mark.parametrize("when", ["after its first commit", "before any commit"])
def test_a_writer_whose_dataset_was_removed_and_made_again_commits_nothing_into_the_new_one(
    isolated_cache: Path, when: str
) -> None:
    """An old writer committed into the dataset made again under its name: its episodes mixed
    into the new one (same schema), or every reader failed on the new schema for good."""
    _grow("g", 1)
    w = rlds_cli.DatasetWriter("g", mode="append", commit_interval=0)
    if when == "after its first commit":
        w.add_episode(uid_episode(8, 3))
        w.flush()
    assert runner.invoke(app, ["rm", "g", "--yes"]).exit_code == 0
    with rlds_cli.DatasetWriter("g", mode="create", commit_interval=0) as fresh:
        fresh.add_episode(uid_episode(1, 5))
    w.add_episode(uid_episode(9, 3))
    with pytest.raises(CommitFailedError, match="'g' was removed and made again while a writer was open"):
        w.close()
    ds = rlds_cli.open_dataset("g")
    assert [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)] == [1]
