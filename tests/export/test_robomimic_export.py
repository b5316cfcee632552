"""``rlds export NAME OUT --to robomimic``: the file holds what the source held (datasets, dtypes,
attributes, filter keys), reads back with 0 differences, and a filter-key view exports its demos."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cache.derive import filtered_dataset
from rlds_cli.cli.app import app
from rlds_cli.export import export_dataset
from rlds_cli.export import robomimic as robomimic_export
from rlds_cli.sources.convert import convert
from tests.robomimic_fixtures import ALL, IMAGE, differences


def _tree(path: Path) -> dict[str, Any]:
    """Every dataset and attribute of an HDF5 file, by path."""
    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:

        def visit(name: str, node: Any) -> None:
            if isinstance(node, h5py.Dataset):
                out[name] = node[()]
            for attr, value in node.attrs.items():
                out[f"{name}@{attr}"] = value

        f.visititems(visit)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return bool(a == b)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_the_export_holds_what_the_source_file_held(path: Path, tmp_path: Path) -> None:
    convert(path, "src")
    out = export_dataset(open_dataset("src"), tmp_path / "out.hdf5", "robomimic")
    want, got = _tree(path), _tree(out)
    assert sorted(got) == sorted(want)
    assert [k for k in want if not _same(got[k], want[k])] == []
    convert(out, "back")
    assert differences(open_dataset("back"), path) == []


def test_a_filter_key_view_exports_its_demos_and_masks(tmp_path: Path) -> None:
    convert(IMAGE, "img")
    out = export_dataset(filtered_dataset(open_dataset("img"), "train"), tmp_path / "train.hdf5", "robomimic")
    with h5py.File(out) as f:
        assert sorted(f["data"], key=lambda d: int(d[5:])) == ["demo_0", "demo_2", "demo_10"]
        assert f["mask/train"][()].tolist() == [b"demo_0", b"demo_2", b"demo_10"]
        assert f["mask/valid"].shape == (0,)
        assert f["data"].attrs["total"] == 5 + 4 + 2
    convert(out, "back")
    assert differences(open_dataset("back"), IMAGE, "train") == []


def test_long_demos_stream_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    convert(IMAGE, "img")
    monkeypatch.setattr(robomimic_export, "CHUNK_BYTES", 1)  # one step at a time
    out = export_dataset(open_dataset("img"), tmp_path / "small.hdf5", "robomimic")
    convert(out, "back")
    assert differences(open_dataset("back"), IMAGE) == []


def test_a_dataset_of_another_format_gets_env_args(golden_dataset: Any, tmp_path: Path) -> None:
    ds = golden_dataset()
    out = export_dataset(ds, tmp_path / "g.hdf5", "robomimic")
    with h5py.File(out) as f:
        import json

        env = json.loads(f["data"].attrs["env_args"])
        spec = ds.env_spec
        assert env["type"] == 2  # robomimic's EnvType.GYM_TYPE
        assert env["env_name"] == (spec.id if spec is not None else ds.name)
        assert f["data"].attrs["total"] == ds.num_steps
        assert "mask" not in f
        assert f["data/demo_0/dones"].dtype == np.int64


def test_the_cli_exports(tmp_path: Path) -> None:
    convert(IMAGE, "img")
    result = CliRunner().invoke(app, ["export", "img", str(tmp_path / "x.hdf5"), "--to", "robomimic"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x.hdf5").is_file()


def test_a_key_robomimic_uses_for_another_array_is_refused(tmp_path: Path) -> None:
    from rlds_cli.errors import ExportError
    from rlds_cli.testing.sources import write_d4rl

    n = 4
    source = write_d4rl(
        tmp_path / "d.hdf5",
        observations=np.zeros((n, 2), np.float32),
        actions=np.zeros((n, 1), np.float32),
        rewards=np.zeros(n, np.float32),
        terminals=np.array([0, 0, 0, 1], bool),
        timeouts=np.zeros(n, bool),
        infos={"actions": np.ones(n, np.float32)},  # info/actions would be written as 'actions'
    )
    convert(source, "clash")
    with pytest.raises(ExportError, match="key 'info/actions' would be written as 'actions'"):
        export_dataset(open_dataset("clash"), tmp_path / "out.hdf5", "robomimic")
    assert not (tmp_path / "out.hdf5").exists()


def test_data_attributes_json_has_no_type_for_are_kept_as_text_and_exported(tmp_path: Path) -> None:
    """A complex or an object-reference attribute stopped the conversion (not JSON serializable);
    a list of camera names came back as numpy unicode, which h5py cannot store."""
    path = Path(shutil.copy(IMAGE, tmp_path / "a.hdf5"))
    with h5py.File(path, "a") as f:
        f["data"].attrs["phase"] = 1 + 2j
        f["data"].attrs["ref"] = f["data/demo_0"].ref
        f["data"].attrs["cameras"] = np.array([b"agentview", b"wrist"])
        f["data"].attrs["gains"] = np.array([1.5, 2.0])
    convert(path, "a")
    attrs = open_dataset("a").source_metadata["robomimic"]["attrs"]
    assert attrs["phase"] == "(1+2j)" and attrs["cameras"] == ["agentview", "wrist"]
    assert isinstance(attrs["ref"], str)
    out = tmp_path / "back.hdf5"
    export_dataset(open_dataset("a"), out, "robomimic")
    with h5py.File(out) as f:
        assert f["data"].attrs["cameras"].tolist() == [b"agentview", b"wrist"]
        np.testing.assert_array_equal(f["data"].attrs["gains"], [1.5, 2.0])
        assert f["data"].attrs["phase"] == "(1+2j)"
