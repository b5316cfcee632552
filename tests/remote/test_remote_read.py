"""Reading a pushed zarr dataset where it lies: ``open_dataset(URL)`` and ``Loader(URL)``.

Units run on fsspec's ``memory://`` store (every layout the chunk reader knows, with and without
the local file cache); integration runs against the local S3 server of ``tests/remote/test_remote.py``
(moto on 127.0.0.1). Replacement is tested by pushing ``--force`` in the middle of a read.
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetReplacedError,
    RemoteCorruptError,
    RemoteDatasetNotFoundError,
)
from rlds_cli.loader.opening import open_dataset
from tests.cache.test_cache_contract import _pixel_blocks

fsspec = pytest.importorskip("fsspec")

from rlds_cli.cache.backends.zarr import read as zarr_read  # noqa: E402
from rlds_cli.remote import reader as reader_module  # noqa: E402
from rlds_cli.remote import store  # noqa: E402
from rlds_cli.remote.push import push  # noqa: E402
from rlds_cli.remote.reader import RemoteDataset, RemoteNotReadableError  # noqa: E402
from tests.remote.test_remote import moto_endpoint, s3, s3_env  # noqa: E402, F401  (fixtures)

runner = CliRunner()
URL = "memory://bucket/ds/z"
#: Tiny chunks and shards, so that a few dozen steps span many of each (as test_cache_contract).
LAYOUTS = {
    "sharded": {"ZARR_CHUNK_BYTES": 40, "ZARR_SHARD_BYTES": 160},
    "one-file-per-chunk": {"ZARR_CHUNK_BYTES": 40, "ZARR_SHARD_BYTES": 0},
}


@pytest.fixture(autouse=True)
def _fresh_memory_store() -> Iterator[None]:
    from fsspec.implementations.memory import MemoryFileSystem

    yield
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


blocks = _pixel_blocks  # the zarr layout tests' episodes


def build(
    name: str, backend: str, lengths: tuple[int, ...] = (13, 1, 29, 5, 17, 2, 24), seed: int = 7
) -> None:
    from rlds_cli.cache import DatasetBuilder

    with DatasetBuilder(name, backend=backend, replace=True) as builder:
        for block in blocks(lengths, seed):
            builder.append(block)
        builder.commit()


@pytest.fixture(params=list(LAYOUTS))
def local(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Dataset:
    """The same episodes as a cached memmap dataset and (pushed to :data:`URL`) as zarr."""
    from rlds_cli.cache.backends.zarr import write as backends

    for name, value in LAYOUTS[request.param].items():
        monkeypatch.setattr(backends, name, value)
    build("m", "memmap")
    build("z", "zarr")
    push("z", URL)
    return open_dataset("m")


def assert_same(a: Any, b: Any) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def read_everything(m: Dataset, z: Dataset) -> None:
    n = m.num_steps
    for idx in (
        np.array([0, 1, 2, 3, 4, 5, 9, 10, 11, 19, 20, 21, 39, 40, 41, n - 2, n - 1]),
        np.array([5, 5, 5, 0, 5, n - 1, n - 1]),
        np.array([-1, -2, -n, 3]),
        np.random.default_rng(3).integers(-n, n, size=(16, 5)),
    ):
        assert_same(m.gather(idx), z.gather(idx))
    for i in range(m.num_episodes):
        assert_same(m.episode(i), z.episode(i))
    assert_same(m[3:50], z[3:50])
    assert_same(m[::7], z[::7])
    for key in m.manifest.fields:
        np.testing.assert_array_equal(np.asarray(z.column(key)), np.asarray(m.column(key)), err_msg=key)
        np.testing.assert_array_equal(z.column(key)[2], np.asarray(m.column(key))[2], err_msg=key)


# --------------------------------------------------------------------------- reads


@pytest.mark.parametrize("cached", [False, True])
def test_remote_reads_match_the_local_dataset(local: Dataset, cached: bool, tmp_path: Path) -> None:
    z = open_dataset(URL, cache=tmp_path / "cache" if cached else None)
    assert isinstance(z, RemoteDataset) and z.url == URL
    assert z.column("pixels")._reader is not None, "the remote read goes through rlds's chunk reader"
    assert z.column("pixels")._reader.source.whole_files is cached
    read_everything(local, z)
    assert z.check_files() == []
    from rlds_cli.cache import digest

    report = digest.check_digests(z)
    assert report.ok and "pixels" in report.checked and "episodes" in report.checked


def test_zarr_itself_reads_the_remote_store_too(local: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layout the chunk reader does not know falls back to zarr's indexing, on the same
    checked metadata and ranged reads."""
    monkeypatch.setattr(zarr_read.ChunkReader, "of", classmethod(lambda cls, *a, **k: None))
    z = open_dataset(URL)
    assert z.column("pixels")._reader is None
    read_everything(local, z)


