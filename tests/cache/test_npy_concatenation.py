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
