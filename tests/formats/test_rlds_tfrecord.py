"""RLDS / Open X-Embodiment TFRecord datasets (``--format rlds``), converted through the CLI.

Sources are written by :mod:`tests.rlds_tfrecord_fixtures`: TFDS's ``features.json`` schema and
shard names, each episode a ``tf.train.Example`` serialized by the real protobuf runtime and
framed by the ``tfrecord`` package's writer (not by the reader under test). Every converted
value is compared with an expectation computed here from the raw arrays the fixture wrote:
PNG frames exactly, JPEG frames against Pillow's decoding of the same bytes, float64 rewards as
the float32 TFDS stores them.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import SourceFormatError, UnknownFormatError
from rlds_cli.formats import detect_format
from rlds_cli.formats.base import is_valid_key
from rlds_cli.sources.convert import convert
from tests.cli_fixtures import download
from tests.formats_fixtures import refused as _refused
from tests.rlds_tfrecord_fixtures import DICT_ACTION, Episode, Fixture, write_rlds_dataset

pytest.importorskip("tfrecord")
Image = pytest.importorskip("PIL.Image")
runner = CliRunner()


def _jpeg(data: bytes) -> np.ndarray:
    with Image.open(__import__("io").BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def _observation_last(ep: Episode, rule: str) -> bool:
    if rule != "auto":
        return rule == "observation"
    return all(not part[-1].any() for part in ep.action.values()) and ep.reward[-1] == 0


def _expected(fx: Fixture, rule: str = "auto") -> dict[str, Any]:
    """The TED dataset the fixture's raw values should give, built here from them."""
    steps: dict[str, list[np.ndarray]] = {}
    flat: dict[str, list[np.ndarray]] = {}
    lengths, final_known, source_ids, terminated, files = [], [], [], [], []
    texts: list[str] = []
    file_table: list[str] = []
    for i, ep in enumerate(fx.episodes):
        for s in ep.instruction:
            if s not in texts:
                texts.append(s)
        observation = _observation_last(ep, rule)
        n = ep.steps - 1 if observation else ep.steps
        if n == 0:
            continue
        rows = slice(0, n)
        action = {("action" + (f"/{k}" if k else "")): v for k, v in ep.action.items()}
        for key, value in {
            **{k: v[rows] for k, v in action.items()},
            "next/reward": ep.reward.astype(np.float32).astype(np.float64)[rows, None],
            "info/discount": ep.discount.astype(np.float32).astype(np.float64)[rows, None],
            "info/language_embedding": ep.embedding[rows],
            "info/language_instruction_index": np.array([texts.index(s) for s in ep.instruction], np.int64)[
                rows, None
            ],
        }.items():
            steps.setdefault(key, []).append(value)
        wrist = np.stack([_jpeg(b) for b in ep.wrist_jpeg])
        for key, value in {
            "observation/image": ep.image,
            "observation/state": ep.state,
            "observation/wrist_image": wrist,
        }.items():
            flat.setdefault(key, []).append(value if observation else np.concatenate([value, value[-1:]]))
        lengths.append(n)
        final_known.append(observation)
        source_ids.append(i)
        terminated.append(bool(ep.is_terminal[-1]))
        if ep.file_path not in file_table:
            file_table.append(ep.file_path)
        files.append(file_table.index(ep.file_path))
    return {
        "steps": {k: np.concatenate(v) for k, v in steps.items()},
        "flat": {k: np.concatenate(v) for k, v in flat.items()},
        "lengths": lengths,
        "final_known": final_known,
        "source_ids": source_ids,
        "terminated": terminated,
        "texts": texts,
        "files": np.array(files, np.int64),
        "file_table": file_table,
    }