def test_a_read_fetches_its_chunks_in_one_batch(local: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = reader_module.RemoteFiles.read_ranges

    def counting(self: Any, rels: Any, starts: Any, ends: Any) -> list[bytes]:
        calls.append(len(rels))
        return real(self, rels, starts, ends)

    monkeypatch.setattr(reader_module.RemoteFiles, "read_ranges", counting)
    z = open_dataset(URL)
    column = z.column("pixels")
    rows = np.arange(0, z.num_steps, 3)
    column[rows]
    # cold: the indexes of every shard needed, then every chunk needed (never one per chunk)
    assert len(calls) == (2 if column._reader.per_shard else 1), calls
    calls.clear()
    column[rows + 1]
    assert len(calls) == 1  # warm: the shard indexes are kept


def test_the_file_cache_serves_a_second_pass_with_no_request(local: Dataset, tmp_path: Path) -> None:
    from rlds_cli import Loader

    first = open_dataset(URL, cache=tmp_path / "c")
    batches = [b for b in Loader(first, 16, sampler="epoch", seed=3, in_memory=False)]
    assert first.requests > 0
    again = open_dataset(URL, cache=tmp_path / "c")
    replay = [b for b in Loader(again, 16, sampler="epoch", seed=3, in_memory=False)]
    assert again.requests == 0 and again.bytes_fetched == 0
    for a, b in zip(batches, replay, strict=True):
        assert_same(a, b)


def test_a_damaged_copy_in_the_file_cache_is_never_served(local: Dataset, tmp_path: Path) -> None:
    """A byte of a cached copy changed after it was fetched (bit rot, a tool): the next process
    served it as the push's (it was checked only when fetched)."""
    from rlds_cli.errors import RemoteCacheDamagedError

    rows = np.arange(local.num_steps)
    open_dataset(URL, cache=tmp_path / "c").column("pixels")[rows]
    copy = max((p for p in (tmp_path / "c").rglob("*") if p.is_file() and "pixels" in str(p)),
               key=lambda p: p.stat().st_size)  # fmt: skip
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(RemoteCacheDamagedError, match="differs from the file pushed") as info:
        open_dataset(URL, cache=tmp_path / "c").column("pixels")[rows]
    assert str(copy) in info.value.message and f"remove {copy}" in info.value.hint
    copy.unlink()
    again = open_dataset(URL, cache=tmp_path / "c").column("pixels")[rows]  # fetched again
    np.testing.assert_array_equal(again, local.column("pixels")[rows])


def test_a_damaged_episode_index_in_the_file_cache_is_never_used(local: Dataset, tmp_path: Path) -> None:
    """The episode index kept by an earlier open was read as it was, unchecked: one episode
    boundary moved (the same size) gave wrong episodes and wrong next observations, no error."""
    from rlds_cli.errors import RemoteCacheDamagedError

    open_dataset(URL, cache=tmp_path / "c")
    (copy,) = (tmp_path / "c").rglob("episodes.npy")
    index = np.load(copy)
    index["length"][0] -= 1
    index["start"][1] -= 1
    index["length"][1] += 1
    np.save(copy, index)
    with pytest.raises(RemoteCacheDamagedError, match="differs from the file pushed") as info:
        open_dataset(URL, cache=tmp_path / "c")
    assert f"remove {copy}" in info.value.hint
    copy.unlink()
    read_everything(open_dataset("m"), open_dataset(URL, cache=tmp_path / "c"))  # fetched again


def test_the_cache_env_variable_and_the_loader_take_a_url(
    local: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli import Loader

    monkeypatch.setenv("RLDS_REMOTE_CACHE", str(tmp_path / "env-cache"))
    loader = Loader(URL, 8, seed=1, in_memory=True)
    assert isinstance(loader.dataset, RemoteDataset)
    assert loader.dataset.column("pixels")._reader.source.whole_files
    assert any((tmp_path / "env-cache").rglob("c/*"))
    assert_same(next(iter(loader)), next(iter(Loader("m", 8, seed=1, in_memory=True))))


def test_a_remote_dataset_pickles_and_reads_in_a_forked_worker(local: Dataset) -> None:
    z = open_dataset(URL)
    z.gather(np.array([1, 2]))
    copy = pickle.loads(pickle.dumps(z))
    assert isinstance(copy, RemoteDataset)
    assert_same(copy.gather(np.array([4, 40])), local.gather(np.array([4, 40])))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:  # the child inherits the open dataset, filesystem and all
        got = pool.apply(_gather_in_child, (z, [4, 40]))
    assert_same(got, local.gather(np.array([4, 40])))


def _gather_in_child(z: Dataset, rows: list[int]) -> dict[str, np.ndarray]:
    return dict(z.gather(np.array(rows)))


# --------------------------------------------------------------------------- refusals and damage


def test_a_memmap_dataset_at_a_url_is_refused_with_pull() -> None:
    build("m", "memmap", (3, 4))
    push("m", "memory://bucket/ds/m")
    with pytest.raises(RemoteNotReadableError, match="is a memmap dataset") as info:
        open_dataset("memory://bucket/ds/m")
    assert "rlds pull memory://bucket/ds/m" in info.value.hint
    result = runner.invoke(app, ["inspect", "memory://bucket/ds/m"])
    assert result.exit_code == 1
    assert "memory://bucket/ds/m is a memmap dataset" in result.stderr and "rlds pull" in result.stderr


def test_no_dataset_or_a_push_in_progress_is_one_clear_error() -> None:
    with pytest.raises(RemoteDatasetNotFoundError, match=r"holds no manifest\.json"):
        open_dataset("memory://bucket/none")
    build("z", "zarr", (3, 4))
    push("z", URL)
    fs = fsspec.filesystem("memory")
    index = json.loads(fs.cat_file("/bucket/ds/z/rlds-files.json"))
    index["manifest_sha256"] = "0" + index["manifest_sha256"]  # (an unknown field is ignored)
    fs.pipe_file("/bucket/ds/z/rlds-files.json", store.index_bytes({**index, "x": 1}))
    with pytest.raises(RemoteCorruptError, match="belong to different pushes") as info:
        open_dataset(URL)
    # a push under way, or an index of another push copied there: both said, with both remedies
    assert "replaced by another copy" in info.value.message and "--force" in info.value.hint


def test_a_damaged_files_index_is_named_before_a_read() -> None:
    """The index was not checked itself: a flipped digit of a file's sha256 or crc32c, of a
    size elsewhere, passed ``inspect URL --check`` (found only by a pull, as the file's damage)."""
    build("z", "zarr", (3, 4))
    push("z", URL)
    fs = fsspec.filesystem("memory")
    pushed = fs.cat_file("/bucket/ds/z/rlds-files.json")
    assert json.loads(pushed)[store.INDEX_DIGEST_KEY]
    where = pushed.index(b'"sha256": "') + len(b'"sha256": "')
    for at in (where, pushed.index(b'"block_crc32c"') + 3, len(pushed) - 10):
        damaged = bytearray(pushed)
        damaged[at] ^= 0x01
        fs.pipe_file("/bucket/ds/z/rlds-files.json", bytes(damaged))
        with pytest.raises(RemoteCorruptError, match=r"rlds-files\.json is damaged: it fails its own digest"):
            open_dataset(URL)
        result = runner.invoke(app, ["inspect", URL, "--check", "--no-stats"])
        assert result.exit_code == 1 and "fails its own digest" in result.stderr, result.output
    # an index an older rlds pushed has no digest: still read
    old = json.loads(pushed)
    old.pop(store.INDEX_DIGEST_KEY)
    fs.pipe_file("/bucket/ds/z/rlds-files.json", json.dumps(old).encode())
    assert open_dataset(URL).num_episodes == 2


def test_a_missing_or_changed_remote_file_is_named(local: Dataset, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    z = open_dataset(URL)
    victim = "/bucket/ds/z/arrays/pixels/c/2/0/0/0"
    fs.rm(victim)
    assert z.check_files() == [f"memory:/{victim} is missing, though rlds-files.json lists it"]
    with pytest.raises(CorruptDatasetError, match=f"memory:/{victim} is missing") as info:
        open_dataset(URL).column("pixels")[np.arange(local.num_steps)]
    assert "rlds push NAME URL --force" in info.value.hint  # was "run 'rlds verify NAME'": no URL
    # a changed byte: caught by the sha256 of the cached copy, and by the content digest
    data = bytearray(local.column("pixels")[:].tobytes())
    fs.pipe_file(victim, bytes(data[:40]))
    with pytest.raises(CorruptDatasetError, match=f"memory:/{victim} differs from the file pushed"):
        open_dataset(URL, cache=tmp_path / "c").column("pixels")[np.arange(local.num_steps)]
    assert (tmp_path / "c").is_dir() and not list((tmp_path / "c").rglob("c/2/0/0/0"))


def test_a_changed_chunk_is_caught_by_the_content_digest(local: Dataset) -> None:
    from rlds_cli.cache import digest

    fs = fsspec.filesystem("memory")
    victim = "/bucket/ds/z/arrays/next/reward/c/0"
    found = [p for p in fs.find("/bucket/ds/z/arrays/next/reward/c")]
    victim = found[0]
    data = bytearray(fs.cat_file(victim))
    data[20] ^= 0xFF  # inside the first chunk's data, past its 16-byte Blosc header
    fs.pipe_file(victim, bytes(data))
    report = digest.check_digests(open_dataset(URL))
    assert [p.key for p in report.problems] == ["next/reward"]


# --------------------------------------------------------------------------- replacement


@pytest.mark.parametrize("cached", [False, True])
def test_a_push_force_during_a_read_is_detected_never_mixed(
    local: Dataset, cached: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    z = open_dataset(URL, cache=tmp_path / "c" if cached else None)
    rows = np.arange(0, z.num_steps, 2)
    z.gather(rows[:3], keys=["pixels"])  # shard indexes (or files) of the first version
    build("z", "zarr", seed=8)  # another version: same shapes, other values
    fired: list[bool] = []
    name = "prepare" if cached else "read_ranges"
    real = getattr(reader_module.RemoteFiles, name)

    def racing(self: Any, *args: Any) -> Any:
        if not fired:
            fired.append(True)
            push("z", URL, force=True)  # in the middle of the read: before its bytes are fetched
        return real(self, *args)

    monkeypatch.setattr(reader_module.RemoteFiles, name, racing)
    with pytest.raises(DatasetReplacedError, match=f"at {URL} was replaced"):
        z.gather(rows)
    assert fired
    monkeypatch.setattr(reader_module.RemoteFiles, name, real)
    with pytest.raises(DatasetReplacedError):
        z.gather(rows[:2], keys=["state"])  # any later read too
    fresh = open_dataset(URL, cache=tmp_path / "c" if cached else None)  # the new version, whole
    assert_same(fresh.gather(rows), open_dataset("z").gather(rows))


@pytest.mark.parametrize("cache", ["none", "files", "blocks"])
def test_a_file_a_push_force_removed_or_changed_is_a_replacement_not_damage(
    local: Dataset, cache: str, tmp_path: Path
) -> None:
    """After a ``push --force`` of a shorter version under an open reader, reading a file the new
    version lacks said "is missing, though rlds-files.json lists it" (with the file cache: "differs
    from the file pushed") and a hint to push again: damage, where the reader is to open it again."""
    kwargs: dict[str, Any] = {} if cache == "none" else {"cache": tmp_path / "c"}
    if cache == "blocks":
        kwargs["cache_limit"] = "64M"
    z = open_dataset(URL, **kwargs)
    z.gather(np.arange(2), keys=["state"])
    build("z", "zarr", lengths=(13, 1, 29, 5, 3, 2), seed=8)  # fewer steps, other values
    push("z", URL, force=True)
    for rows in (np.arange(20, 30), np.arange(80, 90)):  # changed files, then files now gone
        with pytest.raises(DatasetReplacedError, match="replaced \\(or removed\\) while it was open"):
            z.gather(rows, keys=["state", "pixels"])


def test_a_removed_manifest_stops_reads() -> None:
    build("z", "zarr", (3, 4))
    push("z", URL)
    z = open_dataset(URL)
    z.gather(np.array([0]))
    fsspec.filesystem("memory").rm("/bucket/ds/z/manifest.json")
    with pytest.raises(DatasetReplacedError, match="replaced \\(or removed\\)"):
        z.gather(np.array([1, 2]))


# --------------------------------------------------------------------------- the CLI


def test_inspect_check_on_a_url(local: Dataset) -> None:
    result = runner.invoke(app, ["inspect", URL, "--check", "--json"])
    assert result.exit_code == 0, result.output
    import json

    info = json.loads(result.stdout)
    assert info["path"] == URL and info["check"]["ok"]
    assert info["stored"]["pixels"]["bytes"] > 0
    fs = fsspec.filesystem("memory")
    victim = sorted(fs.find("/bucket/ds/z/arrays/next/reward/c"))[0]
    data = bytearray(fs.cat_file(victim))
    data[20] ^= 0x01
    fs.pipe_file(victim, bytes(data))
    result = runner.invoke(app, ["inspect", URL, "--check", "--no-stats"])
    assert result.exit_code == 1, result.output
    said = " ".join((result.stdout + result.stderr).split())
    assert f"{victim[1:]} differs from the file pushed" in said and "rlds-remote-" not in said, said
    assert "rlds push NAME URL --force" in said and "rlds download" not in said, said  # what mends it


@pytest.mark.parametrize("group", ["arrays/zarr.json", "arrays/next/zarr.json"])
def test_check_on_a_url_reads_the_groups_metadata(local: Dataset, group: str) -> None:
    """No read opens a zarr group's metadata (arrays are opened by path): a damaged one passed
    ``inspect URL --check``, though the same damage in the cache fails it."""
    fs = fsspec.filesystem("memory")
    victim = f"/bucket/ds/z/{group}"
    data = bytearray(fs.cat_file(victim))
    data[5] ^= 0x01
    fs.pipe_file(victim, bytes(data))
    read_everything(open_dataset("m"), open_dataset(URL))  # the arrays read right all the same
    result = runner.invoke(app, ["inspect", URL, "--check", "--no-stats"])
    assert result.exit_code == 1, result.output
    said = " ".join((result.stdout + result.stderr).split())
    assert f"{victim[1:]} differs from the file pushed" in said, said
    # the URL is named, and what mends it: not the local name's commands
    assert f"error: {URL}: check failed" in said and "rlds verify" not in said, said
    assert "rlds push NAME URL --force" in said, said


# --------------------------------------------------------------------------- a local S3 server


def test_s3_remote_reads_and_loader(s3: Any, tmp_path: Path) -> None:  # noqa: F811
    from rlds_cli import Loader

    build("m", "memmap", (40, 7, 90))
    build("z", "zarr", (40, 7, 90))
    url = f"s3://{s3.bucket}/rlds/z"
    push("z", url)
    z = open_dataset(url)
    read_everything(open_dataset("m"), z)
    assert z.check_files() == []
    want = [b for b in Loader("m", 32, sampler="epoch", seed=5)]
    for source, in_memory in ((url, False), (url, True), (open_dataset(url, cache=tmp_path / "c"), False)):
        got = [b for b in Loader(source, 32, sampler="epoch", seed=5, in_memory=in_memory)]
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    with multiprocessing.get_context("fork").Pool(1) as pool:  # s3fs's event loop is not fork-safe
        assert_same(pool.apply(_gather_in_child, (z, [4, 100])), open_dataset("m").gather(np.array([4, 100])))
    build("z", "zarr", (40, 7, 90), seed=9)
    push("z", url, force=True)
    with pytest.raises(DatasetReplacedError):
        z.gather(np.arange(0, 130, 3))


def test_s3_unreachable_store_is_one_line() -> None:
    pytest.importorskip("s3fs")
    result = runner.invoke(
        app,
        ["inspect", "s3://b/x"],
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
             "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
    )  # fmt: skip
    assert result.exit_code == 1
    assert "s3://b/x: cannot reach the store" in " ".join(result.stderr.split())


def test_a_missing_index_a_short_file_and_changed_metadata_are_named(local: Dataset) -> None:
    fs = fsspec.filesystem("memory")
    shard = sorted(fs.find("/bucket/ds/z/arrays/pixels/c"))[1]
    fs.pipe_file(shard, fs.cat_file(shard)[:-10])  # shorter than pushed: its index is cut off
    with pytest.raises(CorruptDatasetError, match=f"memory:/{shard} is shorter than the file pushed"):
        open_dataset(URL).column("pixels")[np.arange(local.num_steps)]
    meta = "/bucket/ds/z/arrays/state/zarr.json"
    fs.pipe_file(meta, fs.cat_file(meta).replace(b'"fill_value": 0.0', b'"fill_value": 1.0'))
    with pytest.raises(CorruptDatasetError, match=f"memory:/{meta} differs from the file pushed"):
        open_dataset(URL).column("state")
    z = open_dataset(URL)
    with pytest.raises(RemoteNotReadableError, match="is read-only"):
        z._backend.create_column(z.directory, "x", np.dtype("f4"), ())
    fs.rm("/bucket/ds/z/rlds-files.json")
    with pytest.raises(RemoteCorruptError, match=r"has a manifest but no rlds-files\.json"):
        open_dataset(URL)


# --------------------------------------------------------------------------- frame columns


@pytest.mark.parametrize("cached", [False, True])
def test_frame_columns_read_where_they_lie_and_pull(
    isolated_cache: Path, cached: bool, tmp_path: Path
) -> None:
    """A zarr dataset with a frame column (webp): read where it was pushed (ranged reads, or the
    file cache's copy), checked by its digests, pulled whole; a changed frame is reported."""
    from rlds_cli.cache.digest import check_digests
    from rlds_cli.remote.pull import pull
    from tests.frames_fixtures import build_frames

    pixels = build_frames(isolated_cache, "f", [4, 2, 5], "webp", backend="zarr")
    local = open_dataset("f")
    push("f", URL)
    z = open_dataset(URL, cache=tmp_path / "cache" if cached else None)
    assert z.stored_fields["pixels"].codec == "webp"
    np.testing.assert_array_equal(np.asarray(z.column("pixels")[:]), pixels)
    idx = np.array([0, 3, 3, 7, 10])
    assert_same(local.gather(idx), z.gather(idx))
    assert_same(local.episode(1), z.episode(1))
    assert z.check_files() == []
    report = check_digests(z)
    assert report.ok and "pixels" in report.checked
    pull(URL, "pulled")
    np.testing.assert_array_equal(open_dataset("pulled").column("pixels")[:], pixels)
    assert check_digests(open_dataset("pulled")).ok


def test_a_changed_remote_frame_is_named(isolated_cache: Path) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from rlds_cli.cache.digest import check_digests
    from tests.frames_fixtures import build_frames

    build_frames(isolated_cache, "f", [4, 2], "png", backend="zarr")
    push("f", URL)
    path = "/bucket/ds/z/arrays/pixels@frames"
    data = bytearray(MemoryFileSystem.store[path].getvalue())
    data[len(data) // 2] ^= 0x10
    MemoryFileSystem.store[path] = MemoryFileSystem.store[path].__class__(
        MemoryFileSystem(), path, bytes(data)
    )
    report = check_digests(open_dataset(URL))
    assert not report.ok and report.problems[0].key == "pixels"
    # a frame that no longer decodes: mended by pushing again (the hint said 'rlds verify NAME')
    column = open_dataset(URL).column("pixels")
    hints = []
    for row in range(len(column)):  # one frame a read: a range of the file, decoded, not block-checked
        try:
            column[row]
        except CorruptDatasetError as exc:
            hints.append((str(exc), exc.hint))
    assert len(hints) == 1 and re.match(r"frame 3 of 'pixels' .*@frames\) is damaged", hints[0][0])
    assert hints[0][1] is not None and "rlds push NAME URL --force" in hints[0][1]


@pytest.mark.parametrize("how", ["gather", "loader"])
def test_a_changed_byte_is_never_served_by_a_read_without_a_cache(local: Dataset, how: str) -> None:
    """Reads without a cache fetch whole chunk files here: each whole block fetched is checked
    against the push's crc32c, so a changed byte is an error naming the file, never a row."""
    fs = fsspec.filesystem("memory")
    victim = sorted(fs.find("/bucket/ds/z/arrays/action/c"))[0]
    data = bytearray(fs.cat_file(victim))
    data[20] ^= 0x01  # inside the first chunk's values (a shard's index has a checksum of its own)
    fs.pipe_file(victim, bytes(data))
    with pytest.raises(CorruptDatasetError, match=f"memory:/{victim} differs from the file pushed"):
        if how == "gather":
            open_dataset(URL).gather(np.arange(local.num_steps))
        else:
            from rlds_cli.loader import Loader

            next(iter(Loader(URL, batch_size=8, in_memory=True, seed=0, num_batches=1)))
