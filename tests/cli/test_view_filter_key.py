"""``rlds view NAME --filter-key KEY --name N``: a published view of a filter key's demos."""

from __future__ import annotations

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
