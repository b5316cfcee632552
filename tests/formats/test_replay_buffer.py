"""diffusion_policy / UMI ``ReplayBuffer`` zarr stores: our reading against the upstream
``ReplayBuffer``'s (golden dumps written by its own code, ``tests/fixtures/replay_buffer``) over
every key and step, the action rules, the CLI end to end, and damaged or foreign stores."""

from __future__ import annotations

import json
import shutil
import sys
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import MissingExtraError, SourceFormatError
from rlds_cli.formats import detect_format
from rlds_cli.formats.replay_buffer import ReplayBufferReader
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.sources.convert import convert
from rlds_cli.testing.contracts import ReaderContract
from tests.cli_fixtures import download, download_ok
from tests.formats_fixtures import refused

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "replay_buffer"
UMI_ACTION = [f"robot{r}_{p}" for r in (0, 1) for p in ("eef_pos", "eef_rot_axis_angle", "gripper_width")]


def golden(name: str) -> dict[str, np.ndarray]:
    """The upstream ``ReplayBuffer``'s reading of a fixture (``make_fixtures.py``)."""
    with np.load(FIXTURES / f"{name}.golden.npz") as z:
        return {k: z[k] for k in z.files}


def copy_fixture(name: str, tmp_path: Path) -> Path:
    src = FIXTURES / name
    dst = tmp_path / name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def expected_ted(gold: dict[str, np.ndarray], action: list[str]) -> dict[str, np.ndarray]:
    """What TED holds for an upstream reading: every data key an observation (but a lone action
    key), its next the following step's, an episode's last next repeating its last step."""
    ends = gold["meta/episode_ends"]
    n = int(ends[-1])
    nxt = np.arange(1, n + 1)
    nxt[ends - 1] = ends - 1  # the final observation repeats the last step's
    out = {"action": np.concatenate([gold[f"data/{k}"].reshape(n, -1) for k in action], axis=-1)}
    for key in (k.removeprefix("data/") for k in gold if k.startswith("data/")):
        if action == [key]:
            continue
        out[f"observation/{key}"] = gold[f"data/{key}"]
        out[f"next/observation/{key}"] = gold[f"data/{key}"][nxt]
    truncated = np.zeros((n, 1), bool)
    truncated[ends - 1] = True
    out["next/truncated"] = truncated
    out["next/terminated"] = np.zeros((n, 1), bool)
    out["next/reward"] = np.zeros((n, 1), np.float32)
    return out


CASES = [
    ("pusht.zarr", ["action"]),
    ("pusht.zarr.zip", ["action"]),
    ("robomimic_image.zarr.zip", ["action"]),  # diffusion_policy's robomimic cache: JPEG 2000 cameras
    ("umi.zarr.zip", UMI_ACTION),
]


@pytest.mark.parametrize(("name", "action"), CASES)
@pytest.mark.parametrize("frames", ["keep", "webp"])
def test_every_key_and_step_equals_upstream_reading(
    tmp_path: Path, name: str, action: list[str], frames: str
) -> None:
    gold = golden(name)
    result = convert(FIXTURES / name, "rb", frames=frames)
    assert result.manifest.source["format"] == "replay_buffer"
    ds = open_dataset("rb")
    lengths = np.diff(np.concatenate([[0], gold["meta/episode_ends"]]))
    assert ds.episodes["length"].tolist() == lengths.tolist()
    assert not ds.episodes["final_known"].any()
    batch = ds[:]
    want = expected_ted(gold, action)
    assert set(batch) == {*want, "episode", "next/done"}
    np.testing.assert_array_equal(batch["next/done"], want["next/truncated"])
    for key, value in want.items():
        got = np.asarray(batch[key])
        assert got.dtype == value.dtype, key
        np.testing.assert_array_equal(got, value, err_msg=key)  # 0 differences
    conv = result.manifest.conversion
    assert conv["synthesized_final_observations"] == len(lengths)
    assert any("no rewards" in n for n in conv["notes"])
    if frames == "webp":  # camera arrays become frame columns, lossless: still 0 differences
        cams = [k for k in want if k.startswith("observation/") and want[k].ndim == 4]
        assert cams and all(ds.stored_fields[k].codec == "webp" for k in cams)


@pytest.mark.parametrize("block_rows", [1, 2, 4, 7])
def test_blocks_of_any_size_read_the_same(tmp_path: Path, block_rows: int) -> None:
    ref = convert(FIXTURES / "umi.zarr.zip", "ref")
    other = convert(FIXTURES / "umi.zarr.zip", f"b{block_rows}", options={"block_rows": block_rows})
    for p in sorted(ref.path.rglob("*.npy")):
        assert p.read_bytes() == (other.path / p.relative_to(ref.path)).read_bytes()


def test_default_blocks_hold_whole_chunks_of_the_widest_array() -> None:
    with ReplayBufferReader(FIXTURES / "pusht.zarr") as r:  # img: chunks of 4 rows
        assert r.block_rows % 4 == 0 and r.block_rows >= 4


def test_detected_as_directory_and_zip() -> None:
    for name, _ in CASES:
        assert detect_format(FIXTURES / name) == "replay_buffer"


