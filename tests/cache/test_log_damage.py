"""Damage to a growing dataset is reported, never tidied away (issue 37).

A crash leaves one shape: torn records at the log's end (the start of a record, then zeros),
which the next append vouches for with a ``RECOVER`` record (tests/cache/test_commit_log_torn.py).
Everything else is damage: a record with a flipped byte anywhere, a torn-looking slot in the
middle that nothing vouched for, a record whose checksum holds but that breaks the log's rules,
a segment whose files or manifest disagree with its digests or with the dataset's manifest.
Readers raise one :class:`CorruptDatasetError` naming the log (or segment) and record,
``inspect --check`` exits 1, ``compact`` and ``gc`` remove nothing, and other datasets of the
cache stay usable."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.commit_log import (
    ADD,
    COMPACT,
    EVICT,
    MAGIC,
    RECORD_SIZE,
    LogState,
    Record,
    looks_torn,
    new_segment_id,
    seg_name,
)
from rlds_cli.cache.layout import COMMIT_LOG_FILE, MANIFEST_FILE, SEGMENTS_DIR
from rlds_cli.cli.app import app
from rlds_cli.errors import CommitFailedError, CorruptDatasetError
from rlds_cli.inspection.validate import check_dataset
from tests.dataset_fixtures import rewrite_manifest, uid_episode
from tests.faults import assert_finishes_forked

runner = CliRunner()


def _write(root: Path, name: str, uids: tuple[int, ...], options: dict[str, object]) -> None:
    with rlds_cli.DatasetWriter(name, root=root, mode="append", **options) as w:  # type: ignore[arg-type]
        for uid in uids:
            w.add_episode(uid_episode(uid, 2 + uid))
            w.flush()  # a commit (a record) each


def _grow(root: Path, name: str = "g", uids: tuple[int, ...] = (1, 2, 3), **options: object) -> Path:
    """A growing dataset written by a process that has exited since (its segments' writer is
    gone, so nothing keeps them but the log)."""
    assert_finishes_forked(_write, root, name, uids, options)
    return root / "datasets" / name


def _uids(root: Path, name: str = "g") -> list[int]:
    ds = rlds_cli.open_dataset(name, root)
    return [int(ds.episode(i)["info/episode_uid"][0]) for i in range(ds.num_episodes)]


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _forge(**fields: object) -> bytes:
    """A record with a valid checksum that rlds never writes."""
    return Record(**fields).pack()  # type: ignore[arg-type]


def _segments(directory: Path) -> set[str]:
    return {p.name for p in (directory / SEGMENTS_DIR).iterdir()}


def _assert_reported(root: Path, directory: Path, match: str) -> None:
    """Every command reports the damage in one line and removes nothing."""
    before = _segments(directory)
    with pytest.raises(CorruptDatasetError, match=match):
        rlds_cli.open_dataset("g", root)
    check = runner.invoke(app, ["inspect", "g", "--check", "--root", str(root)])
    assert check.exit_code == 1 and "damaged" in check.output and "Traceback" not in check.output, (
        check.output
    )
    assert "unexpected" not in check.output
    with pytest.raises(CorruptDatasetError):
        rlds_cli.compact("g", root, grace_seconds=0)
    gc = runner.invoke(app, ["gc", "--root", str(root)])
    assert gc.exit_code == 0 and "skipped growing dataset g" in gc.output, gc.output
    assert _segments(directory) == before  # nothing removed


def _assert_compaction_stops(root: Path, directory: Path, match: str) -> None:
    """``compact`` raises the damage (matching ``match``) and removes no segment."""
    before = _segments(directory)
    with pytest.raises(CorruptDatasetError, match=match):
        rlds_cli.compact("g", root, grace_seconds=0)
    assert _segments(directory) == before


def test_a_flipped_byte_in_a_committed_record_is_damage_not_a_torn_write(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root)
    log = directory / COMMIT_LOG_FILE
    _flip(log, RECORD_SIZE + 40)  # inside the second ADD record: its episode count
    _assert_reported(root, directory, r"commits.log is damaged: record 1 \(byte 96\) fails its checksum")


def test_a_flipped_last_record_is_damage_too(isolated_cache: Path) -> None:
    """A crash leaves the start of a record then zeros; a whole record whose bytes changed is
    not what any crash leaves, last or not."""
    root = isolated_cache
    directory = _grow(root)
    _flip(directory / COMMIT_LOG_FILE, 2 * RECORD_SIZE + 10)
    _assert_reported(root, directory, "record 2")


@pytest.mark.parametrize("how", ["cut one byte", "bytes appended", "a record cut short"])
def test_bytes_past_the_last_whole_record_that_no_crash_leaves_are_damage(
    isolated_cache: Path, how: str
) -> None:
    """A log cut by a byte (its EVICT record lost: an evicted episode served again) or with bytes
    appended was read up to its last whole record: every check passed, then compact and the next
    writer appended after the damage, which made it unreadable for good. A crash's torn tail (the
    start of a record, then zeros) still reads as the log before it."""
    root = isolated_cache
    directory = _grow(root, capacity_episodes=2)
    log = directory / COMMIT_LOG_FILE
    data = log.read_bytes()
    damaged = {
        "cut one byte": data[:-1],
        "bytes appended": data + b"oops",
        "a record cut short": data + data[-RECORD_SIZE:][:-3],
    }[how]
    log.write_bytes(damaged)
    _assert_reported(root, directory, r"commits.log is damaged: it ends in \d+ bytes .* not a whole record")
    assert log.read_bytes() == damaged  # compact appended nothing
    verify = runner.invoke(app, ["verify", "g", "--root", str(root)])
    assert verify.exit_code == 1 and "not a whole record" in verify.output, verify.output
    log.write_bytes(data + MAGIC + bytes(20))  # a crash's shape: accepted, the same view
    assert _uids(root) == [2, 3]


def test_a_reader_does_not_wait_for_ever_on_a_held_log_lock(
    isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial tail is judged under the log's lock; a writer stopped mid-append (SIGSTOP) holds
    it for ever, and every reader waited with it. A reader now reads the whole records and judges
    the tail at a later refresh."""
    import fcntl

    from rlds_cli.cache import commit_log

    monkeypatch.setattr(commit_log, "TAIL_LOCK_SECONDS", 0.2)
    root = isolated_cache
    directory = _grow(root, capacity_episodes=2)
    log = directory / COMMIT_LOG_FILE
    data = log.read_bytes()
    log.write_bytes(data + b"oops")
    with open(log, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another open file: excludes this process too
        assert _uids(root) == [2, 3]  # the whole records, not a hang
        ds = rlds_cli.open_dataset("g", root)
        for _ in range(3):  # a refresh after a wait polls the held lock briefly
            ds.refresh()
        assert ds.num_episodes == 2
    with pytest.raises(CorruptDatasetError, match="not a whole record"):
        _uids(root)  # the lock released: the tail is judged


def test_a_zeroed_record_in_the_middle_is_damage(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root)
    log = directory / COMMIT_LOG_FILE
    data = bytearray(log.read_bytes())
    data[RECORD_SIZE : 2 * RECORD_SIZE] = bytes(RECORD_SIZE)
    log.write_bytes(bytes(data))
    _assert_reported(root, directory, "record 1 .* in the middle of the log")


def test_a_torn_slot_with_no_recover_record_after_it_is_damage(isolated_cache: Path) -> None:
    """Torn records are accepted in the middle only where an append vouched for them: what a
    log padded by an older writer, or edited, holds is reported."""
    root = isolated_cache
    directory = _grow(root, uids=(1,))
    log = directory / COMMIT_LOG_FILE
    torn = Record(ADD, new_segment_id(), episodes=1, steps=2).pack()[:32] + bytes(RECORD_SIZE - 32)
    log.write_bytes(log.read_bytes() + torn + Record(EVICT, count=0).pack())
    with pytest.raises(CorruptDatasetError, match=r"record 1 .* in the middle"):
        rlds_cli.open_dataset("g", root)


@pytest.mark.parametrize(
    "record, match",
    [
        (dict(kind=EVICT, count=2**62), "EVICT, evicts 4611686018427387904 episodes where 3 were added"),
        (dict(kind=EVICT, count=-1), "evicts -1 episodes"),
        (dict(kind=ADD, seg=b"x" * 16, episodes=0, steps=0), "adds a segment of 0 episodes"),
        (
            dict(kind=COMPACT, seg=b"y" * 16, first=b"a" * 16, last=b"b" * 16, episodes=1, steps=2),
            "compacts segments the log never added",
        ),
        (dict(kind=9), "of a kind this rlds does not know"),
    ],
)
def test_a_forged_record_that_breaks_the_log_s_rules_is_damage(
    isolated_cache: Path, record: dict[str, object], match: str
) -> None:
    root = isolated_cache
    directory = _grow(root)
    log = directory / COMMIT_LOG_FILE
    log.write_bytes(log.read_bytes() + _forge(**record))
    _assert_reported(root, directory, match)


def test_a_second_add_of_a_segment_and_a_reversed_compaction_are_damage(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root)
    log = directory / COMMIT_LOG_FILE
    pristine = log.read_bytes()
    first = Record.unpack(pristine[:RECORD_SIZE])
    last = Record.unpack(pristine[2 * RECORD_SIZE :])
    assert first is not None and last is not None
    log.write_bytes(pristine + pristine[:RECORD_SIZE])
    with pytest.raises(CorruptDatasetError, match=r"record 3 .* adds segment .* a second time"):
        rlds_cli.open_dataset("g", root)
    reversed_ = _forge(
        kind=COMPACT, seg=new_segment_id(), first=last.seg, last=first.seg, episodes=1, steps=3
    )
    log.write_bytes(pristine + reversed_)
    with pytest.raises(CorruptDatasetError, match="compacts a reversed range"):
        rlds_cli.open_dataset("g", root)


def test_one_damaged_dataset_never_stops_commands_on_the_others(isolated_cache: Path) -> None:
    """A log that is a folder, and a COMPACT record whose first segment comes after its last:
    ``rlds list`` lists every dataset and says which is damaged, ``gc`` cleans the others,
    ``inspect`` names the damage."""
    root = isolated_cache
    _grow(root, "healthy", (1, 2))
    bad = _grow(root, "g")
    log = bad / COMMIT_LOG_FILE
    pristine = log.read_bytes()
    first, last = Record.unpack(pristine[:RECORD_SIZE]), Record.unpack(pristine[-RECORD_SIZE:])
    assert first is not None and last is not None
    forged = _forge(kind=COMPACT, seg=new_segment_id(), first=last.seg, last=first.seg, episodes=1, steps=3)
    for damage in ("reversed", "folder"):
        if damage == "reversed":
            log.write_bytes(pristine + forged)
        else:
            log.unlink()
            log.mkdir()
        listed = runner.invoke(app, ["list", "--root", str(root)])
        assert listed.exit_code == 0 and "healthy" in listed.output, listed.output
        assert "g is damaged" in listed.output and "Traceback" not in listed.output, listed.output
        as_json = json.loads(runner.invoke(app, ["list", "--json", "--root", str(root)]).stdout)
        rows = {row["name"]: row for row in as_json["datasets"]}
        assert rows["healthy"]["damaged"] is None and "commits.log" in rows["g"]["damaged"]
        for command in (["gc"], ["inspect", "healthy", "--check"]):
            result = runner.invoke(app, [*command, "--root", str(root)])
            assert result.exit_code == 0 and "unexpected" not in result.output, result.output
        inspected = runner.invoke(app, ["inspect", "g", "--root", str(root)])
        assert inspected.exit_code == 1 and "commits.log" in inspected.output, inspected.output
        assert "unexpected" not in inspected.output and "Traceback" not in inspected.output
        assert _uids(root, "healthy") == [1, 2]


def test_every_flipped_byte_of_a_small_log_is_detected(isolated_cache: Path) -> None:
    """The property test of the log: each byte of a 3-record log flipped in turn (its low bit,
    then all its bits) is reported by the reader; none is served as a view of fewer episodes."""
    root = isolated_cache
    directory = _grow(root)
    log = directory / COMMIT_LOG_FILE
    pristine = log.read_bytes()
    missed = []
    for offset in range(len(pristine)):
        for mask in (0x01, 0xFF):
            log.write_bytes(pristine)
            _flip(log, offset, mask)
            try:
                rlds_cli.open_dataset("g", root)
            except CorruptDatasetError:
                continue
            missed.append((offset, mask))
    log.write_bytes(pristine)
    assert missed == [] and _uids(root) == [1, 2, 3]


def test_torn_looking_slots_are_a_record_start_and_zeros() -> None:
    record = Record(ADD, new_segment_id(), episodes=1, steps=2).pack()
    assert not looks_torn(b"\xff" * RECORD_SIZE) and not looks_torn(b"junk" + b"\0" * (RECORD_SIZE - 4))
    for cut in (0, 2, 4, 32, 64, RECORD_SIZE - 4):  # what reached the disk, then zeros
        assert looks_torn(record[:cut] + b"\0" * (RECORD_SIZE - cut))
    flipped = bytearray(record)
    flipped[20] ^= 1
    assert not looks_torn(bytes(flipped))  # whole, with its checksum: damage
    assert record[:4] == MAGIC and struct.unpack("<I", record[-4:])[0] == zlib.crc32(record[:-4])


def test_more_torn_records_at_the_end_than_writers_can_tear_is_damage(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root, uids=(1,))
    log = directory / COMMIT_LOG_FILE
    log.write_bytes(log.read_bytes() + bytes(17 * RECORD_SIZE))  # a zeroed region, not a crash
    with pytest.raises(CorruptDatasetError, match="17 records in a row"):
        rlds_cli.open_dataset("g", root)
    log.write_bytes(log.read_bytes()[: 9 * RECORD_SIZE])  # 8 writers torn at once: a crash
    assert _uids(root) == [1]
    state = LogState()
    state.follow(log)
    assert (state.records, state.torn) == (1, 8)


# ---------------------------------------------------------------- segments and compaction


def _column_file(directory: Path, key: str = "observation") -> Path:
    segment = sorted((directory / SEGMENTS_DIR).iterdir())[1]
    return segment / "arrays" / f"{key}.npy"


def test_compaction_refuses_a_segment_whose_array_fails_its_digest(isolated_cache: Path) -> None:
    """A segment whose data changed is never merged into a fresh digest: the compaction stops
    naming it, and the check goes on failing."""
    root = isolated_cache
    directory = _grow(root)
    column = _column_file(directory)
    _flip(column, column.stat().st_size - 1)  # a value's last byte
    _assert_compaction_stops(root, directory, r"compaction of 'g' stopped: segment .* 'observation'")
    assert not any((directory / "building").iterdir())
    assert not check_dataset(rlds_cli.open_dataset("g", root)).ok
    result = runner.invoke(app, ["compact", "g", "--root", str(root)])
    assert result.exit_code == 1 and "does not match its digest" in result.output, result.output


def test_compaction_refuses_a_segment_whose_zarr_group_metadata_is_damaged(isolated_cache: Path) -> None:
    """A zarr segment's group ``zarr.json`` cut short: check, verify, export and push refused the
    dataset, compact merged the segment anyway (no value changed) and the check then passed."""
    root = isolated_cache
    directory = _grow(root, uids=(1, 2, 3, 4), storage="zarr")
    segment = sorted((directory / SEGMENTS_DIR).iterdir())[1]
    group = segment / "arrays" / "next" / "zarr.json"
    group.write_bytes(group.read_bytes()[:-1])
    _assert_compaction_stops(root, directory, rf"compaction of 'g' stopped: segment {segment.name}: .*zarr")
    assert not check_dataset(rlds_cli.open_dataset("g", root)).ok


def test_compaction_reports_damage_in_a_segment_it_does_not_merge(isolated_cache: Path) -> None:
    """A final segment (never merged again) cut short: compact said nothing, exited 0 and
    removed the retired segments besides. It reports the damage and removes nothing."""
    root = isolated_cache
    directory = _grow(root, uids=(1, 2, 3))
    rlds_cli.compact("g", root, grace_seconds=3600)  # one final segment; the merged ones kept
    live = rlds_cli.open_dataset("g", root).live_segments()
    assert len(live) == 1 and len(_segments(directory)) > 1
    column = directory / SEGMENTS_DIR / seg_name(live[0][0].seg) / "arrays" / "observation.npy"
    column.write_bytes(column.read_bytes()[:-1])
    before = _segments(directory)
    _assert_compaction_stops(root, directory, r"compaction of 'g' merged 0 run\(s\), then stopped: segment")
    result = runner.invoke(app, ["compact", "g", "--root", str(root), "--grace", "0"])
    assert result.exit_code == 1 and "then stopped: segment" in result.output, result.output
    assert _segments(directory) == before


@pytest.mark.parametrize("cut", ["to_10_bytes", "by_one_byte", "with_a_byte_more"])
def test_a_zarr_shard_cut_short_is_not_a_file_at_its_full_size(isolated_cache: Path, cut: str) -> None:
    """A zarr segment's shard cut short of its own index (or grown) passed 'files complete' (its
    file was there), so compact exited 0 and removed retired segments beside the damage."""
    root = isolated_cache
    directory = _grow(root, uids=(1, 2, 3), storage="zarr")
    rlds_cli.compact("g", root, grace_seconds=3600)  # one final segment; the merged ones kept
    (live,) = rlds_cli.open_dataset("g", root).live_segments()
    shard = directory / SEGMENTS_DIR / seg_name(live[0].seg) / "arrays" / "observation" / "c" / "0" / "0"
    data = shard.read_bytes()
    damaged = {"to_10_bytes": data[:10], "by_one_byte": data[:-1], "with_a_byte_more": data + b"x"}
    shard.write_bytes(damaged[cut])
    before = _segments(directory)
    result = runner.invoke(app, ["verify", "g", "--root", str(root)])
    assert result.exit_code == 1 and "fail    files complete" in result.output, result.output
    result = runner.invoke(app, ["compact", "g", "--root", str(root), "--grace", "0"])
    assert result.exit_code == 1 and "then stopped: segment" in result.output, result.output
    assert _segments(directory) == before


def test_segments_retired_under_a_check_are_no_damage(isolated_cache: Path) -> None:
    """``inspect --check`` and ``verify`` beside a writer that evicts with a short grace: the
    segments of the checked view lost their files mid-check, reported as missing files or a
    replaced dataset (and verify's hint said to remove the dataset). Damage to a live segment is
    still reported."""
    from rlds_cli.cache.digest import check_digests

    root = isolated_cache
    options = {"capacity_episodes": 2, "grace_seconds": 0}
    directory = _grow(root, uids=(1, 2, 3), **options)
    ds = rlds_cli.open_dataset("g", root)
    viewed = sorted(_segments(directory))
    _grow(root, uids=(4, 5, 6), **options)  # evicts and removes every segment of that view
    assert not set(viewed) & _segments(directory)
    assert ds.check_files() == [] and check_digests(ds).problems == []
    report = check_dataset(ds)  # a read met a removed segment: the view is refreshed
    assert report.ok and _uids(root) == [5, 6] and ds.num_episodes == 2
    column = _column_file(directory, "observation")  # a live segment's data changed: damage
    _flip(column, column.stat().st_size - 1)
    assert not check_dataset(ds).ok and check_digests(ds).problems


def test_a_file_where_the_builds_folder_should_be_is_one_clear_line(isolated_cache: Path) -> None:
    """``building`` replaced by a file: compact said 'unexpected FileExistsError', a writer a raw
    errno."""
    root = isolated_cache
    directory = _grow(root)
    shutil.rmtree(directory / "building")
    (directory / "building").write_text("x")
    compact = runner.invoke(app, ["compact", "g", "--root", str(root)])
    assert compact.exit_code == 1 and "unexpected" not in compact.output
    assert "is not the folder of segment builds" in " ".join(compact.output.split())
    with pytest.raises(CommitFailedError, match="is not the folder of segment builds"):
        _write(root, "g", (9,), {})
    assert _uids(root) == [1, 2, 3]


def test_compaction_refuses_a_segment_whose_episode_index_changed(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root, uids=(3, 4))
    segment = sorted((directory / SEGMENTS_DIR).iterdir())[0]
    manifest = json.loads((segment / MANIFEST_FILE).read_text())
    manifest["content_digest"]["episodes"] = "0" * 64
    (segment / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(segment / MANIFEST_FILE)
    before = sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir())
    with pytest.raises(CorruptDatasetError, match="changed since it was written"):
        rlds_cli.compact("g", root, grace_seconds=0)
    assert sorted(p.name for p in (directory / SEGMENTS_DIR).iterdir()) == before
    with pytest.raises(CorruptDatasetError, match="changed since it was written"):  # never served
        _uids(root)


def _as_written_with_sha256(segment: Path) -> None:
    """Rewrite a segment's digests as an rlds of sha256 digests recorded them, computed here
    apart from the code under test (the logical values, C order, little-endian)."""
    manifest = json.loads((segment / MANIFEST_FILE).read_text())
    columns = {}
    for key in manifest["content_digest"]["columns"]:
        array = np.load(segment / "arrays" / f"{key}.npy")
        columns[key] = hashlib.sha256(
            np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        ).hexdigest()
    index = np.load(segment / "episodes.npy")
    manifest["content_digest"] = {
        "algorithm": "sha256",
        "columns": columns,
        "episodes": hashlib.sha256(np.ascontiguousarray(index).tobytes()).hexdigest(),
    }
    (segment / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(segment / MANIFEST_FILE)


def test_segments_an_older_rlds_digested_with_sha256_are_checked_and_merged(isolated_cache: Path) -> None:
    """Segments of sha256 digests (what rlds wrote before XXH3-128) are checked by sha256 and
    merged into one of the new algorithm; a flipped value in one still stops the merge."""
    root = isolated_cache
    directory = _grow(root, uids=(1, 2, 3, 4))
    for segment in (directory / SEGMENTS_DIR).iterdir():
        _as_written_with_sha256(segment)
    assert check_dataset(rlds_cli.open_dataset("g", root)).ok
    rlds_cli.compact("g", root, grace_seconds=0)
    ds = rlds_cli.open_dataset("g", root)
    assert _uids(root) == [1, 2, 3, 4] and check_dataset(ds).ok
    (merged,) = ds.segment_datasets()
    assert merged.manifest.content_digest["algorithm"] == "xxh3_128"

    directory = _grow(root, "h", uids=(5, 6))
    for segment in (directory / SEGMENTS_DIR).iterdir():
        _as_written_with_sha256(segment)
    column = _column_file(directory)
    _flip(column, column.stat().st_size - 1)
    with pytest.raises(CorruptDatasetError, match=r"compaction of 'h' stopped: .*does not match its digest"):
        rlds_cli.compact("h", root, grace_seconds=0)


def test_compaction_refuses_a_segment_of_an_unknown_digest_algorithm(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root, uids=(3, 4))
    segment = sorted((directory / SEGMENTS_DIR).iterdir())[0]
    manifest = json.loads((segment / MANIFEST_FILE).read_text())
    manifest["content_digest"]["algorithm"] = "md5"
    (segment / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(segment / MANIFEST_FILE)
    _assert_compaction_stops(root, directory, "algorithm this rlds does not know")
    assert _uids(root) == [3, 4]
    assert not check_dataset(rlds_cli.open_dataset("g", root)).ok


@pytest.mark.parametrize("where", ["segment", "head"])
def test_a_manifest_that_contradicts_the_data_is_damage_never_a_cast(
    isolated_cache: Path, where: str
) -> None:
    """The head manifest (or a segment's) says ``observation`` is int8 over float32 data: every
    read would have served int8 casts (3.0, -2.56, 0.42 as 3, -2, 0), and compact written them."""
    root = isolated_cache
    directory = _grow(root)
    target = directory if where == "head" else sorted((directory / SEGMENTS_DIR).iterdir())[0]
    manifest = json.loads((target / MANIFEST_FILE).read_text())
    manifest["fields"]["observation"]["dtype"] = "int8"
    (target / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(target / MANIFEST_FILE)
    with pytest.raises(CorruptDatasetError, match=r"'observation' is (float32|int8) .* in the segment"):
        rlds_cli.open_dataset("g", root)[:]
    with pytest.raises(CorruptDatasetError):
        rlds_cli.compact("g", root, grace_seconds=0)
    check = runner.invoke(app, ["inspect", "g", "--check", "--root", str(root)])
    assert check.exit_code == 1 and "observation" in check.output, check.output


def test_a_key_removed_from_the_head_manifest_is_damage(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root)
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    del manifest["fields"]["info/episode_uid"]
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))
    rewrite_manifest(directory / MANIFEST_FILE)
    with pytest.raises(CorruptDatasetError, match=r"keys differ .*info/episode_uid"):
        rlds_cli.open_dataset("g", root)


def test_a_missing_segment_the_log_holds_live_is_damage(isolated_cache: Path) -> None:
    root = isolated_cache
    directory = _grow(root)
    shutil.rmtree(sorted((directory / SEGMENTS_DIR).iterdir())[0])
    with pytest.raises(CorruptDatasetError, match=r"is missing, and commits\.log holds episodes of it"):
        rlds_cli.open_dataset("g", root)


def _files_of(segment: Path) -> list[Path]:
    return sorted(p for p in segment.rglob("*") if p.is_file())


#: Bytes flipped per segment file in the suite (zarr opens are slower); ``RLDS_TEST_EVERY_BYTE=1``
#: flips every one (minutes: docs/reliability.md has the counts of that run).
SAMPLED_BYTES = {"memmap": 12, "zarr": 4}
#: Read at import: the isolated_cache fixture unsets every RLDS_ variable.
EVERY_BYTE = os.environ.get("RLDS_TEST_EVERY_BYTE") == "1"


def _offsets(size: int, rng: np.random.Generator, sampled: int) -> list[int]:
    if EVERY_BYTE or size <= sampled:
        return list(range(size))
    return sorted(rng.choice(size, sampled, replace=False).tolist())


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_every_flipped_byte_of_a_segment_is_detected_or_harmless_and_never_compacted(
    isolated_cache: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The property test of the segments: bytes of each file of a one-episode segment flipped
    in turn (a seeded sample of each file; every byte with ``RLDS_TEST_EVERY_BYTE=1``). Either
    ``inspect --check``'s checks (open, files, digests) report it, or the dataset reads exactly
    as before (a byte nothing reads, such as the manifest's ``created_by``); and ``compact``
    never succeeds with data other than the original."""
    root = isolated_cache
    directory = _grow(root, uids=(1, 2), storage=backend)
    original = rlds_cli.open_dataset("g", root)[:]
    segment = sorted((directory / SEGMENTS_DIR).iterdir(), key=lambda p: p.stat().st_mtime_ns)[-1]
    pristine = root.parent / "pristine"
    shutil.copytree(directory, pristine)
    served, compacted = [], []
    files = [(path, path.stat().st_size) for path in _files_of(segment)]
    assert files
    rng = np.random.default_rng(37)
    counts = {"flips": 0, "detected": 0, "harmless": 0, "compact refused": 0}
    for path, size in files:
        for offset in _offsets(size, rng, SAMPLED_BYTES[backend]):
            shutil.rmtree(directory)
            shutil.copytree(pristine, directory)
            _flip(path, offset, 0xFF)
            counts["flips"] += 1
            outcome = _detected_or_same(root, original)
            if outcome is None:
                served.append((str(path.relative_to(segment)), offset))
            else:
                counts[outcome] += 1
            try:
                rlds_cli.compact("g", root, grace_seconds=0)
            except CorruptDatasetError:
                counts["compact refused"] += 1
                continue
            if _detected_or_same(root, original) != "harmless":
                compacted.append((str(path.relative_to(segment)), offset))
    with capsys.disabled():  # the counts docs/reliability.md quotes (pytest -s)
        print(f"\n{backend} segment flips: {counts}")
    assert served == [] and compacted == []


def _detected_or_same(root: Path, original: dict[str, np.ndarray]) -> str | None:
    """``"detected"`` (opening or ``check_dataset`` reports damage), ``"harmless"`` (it reads
    exactly as ``original``), or ``None``: served wrong."""
    try:
        ds = rlds_cli.open_dataset("g", root)
        if not check_dataset(ds).ok:
            return "detected"
        batch = ds[:]
    except CorruptDatasetError:
        return "detected"
    same = set(batch.keys()) == set(original.keys()) and all(
        np.array_equal(batch[key], original[key]) for key in original
    )
    return "harmless" if same else None
