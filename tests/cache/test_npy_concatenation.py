"""``NpyConcatenation``: compaction's copy of row ranges of ``.npy`` files into one new file, at the
disk's rate (``O_DIRECT`` where the filesystem takes it). The file is the one numpy would write
for the concatenated rows, every byte read reaches the hooks in order, and a source cut meanwhile
or a short copy is an error, never a short file."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from rlds_cli.cache.backends import memmap
from rlds_cli.cache.backends.memmap import NpyConcatenation, NpySource, load_npy
from rlds_cli.errors import CorruptDatasetError


def _sources(tmp_path: Path) -> list[tuple[Path, np.ndarray, int]]:
    """Three sources of 5-float32 rows (20 bytes: rows straddle every buffer) and the first row
    each one copies."""
    rng = np.random.default_rng(0)
    out = []
    for i, (rows, start) in enumerate([(700, 0), (1, 0), (1500, 333)]):
        array = rng.standard_normal((rows, 5)).astype("<f4")
        path = tmp_path / f"in{i}.npy"
        np.save(path, array)
        out.append((path, array, start))
    return out


def _concatenate(tmp_path: Path, sources: list[tuple[Path, np.ndarray, int]]) -> tuple[Path, Any, Any]:
    rows = sum(len(array) - start for _, array, start in sources)
    out = NpyConcatenation(tmp_path / "out.npy", np.dtype("<f4"), (5,), rows)
    seen, copied = xxhash.xxh3_128(), xxhash.xxh3_128()
    for path, array, start in sources:
        with NpySource(path) as source:
            out.copy(source, start, len(array), seen.update, copied.update)
    assert out.close(fsync=True) == rows
    return out.path, seen, copied


@pytest.mark.parametrize("direct", [True, False])
def test_the_file_is_the_concatenated_rows_and_every_byte_reaches_the_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    monkeypatch.setattr(memmap, "CONCAT_BUFFER_BYTES", 8192)  # many buffers, each reused
    monkeypatch.setattr(memmap, "DIRECT_MIN_BYTES", 0 if direct else 1 << 40)
    sources = _sources(tmp_path)
    path, seen, copied = _concatenate(tmp_path, sources)
    want = np.concatenate([array[start:] for _, array, start in sources])
    got = load_npy(path, mmap=False)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert path.stat().st_size == memmap.NPY_HEADER_BYTES + want.nbytes  # the padding cut back
    assert np.array_equal(np.load(path), want)  # numpy's own reader agrees
    assert seen.hexdigest() == xxhash.xxh3_128(b"".join(a.tobytes() for _, a, _ in sources)).hexdigest()
    assert copied.hexdigest() == xxhash.xxh3_128(want.tobytes()).hexdigest()


def test_a_filesystem_without_o_direct_is_written_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memmap, "DIRECT_MIN_BYTES", 0)
    real_open, flags_seen = os.open, []

    def refusing_open(path: Any, flags: int, *args: Any) -> int:  # as tmpfs answers O_DIRECT
        flags_seen.append(flags)
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(memmap.os, "open", refusing_open)
    sources = _sources(tmp_path)
    path, _, _ = _concatenate(tmp_path, sources)
    assert [bool(f & os.O_DIRECT) for f in flags_seen] == [True, False]
    assert np.array_equal(load_npy(path, mmap=False), np.concatenate([a[s:] for _, a, s in sources]))


def test_a_filesystem_that_refuses_o_direct_writes_is_written_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some filesystems open a file with O_DIRECT and refuse its writes: the first write finds
    out, and the file is written through the page cache from then on."""
    monkeypatch.setattr(memmap, "CONCAT_BUFFER_BYTES", 8192)
    monkeypatch.setattr(memmap, "DIRECT_MIN_BYTES", 0)
    real_pwrite, refused = os.pwrite, []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(memmap.os, "pwrite", pwrite)
    sources = _sources(tmp_path)
    path, _, _ = _concatenate(tmp_path, sources)
    assert refused == [0]
    assert np.array_equal(load_npy(path, mmap=False), np.concatenate([a[s:] for _, a, s in sources]))


def test_a_source_cut_after_its_header_was_checked_is_damage(tmp_path: Path) -> None:
    (path, array, _), *_ = _sources(tmp_path)
    out = NpyConcatenation(tmp_path / "out.npy", np.dtype("<f4"), (5,), len(array))
    with NpySource(path) as source:
        os.truncate(path, source.offset + 10 * source.row_bytes)
        with pytest.raises(CorruptDatasetError, match=rf"array file {path} is damaged: it ends at byte"):
            out.copy(source, 0, len(array), lambda _: None, lambda _: None)
    out.abort()


def test_a_source_whose_header_promises_more_than_its_bytes_is_damage(tmp_path: Path) -> None:
    (path, _, _), *_ = _sources(tmp_path)
    os.truncate(path, path.stat().st_size - 1)
    with pytest.raises(CorruptDatasetError, match="more than its"):
        NpySource(path)


def test_rows_that_do_not_fit_and_a_short_copy_are_refused(tmp_path: Path) -> None:
    (path, array, _), *_ = _sources(tmp_path)
    out = NpyConcatenation(tmp_path / "out.npy", np.dtype("<f8"), (5,), len(array))
    with NpySource(path) as source, pytest.raises(ValueError, match="do not fit"):
        out.copy(source, 0, len(array), lambda _: None, lambda _: None)
    out.abort()
    out = NpyConcatenation(tmp_path / "out.npy", np.dtype("<f4"), (5,), len(array) + 1)
    with NpySource(path) as source:
        out.copy(source, 0, len(array), lambda _: None, lambda _: None)
    with pytest.raises(ValueError, match="bytes copied"):
        out.close(fsync=False)
    assert out._fd == -1  # closed as by abort: nothing left open for the caller to leak


