"""Export of a growing dataset takes one view (issue 25): a hard-link copy of the view's files
(``rlds_cli.cache.growing``, as ``rlds push`` takes), so an export that reads for longer than
the grace period while writers append, evict and compact is still that view, whole."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.export import export_dataset
from tests.dataset_fixtures import make_dataset, uid_episode
from tests.faults import assert_finishes_forked

CAPACITY = 5  # unprotected episodes kept


def _length(uid: int) -> int:
    return 2 + uid % 4


def _grow(name: str, uids: range, storage: str | None = None) -> None:
    options: dict[str, Any] = {"storage": storage, "capacity_episodes": CAPACITY, "grace_seconds": 0}
    with rlds_cli.DatasetWriter(name, mode="append", **(options if storage else {})) as w:
        for uid in uids:
            w.add_episode(uid_episode(uid, _length(uid)))
            w.flush()  # a commit (and an eviction) each


class Churn:
    """Runs before each of the first ``ROUNDS`` chunks the export reads: a writer commits two
    episodes (evicting two) and a compaction with no grace removes the files of the segments
    they retire (after three rounds, every episode of the view the export started from)."""

    ROUNDS = 12

    def __init__(self, name: str, monkeypatch: pytest.MonkeyPatch, next_uid: int) -> None:
        self.name, self.next_uid, self.rounds, self.removed = name, next_uid, 0, 0
        self._busy = False
        real = GrowingDataset.gather

        def gather(ds: GrowingDataset, *args: Any, **kwargs: Any) -> Any:
            if not self._busy and self.rounds < self.ROUNDS:
                self._busy = True
                try:
                    self.round()
                finally:
                    self._busy = False
            return real(ds, *args, **kwargs)

        monkeypatch.setattr(GrowingDataset, "gather", gather)

    def round(self) -> None:
        _grow(self.name, range(self.next_uid, self.next_uid + 2))
        self.next_uid += 2
        self.removed += len(rlds_cli.compact(self.name, grace_seconds=0).removed)
        self.rounds += 1


def _check_whole(uids: np.ndarray, obs: np.ndarray, nxt: np.ndarray, ends: np.ndarray) -> list[int]:
    """Every exported episode whole (its rows in order, ending where its flag says), and the
    episodes in the export, by uid."""
    assert (obs[:, 0] == uids).all() and (nxt[:, 0] == uids).all() and (nxt[:, 1] == obs[:, 1] + 1).all()
    starts = np.concatenate([[0], np.flatnonzero(ends)[:-1] + 1])
    episodes = []
    for start, stop in zip(starts.tolist(), (np.flatnonzero(ends) + 1).tolist(), strict=True):
        uid = int(uids[start])
        assert (uids[start:stop] == uid).all() and stop - start == _length(uid), uid
        assert obs[start:stop, 1].tolist() == list(range(stop - start)), uid
        episodes.append(uid)
    return episodes


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_an_export_reads_one_view_while_writers_evict_and_compact_with_no_grace(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str
) -> None:
    """Chunks of 3 steps, and before each one a writer commits and evicts and a compaction
    (grace 0) removes the retired segments' files: the export is the view it started from,
    exactly. (Reading the live view, the second chunk found its segments gone.)"""
    from rlds_cli.export import d4rl

    _grow("g", range(1, 9), storage)
    ds = rlds_cli.open_dataset("g")  # nothing read yet: its columns are opened as the export reads
    expected = rlds_cli.open_dataset("g")[:]  # the same view, read whole now
    churn = Churn("g", monkeypatch, next_uid=9)
    monkeypatch.setattr(d4rl, "CHUNK_STEPS", 3)
    out = export_dataset(ds, tmp_path / "g.npz", "npz")
    assert churn.rounds == Churn.ROUNDS and churn.removed > 10  # the view's segments went meanwhile
    got = np.load(out)
    uids = got["infos/episode_uid"]
    assert np.array_equal(uids, expected["info/episode_uid"])
    for name, key in (("observations", "observation"), ("next_observations", "next/observation")):
        assert np.array_equal(got[name], expected[key]), name
    ends = got["terminals"] | got["timeouts"]
    assert _check_whole(uids, got["observations"], got["next_observations"], ends) == [4, 5, 6, 7, 8]
    live = rlds_cli.open_dataset("g")
    assert live.num_episodes == CAPACITY and int(live.episode(0)["info/episode_uid"][0]) > 8
    assert sorted(os.listdir(isolated_cache / "tmp")) == []  # the copy is gone


def test_the_cli_export_of_a_growing_dataset_reads_one_view(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rlds export NAME DIR --to torchrl`` as the export above: the view of its start."""
    from tensordict import TensorDict

    import rlds_cli.export as exporters

    _grow("c", range(1, 9), "memmap")
    expected = rlds_cli.open_dataset("c")[:]
    churn = Churn("c", monkeypatch, next_uid=9)
    monkeypatch.setattr(exporters, "CHUNK_STEPS", 4)
    result = CliRunner().invoke(app, ["export", "c", str(tmp_path / "td"), "--to", "torchrl"])
    assert result.exit_code == 0, result.output
    assert churn.rounds >= 3 and churn.removed > 0
    td = TensorDict.load_memmap(tmp_path / "td")
    assert np.array_equal(td["observation"].numpy(), expected["observation"])
    assert np.array_equal(td["info", "episode_uid"].numpy(), expected["info/episode_uid"])
    ends = td["next", "terminated"].numpy().ravel() | td["next", "truncated"].numpy().ravel()
    got, obs, nxt = (td[k].numpy() for k in (("info", "episode_uid"), "observation", ("next", "observation")))
    assert _check_whole(got, obs, nxt, ends) == [4, 5, 6, 7, 8]


