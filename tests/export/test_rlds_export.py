"""``rlds export --to rlds``: RLDS TFRecord folders written without TensorFlow, read back by rlds's
RLDS reader with 0 differences, and (where a side environment holds tensorflow-datasets, named by
``RLDS_TFDS_PYTHON``) loaded by ``tfds.builder_from_directory``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import ExportError
from rlds_cli.export import export_dataset
from rlds_cli.formats.base import StepBlock
from rlds_cli.formats.tfrecord_io import (
    FLOAT_LIST,
    INT64_LIST,
    bytes_spans,
    decode_varints,
    encode_example,
    encode_feature,
    encode_varints,
    float_values,
    frame_record,
    int64_values,
    parse_example,
    scan_records,
)
from rlds_cli.sources.convert import convert
from tests.rlds_tfrecord_fixtures import write_rlds_dataset

pytest.importorskip("crc32c")
pytest.importorskip("tfrecord")
runner = CliRunner()
#: The python of a side environment with tensorflow-datasets (read here: the cache fixture unsets
#: every RLDS_* variable).
TFDS_PYTHON = os.environ.get("RLDS_TFDS_PYTHON")
pytestmark = pytest.mark.usefixtures("consoles")


def same(a: Dataset, b: Dataset) -> None:
    """0 differences: every key of ``a`` (values and dtypes; TED scalars may come back with
    their trailing ``[1]``), each episode's bounds and whether its final observation is known."""
    x, y = a[:], b[:]
    for key in x:
        assert y[key].dtype == x[key].dtype, key
        np.testing.assert_array_equal(y[key].reshape(x[key].shape), x[key], err_msg=key)
    for field in ("start", "length", "final_known"):
        assert a.episode_index[field].tolist() == b.episode_index[field].tolist(), field


# ----------------------------------------------------------------------------- the encoder


def test_varints_round_trip_through_the_decoder() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64), [0, 1, 127, 128, -1, 2**62], np.arange(300)]
    )
    np.testing.assert_array_equal(decode_varints(np.frombuffer(encode_varints(values), np.uint8)), values)


def test_example_is_what_protobuf_parses() -> None:
    """The bytes of :func:`encode_example` parse with the real protobuf runtime as the features
    given, and with rlds's own parser."""
    from tfrecord import example_pb2

    ints = np.array([0, -5, 300, 2**40], np.int64)
    data = encode_example(
        {
            "steps/a": encode_feature(FLOAT_LIST, np.array([1.5, -2.0], np.float32)),
            "steps/b": encode_feature(INT64_LIST, ints),
            "steps/c": encode_feature("bytes", [b"x", b"", "é".encode()]),
            "steps/empty": encode_feature(FLOAT_LIST, np.zeros(0, np.float32)),
        }
    )
    example = example_pb2.Example()
    example.ParseFromString(data)
    feats = example.features.feature
    assert list(feats["steps/a"].float_list.value) == [1.5, -2.0]
    assert list(feats["steps/b"].int64_list.value) == ints.tolist()
    assert list(feats["steps/c"].bytes_list.value) == [b"x", b"", "é".encode()]
    assert feats["steps/empty"].WhichOneof("kind") == "float_list"
    buf = memoryview(data)
    ours = parse_example(buf)
    assert float_values(buf, ours["steps/a"]).tolist() == [1.5, -2.0]
    assert int64_values(buf, ours["steps/b"]).tolist() == ints.tolist()
    assert [bytes(buf[a:b]) for a, b in bytes_spans(buf, ours["steps/c"])] == [b"x", b"", "é".encode()]


def test_records_frame_with_valid_crcs(tmp_path: Path) -> None:
    path = tmp_path / "x.tfrecord"
    path.write_bytes(frame_record(b"hello") + frame_record(b""))
    from tfrecord.reader import tfrecord_iterator

    assert [bytes(r) for r in tfrecord_iterator(str(path))] == [b"hello", b""]  # their CRC checks too
    with open(path, "rb") as fh:
        assert [bytes(rec.view) for _, rec in scan_records(fh.fileno(), path)] == [b"hello", b""]