def _check(name: str, fx: Fixture, rule: str = "auto") -> Any:
    """The dataset ``name`` holds exactly what :func:`_expected` computes, key by key and dtype
    by dtype, and passes ``rlds inspect --check``."""
    ds = open_dataset(name)
    want = _expected(fx, rule)
    assert ds.episodes["length"].tolist() == want["lengths"]
    assert ds.episodes["final_known"].tolist() == want["final_known"]
    assert ds.episodes["source_id"].tolist() == want["source_ids"]
    stored = {
        k
        for k in ds.manifest.fields
        if not k.startswith("next/terminated") and not k.startswith("next/truncated")
    }
    assert stored == set(want["steps"]) | set(want["flat"])
    for key, value in {**want["steps"], **want["flat"]}.items():
        got = np.asarray(ds.column(key)[:])
        assert got.dtype == value.dtype and got.shape == value.shape, (key, got.dtype, got.shape, value.shape)
        np.testing.assert_array_equal(got, value, err_msg=key)
    term = np.asarray(ds.column("next/terminated")[:])[:, 0]
    trunc = np.asarray(ds.column("next/truncated")[:])[:, 0]
    ends = np.cumsum(want["lengths"]) - 1
    assert np.flatnonzero(term | trunc).tolist() == ends.tolist()
    assert term[ends].tolist() == want["terminated"]
    assert trunc[ends].tolist() == [not t for t in want["terminated"]]
    meta = ds.manifest.source["metadata"]["rlds"]
    assert meta["text"] == {"info/language_instruction_index": want["texts"]}
    assert meta["episode_text"] == {"rlds/episode_file_path": want["file_table"]}
    np.testing.assert_array_equal(ds.source_arrays["rlds/episode_file_path"], want["files"])
    # the episode's text, not its index in the table (an OXE user read 0, 1, 2 for file paths)
    paths = [want["file_table"][i] for i in want["files"]]
    assert ds.episode_texts("rlds/file_path") == paths
    assert [ds.episode_metadata(e)["rlds/file_path"] for e in range(ds.num_episodes)] == paths
    check = runner.invoke(app, ["inspect", name, "--check"])
    assert check.exit_code == 0, check.output
    return ds


# ----------------------------------------------------------------------------- conversion


def test_multi_shard_dataset_converts_exactly(tmp_path: Path) -> None:
    """Three shards, both last-step cases (strict RLDS and a real last transition) and a
    one-step episode, through ``rlds download PATH``."""
    fx = write_rlds_dataset(tmp_path / "oxe" / "1.0.0", (5, 7, 4, 1, 6, 3), shards=3, last_step="mixed")
    assert detect_format(fx.root) == "rlds"
    result = download(fx.root, "oxe")
    assert result.exit_code == 0, result.output
    ds = _check("oxe", fx)
    conv = ds.manifest.conversion
    assert conv["rules"] == "rlds-tfrecord-v1"
    assert conv["source_rows"] == 26
    assert conv["synthesized_final_observations"] == 3  # episodes 1, 3, 5 end with a transition
    assert ds.manifest.source["checks"]["expected"] == {"num_episodes": 6}
    assert [f["path"] for f in ds.manifest.source["files"]][:2] == ["features.json", "dataset_info.json"]


def test_worker_count_and_piece_size_do_not_change_the_output(tmp_path: Path) -> None:
    """Two worker processes and one-row pieces give byte-identical arrays (same digests)."""
    fx = write_rlds_dataset(tmp_path / "src", (6, 3, 5, 2), shards=2, last_step="mixed", seed=3)
    convert(fx.root, "one", options={"workers": 1})
    convert(fx.root, "two", options={"workers": 2, "block_rows": 1})
    a, b = open_dataset("one"), open_dataset("two")
    assert a.manifest.content_digest == b.manifest.content_digest
    _check("two", fx)


@pytest.mark.parametrize("rule", ["observation", "transition"])
def test_a_forced_last_step_rule(tmp_path: Path, rule: str) -> None:
    """``last_step`` forces either reading; forcing ``observation`` on real last transitions
    counts the discarded rows, and drops one-step episodes."""
    fx = write_rlds_dataset(tmp_path / "src", (4, 1, 3), last_step="transition", terminal=False)
    convert(fx.root, "forced", options={"last_step": rule})
    ds = _check("forced", fx, rule)
    conv = ds.manifest.conversion
    if rule == "observation":
        assert conv["dropped_rows"] == 3 and conv["dropped_episodes"] == 1
        assert ds.episodes["length"].tolist() == [3, 2]
    else:
        assert conv["synthesized_final_observations"] == 3
        assert ds.episodes["length"].tolist() == [4, 1, 3]