def test_action_key_option(tmp_path: Path) -> None:
    convert(FIXTURES / "pusht.zarr", "st", options={"action_key": "state"})
    batch = open_dataset("st")[:]
    np.testing.assert_array_equal(batch["action"], golden("pusht.zarr")["data/state"])
    assert "observation/state" not in batch and "observation/action" in batch
    # UMI's action asked for by name, from a store that also has other arrays
    with ReplayBufferReader(FIXTURES / "umi.zarr.zip", action_key="robot1_eef_pos") as r:
        assert r.action_keys == ["robot1_eef_pos"]
    for bad, needle in (("nope", "'nope' is not a data array"), ("umi", "action_key=umi needs")):
        with pytest.raises(SourceFormatError, match=needle):
            ReplayBufferReader(FIXTURES / "pusht.zarr", action_key=bad)


def test_no_action_array_asks_for_action_key(tmp_path: Path) -> None:
    store = copy_fixture("pusht.zarr", tmp_path)
    shutil.rmtree(store / "data" / "action")
    with pytest.raises(SourceFormatError, match="which array is the action") as info:
        ReplayBufferReader(store)
    assert "action_key" in info.value.hint


def test_cli_download_then_loader(tmp_path: Path) -> None:
    import rlds_cli

    store = copy_fixture("umi.zarr.zip", tmp_path)
    out = download_ok(store, "umi", "--frames", "webp").output
    assert "umi: converted: 15 steps, 3 episodes" in out
    download_ok(copy_fixture("pusht.zarr", tmp_path), "pusht", "--option", "action_key=state")
    gold = golden("umi.zarr.zip")
    loader = rlds_cli.Loader("umi", batch_size=15, seed=0, sampler="epoch", shuffle=False)
    batch = next(iter(loader))
    frames = batch["observation/camera0_rgb"].numpy()
    np.testing.assert_array_equal(frames, gold["data/camera0_rgb"])
    assert tuple(batch["action"].shape) == (15, 14)
    assert rlds_cli.open_dataset("pusht").fields["action"] == ((5,), "float32")