# ----------------------------------------------------------------------------- round trips


@pytest.fixture
def oxe(isolated_cache: Path, tmp_path: Path) -> Dataset:
    """An RLDS source shaped like an OXE dataset (PNG and JPEG cameras, text, episode metadata),
    converted with its frames kept; episodes alternate strict RLDS and a real last transition."""
    write_rlds_dataset(tmp_path / "src", (5, 7, 4, 3), last_step="mixed", shards=2)
    convert(tmp_path / "src", "oxe")
    return open_dataset("oxe")


def test_rlds_source_round_trips_with_zero_differences(oxe: Dataset, tmp_path: Path) -> None:
    out = export_dataset(oxe, tmp_path / "out", "rlds")
    back = convert(out, "back").manifest
    same(oxe, open_dataset("back"))
    ours = oxe.manifest.source["metadata"]["rlds"]
    theirs = back.source["metadata"]["rlds"]
    assert theirs["text"] == ours["text"] and theirs["episode_text"] == ours["episode_text"]
    assert {k: v for k, v in theirs["keys"].items() if "last_step" not in k} == ours["keys"]
    for key, values in oxe.source_arrays.items():
        np.testing.assert_array_equal(open_dataset("back").source_arrays[key], values)
    features = json.loads((out / "features.json").read_text())
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    assert steps["language_instruction"]["text"] == {}
    obs = steps["observation"]["featuresDict"]["features"]
    assert obs["image"]["image"]["encodingFormat"] == "png"
    assert obs["wrist_image"]["image"]["encodingFormat"] == "jpeg"
    assert steps["reward"]["tensor"] == {"shape": {}, "dtype": "float64", "encoding": "bytes"}


def test_a_view_exports_its_parents_text_and_episode_metadata(oxe: Dataset, tmp_path: Path) -> None:
    """A view keeps no source metadata or arrays of its own: its export turned the language text
    into a bare index and dropped episode_metadata (the parent's are its own)."""
    from rlds_cli.cache.derive import create_selection

    create_selection("oxe", "some", [3, 1])
    view = open_dataset("some")
    out = export_dataset(view, tmp_path / "out", "rlds")
    convert(out, "back")
    back = open_dataset("back")
    features = (out / "features.json").read_text()
    assert '"language_instruction"' in features and '"file_path"' in features

    def file_paths(ds: Dataset) -> list[str]:
        key = "rlds/episode_file_path"
        table = ds.source_metadata["rlds"]["episode_text"][key]
        return [table[int(i)] for i in ds.source_arrays[key]]

    assert file_paths(back) == [file_paths(oxe)[i] for i in (1, 3)]  # the view's episodes, in its order


@pytest.mark.parametrize("kind", ["converted", "selection", "range view", "merge"])
def test_stored_frames_are_written_as_they_are(oxe: Dataset, tmp_path: Path, kind: str) -> None:
    """The kept JPEG files of the source go out bit for bit (nothing decoded or encoded again);
    those of a view or a merge were decoded and encoded again (as PNG, or a second JPEG loss)."""
    from rlds_cli.cache.compose import merge_datasets
    from rlds_cli.cache.derive import create_selection, create_view

    made = {"converted": "oxe", "selection": "oxe-sel", "range view": "oxe-range", "merge": "oxe-merge"}[kind]
    if kind in ("selection", "merge"):
        create_selection("oxe", "oxe-sel", [1, 3], replace=True)
    if kind == "range view":
        create_view("oxe", "oxe-range", (1, 3), replace=True)
    if kind == "merge":
        merge_datasets(["oxe-sel", "oxe"], "oxe-merge", replace=True)
    ds = open_dataset(made)
    out = export_dataset(ds, tmp_path / "out", "rlds")
    assert '"encodingFormat": "jpeg"' in (out / "features.json").read_text()
    shard = sorted(out.glob("*.tfrecord-*"))[0]
    with open(shard, "rb") as fh:
        for _, rec in scan_records(fh.fileno(), shard):  # the first record: episode 0
            buf = rec.view
            spans = bytes_spans(buf, parse_example(buf)["steps/observation/wrist_image"])
            files = [bytes(buf[a:b]) for a, b in spans]
            break
    first = ds.episode_index["start"][0]  # flat rows: episode 0's frames start at its first step
    kept = ds.column("observation/wrist_image").encoded_rows(np.arange(first, first + len(files)))
    assert files == [bytes(b) for b in kept.data]
    parent = oxe.column("observation/wrist_image")
    assert set(files) <= {bytes(parent.frame_bytes(i)) for i in range(len(parent))}  # the stored files