def _snapshot_and_die(name: str, wfd: int) -> None:
    from rlds_cli.cache.growing import snapshot_copy

    with snapshot_copy(rlds_cli.open_dataset(name)) as copy:  # type: ignore[arg-type]
        os.write(wfd, str(copy).encode())
        os._exit(0)  # killed: no cleanup


def test_a_snapshot_is_no_stale_build_while_it_lives_and_one_once_its_process_is_gone(
    isolated_cache: Path,
) -> None:
    """The copy lives in tmp/, where every dataset's transaction and ``rlds gc`` remove the
    builds of dead writers: the copy holds a lock of its own, so they leave it alone (they
    removed it under a running push or export), and remove it once its process is gone."""
    from rlds_cli.cache.growing import snapshot_copy
    from rlds_cli.cache.manage import collect_garbage

    _grow("s", range(1, 4), "memmap")
    ds = rlds_cli.open_dataset("s")
    assert isinstance(ds, GrowingDataset)
    with snapshot_copy(ds) as copy:
        make_dataset("other", [2, 3])  # another dataset's transaction cleans tmp/
        assert collect_garbage(CacheRoot()) == []
        assert copy.is_dir()
        assert GrowingDataset(copy)[:]["info/episode_uid"].tolist() == ds[:]["info/episode_uid"].tolist()
    assert not copy.exists()
    rfd, wfd = os.pipe()
    assert_finishes_forked(_snapshot_and_die, "s", wfd)
    os.close(wfd)
    dead = Path(os.read(rfd, 4096).decode())
    os.close(rfd)
    assert dead.is_dir()
    assert collect_garbage(CacheRoot()) == [dead] and not dead.exists()


def test_a_view_whose_segments_are_gone_is_refreshed_before_it_is_copied(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """An export of a view older than the grace period (its segments compacted away and
    removed): the view is refreshed, as a reader's would be, and the export is the new view
    whole (the copy of the old one would have lacked those segments)."""
    _grow("o", range(1, 9), "memmap")
    ds = rlds_cli.open_dataset("o")
    assert isinstance(ds, GrowingDataset)
    _grow("o", range(9, 11))
    assert rlds_cli.compact("o", grace_seconds=0).removed
    out = export_dataset(ds, tmp_path / "o.npz", "npz")
    got = np.load(out)
    ends = got["terminals"] | got["timeouts"]
    uids = got["infos/episode_uid"]
    assert _check_whole(uids, got["observations"], got["next_observations"], ends) == [6, 7, 8, 9, 10]
    assert ds.num_episodes == CAPACITY and ds[:]["info/episode_uid"].tolist() == uids.tolist()


def test_an_export_that_fails_leaves_no_copy_and_no_lock(isolated_cache: Path, tmp_path: Path) -> None:
    """An export broken off by its progress callback: nothing written, and neither the copy nor
    its lock file is left in the cache; the same export then succeeds."""
    _grow("broken", range(4), "memmap")

    def stop(steps: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_dataset(rlds_cli.open_dataset("broken"), tmp_path / "out.npz", format="npz", progress=stop)
    cache = CacheRoot()
    assert not (tmp_path / "out.npz").exists()
    assert [p.name for p in cache.locks_dir.iterdir() if "~snapshot-" in p.name] == []
    assert [p.name for p in cache.tmp_dir.iterdir() if "~snapshot-" in p.name] == []
    export_dataset(rlds_cli.open_dataset("broken"), tmp_path / "out.npz", format="npz")
    assert (tmp_path / "out.npz").exists()


def test_damage_is_named_in_the_dataset_not_in_its_snapshot(isolated_cache: Path, tmp_path: Path) -> None:
    """A growing dataset exports from a snapshot of hard links, gone once the export ends: the
    refusal of a damaged segment named the snapshot's path."""
    from rlds_cli.errors import CorruptDatasetError

    _grow("g", range(3))
    folder = CacheRoot().dataset_dir("g")
    target = sorted(p for p in folder.glob("segments/*/arrays/observation*") if p.is_file())[0]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(CorruptDatasetError, match="dataset 'g' is damaged") as info:
        export_dataset(GrowingDataset(folder), tmp_path / "out", "torchrl")
    assert "snapshot" not in info.value.message and str(folder) in info.value.message