def test_commits_and_compaction_write_large_columns_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's commit of a column of at least DIRECT_MIN_BYTES, and every memmap column a
    compaction writes, go through NpyConcatenation (O_DIRECT here); what is read back is what
    was written, and the check passes."""
    import rlds_cli
    from rlds_cli.inspection.validate import check_dataset
    from tests.dataset_fixtures import uid_episode

    monkeypatch.setattr(memmap, "DIRECT_MIN_BYTES", 100)  # a 20-step episode's observation (176 bytes)
    made: list[Path] = []
    real_init = NpyConcatenation.__init__

    def spying_init(self: NpyConcatenation, path: Path, *args: Any) -> None:
        made.append(path)
        real_init(self, path, *args)

    monkeypatch.setattr(NpyConcatenation, "__init__", spying_init)
    episodes = [uid_episode(uid, 20 + uid) for uid in range(1, 5)]
    with rlds_cli.DatasetWriter("g", root=tmp_path, mode="append") as writer:
        for ep in episodes:
            writer.add_episode(ep)
            writer.flush()
    assert {p.name for p in made} >= {"observation.npy"} and len(made) >= 4
    made.clear()
    rlds_cli.compact("g", tmp_path, grace_seconds=0)
    assert "observation.npy" in {p.name for p in made}
    ds = rlds_cli.open_dataset("g", tmp_path)
    assert check_dataset(ds).ok and ds.num_episodes == 4
    for i, ep in enumerate(episodes):
        got = ds.episode(i)
        assert np.array_equal(got["observation"], ep["observation"])
        assert np.array_equal(got["next/observation"], ep["next/observation"])


def test_a_forked_child_never_shares_the_parents_spare_buffers(tmp_path: Path) -> None:
    """A spare buffer kept by the parent is the child's own copy after a fork (a shared anonymous
    map would let a child's commit and the parent's fill the same pages)."""
    rows, width = 1000, 64
    warm = NpyConcatenation(tmp_path / "warm.npy", np.dtype("<f4"), (width,), rows)
    warm.append(np.zeros((rows, width), "<f4"))
    warm.close(fsync=False)  # its buffer is now a spare, in both processes after the fork
    filled, go = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            child = NpyConcatenation(tmp_path / "child.npy", np.dtype("<f4"), (width,), rows)
            child.append(np.full((rows, width), 2.0, "<f4"))
            os.write(filled[1], b"x")
            os.read(go[0], 1)  # the parent fills its own buffer meanwhile
            child.close(fsync=False)
        finally:
            os._exit(0)
    os.read(filled[0], 1)
    parent = NpyConcatenation(tmp_path / "parent.npy", np.dtype("<f4"), (width,), rows)
    parent.append(np.full((rows, width), 1.0, "<f4"))
    parent.close(fsync=False)
    os.write(go[1], b"x")
    os.waitpid(pid, 0)
    assert (load_npy(tmp_path / "parent.npy", mmap=False) == 1.0).all()
    assert (load_npy(tmp_path / "child.npy", mmap=False) == 2.0).all()


def test_a_write_error_reaches_the_caller_and_abort_releases_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk met on an I/O thread is the caller's OSError, never a BufferError of the
    abort that follows (the pool full, a view of the buffer still held by the traceback)."""
    dtype, width, rows = np.dtype("<u1"), 8 << 20, 6  # 48 MiB: 4 buffers each
    full = NpyConcatenation(tmp_path / "a.npy", dtype, (width,), rows)
    failing = NpyConcatenation(tmp_path / "b.npy", dtype, (width,), rows)
    for _ in range(rows):
        full.append(np.zeros((1, width), dtype))
    full.close(fsync=False)  # the spare pool is full now
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if offset > 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(memmap.os, "pwrite", pwrite)
    with pytest.raises(OSError, match="No space left"):
        try:
            for _ in range(rows):
                failing.append(np.zeros((1, width), dtype))
            failing.close(fsync=False)
        except BaseException:
            failing.abort()  # what a commit and a compaction do
            raise
    assert failing._fd == -1


def test_a_header_that_does_not_fit_leaks_no_descriptor(tmp_path: Path) -> None:
    dtype = np.dtype([(f"field_{i}", "<f4") for i in range(12)])  # a header over 256 bytes
    before = len(os.listdir("/proc/self/fd"))
    for i in range(5):
        with pytest.raises(ValueError, match="npy header too long"):
            NpyConcatenation(tmp_path / f"c{i}.npy", dtype, (), 1000)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_writer_left_open_at_exit_commits_its_large_columns(tmp_path: Path) -> None:
    """The writer's exit hook commits what a script left open; a column of several buffers is
    then written on the committing thread (the I/O threads' pool refuses work at exit)."""
    import subprocess
    import sys

    script = """
import sys, numpy as np, rlds_cli
length = 1000
flags = np.zeros((length, 1), bool); flags[-1] = True
obs = np.full((length + 1, 84, 84, 3), 7, np.uint8)  # 21 MB: three 8 MiB buffers
w = rlds_cli.DatasetWriter("open", root=sys.argv[1], episodes_per_commit=1, commit_interval=3600)
w.add_episode({"observation": obs[:-1], "next/observation": obs[1:],
               "action": np.zeros((length, 2), np.float32), "next/reward": np.ones((length, 1), np.float32),
               "next/terminated": flags, "next/truncated": np.zeros_like(flags)})
# no close(): the exit hook commits
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import rlds_cli

    ds = rlds_cli.open_dataset("open", tmp_path)
    assert ds.num_episodes == 1 and int(np.asarray(ds.episode(0)["observation"])[-1, 0, 0, 0]) == 7