def test_relative_path_and_an_archive_of_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rlds download ./pusht.zarr``, and diffusion_policy's own packaging: a ``pusht.zip``
    holding ``pusht/pusht_cchi_v7_replay.zarr/`` (unpacked, the store found below)."""
    copy_fixture("pusht.zarr", tmp_path)
    monkeypatch.chdir(tmp_path)
    download_ok("./pusht.zarr", "rel")
    archive = tmp_path / "pusht.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for f in sorted((tmp_path / "pusht.zarr").rglob("*")):
            if f.is_file():
                zf.write(
                    f, f"pusht/pusht_cchi_v7_replay.zarr/{f.relative_to(tmp_path / 'pusht.zarr').as_posix()}"
                )
    download_ok(archive, "zipped")
    gold = golden("pusht.zarr")
    for name in ("rel", "zipped"):
        ds = open_dataset(name)
        assert ds.manifest.source["format"] == "replay_buffer"
        np.testing.assert_array_equal(ds[:]["observation/img"], gold["data/img"])
    two = tmp_path / "two"
    two.mkdir()
    shutil.copytree(tmp_path / "pusht.zarr", two / "a.zarr")
    shutil.copytree(tmp_path / "pusht.zarr", two / "b.zarr")
    refused(download(two, "two"), "holds 2 replay buffers", "a.zarr", published=("rel", "zipped"))


# ------------------------------------------------------------------ damaged and foreign stores


def _rewrite_ends(store: Path, ends: list[int]) -> None:
    """Replace ``meta/episode_ends`` (uncompressed int64 in these fixtures) by ``ends``."""
    meta = store / "meta" / "episode_ends"
    zarray = json.loads((meta / ".zarray").read_text())
    for chunk in meta.iterdir():
        if not chunk.name.startswith("."):
            chunk.unlink()
    zarray.update(shape=[len(ends)], chunks=[len(ends)], compressor=None, filters=None)
    (meta / ".zarray").write_text(json.dumps(zarray))
    (meta / "0").write_bytes(np.asarray(ends, "<i8").tobytes())


def _lose_an_end_chunk(store: Path) -> None:
    """``meta/episode_ends`` in chunks of one end, the middle one lost (zarr would read it as
    the fill value 0, merging episodes)."""
    _rewrite_ends(store, [4, 10, 15])
    meta = store / "meta" / "episode_ends"
    zarray = json.loads((meta / ".zarray").read_text())
    zarray.update(chunks=[1])
    (meta / ".zarray").write_text(json.dumps(zarray))
    (meta / "0").write_bytes(np.asarray([4], "<i8").tobytes())
    (meta / "2").write_bytes(np.asarray([15], "<i8").tobytes())


def _ends_past_int64(store: Path) -> None:
    meta = store / "meta" / "episode_ends"
    _rewrite_ends(store, [4, 10, 15])
    zarray = json.loads((meta / ".zarray").read_text())
    zarray.update(dtype="<u8")
    (meta / ".zarray").write_text(json.dumps(zarray))
    (meta / "0").write_bytes(np.asarray([4, 2**63 + 5, 15], "<u8").tobytes())


def _only_the_action(store: Path) -> None:
    for array in (store / "data").iterdir():
        if array.is_dir() and array.name != "action":
            shutil.rmtree(array)


def _edit_zarray(store: Path, key: str, **changes: object) -> None:
    path = store / "data" / key / ".zarray"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps(meta))


def _break_missing_ends(store: Path) -> None:
    shutil.rmtree(store / "meta" / "episode_ends")


def _break_unknown_codec(store: Path) -> None:
    _edit_zarray(store, "action", compressor={"id": "no_such_codec"})


def _break_chunk(store: Path) -> None:
    (store / "data" / "img" / "1.0.0.0").write_bytes(b"\x02\x01garbage" * 10)


HOSTILE = [
    (_break_missing_ends, ["has no meta/episode_ends"]),
    (_only_the_action, ["holds no observation array beside its action (data arrays: action)"]),
    (_lose_an_end_chunk, ["1 of the 3 chunks of meta/episode_ends are not stored"]),
    (_ends_past_int64, [f"meta/episode_ends holds {2**63 + 5}, past any step count"]),
    (lambda s: _rewrite_ends(s, [10, 4, 15]), ["goes back from 10 to 4"]),
    (lambda s: _rewrite_ends(s, [4, 10, 20]), ["data/", "has 15 rows", "ends at step 20"]),
    (lambda s: _rewrite_ends(s, [4, 10, 12]), ["has 15 rows", "ends at step 12"]),
    (lambda s: _rewrite_ends(s, [-1, 10, 15]), ["below 0"]),
    (lambda s: _rewrite_ends(s, []), ["has 15 rows", "ends at step 0"]),
    (lambda s: _edit_zarray(s, "state", shape=[14, 5]), ["data/state has 14 rows", "ends at step 15"]),
    (_break_unknown_codec, ["data/action", "'no_such_codec'"]),
    (_break_chunk, ["data/img rows", "does not decode"]),
    (lambda s: (s / "data" / "keypoint" / ".zarray").write_text("{not json"), ["data/keypoint/.zarray"]),
    # a few KB of chunks declaring 450 GB: refused before anything is allocated
    (lambda s: _edit_zarray(s, "img", shape=[15, 100000, 100000, 3]), ["'data/img' declares", "bytes"]),
    # a few hundred bytes of data declared in chunks of 200 MB: refused before a chunk is inflated
    (
        lambda s: _edit_zarray(s, "n_contacts", chunks=[5, 50_000_000]),
        ["declares chunks of", "a decompression bomb"],
    ),
]


@pytest.mark.parametrize(("damage", "needles"), HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_damaged_store_is_one_clear_line(tmp_path: Path, damage, needles: list[str]) -> None:  # type: ignore[no-untyped-def]
    store = copy_fixture("pusht.zarr", tmp_path)
    damage(store)
    refused(download(store, "bad", "--format", "replay_buffer"), *needles)


def test_empty_episode_dropped_and_missing_chunk_reported(tmp_path: Path) -> None:
    store = copy_fixture("pusht.zarr", tmp_path)
    _rewrite_ends(store, [4, 4, 10, 15])
    (store / "data" / "n_contacts" / "0.0").unlink()
    (store / "data" / "n_contacts" / "7.0").write_bytes(b"stray")  # outside the array: no stand-in
    m = convert(store, "holes").manifest
    ds = open_dataset("holes")
    assert ds.episodes["length"].tolist() == [4, 6, 5]
    assert ds.episodes["source_id"].tolist() == [0, 2, 3]
    assert m.conversion["dropped_episodes"] == 1
    assert any("1 of 4 chunks are not stored" in n for n in m.conversion["notes"])
    assert not ds[:4]["observation/n_contacts"].any()  # zarr's fill value, as upstream reads it


def _meta_array(store: Path, key: str, values: np.ndarray) -> None:
    """Write ``meta/<key>`` (uncompressed, one chunk) as diffusion_policy's zarr v2 lays it out."""
    folder = store / "meta" / key
    folder.mkdir()
    zarray = json.loads((store / "meta" / "episode_ends" / ".zarray").read_text())
    zarray.update(shape=[len(values)], chunks=[len(values)], compressor=None, filters=None, dtype="<i8")
    (folder / ".zarray").write_text(json.dumps(zarray))
    (folder / "0").write_bytes(np.asarray(values, "<i8").tobytes())


def test_per_episode_meta_arrays_follow_the_episodes_kept(tmp_path: Path) -> None:
    """An empty episode dropped: ``meta/episode_<x>`` (one row per source episode) was taken row
    for row by the episodes kept, so each episode after it read its predecessor's value, and
    ``inspect --check`` of the fresh conversion reported 4 rows for 3 episodes."""
    store = copy_fixture("pusht.zarr", tmp_path)
    _rewrite_ends(store, [4, 4, 10, 15])
    _meta_array(store, "episode_success", np.array([10, 11, 12, 13]))
    _meta_array(store, "episode_cut", np.array([1, 2]))  # not one row per episode
    m = convert(store, "holes").manifest
    ds = open_dataset("holes")
    assert [ds.episode_metadata(i)["replay_buffer/meta/success"] for i in range(3)] == [10, 12, 13]
    assert any("meta/episode_cut has 2 rows for 4 episodes" in n for n in m.conversion["notes"])
    assert check_dataset(ds).ok
    download_ok(store, "window", "--episodes", "1:3")
    window = open_dataset("window")
    assert window.episodes["source_id"].tolist() == [2, 3]
    assert [window.episode_metadata(i)["replay_buffer/meta/success"] for i in range(2)] == [12, 13]


