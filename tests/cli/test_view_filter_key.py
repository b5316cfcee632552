"""``rlds view NAME --filter-key KEY --name N``: a published view of a filter key's demos."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cache.derive import filter_key_episodes
from rlds_cli.cli.app import app
from rlds_cli.sources.convert import convert
from tests.robomimic_fixtures import IMAGE, differences


def test_a_filter_key_becomes_a_view() -> None:
    convert(IMAGE, "img")
    result = CliRunner().invoke(app, ["view", "img", "--filter-key", "valid", "--name", "img-valid"])
    assert result.exit_code == 0, result.output
    assert "filter key 'valid' of img" in result.output
    view = open_dataset("img-valid")
    assert view.manifest.source["selection"] == "filter key 'valid'"
    assert differences(view, IMAGE, "valid") == []


def test_an_unknown_key_exits_1_naming_the_known_ones() -> None:
    convert(IMAGE, "img")
    result = CliRunner().invoke(app, ["view", "img", "--filter-key", "test", "--name", "x"])
    assert result.exit_code == 1
    assert "has no filter key 'test'; its filter keys: train, valid" in result.output
    assert "Traceback" not in result.output


def test_a_range_and_a_filter_key_select_the_episodes_in_both() -> None:
    convert(IMAGE, "img")
    both = CliRunner().invoke(app, ["view", "img", "-e", "0:2", "--filter-key", "train", "--name", "x"])
    assert both.exit_code == 0, both.output
    keyed = filter_key_episodes(open_dataset("img"), "train")
    assert open_dataset("x").view_parent()[1].tolist() == [i for i in keyed.tolist() if i < 2]
    neither = CliRunner().invoke(app, ["view", "img", "--name", "x"])
    assert neither.exit_code == 2
    assert "--filter-key" in neither.output


def test_a_merge_of_files_that_differ_keeps_what_they_share(tmp_path: Path) -> None:
    """Two robomimic files of one task differ in their step count (``data@total``): the merge
    kept no filter key (``view --filter-key`` said its source had none), and its robomimic
    export wrote no mask and a made-up gym ``env_args``."""
    import h5py
    import numpy as np

    other = tmp_path / "other.hdf5"
    shutil.copy(IMAGE, other)
    with h5py.File(other, "r+") as f:
        f["data"].attrs["total"] = int(f["data"].attrs["total"]) + 1
        del f["mask/valid"], f["mask/train"]
        f["mask/train"] = np.array([b"demo_1"])
        f["mask/expert"] = np.array([b"demo_0", b"demo_10"])
    convert(IMAGE, "a")
    convert(other, "b")
    assert CliRunner().invoke(app, ["merge", "a", "b", "--name", "ab"]).exit_code == 0
    merged, a = open_dataset("ab"), open_dataset("a")
    assert merged.source_metadata["filter_keys"] == ["expert", "train", "valid"]
    meta = merged.source_metadata["robomimic"]
    assert meta["env_args"] == a.source_metadata["robomimic"]["env_args"]
    assert "episodes" not in meta and "total" not in meta["attrs"]  # one file's counts
    assert meta["attrs"]["env_args"] == a.source_metadata["robomimic"]["attrs"]["env_args"]
    n = a.num_episodes
    own = {key: filter_key_episodes(a, key).tolist() for key in ("train", "valid")}
    assert filter_key_episodes(merged, "train").tolist() == [*own["train"], n + 1]
    assert filter_key_episodes(merged, "valid").tolist() == own["valid"]  # b has no valid demos
    assert filter_key_episodes(merged, "expert").tolist() == [n, n + 3]
    view = CliRunner().invoke(app, ["view", "ab", "--filter-key", "expert", "--name", "ab-expert"])
    assert view.exit_code == 0, view.output
    assert open_dataset("ab-expert").num_episodes == 2
    out = tmp_path / "ab.hdf5"
    assert CliRunner().invoke(app, ["export", "ab", str(out), "--to", "robomimic"]).exit_code == 0
    with h5py.File(out) as f, h5py.File(IMAGE) as source:
        assert sorted(f["mask"]) == ["expert", "train", "valid"]
        assert [bytes(x) for x in f["mask/expert"][()]] == [b"demo_4", b"demo_7"]
        assert f["data"].attrs["env_args"] == source["data"].attrs["env_args"]
        assert int(f["data"].attrs["total"]) == merged.num_steps


def test_a_loader_of_a_merges_filter_key_says_how_to_take_it(tmp_path: Path) -> None:
    from rlds_cli.cache.derive import filtered_dataset
    from rlds_cli.errors import InvalidSelectionError

    convert(IMAGE, "a")
    assert CliRunner().invoke(app, ["trim", "a", "--end", "1", "--name", "cut"]).exit_code == 0
    try:
        filtered_dataset(open_dataset("cut"), "train")
    except InvalidSelectionError as exc:
        assert exc.hint == "rlds view cut --filter-key train --name N, then use N"
    else:
        raise AssertionError("a composed dataset's filter key was selected in memory")
    assert CliRunner().invoke(app, ["view", "cut", "--filter-key", "train", "--name", "N"]).exit_code == 0
    assert open_dataset("N").num_episodes == len(filter_key_episodes(open_dataset("a"), "train"))