def test_dict_actions_and_sharding(isolated_cache: Path, tmp_path: Path) -> None:
    write_rlds_dataset(tmp_path / "src", (3, 4, 2), dict_action=True)
    convert(tmp_path / "src", "rt1")
    out = export_dataset(open_dataset("rt1"), tmp_path / "out", "rlds", options={"shard_bytes": 1})
    assert sorted(p.name for p in out.glob("*.tfrecord*")) == [
        f"rt1-train.tfrecord-0000{i}-of-00003" for i in range(3)
    ]
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["splits"][0]["shardLengths"] == ["1", "1", "1"]
    assert info["splits"][0]["numBytes"] == str(sum(p.stat().st_size for p in out.glob("*.tfrecord*")))
    convert(out, "back")
    same(open_dataset("rt1"), open_dataset("back"))


def test_a_zero_last_transition_stays_a_transition(isolated_cache: Path, tmp_path: Path) -> None:
    """Episodes whose last transition has a zero action and reward and no final observation: the
    export says so per episode, and the reader's auto rule follows it (no transition lost)."""
    write_rlds_dataset(tmp_path / "src", (3, 4), last_step="observation")
    convert(tmp_path / "src", "t", options={"last_step": "transition"})
    ds = open_dataset("t")
    assert ds.episode_index["final_known"].tolist() == [False, False]
    out = export_dataset(ds, tmp_path / "out", "rlds")
    convert(out, "back")
    same(ds, open_dataset("back"))


def _frames_dataset(name: str, shape: tuple[int, ...], frames: str = "raw") -> Dataset:
    from tests.frames_fixtures import frames_block

    block, _ = frames_block([3, 2], shape, prefix="observation/")
    with DatasetBuilder(name, frames=frames) as builder:
        builder.append(block)
        builder.commit()
    return open_dataset(name)


@pytest.mark.parametrize("codec", ["png", "none"])
def test_raw_frames_lossless(isolated_cache: Path, tmp_path: Path, codec: str) -> None:
    ds = _frames_dataset("cam", (12, 16, 3))
    out = export_dataset(ds, tmp_path / "out", "rlds", options={"image_codec": codec})
    features = (out / "features.json").read_text()
    assert ('"encodingFormat": "png"' in features) is (codec == "png")
    convert(out, "back")
    same(ds, open_dataset("back"))


def test_raw_frames_as_jpeg(isolated_cache: Path, tmp_path: Path) -> None:
    ds = _frames_dataset("cam", (12, 16, 3))
    out = export_dataset(ds, tmp_path / "out", "rlds", options={"image_codec": "jpeg"})
    assert '"encodingFormat": "jpeg"' in (out / "features.json").read_text()
    convert(out, "back")
    back = open_dataset("back")
    got = back.column("observation/pixels")[:].astype(int)
    assert got.shape == (7, 12, 16, 3)
    assert np.abs(got - ds.column("observation/pixels")[:].astype(int)).mean() < 8  # lossy, close
    np.testing.assert_array_equal(back.column("observation/state")[:], ds.column("observation/state")[:])


@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_kept_frame_files(isolated_cache: Path, tmp_path: Path, codec: str) -> None:
    ds = _frames_dataset("cam", (48, 64, 3), codec)
    assert ds.stored_fields["observation/pixels"].codec == codec
    out = export_dataset(ds, tmp_path / "out", "rlds")
    assert f'"encodingFormat": "{codec}"' in (out / "features.json").read_text()
    convert(out, "back")
    same(ds, open_dataset("back"))