def test_episodes_window_decodes_only_its_rows(tmp_path: Path) -> None:
    store = copy_fixture("pusht.zarr", tmp_path)
    _break_chunk(store)  # img rows 4-7: episode 0 ends at row 3, episode 1 holds rows 4-9
    download_ok(store, "last", "--episodes", "2:3")  # rows 10-14 only: chunks 2 and 3
    ds = open_dataset("last")
    assert ds.episodes["source_id"].tolist() == [2]
    np.testing.assert_array_equal(ds[:]["observation/img"], golden("pusht.zarr")["data/img"][10:15])
    refused(
        download(store, "mid", "--episodes", "1:2"), "data/img rows", "does not decode", published=("last",)
    )
    refused(
        download(store, "none", "--episodes", "5:"), "selects none of the 3 episodes", published=("last",)
    )


def test_damaged_jpegxl_chunk_in_a_zip(tmp_path: Path) -> None:
    bad = tmp_path / "umi.zarr.zip"
    with zipfile.ZipFile(FIXTURES / "umi.zarr.zip") as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data[:40] if info.filename == "data/camera1_rgb/7.0.0.0" else data)
    refused(download(bad, "bad"), "data/camera1_rgb rows", "does not decode")


def _swap_zip_member(
    src: Path, dst: Path, member: str, data: bytes, compress_type: int | None = None
) -> None:
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w") as new:
        for info in old.infolist():
            if info.filename == member:
                new.writestr(info, data, compress_type=compress_type)
            else:
                new.writestr(info, old.read(info))


def test_a_deflated_zip_entry_larger_than_a_chunk_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    """zarr's ZipStore inflates an entry whole before the codec sees it: 64 MB of zeros, deflated
    to 64 KB, in an array of 414,720-byte chunks was allocated, then refused."""
    convert(FIXTURES / "pusht.zarr.zip", "intact")
    bad = tmp_path / "pusht.zarr.zip"
    _swap_zip_member(FIXTURES / bad.name, bad, "data/img/0.0.0.0", bytes(64 << 20), zipfile.ZIP_DEFLATED)
    _refused_within(
        lambda: download(bad, "bad"),
        16 << 20,
        "the zip entry data/img/0.0.0.0 holds more than 1,878,016 bytes",
        "(414,720 bytes decoded)",
        published=("intact",),
    )


def _declare_size(path: Path, member: str, size: int) -> None:
    """Rewrite the uncompressed size ``path``'s zip entry ``member`` declares (local and central
    headers) to ``size``: a header that lies."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        offset = z.getinfo(member).header_offset
    data[offset + 22 : offset + 26] = size.to_bytes(4, "little")
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_length = int.from_bytes(data[at + 28 : at + 30], "little")
        if data[at + 46 : at + 46 + name_length] == member.encode():
            data[at + 24 : at + 28] = size.to_bytes(4, "little")
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_zip_entry_whose_header_lies_about_its_size_is_refused_in_bounded_memory(
    tmp_path: Path, method: int
) -> None:
    """600 MB of zeros compressed (611 KB deflated, 337 bytes of bzip2) in the entry of a 16-byte
    chunk, its headers declaring 16 bytes: zipfile inflated it whole (1.3 GB resident) before its
    CRC check refused it."""
    member = "data/robot0_gripper_width/0.0"
    bad = tmp_path / "umi.zarr.zip"
    _swap_zip_member(FIXTURES / bad.name, bad, member, bytes(600 << 20), method)
    _declare_size(bad, member, 16)
    _refused_within(
        lambda: download(bad, "bad"),
        16 << 20,
        f"the zip entry {member} holds more than",
        "(16 bytes decoded)",
    )


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_zip_of_compressed_entries_reads_as_the_stored_one(tmp_path: Path, method: int) -> None:
    """``zip -r`` deflates; zarr's ZipStore stores: both read the same."""
    packed = tmp_path / "pusht.zarr.zip"
    with zipfile.ZipFile(FIXTURES / packed.name) as src, zipfile.ZipFile(packed, "w", method) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    convert(FIXTURES / packed.name, "stored")
    convert(packed, "packed")
    stored, compressed = open_dataset("stored")[:], open_dataset("packed")[:]
    assert sorted(compressed) == sorted(stored)
    for key, rows in stored.items():
        np.testing.assert_array_equal(compressed[key], rows)


def _refused_within(result_of: object, limit: int, *needles: str, published: tuple[str, ...] = ()) -> None:
    """The download ``result_of()`` is refused naming ``needles``, its Python allocations (numpy's
    included) peaking under ``limit`` bytes."""
    tracemalloc.start()
    try:
        result = result_of()  # type: ignore[operator]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    refused(result, *needles, published=published)
    assert peak < limit, f"{peak:,} bytes allocated"