def test_an_unknown_last_step_rule_is_refused(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3,))
    with pytest.raises(SourceFormatError, match="last_step is 'first'"):
        convert(fx.root, "x", options={"last_step": "first"})


def test_a_dict_action(tmp_path: Path) -> None:
    """RT-1-style dict actions become ``action/<k>``, a scalar part keeping its shape ``()``."""
    fx = write_rlds_dataset(tmp_path / "src", (4, 5), dict_action=True, last_step="mixed")
    assert download(fx.root, "dict").exit_code == 0
    ds = _check("dict", fx)
    assert {k for k in ds.manifest.fields if k.startswith("action")} == {f"action/{k}" for k in DICT_ACTION}
    assert ds.manifest.fields["action/terminate_episode"].shape == ()


def test_a_single_shard_and_its_detection(tmp_path: Path) -> None:
    """One shard file is a source of its own (its folder's features.json describes it)."""
    fx = write_rlds_dataset(tmp_path / "src", (3, 4, 2, 5), shards=2, last_step="observation")
    assert detect_format(fx.shards[1]) == "rlds"
    assert detect_format(fx.root / "features.json") == "rlds"
    assert download(fx.shards[1], "half").exit_code == 0
    ds = open_dataset("half")
    assert ds.episodes["length"].tolist() == [1, 4]  # episodes 2 and 3 (strict RLDS: T - 1)
    assert [f["path"] for f in ds.manifest.source["files"]] == [
        "features.json",
        "dataset_info.json",
        fx.shards[1].name,
    ]
    np.testing.assert_array_equal(np.asarray(ds.column("observation/image")[:2]), fx.episodes[2].image)
    assert runner.invoke(app, ["inspect", "half", "--check"]).exit_code == 0


def test_a_folder_without_features_json_is_not_detected(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3,))
    (fx.root / "features.json").unlink()
    with pytest.raises(UnknownFormatError):
        detect_format(fx.root)
    _refused(download(fx.root, "x", "--format", "rlds"), str(fx.root), "has no features.json")


def test_a_tfds_folder_below_the_folder_named_is_detected_and_read_from_there(tmp_path: Path) -> None:
    """``rlds download parent/`` on a folder holding ``name/version/`` (TFDS's and Open
    X-Embodiment's layout, what the Hub path finds in a repo): detected as rlds and read from that
    folder, as if it were named (a copy in a hidden folder does not count)."""
    parent = tmp_path / "parent"
    fx = write_rlds_dataset(parent / "oxe_fixture" / "0.1.0", (3, 4, 2), shards=2)
    (parent / "notes.txt").write_text("a file beside it\n")
    shutil.copytree(fx.root, parent / ".trash" / "0.1.0")
    assert detect_format(parent) == "rlds"
    assert download(parent, "nested").exit_code == 0
    nested = _check("nested", fx).manifest.source
    assert download(fx.root, "direct").exit_code == 0
    direct = open_dataset("direct").manifest.source
    assert (nested["sha256"], nested["files"]) == (direct["sha256"], direct["files"])


def test_several_tfds_folders_below_are_refused_naming_them(tmp_path: Path) -> None:
    """Two versions below the folder named: one line naming both and saying to name one, with
    detection and with --format rlds; nothing converted."""
    parent = tmp_path / "parent"
    write_rlds_dataset(parent / "oxe_fixture" / "0.1.0", (3,))
    write_rlds_dataset(parent / "oxe_fixture" / "0.2.0", (2,))
    with pytest.raises(SourceFormatError, match="2 RLDS/TFDS dataset folders"):
        detect_format(parent)
    for extra in ((), ("--format", "rlds")):
        result = download(parent, "two", *extra)
        _refused(result, str(parent), "2 RLDS/TFDS dataset folders (oxe_fixture/0.1.0, oxe_fixture/0.2.0)")
        assert f"name one, e.g. {parent}/oxe_fixture/0.1.0" in result.stderr


