"""The bounded block cache of remote reads (``cache_limit``) and reads planned ahead
(``Loader(url, read_ahead=N)``), on fsspec's ``memory://`` store with 4 KiB blocks (so a few
hundred steps span many blocks): same rows as the local dataset, never over the limit (sampled,
and after a SIGKILL at every step), one download per node, damage reported, ``rlds gc``.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError, SettingError
from rlds_cli.loader.opening import open_dataset

fsspec = pytest.importorskip("fsspec")

from rlds_cli.remote import block_cache, block_gc, block_ledger, store  # noqa: E402
from rlds_cli.remote.files import RemoteFiles  # noqa: E402
from rlds_cli.remote.push import push  # noqa: E402
from rlds_cli.remote.reader import RemoteDataset, RemoteNotReadableError  # noqa: E402
from tests.faults import count_steps, kill_at  # noqa: E402
from tests.formats_fixtures import refused  # noqa: E402
from tests.remote.test_remote import moto_endpoint, s3  # noqa: E402, F401  (fixtures)
from tests.remote.test_remote_read import URL, assert_same, build, read_everything  # noqa: E402

runner = CliRunner()
BLOCK = 4096
LENGTHS = (130, 10, 290, 50, 170)
LIMIT = 12 * BLOCK


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> Any:
    from fsspec.implementations.memory import MemoryFileSystem

    monkeypatch.setattr(store, "INDEX_BLOCK_BYTES", BLOCK)
    yield
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


@pytest.fixture
def local() -> Any:
    build("m", "memmap", LENGTHS)
    build("z", "zarr", LENGTHS)
    push("z", URL)
    return open_dataset("m")


def block_bytes(folder: Path) -> int:
    """Bytes of the block files (and their ``.part``) on disk: what the limit bounds (a file
    evicted while it is counted counts nothing: a reader may be at work)."""
    total = 0
    blocks = folder / block_ledger.BLOCKS_DIR
    for root, _, files in os.walk(blocks):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


# --------------------------------------------------------------------------- push and index


def test_push_records_block_digests_and_the_index_reads_them_back(local: Any) -> None:
    z = open_dataset(URL)
    index = z._files.index
    assert index.block_bytes == BLOCK
    big = {rel: e for rel, e in index.files.items() if e.size > BLOCK}
    assert big and all(e.blocks is not None for e in big.values())
    assert all(e.blocks is None for e in index.files.values() if e.size <= BLOCK)
    again = store.RemoteIndex.from_json(index.to_json(), "x")
    assert {r: e.blocks for r, e in again.files.items()} == {r: e.blocks for r, e in index.files.items()}
    doc = json.loads(index.to_json())
    rel = next(iter(big))
    doc["files"][rel]["blocks"] = doc["files"][rel]["blocks"][:-1]
    with pytest.raises(Exception, match="block digests where it has"):
        store.RemoteIndex.from_json(store.index_bytes(doc), "idx")


def test_an_old_push_without_block_digests_is_refused_then_push_rewrites_the_index(
    local: Any, tmp_path: Path
) -> None:
    fs = fsspec.filesystem("memory")
    path = "/bucket/ds/z/" + store.INDEX_FILE
    doc = json.loads(fs.cat_file(path))
    for entry in doc["files"].values():
        entry.pop("blocks", None)
    doc.pop("block_bytes")
    doc.pop(store.INDEX_DIGEST_KEY)  # an older rlds wrote none
    fs.pipe_file(path, json.dumps(doc).encode())
    with pytest.raises(RemoteNotReadableError, match="per-block digests") as err:
        open_dataset(URL, cache=tmp_path / "c", cache_limit=LIMIT)
    assert "rlds push" in err.value.hint
    assert open_dataset(URL, cache=tmp_path / "whole").num_steps  # without a limit: whole files
    result = push("z", URL)  # same version: only the index is written again
    assert result.up_to_date
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=LIMIT)
    assert_same(z.gather(np.arange(20)), local.gather(np.arange(20)))


# --------------------------------------------------------------------------- reads and limits


def test_reads_match_the_local_dataset_and_stay_under_the_limit(local: Any, tmp_path: Path) -> None:
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=LIMIT)
    assert isinstance(z, RemoteDataset) and z._files.blocks is not None
    assert not z.column("pixels")._reader.source.whole_files
    read_everything(local, z)
    assert z._files.blocks.used_bytes() <= LIMIT
    assert block_bytes(tmp_path / "c") <= LIMIT
    assert [p.name for p in (tmp_path / "c").iterdir() if p.is_dir()] == ["blocks"], "no whole-file mirror"


def test_a_second_reader_is_served_from_the_blocks(local: Any, tmp_path: Path) -> None:
    rows = np.arange(0, 60)
    first = open_dataset(URL, cache=tmp_path / "c", cache_limit=64 * BLOCK)
    first.gather(rows)
    again = open_dataset(URL, cache=tmp_path / "c", cache_limit=64 * BLOCK)
    assert_same(again.gather(rows), local.gather(rows))
    assert again.requests == 0  # the small files (episode index, zarr metadata) are blocks too


def test_a_pickled_dataset_keeps_its_bounded_cache(local: Any, tmp_path: Path) -> None:
    """What a DataLoader worker gets: the same folder, the same limit, the same blocks."""
    import pickle

    z = open_dataset(URL, cache=tmp_path / "c", cache_limit="40KiB")
    z.gather(np.arange(10))
    copy = pickle.loads(pickle.dumps(z))
    assert copy._files.blocks is not None and copy._files.blocks.limit == 40 * 1024
    assert copy._files.blocks.root == z._files.blocks.root
    assert_same(copy.gather(np.arange(10)), local.gather(np.arange(10)))
    assert copy.requests == 0


def test_size_settings_are_parsed_once_and_errors_name_them(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SettingError, match="cache_limit='lots'"):
        open_dataset(URL, cache=tmp_path / "c", cache_limit="lots")
    with pytest.raises(SettingError, match="none is given"):
        open_dataset(URL, cache_limit="1G")
    with pytest.raises(SettingError, match="less than two cache blocks"):
        open_dataset(URL, cache=tmp_path / "c", cache_limit=100)
    with pytest.raises(SettingError, match="less than two cache blocks"):
        open_dataset(URL, cache=tmp_path / "c", cache_limit=2 * BLOCK - 1)
    assert (
        open_dataset(URL, cache=tmp_path / "c", cache_limit=2 * BLOCK)
        .gather(np.arange(50))["action"]
        .shape[0]
        == 50
    )
    monkeypatch.setenv("RLDS_REMOTE_CACHE", str(tmp_path / "env"))
    monkeypatch.setenv("RLDS_REMOTE_CACHE_LIMIT", "-3")
    with pytest.raises(SettingError, match="RLDS_REMOTE_CACHE_LIMIT"):
        open_dataset(URL)
    monkeypatch.setenv("RLDS_REMOTE_CACHE_LIMIT", "48KiB")
    z = open_dataset(URL)
    assert z._files.blocks is not None and z._files.blocks.limit == 48 * 1024


def test_a_read_larger_than_the_limit_is_served_in_passes(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose blocks pass half the limit (a whole dataset through a 2-block cache) comes in
    passes of at most half the limit, each pinned only while read: the same rows, never more
    on disk than the limit, nothing left half-written."""
    from rlds_cli.remote import block_cache

    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=2 * BLOCK)
    assert z._files.blocks is not None
    cache = z._files.blocks
    pinned: list[int] = []
    ensure = block_cache.BlockCache.ensure

    def counting(self: Any, source: Any, blocks: list[Any]) -> int:
        pinned.append(sum(b.size for b in blocks))
        assert block_bytes(tmp_path / "c") <= 2 * BLOCK
        return ensure(self, source, blocks)

    monkeypatch.setattr(block_cache.BlockCache, "ensure", counting)
    rows = np.arange(z.num_steps)
    assert_same(z.gather(rows), local.gather(rows))
    assert_same(z.gather(rows[::-1]), local.gather(rows[::-1]))
    assert len(pinned) > 2 and max(pinned) <= max(BLOCK, cache.limit // 2)
    assert block_bytes(tmp_path / "c") <= 2 * BLOCK
    assert cache.used_bytes() <= 2 * BLOCK
    assert not list((tmp_path / "c").rglob("*.part.*"))


def test_a_cache_too_small_to_read_ahead_says_so_once(
    local: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A limit under what a read planned ahead needs: the reads go on (each waits for the store)
    and one logged warning names the cache and the limit to give."""
    from rlds_cli import Loader

    loader = Loader(URL, 64, sampler="epoch", seed=1, in_memory=False, cache=tmp_path / "c",
                    cache_limit=3 * BLOCK, read_ahead=2)  # fmt: skip
    with caplog.at_level("WARNING", logger="rlds_cli.remote.block_cache"):
        got = [len(batch["action"]) for batch in loader]
    loader.close()
    assert sum(got) == local.num_steps
    warned = [r.getMessage() for r in caplog.records if "reads are not planned ahead" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / "c") in warned[0] and "give cache_limit at least" in warned[0]
    assert block_bytes(tmp_path / "c") <= 3 * BLOCK
    # a dataset opened already was read without the cache asked for, and its checks, silently
    with pytest.raises(ValueError, match=r"cache= and cache_limit= apply to a URL the Loader opens"):
        Loader(open_dataset(URL), 64, cache=tmp_path / "c", cache_limit=3 * BLOCK)


def test_a_flipped_byte_in_a_cached_block_is_reported_then_gc_removes_it(local: Any, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    rows = np.arange(0, 40)
    open_dataset(URL, cache=cache, cache_limit=64 * BLOCK).gather(rows)
    victim = max((p for p in (cache / "blocks").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    z = open_dataset(URL, cache=cache, cache_limit=64 * BLOCK)
    with pytest.raises(CorruptDatasetError, match="remote cache block") as err:
        for key in z.manifest.fields:
            np.asarray(z.column(key)[rows])
    assert str(victim) in err.value.message and "rlds gc --remote-cache" in err.value.hint
    result = runner.invoke(app, ["gc", "--remote-cache", str(cache), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["remote_cache"]["damaged"] == [str(victim)] and victim.exists()
    result = runner.invoke(app, ["gc", "--remote-cache", str(cache), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["remote_cache"]
    assert report["damaged"] == [str(victim)] and not victim.exists()
    z = open_dataset(URL, cache=cache, cache_limit=64 * BLOCK)
    assert_same(z.gather(rows), local.gather(rows))  # fetched again, checked
    assert (
        json.loads(runner.invoke(app, ["gc", "--remote-cache", str(cache), "--json"]).stdout)["remote_cache"][
            "damaged"
        ]
        == []
    )


def test_bytes_of_the_store_that_differ_from_the_push_are_refused(local: Any, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    rel = next(r for r, e in open_dataset(URL)._files.index.files.items() if e.blocks)
    path = f"/bucket/ds/z/{rel}"
    data = bytearray(fs.cat_file(path))
    data[5] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=64 * BLOCK)
    with pytest.raises(CorruptDatasetError, match="differs from the file pushed: block 0"):
        z.gather(np.arange(z.num_steps))
    assert not list((tmp_path / "c").rglob("*.part.*"))
    again = open_dataset(URL, cache=tmp_path / "c", cache_limit=64 * BLOCK)
    with pytest.raises(CorruptDatasetError, match="differs from the file pushed: block 0"):
        again.gather(np.arange(again.num_steps))  # nothing unchecked entered: asked again, refused


def test_blocks_are_checked_by_their_crc32c_and_an_older_index_s_by_sha256(
    local: Any, tmp_path: Path
) -> None:
    """The push records each block's crc32c (every file, small ones too) beside its sha256; a
    reader checks the crc32c (and the block's size), or the sha256 where an older push's index
    has no crc32c; a damaged list in the index is refused naming it."""
    from rlds_cli._util.io import crc32c

    fs = fsspec.filesystem("memory")
    index_path = "/bucket/ds/z/" + store.INDEX_FILE
    index = open_dataset(URL)._files.index
    for rel, entry in index.files.items():
        data = fs.cat_file(f"/bucket/ds/z/{rel}")
        assert entry.crcs == tuple(crc32c(data[k : k + BLOCK]) for k in range(0, max(1, len(data)), BLOCK)), (
            rel
        )
    rel = next(r for r, e in index.files.items() if e.blocks)
    path = f"/bucket/ds/z/{rel}"
    good = fs.cat_file(path)
    flipped = bytearray(good)
    flipped[BLOCK + 7] ^= 0x10
    fs.pipe_file(path, bytes(flipped))
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=64 * BLOCK)
    with pytest.raises(CorruptDatasetError, match="block 1 has crc32c"):
        z.gather(np.arange(z.num_steps))
    # an older push's index: per-block sha256 only
    doc = json.loads(fs.cat_file(index_path))
    for entry in doc["files"].values():
        entry.pop(store.CRC_KEY)
    doc.pop(store.INDEX_DIGEST_KEY)  # nor its own digest
    fs.pipe_file(index_path, json.dumps(doc).encode())
    old = open_dataset(URL, cache=tmp_path / "old", cache_limit=64 * BLOCK)
    assert all(e.crcs is None for e in old._files.index.files.values())
    with pytest.raises(CorruptDatasetError, match="block 1 has sha256"):
        old.gather(np.arange(old.num_steps))
    fs.pipe_file(path, good)
    rows = np.arange(local.num_steps)
    assert_same(
        open_dataset(URL, cache=tmp_path / "old2", cache_limit=64 * BLOCK).gather(rows), local.gather(rows)
    )
    assert push("z", URL).up_to_date  # same version: the index alone is written again, with crc32c
    assert all(e.crcs for e in open_dataset(URL)._files.index.files.values())
    # a damaged crc32c list is the index's damage, named
    doc = json.loads(fs.cat_file(index_path))
    for bad, message in (
        (doc["files"][rel][store.CRC_KEY][:-1], "block crc32c values where it has"),
        ([-1] * len(doc["files"][rel][store.CRC_KEY]), "not a readable rlds files index"),
        (["00ff"] * len(doc["files"][rel][store.CRC_KEY]), "not a readable rlds files index"),
    ):
        changed = json.loads(json.dumps(doc))
        changed["files"][rel][store.CRC_KEY] = bad
        with pytest.raises(Exception, match=message):
            store.RemoteIndex.from_json(store.index_bytes(changed), "idx")


def test_a_ledger_of_an_older_rlds_starts_again(local: Any, tmp_path: Path) -> None:
    """An older rlds's ledger kept zlib crc32 checks (column ``crc``): its blocks are dropped and
    fetched again, never checked against a checksum of another kind."""
    import sqlite3

    cache = tmp_path / "c"
    rows = np.arange(0, 60)
    open_dataset(URL, cache=cache, cache_limit=64 * BLOCK).gather(rows)
    block_cache._SHARED.clear()
    with contextlib.closing(sqlite3.connect(cache / block_ledger.LEDGER_FILE)) as db:
        db.execute("ALTER TABLE blocks RENAME COLUMN crc32c TO crc")
        db.commit()
    old_files = [p for p in (cache / "blocks").rglob("*") if p.is_file()]
    assert old_files
    z = open_dataset(URL, cache=cache, cache_limit=64 * BLOCK)
    assert_same(z.gather(rows), local.gather(rows))
    assert z.requests > 0, "the older ledger's blocks were fetched again"
    with contextlib.closing(sqlite3.connect(cache / block_ledger.LEDGER_FILE)) as db:
        assert "crc32c" in {row[1] for row in db.execute("PRAGMA table_info(blocks)")}
    result = runner.invoke(app, ["gc", "--remote-cache", str(cache), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["remote_cache"]["damaged"] == []


# --------------------------------------------------------------------------- kills and processes


#: A limit below the dataset's 15 blocks (pixels: one chunk of 9 blocks): reads evict.
SMALL = 10 * BLOCK


def _read_all(cache: str) -> None:
    z = open_dataset(URL, cache=cache, cache_limit=SMALL)
    for start in range(0, z.num_steps, 40):
        z.gather(np.arange(start, min(z.num_steps, start + 40)))


def test_a_full_local_disk_is_named_as_such_not_as_damage_of_the_store(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk smaller than the cache's limit: "zarr array ... is damaged: OSError: No space left"
    with a hint to 'rlds verify NAME' (the block cache); "the store failed ... check the URL, the
    endpoint and the credentials" (the whole-file cache, pull)."""
    import errno

    from rlds_cli.errors import DiskFullError
    from rlds_cli.remote.store import translated

    def full(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return open(path, mode, *args, **kwargs)

    refused = f"no space left on the disk of the remote cache {tmp_path / 'c'}"
    with monkeypatch.context() as patched, pytest.raises(DiskFullError, match=refused):
        patched.setattr(block_cache, "open", full, raising=False)
        _read_all(str(tmp_path / "c"))
    assert not list((tmp_path / "c" / "blocks").rglob("*.part*"))  # its reservations dropped
    _read_all(str(tmp_path / "c"))  # room again: the same cache reads on
    disk_full = pytest.raises(DiskFullError, match=r"no space left on a local disk copying s3://b/x \(/c/f\)")
    with disk_full, translated("s3://b/x"):
        raise OSError(errno.ENOSPC, "No space left on device", "/c/f")


def test_a_kill_at_every_step_never_leaves_the_cache_over_its_limit(local: Any, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    _read_all(str(cache))  # a full cache: the reads below evict
    steps = count_steps(lambda: _read_all(str(cache)))
    assert steps > 5
    for k in range(1, steps + 1, max(1, steps // 25)):
        kill_at(lambda: _read_all(str(cache)), k)
        assert block_bytes(cache) <= SMALL, f"over the limit after a kill at step {k}"
    z = open_dataset(URL, cache=cache, cache_limit=SMALL)
    for start in range(0, z.num_steps, 40):  # a dead reader's reservations are reclaimed, reads go on
        rows = np.arange(start, min(z.num_steps, start + 40))
        assert_same(z.gather(rows), local.gather(rows))
    assert block_bytes(cache) <= SMALL and z._files.blocks.used_bytes() <= SMALL
    report = block_gc.gc_blocks(cache)
    assert report.damaged == [] and report.bytes <= SMALL


def test_a_kill_at_every_step_of_starting_an_older_ledger_again(local: Any, tmp_path: Path) -> None:
    """An older rlds's ledger is dropped with its blocks (files first, then the tables): a kill at
    any step of that, or of the reads after it, leaves a folder within the limit that reads on."""
    import shutil
    import sqlite3

    template = tmp_path / "old"
    _read_all(str(template))
    with contextlib.closing(sqlite3.connect(template / block_ledger.LEDGER_FILE)) as db:
        db.execute("ALTER TABLE blocks RENAME COLUMN crc32c TO crc")
        db.commit()
    cache = tmp_path / "c"
    shutil.copytree(template, cache)
    steps = count_steps(lambda: _read_all(str(cache)))
    assert steps > 5
    for k in range(1, min(steps, 40) + 1):
        shutil.rmtree(cache)
        shutil.copytree(template, cache)
        kill_at(lambda: _read_all(str(cache)), k)
        block_cache._SHARED.clear()
        assert block_bytes(cache) <= SMALL, f"over the limit after a kill at step {k}"
        z = open_dataset(URL, cache=cache, cache_limit=SMALL)
        rows = np.arange(0, z.num_steps, 7)
        assert_same(z.gather(rows), local.gather(rows))
        assert block_bytes(cache) <= SMALL and not block_gc.gc_blocks(cache).damaged, k


def _reader(cache: str, seed: int, out: Any) -> None:
    z = open_dataset(URL, cache=cache, cache_limit=LIMIT)
    rng = np.random.default_rng(seed)
    for _ in range(15):
        start = int(rng.integers(0, z.num_steps - 30))
        z.gather(np.arange(start, start + 30))
    out.put(z.bytes_fetched)


def test_processes_sharing_a_cache_stay_under_the_limit_sampled(local: Any, tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(cache, seed, out)) for seed in range(3)]
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(block_bytes(Path(cache)))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    stop.set()
    sampler.join()
    assert all(p.exitcode == 0 for p in procs)
    assert len(samples) > 10 and max(samples) <= LIMIT, max(samples)


def _same_rows(cache: str, out: Any) -> None:
    z = open_dataset(URL, cache=cache, cache_limit=256 * BLOCK)
    z.gather(np.arange(z.num_steps))
    out.put(z.bytes_fetched)


def test_one_download_of_a_block_per_node(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RemoteFiles.fetch

    def slow(self: Any, *args: Any, **kw: Any) -> Any:
        time.sleep(0.05)  # the store's latency: the others arrive while a fetch is under way
        return real(self, *args, **kw)

    monkeypatch.setattr(RemoteFiles, "fetch", slow)
    cache = str(tmp_path / "c")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_same_rows, args=(cache, out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    fetched = [out.get(timeout=5) for _ in procs]
    report = block_gc.gc_blocks(cache)
    assert sum(fetched) == report.bytes, (fetched, report.bytes)  # each block came once


# --------------------------------------------------------------------------- reads planned ahead


@pytest.mark.parametrize("sampler", ["epoch", "uniform", "slice"])
def test_read_ahead_keeps_state_dict_exact(local: Any, tmp_path: Path, sampler: str) -> None:
    from rlds_cli import Loader

    options: dict[str, Any] = {"slice_len": 4} if sampler == "slice" else {}

    def make(read_ahead: int) -> Any:
        return Loader(URL, 16, sampler=sampler, seed=5, in_memory=False, cache=tmp_path / "c",
                      cache_limit=256 * BLOCK, read_ahead=read_ahead, epochs=None, **options)  # fmt: skip

    plain = make(0)
    expected = [plain.sample() for _ in range(10)]
    ahead = make(3)
    assert type(ahead.sampler).__name__ == "ReadAhead"
    got = [ahead.sample() for _ in range(5)]
    state = ahead.state_dict()
    got += [ahead.sample() for _ in range(5)]
    for a, b in zip(expected, got, strict=True):
        assert_same(a, b)
    again = make(3)
    again.load_state_dict(state)
    for a, b in zip(expected[5:], [again.sample() for _ in range(5)], strict=True):
        assert_same(a, b)


def test_a_batch_s_blocks_are_there_before_it_is_gathered(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli import Loader

    gather_fetches: list[int] = []
    in_flight = [0, 0]  # now, most
    real = RemoteFiles.fetch

    def watched(self: Any, rels: Any, starts: Any, ends: Any, **kw: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            gather_fetches.append(len(rels))
        size = sum(e - s for s, e in zip(starts, ends, strict=True))
        in_flight[0] += size
        in_flight[1] = max(in_flight[1], in_flight[0])
        try:
            time.sleep(0.01)
            return real(self, rels, starts, ends, **kw)
        finally:
            in_flight[0] -= size

    monkeypatch.setattr(RemoteFiles, "fetch", watched)
    loader = Loader(URL, 16, sampler="epoch", seed=2, in_memory=False, cache=tmp_path / "c",
                    cache_limit=64 * BLOCK, read_ahead=2, shuffle=False)  # fmt: skip
    batches = iter(loader)
    next(batches)  # the first batch: nothing was planned before it
    gather_fetches.clear()
    count = 1
    for _ in batches:
        count += 1
        time.sleep(0.05)  # the training step, during which the next batches' blocks arrive
    assert count == loader.batches_per_epoch and count > 5
    assert gather_fetches == [], "every block was fetched ahead"
    assert in_flight[1] <= block_cache.FETCH_WINDOW
    blocks = loader.dataset._files.blocks
    assert 0 < blocks._held <= blocks.limit  # the next epoch's first draws, pinned ahead
    loader.close()
    assert blocks._held == 0 and blocks._held_refs == {}
    with blocks.ledger() as db:
        assert db.execute("SELECT COUNT(*) FROM pins").fetchone()[0] == 0


def _frames_remote(root: Path, name: str = "f") -> np.ndarray:
    """A zarr dataset of PNG frames (about 5 KB each: a batch of 8 in order spans 10-13 blocks of
    4 KiB) pushed to :data:`URL`; returns its frames."""
    from tests.frames_fixtures import build_frames

    pixels = build_frames(root, name, [40, 20, 50, 30, 60], "png", backend="zarr")
    push(name, URL)
    return pixels


def _main_thread_fetches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes of each fetch the main thread (the gather) makes from now on."""
    fetches: list[int] = []
    real = RemoteFiles.fetch

    def watched(self: Any, rels: Any, starts: Any, ends: Any, **kw: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            fetches.append(sum(e - s for s, e in zip(starts, ends, strict=True)))
        return real(self, rels, starts, ends, **kw)

    monkeypatch.setattr(RemoteFiles, "fetch", watched)
    return fetches


@pytest.mark.parametrize("checkpoint", [False, True])
def test_read_ahead_keeps_fetching_ahead_when_the_cache_holds_two_batches(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: bool
) -> None:
    """Each batch's blocks are close to half the limit: a prefetch waits for the blocks of the
    batch before it to be let go (it used to give up past half the limit, and the gather
    fetched). A checkpoint mid-epoch (``state_dict`` drops the draws ahead) leaves the next
    prefetches waiting as before (they gave up at once, found by a review)."""
    from rlds_cli import Loader

    _frames_remote(isolated_cache)
    local = open_dataset("f")
    limit = 26 * BLOCK
    fetches = _main_thread_fetches(monkeypatch)
    loader = Loader(URL, 8, sampler="epoch", shuffle=False, in_memory=False, keys=["pixels"],
                    cache=tmp_path / "c", cache_limit=limit, read_ahead=3)  # fmt: skip
    blocks = loader.dataset._files.blocks
    peak = [0]
    count = 0
    for batch in loader:
        if count == 0:
            fetches.clear()  # the first batch: nothing was planned before it
        want = local.gather(np.arange(8 * count, min(8 * count + 8, local.num_steps)))["pixels"]
        np.testing.assert_array_equal(np.asarray(batch["pixels"]), want)
        count += 1
        peak[0] = max(peak[0], block_bytes(tmp_path / "c"))
        if checkpoint and count == 3:
            loader.state_dict()
            time.sleep(0.3)  # the draws after it are planned again
            fetches.clear()
        time.sleep(0.05)  # the training step, during which the next batches' blocks arrive
    assert count == 25
    # the read-ahead thread has one training step to fetch a batch once the one two before it is
    # let go: on a loaded machine it may be late for a batch or two (the code before this:
    # 20 of 24 batches fetched by the gather)
    assert len(fetches) <= 2, f"{len(fetches)} of 24 batches were fetched by the gather, not ahead"
    assert 0 < peak[0] <= limit
    loader.close()
    assert blocks._held == 0 and blocks._holds == {}


def test_a_read_short_of_room_releases_this_process_s_holds_for_later_reads(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holds for later reads fill the cache: the read releases the newest (else it would wait
    on its own holds until RemoteCacheFullError)."""
    pixels = _frames_remote(isolated_cache)
    monkeypatch.setattr(block_cache, "WAIT_SECONDS", 5.0)
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=26 * BLOCK)
    assert pixels.shape[0] > 160
    first = z.prefetch(np.arange(0, 8), ["pixels"])
    second = z.prefetch(np.arange(40, 48), ["pixels"])
    assert first is not None and second is not None
    rows = np.arange(100, 108)
    np.testing.assert_array_equal(z.column("pixels")[rows], pixels[rows])
    assert second.released and not first.released
    assert block_bytes(tmp_path / "c") <= 26 * BLOCK
    first.release()
    assert z._files.blocks._held == 0


def test_two_readers_of_one_process_share_their_holds(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training loader's holds ahead fill the cache; a validation dataset of the same URL in the
    same process releases them instead of waiting on them (each waited PASS_BY_SECONDS a pass,
    as on another process, and read past the cache)."""
    pixels = _frames_remote(isolated_cache)
    monkeypatch.setattr(block_cache, "PASS_BY_SECONDS", 600.0)
    train = open_dataset(URL, cache=tmp_path / "c", cache_limit=26 * BLOCK)
    val = open_dataset(URL, cache=tmp_path / "c", cache_limit=26 * BLOCK)
    assert train._files.blocks is val._files.blocks
    first = train.prefetch(np.arange(0, 8), ["pixels"])
    second = train.prefetch(np.arange(40, 48), ["pixels"])
    assert first is not None and second is not None
    rows = np.arange(100, 108)
    read: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: read.append(val.column("pixels")[rows]), daemon=True)
    reader.start()
    reader.join(60)
    assert read, "the validation read waited on the training loader's holds"
    np.testing.assert_array_equal(read[0], pixels[rows])
    assert second.released
    first.release()


def test_a_prefetch_waits_for_room_and_ends_its_wait_when_stopped(
    isolated_cache: Path, tmp_path: Path
) -> None:
    _frames_remote(isolated_cache)
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=28 * BLOCK)
    first = z.prefetch(np.arange(0, 8), ["pixels"])
    second = z.prefetch(np.arange(40, 48), ["pixels"])
    assert first is not None and second is not None
    got: list[Any] = []
    stop = threading.Event()

    def prefetch(first: int) -> None:
        got.append(z.prefetch(np.arange(first, first + 8), ["pixels"], stop=stop))

    waiting = threading.Thread(target=prefetch, args=(100,))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive(), "no room yet: it waits"
    first.release()  # the read before it is done
    waiting.join(30)
    assert not waiting.is_alive() and got[0] is not None and got[0].fetched > 0
    assert block_bytes(tmp_path / "c") <= 28 * BLOCK
    stopped = threading.Thread(target=prefetch, args=(150,))
    stopped.start()
    stopped.join(0.3)
    assert stopped.is_alive()
    stop.set()  # its draw was dropped
    stopped.join(30)
    assert not stopped.is_alive() and got[1] is None
    second.release()
    got[0].release()
    assert z._files.blocks._held == 0


def _hold_until_told(cache: str, limit: int, held: Any, done: Any) -> None:
    z = open_dataset(URL, cache=cache, cache_limit=limit)
    hold = z.prefetch(np.arange(0, 8), ["pixels"])
    held.set()
    done.wait(60)
    if hold is not None:
        hold.release()


def test_processes_reading_one_cache_share_what_they_hold_ahead(isolated_cache: Path, tmp_path: Path) -> None:
    """Another live process with blocks pinned halves this one's share of the limit for reads
    planned ahead (neither waits on the other's read-ahead); a dead one's pins count for nothing."""
    _frames_remote(isolated_cache)
    limit = 26 * BLOCK
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=limit)
    blocks = z._files.blocks
    assert blocks.hold_share() == blocks.room
    ctx = multiprocessing.get_context("fork")
    held, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_until_told, args=(str(tmp_path / "c"), limit, held, done))
    other.start()
    try:
        assert held.wait(60)
        assert blocks.hold_share() == blocks.room // 2
        assert z.prefetch(np.arange(40, 56), ["pixels"]) is None  # its blocks alone pass the half
        hold = z.prefetch(np.arange(40, 48), ["pixels"])
        assert hold is not None and blocks._held <= blocks.room // 2
        hold.release()
    finally:
        done.set()
        other.join(60)
    assert blocks.hold_share() == blocks.room


def _gather_in_another_process(cache: str, limit: int, out: Any) -> None:
    block_cache.WAIT_SECONDS = 30.0
    z = open_dataset(URL, cache=cache, cache_limit=limit)
    began = time.monotonic()
    try:
        pixels = z.column("pixels")[np.arange(100, 108)]
        out.put(("ok", time.monotonic() - began, pixels))
    except Exception as exc:  # reported to the test, which fails on it
        out.put((f"{type(exc).__name__}: {exc}", time.monotonic() - began, None))


def test_another_process_s_read_ahead_filling_the_cache_never_stalls_a_read(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """This process's holds fill the cache before another process pinned anything (its share
    was the whole limit); the other's read, short of room, reads its blocks past the cache
    (checked, not kept) instead of waiting on holds only this process can let go (a DDP rank
    waiting at a collective for the other: a deadlock until RemoteCacheFullError)."""
    pixels = _frames_remote(isolated_cache)
    limit = 26 * BLOCK
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=limit)
    holds = [z.prefetch(np.arange(0, 8), ["pixels"]), z.prefetch(np.arange(40, 48), ["pixels"])]
    assert all(h is not None for h in holds) and z._files.blocks._held > limit // 2
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    other = ctx.Process(target=_gather_in_another_process, args=(str(tmp_path / "c"), limit, out))
    other.start()
    what, took, got = out.get(timeout=60)
    other.join(30)
    assert what == "ok" and took < 20, (what, took)
    np.testing.assert_array_equal(got, pixels[100:108])
    assert block_bytes(tmp_path / "c") <= limit
    assert all(not h.released for h in holds)  # the other process took none of them
    for h in holds:
        h.release()


def _prefetch_in_a_child(z: Any, out: Any) -> None:
    blocks = z._files.blocks
    began = time.monotonic()
    hold = z.prefetch(np.arange(100, 108), ["pixels"])
    out.put((blocks._held, len(blocks._holds), hold is not None, time.monotonic() - began))
    if hold is not None:
        hold.release()


def test_a_forked_child_holds_nothing_of_its_parent_s(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DataLoader worker forked while the parent holds blocks ahead starts with no holds
    (it counted the parent's and waited out its prefetches: found by a review)."""
    _frames_remote(isolated_cache)
    monkeypatch.setattr(block_cache, "WAIT_SECONDS", 30.0)
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=28 * BLOCK)
    hold = z.prefetch(np.arange(0, 8), ["pixels"])
    assert hold is not None
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_prefetch_in_a_child, args=(z, out))
    child.start()
    held, holds, got, took = out.get(timeout=60)
    child.join(30)
    hold.release()
    assert got and holds == 1 and took < 15, (held, holds, got, took)
    assert held < 28 * BLOCK // 2  # its own batch only


def _ranges_of(z: Any, rows: np.ndarray) -> tuple[list[str], list[int], list[int]]:
    """The byte ranges a prefetch of ``rows`` (pixels) asks the block cache for."""
    seen: list[tuple[list[str], list[int], list[int]]] = []

    def record(self: Any, rels: Any, starts: Any, ends: Any, stop: Any = None) -> None:
        seen.append((list(rels), list(starts), list(ends)))

    real = RemoteFiles.prefetch
    RemoteFiles.prefetch = record  # type: ignore[method-assign]
    try:
        z.prefetch(rows, ["pixels"])
    finally:
        RemoteFiles.prefetch = real  # type: ignore[method-assign]
    return seen[0]


def test_a_read_short_of_room_releases_a_prefetch_still_waiting(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefetch waiting for room keeps the ready blocks it pinned; a read of this process
    short of room releases it while it waits (it was releasable only once returned, and the
    read waited out the prefetch: found by a review)."""
    _frames_remote(isolated_cache)
    monkeypatch.setattr(block_cache, "WAIT_SECONDS", 30.0)
    limit = 26 * BLOCK
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=limit)
    files, blocks = z._files, z._files.blocks
    ahead, now = _ranges_of(z, np.arange(0, 17)), _ranges_of(z, np.arange(100, 108))
    ahead_blocks = list(blocks._blocks_of(files, *ahead).values())
    now_blocks = list(blocks._blocks_of(files, *now).values())
    assert not {b.name for b in ahead_blocks} & {b.name for b in now_blocks}
    for part in (ahead_blocks[:-4], now_blocks[:-6]):  # some of each in the cache already
        blocks.ensure(files, part)
        blocks._unpin([b.name for b in part])
    other = subprocess.Popen(["sleep", "60"])  # another reader of the node, mid-read
    real_share = block_cache.BlockCache.hold_share

    def share_then_the_other_pins(self: Any) -> int:
        share = real_share(self)  # the other has pinned nothing yet: the whole limit
        with self.ledger() as db:  # then pins every block and fetches into the rest
            for (name,) in db.execute("SELECT name FROM blocks").fetchall():
                db.execute("INSERT INTO pins VALUES (?, ?, 1)", (name, other.pid))
            used = db.execute("SELECT SUM(size) FROM blocks").fetchone()[0]
            db.execute("INSERT INTO blocks VALUES ('x/o', ?, 0, ?, 0, NULL)", (limit - used, other.pid))
        return share

    monkeypatch.setattr(block_cache.BlockCache, "hold_share", share_then_the_other_pins)
    monkeypatch.setattr(block_cache, "PASS_BY_SECONDS", 30.0)  # only a release can serve the read
    stop = threading.Event()
    held: list[Any] = []
    waiting = threading.Thread(target=lambda: held.append(blocks.prefetch(files, *ahead, stop=stop)))
    try:
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive(), "the prefetch waits for room"
        took: list[float] = []

        def read() -> None:
            began = time.monotonic()
            blocks.read_ranges(files, *now)
            took.append(time.monotonic() - began)

        reading = threading.Thread(target=read)
        reading.start()
        reading.join(0.3)
        with blocks.ledger() as db:  # the other reader is done
            db.execute("DELETE FROM pins WHERE pid = ?", (other.pid,))
            db.execute("DELETE FROM blocks WHERE name = 'x/o'")
        reading.join(60)
        waiting.join(60)
        assert took and took[0] < 15, took
        assert held and (held[0] is None or held[0].released)
    finally:
        other.kill()
        other.wait()
        stop.set()
    assert blocks._held == 0 and blocks._holds == {}
    with blocks.ledger() as db:
        assert db.execute("SELECT COUNT(*) FROM pins").fetchone()[0] == 0


def test_a_read_or_prefetch_that_fails_leaves_nothing_pinned(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose fetch fails after it pinned the blocks already there unpins them (they
    stayed pinned for the process's life: never evicted, and counted in every share); a
    prefetch likewise (found by a review)."""
    from rlds_cli.errors import RemoteAccessError

    pixels = _frames_remote(isolated_cache)
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=64 * BLOCK)
    blocks = z._files.blocks
    z.column("pixels")[np.arange(0, 8)]  # some blocks in the cache

    def unreachable(self: Any, *args: Any, **kw: Any) -> Any:
        raise RemoteAccessError("memory://bucket: cannot reach the store")

    with monkeypatch.context() as patched:
        patched.setattr(RemoteFiles, "fetch", unreachable)
        with pytest.raises(RemoteAccessError):
            z.column("pixels")[np.arange(0, 24)]
        with pytest.raises(RemoteAccessError):
            z.prefetch(np.arange(0, 24), ["pixels"])
    with blocks.ledger() as db:
        assert db.execute("SELECT COUNT(*) FROM pins").fetchone()[0] == 0
        assert db.execute("SELECT COUNT(*) FROM blocks WHERE ready = 0").fetchone()[0] == 0
    assert blocks._held == 0 and blocks._holds == {}
    # the store back: the same read and prefetch succeed, nothing left over in the way
    rows = np.arange(0, 24)
    np.testing.assert_array_equal(z.column("pixels")[rows], pixels[rows])
    hold = z.prefetch(rows, ["pixels"])
    assert hold is not None
    hold.release()


def test_closing_a_loader_ends_a_prefetch_waiting_for_room(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli import Loader

    _frames_remote(isolated_cache)
    monkeypatch.setattr(block_cache, "WAIT_SECONDS", 600.0)
    loader = Loader(URL, 8, sampler="epoch", shuffle=False, in_memory=False, keys=["pixels"],
                    cache=tmp_path / "c", cache_limit=26 * BLOCK, read_ahead=4)  # fmt: skip
    batches = iter(loader)
    next(batches)
    time.sleep(0.3)  # the read-ahead fills the cache, and its next prefetch waits
    blocks = loader.dataset._files.blocks
    assert blocks._held > 13 * BLOCK  # more than the half a prefetch used to stop at
    began = time.monotonic()
    loader.close()
    assert time.monotonic() - began < 60, "the waiting prefetch was stopped, not waited out"
    assert blocks._held == 0
    with blocks.ledger() as db:
        assert db.execute("SELECT COUNT(*) FROM pins").fetchone()[0] == 0


def _break_out_and_exit(cache: str) -> None:
    """A training loop that stops after one batch and leaves its loader open, as a script that
    ``break``s out does before its process exits."""
    from rlds_cli import Loader

    loader = Loader(URL, 8, sampler="epoch", shuffle=False, in_memory=False, keys=["pixels"],
                    cache=cache, cache_limit=26 * BLOCK, read_ahead=4)  # fmt: skip
    next(iter(loader))
    time.sleep(0.3)  # the read-ahead fills the cache, and its next prefetch waits for room


def test_a_loader_left_open_never_holds_the_process_s_exit(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefetch waiting for room when the process ends does not hold the exit (the read-ahead
    thread was joined at exit: found on a 16-core machine, where a bench's case broke out of
    its loop and its process waited out WAIT_SECONDS)."""
    _frames_remote(isolated_cache)
    monkeypatch.setattr(block_cache, "WAIT_SECONDS", 600.0)
    child = multiprocessing.get_context("fork").Process(
        target=_break_out_and_exit, args=(str(tmp_path / "c"),)
    )
    child.start()
    child.join(60)
    stuck = child.is_alive()
    if stuck:
        child.kill()
        child.join()
    assert not stuck and child.exitcode == 0, "the process waited for its read-ahead to exit"


def test_a_version_pushed_again_with_other_blocks_never_reads_the_first_push_s_blocks(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same version (same manifest) pushed again with blocks twice as large, as an older rlds's
    8 MiB and today's 2 MiB: the first push's cached blocks were taken under the same numbers
    (a checksum failure that gc called good, or wrong bytes where sizes matched)."""
    from fsspec.implementations.memory import MemoryFileSystem

    cache = tmp_path / "c"
    rows = np.arange(local.num_steps)
    assert_same(open_dataset(URL, cache=cache, cache_limit=LIMIT).gather(rows[::3]), local.gather(rows[::3]))
    MemoryFileSystem().rm(URL.removeprefix("memory://"), recursive=True)
    monkeypatch.setattr(store, "INDEX_BLOCK_BYTES", 2 * BLOCK)
    push("z", URL)
    again = open_dataset(URL, cache=cache, cache_limit=LIMIT)
    assert again._files.index.block_bytes == 2 * BLOCK
    assert_same(again.gather(rows), local.gather(rows))


def _gather_in_a_child(z: Any, out: Any) -> None:
    out.put(len(z.gather(np.arange(0, 40))["action"]))


def test_a_child_forked_while_a_thread_holds_the_cache_s_lock_reads(local: Any, tmp_path: Path) -> None:
    """A thread of the parent inside the ledger at the fork (a read-ahead thread) left the
    child's copy of the lock held forever: its first read hung."""
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=LIMIT)
    z.gather(np.arange(0, 10))
    blocks = z._files.blocks
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    with blocks._ledger._mutex, blocks._held_mutex:  # as another thread of this process may at the fork
        child = ctx.Process(target=_gather_in_a_child, args=(z, out))
        child.start()
        got = out.get(timeout=60)
    child.join(30)
    assert got == 40 and child.exitcode == 0


def test_read_ahead_on_a_local_dataset_changes_nothing(local: Any) -> None:
    from rlds_cli import Loader

    loader = Loader("m", 8, sampler="epoch", seed=1, read_ahead=4)
    assert loader.read_ahead == 0 and type(loader.sampler).__name__ == "EpochSampler"
    with pytest.raises(ValueError, match="read_ahead"):
        Loader("m", 8, read_ahead=-1)


def test_gc_reclaims_a_dead_reader_s_reservation(local: Any, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    rel_part: list[str] = []

    def killed_mid_fetch() -> None:
        real = os.replace

        def dying(src: Any, dst: Any) -> None:
            if str(src).endswith(f".part.{os.getpid()}"):
                rel_part.append(str(src))
                os._exit(137)
            real(src, dst)

        os.replace = dying  # type: ignore[assignment]
        _read_all(str(cache))

    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=killed_mid_fetch)
    p.start()
    p.join(60)
    assert p.exitcode == 137
    parts = list((cache / "blocks").rglob("*.part.*"))
    assert parts and block_bytes(cache) <= SMALL
    result = runner.invoke(app, ["gc", "--remote-cache", str(cache), "--json"])
    assert result.exit_code == 0, result.output
    reclaimed = json.loads(result.stdout)["remote_cache"]["reclaimed"]
    assert reclaimed and not list((cache / "blocks").rglob("*.part.*"))


def test_gc_refuses_a_folder_that_is_not_a_remote_cache(tmp_path: Path) -> None:
    """A mistyped --remote-cache removed every file under DIR/blocks/ ("not counted") and any
    NAME.<digits>.X.part in the tree (a browser's half download), and said it cleaned up."""
    folder = tmp_path / "mine"
    (folder / "blocks" / "lego").mkdir(parents=True)
    (folder / "blocks" / "lego" / "instructions.txt").write_text("precious\n")
    (folder / "downloads").mkdir()
    (folder / "downloads" / "movie.2024.mkv.part").write_text("half\n")
    before = sorted(p for p in folder.rglob("*"))
    for dry in ([], ["--dry-run"]):
        result = runner.invoke(app, ["gc", "--remote-cache", str(folder), *dry])
        refused(
            result, f"{folder} is not an rlds remote cache: it holds 'blocks/lego', 'downloads'", hint=True
        )
    assert sorted(p for p in folder.rglob("*")) == before
    (folder / "blocks" / "lego" / "instructions.txt").unlink()
    (folder / "blocks" / "lego").rmdir()
    refused(runner.invoke(app, ["gc", "--remote-cache", str(folder)]), "it holds 'downloads', which rlds")
    # a cache folder's own names pass, a foreign .part inside a version folder is left alone
    (folder / "downloads" / "movie.2024.mkv.part").unlink()
    (folder / "downloads").rmdir()
    version = folder / "0123456789abcdef-0123456789abcdef"
    version.mkdir()
    (version / "x.2024.mkv.part").write_text("not ours\n")
    (version / "arrays.npy.999999999.0123abcd.part").write_text("a dead reader's\n")
    result = runner.invoke(app, ["gc", "--remote-cache", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["remote_cache"]["reclaimed"] == [
        str(version / "arrays.npy.999999999.0123abcd.part")
    ]
    assert [p.name for p in version.iterdir()] == ["x.2024.mkv.part"]


def test_gc_reads_the_blocks_without_holding_the_cache_s_lock(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers wait for the lock: gc held it while it read every block (minutes for a large
    cache). A block damaged meanwhile is still found; one fetched again meanwhile is kept."""
    from rlds_cli._util.locks import FileLock

    cache = tmp_path / "c"
    _read_all(str(cache))
    free: list[bool] = []
    real = block_gc._intact

    def looking(*args: Any) -> bool:
        other = FileLock(cache / block_ledger.LOCK_FILE)
        try:
            other.acquire(timeout=0)
            other.release()
            free.append(True)
        except Exception:
            free.append(False)
        return real(*args)

    victim = next(p for p in (cache / "blocks").rglob("*") if p.is_file() and p.stat().st_size > 16)
    data = bytearray(victim.read_bytes())
    data[7] ^= 0xFF
    victim.write_bytes(bytes(data))
    monkeypatch.setattr(block_gc, "_intact", looking)
    report = block_gc.gc_blocks(cache)
    assert report.damaged == [str(victim)] and not victim.exists()
    # every block read unlocked, then the damaged one read again under the lock
    assert free.count(True) == report.blocks + 1 and free.count(False) == 1


def test_a_damaged_ledger_or_folder_is_one_line_naming_it(local: Any, tmp_path: Path) -> None:
    """A raw sqlite3.DatabaseError (or IsADirectoryError...) came out of reads, and gc said
    'nothing to remove' or 'unexpected DatabaseError'."""
    from rlds_cli.errors import RemoteCacheDamagedError

    cache = tmp_path / "c"
    _read_all(str(cache))
    (cache / block_ledger.LEDGER_FILE).write_bytes(b"not a database" * 100)
    for name in ("blocks.db-wal", "blocks.db-shm"):
        (cache / name).unlink(missing_ok=True)
    with pytest.raises(
        RemoteCacheDamagedError, match=r"its ledger blocks.db cannot be used \(file is not a database"
    ):
        open_dataset(URL, cache=cache, cache_limit=LIMIT).gather(np.arange(5))
    result = runner.invoke(app, ["gc", "--remote-cache", str(cache)])
    assert result.exit_code == 1 and "its ledger blocks.db cannot be used" in result.output
    assert "hint: remove the cache folder" in result.output and "Traceback" not in result.output
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(RemoteCacheDamagedError, match="is not what the cache keeps there"):
        open_dataset(URL, cache=a_file, cache_limit=LIMIT).gather(np.arange(5))
    result = runner.invoke(app, ["gc", "--remote-cache", str(a_file)])
    assert result.exit_code == 1 and f"the remote cache {a_file} is not a folder" in result.output
    result = runner.invoke(app, ["gc", "--remote-cache", str(tmp_path / "typo")])  # was "0 good block(s)"
    assert result.exit_code == 0 and f"remote cache {tmp_path / 'typo'}: no such folder" in result.output


def test_blocks_left_without_their_ledger_never_pass_the_limit(local: Any, tmp_path: Path) -> None:
    """The ledger deleted (as a user does with a damaged one): its blocks counted for nothing, and
    the next reader filled the limit again beside them (1.5x the limit on disk)."""
    cache = tmp_path / "c"
    _read_all(str(cache))
    assert block_bytes(cache) > LIMIT // 2
    (cache / block_ledger.LEDGER_FILE).unlink()
    result = runner.invoke(app, ["gc", "--remote-cache", str(cache), "--dry-run", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["remote_cache"]["unledgered"]
    _read_all(str(cache))  # opening the folder again starts from no block
    assert block_bytes(cache) <= LIMIT


def test_a_lock_held_past_the_wait_is_one_line(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process stopped while it holds the cache's lock (Ctrl-Z, a debugger) made every other
    reader and gc wait forever."""
    from rlds_cli._util.locks import FileLock
    from rlds_cli.errors import RemoteCacheDamagedError

    cache = tmp_path / "c"
    _read_all(str(cache))
    monkeypatch.setattr(block_ledger, "LOCK_WAIT_SECONDS", 0.3)
    held = FileLock(cache / block_ledger.LOCK_FILE)  # another open of the file: another holder
    with held, pytest.raises(RemoteCacheDamagedError, match=r"blocks\.lock stayed locked by another"):
        open_dataset(URL, cache=cache, cache_limit=LIMIT).gather(np.arange(5))


# --------------------------------------------------------------------------- frames, S3


def test_a_frame_column_is_read_through_blocks(isolated_cache: Path, tmp_path: Path) -> None:
    """A frame column is one big file (``<key>@frames``): blocks of it, never the whole file."""
    from tests.frames_fixtures import build_frames

    pixels = build_frames(isolated_cache, "f", [40, 20, 50], "png", backend="zarr")
    push("f", URL)
    index = open_dataset(URL)._files.index
    frames = index.files["arrays/pixels@frames"]
    assert frames.blocks is not None and len(frames.blocks) > 3
    limit = 3 * BLOCK + frames.size // 2  # less than the frame file
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=limit)
    for start in range(0, len(pixels), 7):
        rows = np.arange(start, min(len(pixels), start + 7))
        np.testing.assert_array_equal(z.column("pixels")[rows], pixels[rows])
        assert block_bytes(tmp_path / "c") <= limit
    assert z.bytes_fetched >= frames.size  # every frame came once, in blocks


def test_a_frame_file_s_blocks_are_cut_where_episodes_begin(isolated_cache: Path, tmp_path: Path) -> None:
    """The push cuts a frame file's cache blocks where episodes begin (each block at most the
    block size): reading whole episodes in any order through a cache smaller than the file
    fetches each byte once (fixed blocks fetch the blocks an episode shares with its neighbours
    again once evicted); the fixed blocks' sha256 stay in the index for an older rlds."""
    pixels = _frames_remote(isolated_cache)
    local = open_dataset("f")
    rel = "arrays/pixels@frames"
    entry = open_dataset(URL)._files.index.files[rel]
    assert entry.starts is not None and entry.crcs is not None and len(entry.crcs) == len(entry.starts)
    assert entry.blocks is not None and len(entry.blocks) == store.block_count(entry.size, BLOCK)
    edges = np.append(entry.starts, entry.size)
    assert edges[0] == 0 and np.all(np.diff(edges) > 0) and np.all(np.diff(edges) <= BLOCK)
    flat = local.manifest.fields["pixels"].storage == "flat"
    lengths = np.asarray(local.episode_index["length"])
    first_rows = np.cumsum(lengths) - lengths + (np.arange(len(lengths)) if flat else 0)
    row_ends = np.append(first_rows[1:], len(local.column("pixels")))
    byte_starts = local.column("pixels").starts[first_rows]
    assert set(byte_starts.tolist()) <= set(entry.starts)  # episodes of ~200 KB: each starts a block
    largest = max(
        int(local.column("pixels").ends[e - 1] - local.column("pixels").starts[s])
        for s, e in zip(first_rows, row_ends, strict=True)
    )
    limit = largest + 2 * BLOCK  # under the file: episodes read later evict the earlier ones
    assert limit < entry.size
    z = open_dataset(URL, cache=tmp_path / "c", cache_limit=limit)
    z.column("pixels")  # its offsets file fetched
    before = z.bytes_fetched
    for e in np.random.default_rng(0).permutation(len(lengths)):
        rows = np.arange(first_rows[e], row_ends[e])
        np.testing.assert_array_equal(z.column("pixels")[rows], np.asarray(local.column("pixels")[rows]))
        assert block_bytes(tmp_path / "c") <= limit
    assert z.bytes_fetched - before == entry.size  # each byte once: no block shared by two episodes
    # offsets that point past the file (damaged ends) are named, never a short or raw read
    with pytest.raises(CorruptDatasetError, match="past its"):
        z._files.read_ranges([rel, rel], [0, entry.size - 5], [8, entry.size + 3 * BLOCK])
    with pytest.raises(CorruptDatasetError, match="past its"):
        z._files.read_ranges([rel], [entry.size + BLOCK], [entry.size + 2 * BLOCK])
    # the ledger's own files fit in what the smallest limit of 2 MiB blocks keeps free for them
    assert block_ledger.LEDGER_BYTES <= 2 * (2 << 20) // 16
    del pixels
    # the cut layout's damage is the index's, named
    doc = json.loads(open_dataset(URL)._files.index.to_json())
    for change, message in (
        (lambda f: f.update({store.STARTS_KEY: [1, *f[store.STARTS_KEY][1:]]}), "do not cut its"),
        (
            lambda f: f.update(
                {store.STARTS_KEY: [0, *f[store.STARTS_KEY][2:]], store.CRC_KEY: f[store.CRC_KEY][1:]}
            ),
            "do not cut its",
        ),
        (lambda f: f.pop(store.CRC_KEY), "come without their block_crc32c"),
        (lambda f: f.update({store.CRC_KEY: f[store.CRC_KEY][:-1]}), "block crc32c values where it has"),
        (lambda f: f.update({store.STARTS_KEY: "0"}), "not a readable rlds files index"),
        (lambda f: f.update({store.STARTS_KEY: [0, 2**64]}), "not a readable rlds files index"),
    ):
        changed = json.loads(json.dumps(doc))
        change(changed["files"][rel])
        with pytest.raises(Exception, match=message):
            store.RemoteIndex.from_json(store.index_bytes(changed), "idx")


def test_a_growing_dataset_s_frame_files_are_cut_where_its_episodes_begin(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """A growing dataset is pushed as a snapshot of its segments: each segment's frame file is
    cut where its episodes begin (for its readers after a pull: where it lies, it is refused in
    one line, never read as a damaged dataset)."""
    from rlds_cli.write.writer import DatasetWriter
    from tests.write.test_writer_frames import episode

    with DatasetWriter("g", frames="png", storage="zarr", grace_seconds=0) as writer:
        for i in range(4):
            writer.add_episode(episode(30, 10 * i)[0])
            if i % 2:
                writer.flush()  # segments of one or two episodes
    push("g", URL)
    index = store.RemoteIndex.from_json(
        fsspec.filesystem("memory").cat_file(f"/bucket/ds/z/{store.INDEX_FILE}"), "i"
    )
    cut = {rel: e for rel, e in index.files.items() if rel.endswith("@frames")}
    assert len(cut) >= 2 and all(e.starts is not None and len(e.starts) >= 2 for e in cut.values())
    segments = {part.directory.name: part for part in open_dataset("g").segment_datasets()}
    for rel, entry in cut.items():
        segment = segments[rel.split("/")[1]]
        lengths = np.asarray(segment.episode_index["length"])
        rows = np.cumsum(lengths) - lengths + np.arange(len(lengths))  # flat: T + 1 rows an episode
        assert set(segment.column("observation").starts[rows].tolist()) <= set(entry.starts), rel
    with pytest.raises(RemoteNotReadableError, match="growing dataset's snapshot") as err:
        open_dataset(URL, cache=tmp_path / "c", cache_limit=16 * BLOCK)
    assert "rlds pull" in err.value.hint


def test_s3_reads_through_the_block_cache_with_read_ahead(s3: Any, tmp_path: Path) -> None:  # noqa: F811
    from rlds_cli import Loader

    build("m", "memmap", LENGTHS)
    build("z", "zarr", LENGTHS)
    url = f"s3://{s3.bucket}/rlds/z"
    push("z", url)
    want = [b for b in Loader("m", 32, sampler="epoch", seed=5, in_memory=False)]
    loader = Loader(url, 32, sampler="epoch", seed=5, in_memory=False, cache=tmp_path / "c",
                    cache_limit=LIMIT, read_ahead=3)  # fmt: skip
    got = [b for b in loader]
    for a, b in zip(got, want, strict=True):
        assert_same(a, b)
    assert block_bytes(tmp_path / "c") <= LIMIT
    loader.close()