def test_channels_first_frames_are_tensors(isolated_cache: Path, tmp_path: Path) -> None:
    ds = _frames_dataset("chw", (3, 12, 16))
    out = export_dataset(ds, tmp_path / "out", "rlds")
    assert '"image"' not in (out / "features.json").read_text()
    convert(out, "back")
    same(ds, open_dataset("back"))


def test_a_key_on_a_reserved_feature_is_refused(isolated_cache: Path, tmp_path: Path) -> None:
    steps = {
        "action": np.zeros((2, 1), np.float32),
        "next/reward": np.zeros((2, 1), np.float32),
        "next/terminated": np.array([[False], [True]]),
        "next/truncated": np.zeros((2, 1), bool),
        "info/is_first": np.zeros((2, 1), bool),
    }
    block = StepBlock(
        steps=steps, observations={"observation": np.zeros((3, 2), np.float32)}, ends=np.array([1])
    )
    with DatasetBuilder("clash") as builder:
        builder.append(block)
        builder.commit()
    with pytest.raises(ExportError, match="'info/is_first' would be written as 'steps/is_first'"):
        export_dataset(open_dataset("clash"), tmp_path / "out", "rlds")
    assert not (tmp_path / "out").exists()


def test_cli(oxe: Dataset, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = runner.invoke(
        app, ["export", "oxe", str(out), "--to", "rlds", "--image-codec", "jpeg", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["format"] == "rlds"
    assert (out / "features.json").is_file()
    bad = runner.invoke(app, ["export", "oxe", str(tmp_path / "x"), "--to", "rlds", "--image-codec", "gif"])
    assert bad.exit_code == 1
    assert bad.stderr.splitlines()[0] == "error: image_codec is 'gif'; RLDS exports take png, jpeg, none"
    wrong = runner.invoke(app, ["export", "oxe", str(tmp_path / "y"), "--to", "d4rl", "--image-codec", "png"])
    assert wrong.exit_code == 1
    assert wrong.stderr.splitlines() == [
        "error: --image-codec is an option of --to rlds, not of --to d4rl",
        "hint: drop --image-codec, or export --to rlds",  # not "pass --force"
    ]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_unknown_option_is_refused(oxe: Dataset, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="the d4rl export takes no option 'image_codec'") as info:
        export_dataset(oxe, tmp_path / "x.hdf5", "d4rl", options={"image_codec": "png"})
    assert info.value.hint == "its options: none"
    with pytest.raises(ExportError, match="the rlds export takes no option 'codec'") as info:
        export_dataset(oxe, tmp_path / "x", "rlds", options={"codec": "png"})
    assert info.value.hint == "its options: image_codec, shard_bytes"


# ----------------------------------------------------------------------------- TFDS itself

_TFDS_DUMP = """
import sys, numpy as np, tensorflow_datasets as tfds
builder = tfds.builder_from_directory(sys.argv[1])
arrays = {}
for e, episode in enumerate(tfds.as_numpy(builder.as_dataset(split="train"))):
    steps = list(episode["steps"])
    def walk(prefix, value, i):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(prefix + "/" + k, v, i)
        else:
            arrays.setdefault(f"{e}{prefix}", []).append(np.asarray(value))
    for i, step in enumerate(steps):
        walk("/steps", step, i)
    walk("/meta", episode["episode_metadata"], 0)
np.savez(sys.argv[2], **{k: np.stack(v) for k, v in arrays.items()})
"""


@pytest.mark.skipif(not TFDS_PYTHON, reason="no tensorflow-datasets side env (RLDS_TFDS_PYTHON)")
def test_tfds_loads_the_export_as_rlds_reads_it(oxe: Dataset, tmp_path: Path) -> None:
    """``tfds.builder_from_directory(OUT).as_dataset()`` in a side environment (TensorFlow does not
    install next to torch): every step of every episode equals what rlds reads back."""
    out = export_dataset(oxe, tmp_path / "out", "rlds")
    dump = tmp_path / "tfds.npz"
    script = tmp_path / "dump.py"
    script.write_text(_TFDS_DUMP)
    subprocess.run([str(TFDS_PYTHON), str(script), str(out), str(dump)], check=True, timeout=600)
    text = oxe.manifest.source["metadata"]["rlds"]["text"]["info/language_instruction_index"]
    with np.load(dump) as tf:
        for e in range(oxe.num_episodes):
            ep = oxe.episode(e)
            known = bool(oxe.episode_index["final_known"][e])
            T = len(ep["action"])
            obs = {
                k: np.concatenate([ep[k], ep["next/" + k][-1:]])
                for k in ("observation/image", "observation/wrist_image", "observation/state")
            }
            for k in ("observation/image", "observation/state"):
                np.testing.assert_array_equal(tf[f"{e}/steps/{k}"], obs[k][: T + known], err_msg=k)
            # the same JPEG files; TensorFlow's decoder (a faster IDCT) differs from Pillow's by a few levels
            wrist = tf[f"{e}/steps/observation/wrist_image"].astype(int)
            assert np.abs(wrist - obs["observation/wrist_image"][: T + known]).max() <= 4
            np.testing.assert_array_equal(tf[f"{e}/steps/action"][:T], ep["action"])
            np.testing.assert_array_equal(tf[f"{e}/steps/reward"][:T], ep["next/reward"][:, 0])
            np.testing.assert_array_equal(
                tf[f"{e}/steps/language_embedding"][:T], ep["info/language_embedding"]
            )
            words = [text[i] for i in ep["info/language_instruction_index"][:, 0]]
            assert [s.decode() for s in tf[f"{e}/steps/language_instruction"][:T]] == words
            last = np.zeros(T + known, bool)
            last[-1] = True
            np.testing.assert_array_equal(tf[f"{e}/steps/is_last"], last)
            np.testing.assert_array_equal(
                tf[f"{e}/steps/is_terminal"], last & bool(ep["next/terminated"][-1, 0])
            )
            assert tf[f"{e}/meta/last_step_is_observation"].tolist() == [known]


def test_a_lerobot_dataset_gets_its_task_texts(isolated_cache: Path, tmp_path: Path) -> None:
    """LeRobot -> RLDS (what OpenVLA and Octo fine-tune on): each step's task text becomes
    ``language_instruction``, beside ``task_index``; the camera is a PNG image; read back, every
    key equals."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    from tests.cli_fixtures import download
    from tests.lerobot_fixtures import writable_v3

    assert download(writable_v3(tmp_path), "tiny").exit_code == 0
    ds = open_dataset("tiny")
    out = export_dataset(ds, tmp_path / "out", "rlds")
    features = json.loads((out / "features.json").read_text())
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    assert steps["language_instruction"]["text"] == {} and "task_index" in steps
    assert steps["observation"]["featuresDict"]["features"]["image"]["image"]["encodingFormat"] == "png"
    back = convert(out, "back").manifest
    assert back.source["metadata"]["rlds"]["text"] == {"info/language_instruction_index": ["push the T"]}
    same(ds, open_dataset("back"))


def test_missing_crc32c_says_what_to_install(
    oxe: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli.errors import MissingExtraError
    from rlds_cli.export import rlds_tfrecord

    monkeypatch.setattr(rlds_tfrecord, "have_crc32c", lambda: False)
    with pytest.raises(MissingExtraError, match="crc32c") as info:
        export_dataset(oxe, tmp_path / "out", "rlds")
    assert "rlds-cli[rlds]" in str(info.value.hint)
    assert not (tmp_path / "out").exists()


def test_a_text_index_outside_its_table_is_refused(oxe: Dataset, tmp_path: Path) -> None:
    """A manifest whose string table is shorter than the indices (damage): one line, nothing written."""
    meta = oxe.manifest.source["metadata"]["rlds"]
    meta["text"]["info/language_instruction_index"] = meta["text"]["info/language_instruction_index"][:1]
    with pytest.raises(ExportError, match="'info/language_instruction_index' holds a text index outside"):
        export_dataset(oxe, tmp_path / "out", "rlds")
    assert list(tmp_path.glob("out*")) == []