def test_splits_default_to_train_and_can_be_chosen(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3, 4), split="train")
    val = write_rlds_dataset(tmp_path / "val", (5,), split="val", seed=9)
    shutil.copy(val.shards[0], fx.root / val.shards[0].name)
    info = json.loads((fx.root / "dataset_info.json").read_text())
    info["splits"] += json.loads((val.root / "dataset_info.json").read_text())["splits"]
    (fx.root / "dataset_info.json").write_text(json.dumps(info))
    convert(fx.root, "train")
    ds = open_dataset("train")
    assert ds.num_episodes == 2 and any("'val'" in n for n in ds.manifest.conversion["notes"])
    convert(fx.root, "val", options={"split": "val"})
    np.testing.assert_array_equal(
        np.asarray(open_dataset("val").column("observation/image")[:]), val.episodes[0].image
    )
    with pytest.raises(SourceFormatError, match="no shards of split 'test'"):
        convert(fx.root, "test", options={"split": "test"})


def test_a_zlib_encoded_tensor_and_an_unknown_dimension(tmp_path: Path) -> None:
    """TFDS's ``encoding: zlib`` (raw bytes, compressed) and a ``-1`` dimension inferred from the
    value count."""
    import zlib

    def mutate(i: int, features: dict[str, Any]) -> None:
        state = fx_state[i]
        features["steps/observation/state"] = ([zlib.compress(row.tobytes()) for row in state], "byte")

    rng = np.random.default_rng(5)
    fx_state = [rng.standard_normal((n, 8)).astype(np.float32) for n in (3, 4)]
    fx = write_rlds_dataset(tmp_path / "src", (3, 4), mutate=mutate)
    doc = json.loads((fx.root / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    steps["observation"]["featuresDict"]["features"]["state"]["tensor"]["encoding"] = "zlib"
    steps["language_embedding"]["tensor"]["shape"] = {"dimensions": ["-1"]}
    (fx.root / "features.json").write_text(json.dumps(doc))
    convert(fx.root, "z")
    ds = open_dataset("z")
    np.testing.assert_array_equal(np.asarray(ds.column("observation/state")[:]), np.concatenate(fx_state))
    assert ds.manifest.fields["info/language_embedding"].shape == (512,)


def _steps_features(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]


def test_frames_kept_as_the_records_store_them(tmp_path: Path) -> None:
    """``--frames keep`` (the default) stores each step's PNG and JPEG file bit for bit; its
    pixels are Pillow's decoding of them (the expectations above); ``raw`` stores arrays."""
    fx = write_rlds_dataset(tmp_path / "src", (3, 4), last_step="observation")
    m = convert(fx.root, "kept").manifest
    assert (m.fields["observation/image"].codec, m.fields["observation/wrist_image"].codec) == ("png", "jpeg")
    wrist = open_dataset("kept").column("observation/wrist_image")
    stored = [bytes(wrist.frame_bytes(i)) for i in range(3)]  # episode 0: its 3 steps, the last one final
    assert stored == fx.episodes[0].wrist_jpeg[:3]
    raw = convert(fx.root, "raw", frames="raw").manifest
    assert raw.fields["observation/image"].codec == "raw" and raw.format_version == 1
    for key in ("observation/image", "observation/wrist_image"):
        np.testing.assert_array_equal(open_dataset("raw").column(key)[:], open_dataset("kept").column(key)[:])


def test_16_bit_gray_pngs_in_a_uint8_rgb_feature_read_as_tensorflow_reads_them(tmp_path: Path) -> None:
    """TensorFlow's decode_png(dtype=uint8) keeps a 16-bit PNG's high byte (libpng's strip_16),
    then copies gray to RGB; Pillow's convert clipped every value to 255 (33375 read 255, not 130)."""
    import io

    rng = np.random.default_rng(3)
    sixteen: dict[int, np.ndarray] = {}

    def mutate(i: int, features: dict[str, Any]) -> None:
        n = len(features["steps/observation/image"][0])
        sixteen[i] = rng.integers(0, 65536, (n, 16, 16), dtype=np.uint16)
        pngs = []
        for frame in sixteen[i]:
            out = io.BytesIO()
            Image.fromarray(frame).save(out, format="PNG")
            pngs.append(out.getvalue())
        features["steps/observation/image"] = (pngs, "byte")

    fx = write_rlds_dataset(tmp_path / "src", (3, 4), side=16, mutate=mutate)
    assert download(fx.root, "gray16").exit_code == 0
    got = np.asarray(open_dataset("gray16").column("observation/image")[:])
    high = (np.concatenate([sixteen[0], sixteen[1]]) >> 8).astype(np.uint8)
    np.testing.assert_array_equal(got, np.repeat(high[..., None], 3, axis=-1))


@pytest.mark.parametrize("block_rows", [None, 4])
def test_one_damaged_jpeg_is_refused_naming_its_step(tmp_path: Path, block_rows: int | None) -> None:
    """One JPEG with damaged tables in one step made the whole camera raw, in silence, under
    --frames keep (with Pillow's lenient decoding of the damaged frame), or failed, depending on
    the block size."""

    def mutate(i: int, features: dict[str, Any]) -> None:
        if i == 1:
            files = list(features["steps/observation/wrist_image"][0])
            damaged = bytearray(files[2])
            for k in range(20):  # inside the tables, before the scan
                damaged[len(damaged) // 2 + k] ^= 0x5A
            files[2] = bytes(damaged)
            features["steps/observation/wrist_image"] = (files, "byte")

    fx = write_rlds_dataset(tmp_path / "src", (3, 4, 2), side=40, mutate=mutate)
    options = [] if block_rows is None else ["--option", f"block_rows={block_rows}"]
    result = download(fx.root, "bad", *options)
    _refused(result, "record 1", "step 2 of 'steps/observation/wrist_image' is a damaged JPEG image")


def test_a_uint16_depth_image_and_numeric_episode_metadata(tmp_path: Path) -> None:
    """A single-channel uint16 PNG (a depth camera) is stored as uint16 exactly; a numeric
    ``episode_metadata`` scalar becomes a per-episode source array that follows ``--episodes``."""
    rng = np.random.default_rng(8)
    depth = {i: rng.integers(0, 65536, (n, 16, 16), dtype=np.uint16) for i, n in enumerate((3, 4, 2))}

    def mutate(i: int, features: dict[str, Any]) -> None:
        pngs = []
        for frame in depth[i]:
            out = __import__("io").BytesIO()
            Image.fromarray(frame).save(out, format="PNG")
            pngs.append(out.getvalue())
        features["steps/observation/depth"] = (pngs, "byte")
        features["episode_metadata/success"] = ([i % 2], "int")

    fx = write_rlds_dataset(tmp_path / "src", (3, 4, 2), mutate=mutate)
    doc = json.loads((fx.root / "features.json").read_text())
    obs = _steps_features(doc)["observation"]["featuresDict"]["features"]
    obs["depth"] = {
        "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
        "image": {"shape": {"dimensions": ["16", "16", "1"]}, "dtype": "uint16", "encodingFormat": "png"},
    }
    meta = doc["featuresDict"]["features"]["episode_metadata"]["featuresDict"]["features"]
    meta["success"] = {
        "pythonClassName": "tensorflow_datasets.core.features.scalar.Scalar",
        "tensor": {"shape": {}, "dtype": "bool", "encoding": "none"},
    }
    (fx.root / "features.json").write_text(json.dumps(doc))
    result = download(fx.root, "depth")
    assert result.exit_code == 0, result.output
    ds = open_dataset("depth")
    got = np.asarray(ds.column("observation/depth")[:])
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got[..., 0], np.concatenate([depth[i] for i in range(3)]))
    np.testing.assert_array_equal(ds.source_arrays["rlds/episode_success"], [False, True, False])
    assert download(fx.root, "sub", "--episodes", "1:3").exit_code == 0
    sub = open_dataset("sub")
    np.testing.assert_array_equal(sub.source_arrays["rlds/episode_success"], [True, False])
    assert sub.episodes["source_id"].tolist() == [1, 2]
    assert runner.invoke(app, ["inspect", "sub", "--check"]).exit_code == 0


def test_hostile_feature_names_are_cleaned(tmp_path: Path) -> None:
    """An observation named ``../../x y`` (in features.json and the Example) is stored under a
    cleaned key inside the dataset, with a note."""
    hostile = "../../x y"
    fx = write_rlds_dataset(tmp_path / "src", (3, 2), state_name=hostile)
    assert download(fx.root, "hostile").exit_code == 0
    ds = open_dataset("hostile")
    assert all(is_valid_key(k) for k in ds.manifest.fields)
    (key,) = [k for k in ds.manifest.fields if k.startswith("observation/") and "image" not in k]
    assert ".." not in key.split("/")
    assert repr(f"steps/observation/{hostile}") in "\n".join(ds.manifest.conversion["notes"])
    np.testing.assert_array_equal(np.asarray(ds.column(key)[:2]), fx.episodes[0].state[:2])
    arrays = Path(os.environ["RLDS_HOME"]) / "datasets" / "hostile" / "arrays"
    assert all(p.resolve().is_relative_to(arrays.resolve()) for p in arrays.rglob("*"))


# ----------------------------------------------------------------------------- refused sources


def _record_offsets(path: Path) -> list[int]:
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        out.append(pos)
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        pos += 16 + length
    return out


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["length", "data"])
def test_a_crc_mismatch_names_the_shard_record_and_offset(tmp_path: Path, where: str) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3, 4, 2), shards=1)
    shard = fx.shards[0]
    offset = _record_offsets(shard)[1]
    # the stored CRC of the length (the length itself stays sound), or a byte of the data
    _flip(shard, offset + 8 if where == "length" else offset + 40)
    line = _refused(download(fx.root, "oxe"), shard.name, "record 1", f"byte {offset}", "CRC")
    assert ("length" in line) == (where == "length")