@pytest.mark.parametrize(
    ("fixture", "array", "codec"),
    [("umi", "camera1_rgb", "jpegxl"), ("robomimic_image", "agentview_image", "jpeg2k")],
)
def test_an_image_chunk_larger_than_its_chunk_is_refused_before_it_is_decoded(
    tmp_path: Path, fixture: str, array: str, codec: str
) -> None:
    """A 2048 x 2048 image in an array of 48 x 48 chunks: it was decoded whole (12.6 MB) before
    zarr saw its shape; imagecodecs now compares the image's header with the chunk first."""
    import imagecodecs

    convert(FIXTURES / f"{fixture}.zarr.zip", "intact")  # the imports are not the chunk's allocation
    big = getattr(imagecodecs, f"{codec}_encode")(np.zeros((2048, 2048, 3), np.uint8))
    bad = tmp_path / f"{fixture}.zarr.zip"
    _swap_zip_member(FIXTURES / bad.name, bad, f"data/{array}/7.0.0.0", big)
    _refused_within(
        lambda: download(bad, "bad"),
        4 << 20,
        f"data/{array} rows",
        "does not decode",
        "(2048, 2048, 3)",
        published=("intact",),
    )


#: numcodecs' compressors, each with its own way of saying (or not) how big a chunk decodes (LZMA's
#: decoder takes its window, 8 MiB at the default preset, per chunk decoded at once: preset 1, 1 MiB).
CODECS = [{"id": c} for c in ("blosc", "zstd", "lz4", "zlib", "gzip", "bz2")] + [{"id": "lzma", "preset": 1}]
#: imagecodecs' byte codecs: zarr decoded them whole (a bomb was allocated, then refused).
CODECS += [{"id": f"imagecodecs_{c}"} for c in ("zlib", "deflate", "brotli", "zstd", "lz4f", "bz2", "snappy")]


def _recompress(folder: Path, codec: dict[str, object]) -> Any:
    """Every chunk of the zarr v2 array at ``folder`` compressed again with ``codec``; the codec."""
    import numcodecs

    zarray = json.loads((folder / ".zarray").read_text())
    old, new = numcodecs.get_codec(zarray["compressor"]), numcodecs.get_codec(dict(codec))
    for chunk in (p for p in folder.iterdir() if not p.name.startswith(".")):
        chunk.write_bytes(new.encode(np.frombuffer(old.decode(chunk.read_bytes()), np.uint8)))
    zarray["compressor"] = new.get_config()
    (folder / ".zarray").write_text(json.dumps(zarray))
    return new


@pytest.mark.parametrize("codec", CODECS, ids=[c["id"] for c in CODECS])
def test_every_compressor_reads_exactly_and_a_chunk_bomb_is_refused_unallocated(
    tmp_path: Path, codec: dict[str, object]
) -> None:
    """pusht's images compressed with ``codec`` read as upstream's; then one chunk becomes 32 MB of
    zeros (a few KB compressed): refused naming its rows, with no 32 MB allocation."""
    if str(codec["id"]).startswith("imagecodecs_"):
        from rlds_cli.formats.zarr_v2 import register_imagecodecs

        register_imagecodecs(tmp_path, "img", str(codec["id"]))
    store = copy_fixture("pusht.zarr", tmp_path)
    new = _recompress(store / "data" / "img", codec)
    convert(store, "exact")
    np.testing.assert_array_equal(
        open_dataset("exact")[:]["observation/img"], golden("pusht.zarr")["data/img"]
    )

    (store / "data" / "img" / "1.0.0.0").write_bytes(new.encode(np.zeros(32 << 20, np.uint8)))
    _refused_within(
        lambda: download(store, "bomb"),
        16 << 20,
        "data/img rows",
        "does not decode",
        "110,592",
        published=("exact",),
    )


def test_every_bounded_byte_codec_reads_every_dtype_exactly(tmp_path: Path) -> None:
    """The byte codecs decoded into a buffer one byte past the chunk read back exact (aec and
    bitshuffle did not: their output depends on the buffer, so they stay out of the list)."""
    import numcodecs

    from rlds_cli.formats.zarr_v2 import _BYTE_CODECS, BoundedChunkDecoder, register_imagecodecs

    register_imagecodecs(tmp_path, "x", "imagecodecs_zlib")
    rng = np.random.default_rng(1)
    for dtype in (np.uint8, np.int16, np.float32, np.float64):
        chunk = (rng.random((7, 33, 5)) * 100).astype(dtype)
        for codec_id in sorted(_BYTE_CODECS):
            codec = numcodecs.get_codec({"id": codec_id})
            got = BoundedChunkDecoder(codec, chunk.shape, chunk.dtype).decode(codec.encode(chunk))
            np.testing.assert_array_equal(got, chunk, err_msg=f"{codec_id} {np.dtype(dtype)}")


