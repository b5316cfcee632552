"""Minari layout rules that minari's collector cannot produce (written with h5py): T-row infos,
unflagged episode ends, JPEG frames without pillow, arrow without pyarrow, and damaged datasets."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import MissingExtraError, SourceFormatError
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import minari_episode, write_minari_by_hand


def test_golden_hand_written(tmp_path: Path) -> None:
    eps = [minari_episode(3, terminated=True), minari_episode(2, terminated=False, start=10)]
    eps[0]["infos"] = {"success": np.array([0, 0, 1, 1]), "step_cost": np.array([0.5, 0.25, 0.125])}
    eps[1]["infos"] = {"success": np.array([0, 0, 0]), "step_cost": np.array([1.0, 2.0])}
    m = convert(write_minari_by_hand(tmp_path / "ds", eps), "hand").manifest
    ds = open_dataset("hand")
    b = ds[:]
    assert b["observation"][:, 0].tolist() == [0, 1, 2, 10, 11]
    assert b["next/observation"][:, 0].tolist() == [1, 2, 3, 11, 12]
    assert b["next/terminated"][:, 0].tolist() == [0, 0, 1, 0, 0]
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 0, 0, 1]
    # T+1 infos are observation-like, T infos are per step (never padded)
    assert b["info/success"].tolist() == [0, 0, 1, 0, 0]
    assert b["next/info/success"].tolist() == [0, 1, 1, 0, 0]
    assert b["info/step_cost"].tolist() == [0.5, 0.25, 0.125, 1.0, 2.0]
    assert "next/info/step_cost" not in ds.fields
    assert m.source["checks"]["expected"] == {"num_episodes": 2, "num_steps": 5}


def test_unflagged_end_is_truncated_with_a_note(tmp_path: Path) -> None:
    ep = minari_episode(3)
    ep["terminations"][:] = False
    m = convert(write_minari_by_hand(tmp_path / "ds", [ep]), "u").manifest
    assert open_dataset("u")[:]["next/truncated"][:, 0].tolist() == [0, 0, 1]
    assert any("neither terminations nor truncations" in n for n in m.conversion["notes"])


def _jpeg_dataset(tmp_path: Path) -> tuple[Path, np.ndarray]:
    from PIL import Image

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    encoded = []
    for fr in frames:
        buf = io.BytesIO()
        Image.fromarray(fr).save(buf, format="JPEG")
        encoded.append(np.frombuffer(buf.getvalue(), np.uint8))
    ep = minari_episode(2)
    ep["observations"] = encoded
    space = {"type": "Box", "dtype": "uint8", "shape": [32, 32, 3], "low": 0, "high": 255}
    d = tmp_path / "img"
    write_minari_by_hand(
        d,
        [{k: v for k, v in ep.items() if k != "observations"}],
        metadata={"observation_space": json.dumps(space)},
    )
    with h5py.File(d / "data" / "main_data.hdf5", "a") as f:
        f["episode_0"].create_dataset("observations", data=encoded, dtype=h5py.vlen_dtype(np.uint8))
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(e.tobytes()))) for e in encoded])
    return d, decoded


def test_jpeg_frames_kept_bit_for_bit_and_decoded_as_pillow_does(tmp_path: Path) -> None:
    d, decoded = _jpeg_dataset(tmp_path)
    m = convert(d, "img").manifest
    assert m.fields["observation"].codec == "jpeg"
    assert m.conversion["frames"]["columns"]["observation"] == {"codec": "jpeg", "kept": 3, "encoded": 0}
    ds = open_dataset("img")
    assert ds.fields["observation"] == ((32, 32, 3), "uint8")
    column = ds.column("observation")
    with h5py.File(d / "data" / "main_data.hdf5") as f:
        source = [bytes(b) for b in f["episode_0/observations"][()]]
    assert [bytes(column.frame_bytes(i)) for i in range(3)] == source  # the source's bytes exactly
    assert np.array_equal(ds[:]["observation"], decoded[:2])
    assert np.array_equal(ds[:]["next/observation"][-1], decoded[2])


def test_jpeg_frames_raw_mode_decodes_them(tmp_path: Path) -> None:
    d, decoded = _jpeg_dataset(tmp_path)
    m = convert(d, "img", frames="raw").manifest
    assert m.fields["observation"].codec == "raw" and m.format_version == 1
    assert np.array_equal(open_dataset("img")[:]["observation"], decoded[:2])


def test_damaged_jpeg_frame_is_a_source_error(tmp_path: Path) -> None:
    d, _ = _jpeg_dataset(tmp_path)
    with h5py.File(d / "data" / "main_data.hdf5", "a") as f:
        del f["episode_0/observations"]
        bad = f["episode_0"].create_dataset("observations", (3,), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(3):
            bad[i] = np.frombuffer(b"\xff\xd8\xff" + bytes(20), np.uint8)
    with pytest.raises(SourceFormatError, match=r"episode_0/observations frame 0 is not a readable JPEG"):
        convert(d, "img")


def test_a_png_frame_among_jpeg_ones_is_named_for_its_codec(tmp_path: Path) -> None:
    """A PNG of the right size was 'a png image of (32, 32, 3), the space says (32, 32, 3)'."""
    from PIL import Image

    d, _ = _jpeg_dataset(tmp_path)
    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(buf, format="PNG")
    with h5py.File(d / "data" / "main_data.hdf5", "a") as f:
        f["episode_0/observations"][1] = np.frombuffer(buf.getvalue(), np.uint8)
    with pytest.raises(SourceFormatError, match=r"(?m)observations frame 1 is a png image, not a JPEG$"):
        convert(d, "img")


def test_arrow_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = write_minari_by_hand(tmp_path / "ds", [minari_episode(2)], metadata={"data_format": "arrow"})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingExtraError, match=r"data_format 'arrow' needs pyarrow") as info:
        convert(d, "arrow")
    assert "rlds-cli[arrow]" in info.value.hint


def test_unknown_data_format_refused(tmp_path: Path) -> None:
    d = write_minari_by_hand(tmp_path / "ds", [minari_episode(2)], metadata={"data_format": "zarr"})
    with pytest.raises(SourceFormatError, match=r"metadata.json: unknown Minari data_format 'zarr'") as info:
        convert(d, "z")
    assert "'hdf5', 'arrow' or 'parquet'" in info.value.hint


def test_damaged_datasets(tmp_path: Path) -> None:
    def bad(name: str, eps: list, match: str, **kw: object) -> None:
        with pytest.raises(SourceFormatError, match=match):
            convert(write_minari_by_hand(tmp_path / name, eps, **kw), "bad", format="minari")

    ep = minari_episode(3)
    bad("ragged", [{**ep, "actions": ep["actions"][:2]}], r"episode_0: 'actions' has 2 rows, 'rewards' has 3")
    bad("obs", [{**ep, "observations": ep["observations"][:3]}], r"'observation' has 3 rows, expected 4")
    bad("missing", [{k: v for k, v in ep.items() if k != "truncations"}], r"episode_0 has no 'truncations'")
    bad("unknown", [{**ep, "extras": np.zeros(3)}], r"unknown datasets \['extras'\]")
    bad(
        "mixed",
        [ep, minari_episode(2, obs_dim=5)],
        r"episode_1: 'observation' has shape \(5,\).*mixed shapes",
    )
    early = {**ep, "terminations": np.array([1, 0, 1], bool)}
    bad("early", [early], r"step 0 is flagged terminated/truncated before the episode's last step")
    bad("count", [ep], r"total_episodes=2 but the file has 1", metadata={"total_episodes": 2})
    infos = {**ep, "infos": {"x": np.zeros(7)}}
    bad("infos", [infos], r"infos 'x' has 7 rows")
    d = write_minari_by_hand(tmp_path / "trunc", [minari_episode(200)])
    h5 = d / "data" / "main_data.hdf5"
    h5.write_bytes(h5.read_bytes()[:1000])
    with pytest.raises(SourceFormatError, match=r"main_data.hdf5"):
        convert(d, "bad")
    (d / "data" / "metadata.json").write_text("{not json")
    with pytest.raises(SourceFormatError, match=r"metadata.json is not readable JSON"):
        convert(d, "bad")


def test_a_multibinary_space_without_n_is_a_format_error() -> None:
    """A damaged space description (an arrow/parquet column's shape comes from it) is refused
    as a format error; it was a ``TypeError`` ('NoneType' object is not iterable)."""
    from rlds_cli.formats.minari.layout import space_shape

    assert space_shape({"type": "MultiBinary", "n": 3}) == (3,)
    assert space_shape({"type": "MultiBinary", "n": [2, 4]}) == (2, 4)
    for bad in ({"type": "MultiBinary"}, {"type": "MultiBinary", "n": "3"}):
        with pytest.raises(SourceFormatError, match="MultiBinary space without a valid 'n'"):
            space_shape(bad)