def test_a_truncated_shard(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3, 4), shards=1)
    shard = fx.shards[0]
    offset = _record_offsets(shard)[1]
    shard.write_bytes(shard.read_bytes()[: offset + 100])
    _refused(download(fx.root, "oxe"), shard.name, "truncated", "record 1", f"byte {offset}")


def test_a_shard_cut_at_a_record_boundary_disagrees_with_dataset_info(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3, 4), shards=1)
    shard = fx.shards[0]
    shard.write_bytes(shard.read_bytes()[: _record_offsets(shard)[1]])
    _refused(download(fx.root, "oxe"), shard.name, "holds 1 records", "gives it 2")


def test_a_missing_shard(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3, 4, 2), shards=3)
    fx.shards[1].unlink()
    _refused(download(fx.root, "oxe"), "tfrecord-00001-of-00003 is missing")


def test_a_record_that_is_not_an_example(tmp_path: Path) -> None:
    """Garbage framed correctly (valid CRCs, written with the tfrecord package's own CRC)."""
    from tfrecord import TFRecordWriter

    fx = write_rlds_dataset(tmp_path / "src", (3, 4), shards=1)
    shard = fx.shards[0]
    keep = shard.read_bytes()[: _record_offsets(shard)[1]]
    junk = b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 10  # Example.features claiming 4 GB
    length = struct.pack("<Q", len(junk))
    shard.write_bytes(
        keep + length + TFRecordWriter.masked_crc(length) + junk + TFRecordWriter.masked_crc(junk)
    )
    _refused(download(fx.root, "oxe"), shard.name, "record 1", "is not a tf.train.Example")