@pytest.mark.parametrize("codec_id", ["imagecodecs_lerc", "imagecodecs_zfp"])
def test_an_array_codecs_chunk_of_another_shape_is_refused_unallocated(tmp_path: Path, codec_id: str) -> None:
    """A 70-byte LERC chunk declaring 3000 x 3000 floats decoded whole (191 MB) before zarr saw
    its size: LERC and ZFP now decode into the chunk's shape, which they check first."""
    import numcodecs

    from rlds_cli.formats.zarr_v2 import BoundedChunkDecoder, register_imagecodecs

    register_imagecodecs(tmp_path, "x", codec_id)
    codec = numcodecs.get_codec({"id": codec_id})
    chunk = np.random.default_rng(0).random((1, 48, 48)).astype(np.float32)
    bounded = BoundedChunkDecoder(codec, chunk.shape, chunk.dtype)
    np.testing.assert_array_equal(np.asarray(bounded.decode(codec.encode(chunk))).reshape(chunk.shape), chunk)
    bomb = codec.encode(np.zeros((3000, 3000), np.float32))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="shape"):
            bounded.decode(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes allocated"


def _frame_chunks(folder: Path, codec_id: str) -> Any:
    """The zarr v2 image array at ``folder`` rewritten as one frame per chunk, each compressed
    with ``codec_id`` (as UMI writes its cameras); the codec."""
    import numcodecs

    from rlds_cli.formats.zarr_v2 import register_imagecodecs

    register_imagecodecs(folder, "img", codec_id)
    zarray = json.loads((folder / ".zarray").read_text())
    frames = golden("pusht.zarr")["data/img"]
    codec = numcodecs.get_codec({"id": codec_id})
    for chunk in (p for p in folder.iterdir() if not p.name.startswith(".")):
        chunk.unlink()
    for i, frame in enumerate(frames):
        (folder / f"{i}.0.0.0").write_bytes(bytes(codec.encode(frame)))
    zarray["chunks"], zarray["compressor"] = [1, *frames.shape[1:]], codec.get_config()
    (folder / ".zarray").write_text(json.dumps(zarray))
    return codec


@pytest.mark.parametrize("codec_id", ["imagecodecs_jpeg", "imagecodecs_qoi"])
def test_an_image_chunk_cut_short_is_refused_and_a_jpeg_bomb_unallocated(
    tmp_path: Path, codec_id: str
) -> None:
    """imagecodecs' JPEG (and QOI) decoders serve a cut image, its missing rows grey, without an
    error: a chunk cut to 70% converted (exit 0). And 'imagecodecs_jpeg' was missing from the image
    codecs checked before decoding: a JPEG header of 3000 x 3000 was decoded whole, then refused."""
    import zarr

    store = copy_fixture("pusht.zarr", tmp_path)
    codec = _frame_chunks(store / "data" / "img", codec_id)
    convert(store, "exact")
    upstream = zarr.open_array(store / "data" / "img", mode="r", zarr_format=2)[:]
    np.testing.assert_array_equal(open_dataset("exact")[:]["observation/img"], upstream)
    chunk = store / "data" / "img" / "5.0.0.0"
    whole = chunk.read_bytes()
    chunk.write_bytes(whole[: len(whole) * 7 // 10])
    refused(download(store, "cut"), "data/img rows", "does not decode", "cut short", published=("exact",))
    if codec_id == "imagecodecs_jpeg":
        chunk.write_bytes(bytes(codec.encode(np.zeros((3000, 3000, 3), np.uint8))))
        _refused_within(
            lambda: download(store, "bomb"), 4 << 20, "data/img rows", "does not decode", published=("exact",)
        )


def test_a_truncated_zip_is_named_as_such(tmp_path: Path) -> None:
    """It was 'not a ReplayBuffer zarr', with a hint to pass the store diffusion_policy wrote."""
    bad = tmp_path / "umi.zarr.zip"
    data = (FIXTURES / "umi.zarr.zip").read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    refused(download(bad, "bad", "--format", "replay_buffer"), "not a readable zip file, truncated")


def test_missing_imagecodecs_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "imagecodecs", None)
    monkeypatch.setitem(sys.modules, "imagecodecs.numcodecs", None)
    with pytest.raises(MissingExtraError, match="'umi' extra") as info:
        ReplayBufferReader(FIXTURES / "umi.zarr.zip")
    assert "rlds-cli[umi]" in info.value.hint
    refused(download(FIXTURES / "umi.zarr.zip", "nocodec"), "imagecodecs_jpegxl", "'umi' extra")


def test_not_a_replay_buffer(tmp_path: Path) -> None:
    junk = tmp_path / "x.zarr.zip"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    assert not ReplayBufferReader.sniff(junk)
    with pytest.raises(SourceFormatError, match="not a readable zip file"):  # named .zip: said so
        ReplayBufferReader(junk)
    with pytest.raises(SourceFormatError, match="not a ReplayBuffer zarr"):
        ReplayBufferReader(junk.rename(tmp_path / "x.bin"))
    store = copy_fixture("pusht.zarr", tmp_path)
    (store / "meta" / ".zgroup").unlink()
    assert not ReplayBufferReader.sniff(store)


class TestReplayBufferReader(ReaderContract):
    reader_cls = ReplayBufferReader
    block_rows = 4

    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return copy_fixture("pusht.zarr", tmp_path)


class TestReplayBufferZipReader(TestReplayBufferReader):
    def write_source(self, tmp_path: Path) -> Path:
        tmp_path.mkdir(parents=True)
        return copy_fixture("umi.zarr.zip", tmp_path)


@pytest.mark.parametrize(
    ("codec", "chunk", "needle"),
    [
        ("blosc", b"\x02\x01\x21", "shorter than a blosc header"),
        ("lz4", b"\x10", "shorter than its LZ4 size prefix"),
        ("zstd", b"garbage!", "not a zstd frame"),
        ("zstd", b"\x28\xb5\x2f\xfd\xc0\x00", "zstd header is cut short"),
    ],
)
def test_a_chunk_header_cut_short_or_foreign_is_named(
    tmp_path: Path, codec: str, chunk: bytes, needle: str
) -> None:
    store = copy_fixture("pusht.zarr", tmp_path)
    _recompress(store / "data" / "img", {"id": codec})
    (store / "data" / "img" / "2.0.0.0").write_bytes(chunk)
    refused(download(store, "bad"), "data/img rows", "does not decode", needle)


@pytest.mark.parametrize("shuffle", [0, 1])
def test_a_blosc_chunk_cut_short_is_refused_not_read_past_its_end(tmp_path: Path, shuffle: int) -> None:
    """c-blosc trusts its header's sizes: a stored (memcpyed) chunk cut in half was read past its
    end, each conversion storing other bytes of the process's memory, exit 0."""
    store = copy_fixture("pusht.zarr", tmp_path)
    _recompress(store / "data" / "img", {"id": "blosc", "cname": "lz4", "clevel": 0, "shuffle": shuffle})
    chunk = store / "data" / "img" / "1.0.0.0"
    data = chunk.read_bytes()
    assert data[2] & 0x02  # clevel 0: blosc stored the bytes as they are
    chunk.write_bytes(data[: len(data) // 2])
    refused(download(store, "bad"), "data/img rows", "does not decode", "its blosc header says")
    chunk.write_bytes(data + b"\0")  # a byte more than the header names
    refused(download(store, "bad"), "data/img rows", "does not decode", "its blosc header says")


@pytest.mark.parametrize("codec", ["imagecodecs_lz4f", "imagecodecs_lzma"])
def test_a_chunk_larger_than_its_chunk_is_never_cut_to_fit(tmp_path: Path, codec: str) -> None:
    """imagecodecs' byte codecs, given a buffer, cut a larger stream to fit without a word: a chunk
    of 1 MB in an array of 110,592-byte chunks was read as its first 110,592 bytes."""
    from rlds_cli.formats.zarr_v2 import register_imagecodecs

    register_imagecodecs(tmp_path, "img", codec)
    store = copy_fixture("pusht.zarr", tmp_path)
    new = _recompress(store / "data" / "img", {"id": codec})
    convert(store, "exact")
    np.testing.assert_array_equal(
        open_dataset("exact")[:]["observation/img"], golden("pusht.zarr")["data/img"]
    )
    (store / "data" / "img" / "1.0.0.0").write_bytes(new.encode(np.zeros(1 << 20, np.uint8)))
    refused(download(store, "bad"), "data/img rows", "does not decode", published=("exact",))


def _unzipped(name: str, tmp_path: Path) -> Path:
    store = tmp_path / name.removesuffix(".zip")
    with zipfile.ZipFile(FIXTURES / name) as zf:
        zf.extractall(store)
    return store


@pytest.mark.parametrize("gone", ["robot0_eef_rot_axis_angle", "robot1_gripper_width", "robot1_*"])
def test_umis_action_with_a_part_missing_is_refused(tmp_path: Path, gone: str) -> None:
    """The action was built of the parts present (11 wide instead of 14, robot 1's columns shifted
    left), said only in a note; a robot missing altogether made robot 2's arrays observations."""
    store = _unzipped("umi.zarr.zip", tmp_path)
    for folder in store.glob(f"data/{gone}"):
        shutil.rmtree(folder)
    if gone == "robot1_*":  # robots 0 and 2: robot 1 gone
        for folder in store.glob("data/robot0_*"):
            shutil.copytree(folder, folder.with_name(folder.name.replace("robot0", "robot2")))
        gone = "robot1_eef_pos"
    refused(download(store, "bad"), "UMI's action needs data/", gone, published=())


def test_an_array_whose_metadata_is_lost_is_named(tmp_path: Path) -> None:
    """An array folder with chunks but no .zarray (deleted, or a dangling link) was left out of the
    dataset without a word."""
    store = copy_fixture("pusht.zarr", tmp_path)
    (store / "data" / "state" / ".zarray").unlink()
    refused(download(store, "bad"), "data/state holds files but no readable .zarray", published=())
    (store / "data" / "state" / ".zarray").symlink_to(tmp_path / "nowhere")
    refused(download(store, "bad"), "data/state holds files but no readable .zarray", published=())


def test_damaged_zip_structures_and_meta_chunks_are_named(tmp_path: Path) -> None:
    """Each was 'unexpected ...': a central directory's signature (BadZipFile), a member's unknown
    compression method (NotImplementedError), a meta/ array's damaged chunk (ValueError)."""
    data = bytearray((FIXTURES / "pusht.zarr.zip").read_bytes())
    first = data.find(b"PK\x01\x02")  # the central directory's first entry
    bad = tmp_path / "cd.zarr.zip"
    bad.write_bytes(bytes(data[:first] + b"PX" + data[first + 2 :]))
    refused(download(bad, "bad"), "cd.zarr.zip as a zip archive", published=())
    store = copy_fixture("pusht.zarr", tmp_path)
    meta = store / "meta" / "extra"
    meta.mkdir()
    (meta / ".zarray").write_text(
        json.dumps({
            "zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<f8", "order": "C", "fill_value": 0,
            "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
            "filters": None,
        })
    )  # fmt: skip
    (meta / "0").write_bytes(b"\x02\x01\x21\x08")  # cut inside its blosc header
    refused(download(store, "bad"), "meta/extra cannot be read: a chunk does not decode", published=())


def test_an_array_decoded_through_filters_is_refused_before_decoding(tmp_path: Path) -> None:
    """A filter's output size is its own: a zlib filter (no compressor) took the bounded decoder
    out of the way, and a 1.5 MB chunk inflated to gigabytes before its size was checked."""
    store = copy_fixture("pusht.zarr", tmp_path)
    zarray = store / "data" / "state" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta.update(compressor=None, filters=[{"id": "zlib", "level": 1}])
    zarray.write_text(json.dumps(meta))
    refused(download(store, "bad"), "data/state decodes through zarr filters (zlib)", published=())


def test_a_chunk_shape_of_zero_is_named(tmp_path: Path) -> None:
    """``chunks: [0, 5]`` was 'a chunk does not decode (ZeroDivisionError: division by zero)'."""
    store = copy_fixture("pusht.zarr", tmp_path)
    zarray = store / "data" / "state" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["chunks"] = [0, *meta["chunks"][1:]]
    zarray.write_text(json.dumps(meta))
    refused(download(store, "bad"), "'data/state' declares chunks of shape [0,", published=())


def test_a_failed_read_raises_only_once_no_other_chunk_is_decoding(tmp_path: Path) -> None:
    """zarr raised the first chunk's error while the read's other chunks still decoded in its
    threads (a worker crashed under tracemalloc); the error now waits for them."""
    import threading
    import time

    import numcodecs
    import zarr

    from rlds_cli.formats.zarr_v2 import read_rows

    busy: list[int] = []
    lock = threading.Lock()

    class SlowOrBroken(numcodecs.Zlib):
        codec_id = "rlds_test_slow_or_broken"

        def decode(self, buf: Any, out: Any = None) -> Any:
            data = bytes(buf)
            if data.startswith(b"broken"):
                raise ValueError("damaged")
            with lock:
                busy.append(1)
            time.sleep(0.3)
            with lock:
                busy.pop()
            return super().decode(data, out)

    numcodecs.register_codec(SlowOrBroken)
    array = zarr.create_array(
        tmp_path / "a", shape=(16,), chunks=(1,), dtype="u1", zarr_format=2, compressors=SlowOrBroken()
    )
    array[:] = np.arange(16, dtype=np.uint8)
    (tmp_path / "a" / "0").write_bytes(b"broken")
    with pytest.raises(ValueError, match="damaged"):
        read_rows(zarr.open_array(tmp_path / "a", mode="r", zarr_format=2))
    assert not busy, f"{len(busy)} chunks still decoding after the read raised"


@pytest.mark.parametrize("link", ["chunk", "array"])
def test_a_symlink_out_of_a_directory_store_is_refused(tmp_path: Path, link: str) -> None:
    """A chunk file or a whole array folder linked from elsewhere: its values were converted (and a
    link to any readable file was read) where the conversion must read the store alone."""
    store = copy_fixture("pusht.zarr", tmp_path / "in")
    outside = tmp_path / "outside"
    shutil.copytree(store / "data" / "state", outside)
    if link == "chunk":
        chunk = next(p for p in sorted((store / "data" / "state").iterdir()) if not p.name.startswith("."))
        chunk.unlink()
        chunk.symlink_to(outside / chunk.name)
    else:
        shutil.rmtree(store / "data" / "state")
        (store / "data" / "state").symlink_to(outside, target_is_directory=True)
    refused(download(store, "bad"), "escapes the source folder", str(outside))


def test_symlinks_inside_a_directory_store_and_a_linked_store_read_as_the_store(tmp_path: Path) -> None:
    store = copy_fixture("pusht.zarr", tmp_path / "in")
    chunk = next(p for p in sorted((store / "data" / "state").iterdir()) if not p.name.startswith("."))
    kept = store / "kept-elsewhere-in-the-store"
    kept.write_bytes(chunk.read_bytes())
    chunk.unlink()
    chunk.symlink_to(kept)
    linked = tmp_path / "linked.zarr"
    linked.symlink_to(store, target_is_directory=True)
    convert(linked, "linked")
    convert(FIXTURES / "pusht.zarr", "intact")
    got, want = open_dataset("linked")[:], open_dataset("intact")[:]
    for key, rows in want.items():
        np.testing.assert_array_equal(got[key], rows)


def test_missing_chunks_and_text_of_meta_arrays_are_noted(tmp_path: Path) -> None:
    """A ``meta/`` array's missing chunk read as the fill value, and a text ``meta/`` array left
    out, without a word (``data/`` arrays had their notes)."""
    import zarr

    store = copy_fixture("pusht.zarr", tmp_path)
    episodes = len(golden("pusht.zarr")["meta/episode_ends"])
    x = zarr.open_array(
        store / "meta" / "episode_x", mode="w", shape=(episodes,), chunks=(1,), dtype="<i8", zarr_format=2
    )
    x[:] = np.arange(1, episodes + 1) * 11
    (store / "meta" / "episode_x" / "1").unlink()
    names = zarr.open_array(
        store / "meta" / "names", mode="w", shape=(2,), chunks=(2,), dtype="<U4", zarr_format=2
    )
    names[:] = ["a", "b"]
    result = download_ok(store, "noted")
    assert f"meta/episode_x: 1 of {episodes} chunks are not stored" in result.output
    assert "meta/names holds <U4 values, not numbers: not kept" in result.output
    kept = open_dataset("noted").source_arrays
    assert kept["replay_buffer/meta/episode_x"][1] == 0 and "replay_buffer/meta/names" not in kept