def test_features_json_disagreeing_with_the_data(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3, 4))
    doc = json.loads((fx.root / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    steps["observation"]["featuresDict"]["features"]["state"]["tensor"]["shape"] = {"dimensions": ["9"]}
    (fx.root / "features.json").write_text(json.dumps(doc))
    _refused(download(fx.root, "oxe"), "record 0", "'steps/observation/state' holds 24 values", "9 per step")


def test_a_feature_missing_from_a_record(tmp_path: Path) -> None:
    fx = write_rlds_dataset(
        tmp_path / "src", (3, 4), mutate=lambda i, f: f.pop("steps/discount") if i == 1 else None
    )
    _refused(download(fx.root, "oxe"), "record 1", "has no feature 'steps/discount'")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "is not readable JSON"),
        (
            '{"type": "tensorflow_datasets.core.features.features_dict.FeaturesDict", "content": {}}',
            "old TFDS",
        ),
        ('{"featuresDict": {"features": {"x": {"text": {}}}}}', "no 'steps' sequence"),
        ("[1, 2]", "not a FeaturesDict"),
    ],
)
def test_a_malformed_features_json(tmp_path: Path, content: str, needle: str) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3,))
    (fx.root / "features.json").write_text(content)
    _refused(download(fx.root, "oxe"), "features.json", needle)


@pytest.mark.parametrize("garbage", [b"\x00" * 40, b"GARBAGE"])
def test_an_image_that_does_not_decode(tmp_path: Path, garbage: bytes) -> None:
    """Named by record and step, in words that do not change from run to run (Pillow's message
    named its stream, ``<_io.BytesIO object at 0x7ff1...>``)."""

    def mutate(i: int, features: dict[str, Any]) -> None:
        if i == 1:
            frames = list(features["steps/observation/image"][0])
            frames[2] = b"\x89PNG\r\n\x1a\n" + garbage
            features["steps/observation/image"] = (frames, "byte")

    fx = write_rlds_dataset(tmp_path / "src", (3, 4), mutate=mutate)
    result = download(fx.root, "oxe")
    _refused(result, "record 1", "step 2 of 'steps/observation/image'", "does not decode")
    assert "BytesIO" not in result.output and " at 0x" not in result.output


def test_an_image_of_another_size_than_declared(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3,), side=16)
    doc = json.loads((fx.root / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    steps["observation"]["featuresDict"]["features"]["image"]["image"]["shape"] = {
        "dimensions": ["24", "16", "3"]
    }
    (fx.root / "features.json").write_text(json.dumps(doc))
    _refused(download(fx.root, "oxe"), "step 0", "16x16 image", "[24, 16, 3]")


def test_is_first_in_the_middle_of_a_record(tmp_path: Path) -> None:
    def mutate(i: int, features: dict[str, Any]) -> None:
        if i == 0:
            features["steps/is_first"] = ([1, 0, 1, 0], "int")

    fx = write_rlds_dataset(tmp_path / "src", (4, 3), mutate=mutate)
    _refused(download(fx.root, "oxe"), "record 0", "is_first is set on step 2")


def test_a_shard_that_is_a_symlink_out_of_the_folder(tmp_path: Path) -> None:
    fx = write_rlds_dataset(tmp_path / "src", (3,))
    outside = tmp_path / "elsewhere.bin"
    fx.shards[0].rename(outside)
    fx.shards[0].symlink_to(outside)
    _refused(download(fx.root, "oxe"), "escapes the dataset folder")


def test_a_shard_declaring_far_more_than_it_stores(tmp_path: Path) -> None:
    """Blank 512x512 frames compress over 100-fold: past 64 MiB decoded, the shard is refused as
    a bomb before any frame is decoded (RLDS_SOURCE_MAX_RATIO lets a trusted one through)."""
    fx = write_rlds_dataset(tmp_path / "src", (48,), side=512, constant=True)
    _refused(download(fx.root, "oxe"), fx.shards[0].name, "'steps' declares", "ratio over 100")


# ----------------------------------------------------------------------------- memory


_CONVERT_CAPPED = """
import resource, sys
from rlds_cli.sources.convert import convert
cap = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
result = convert(sys.argv[1], "capped", options={"workers": 1})
print(result.manifest.num_steps, open("/proc/self/status").read().split("VmPeak:")[1].split()[0])
"""


@pytest.mark.slow
def test_conversion_streams_under_an_address_space_cap(tmp_path: Path) -> None:
    """1,600 steps of two 256x256 cameras (629 MB decoded, 7 MB of shards) convert in a process
    whose address space is capped at 448 MiB (its peak is about 340 MB, whatever the source's
    size): memory follows the block, not the source."""
    fx = write_rlds_dataset(tmp_path / "src", [200] * 8, side=256, shards=2, constant=True)
    decoded = sum(ep.steps * 2 * ep.image[0].nbytes for ep in fx.episodes)
    cap = 448 << 20
    assert decoded > 1.3 * cap
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CONVERT_CAPPED), str(fx.root), str(cap)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    steps, peak_kb = map(int, out.stdout.split())
    assert steps == 1600 - 8  # strict RLDS: the last step of each episode is its final observation
    assert peak_kb * 1024 < cap
