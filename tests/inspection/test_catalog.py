"""``rlds_cli.inspection.listing``: the cache and the registry as typed records, the same facts ``rlds list``,
``rlds list --remote`` and ``rlds info`` print (their ``--json`` is these records' ``to_dict()``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cli.app import app
from rlds_cli.cli.output import human_bytes
from rlds_cli.errors import UnknownDatasetIdError
from rlds_cli.inspection import listing as catalog
from rlds_cli.sources.convert import convert
from rlds_cli.sources.download import download
from tests.d4rl_fixtures import golden_expected


def cli_json(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def test_the_records_are_public_lazy_names() -> None:
    assert rlds_cli.list_datasets is catalog.list_datasets
    assert rlds_cli.list_registry is catalog.list_registry
    assert rlds_cli.registry_status is catalog.registry_status
    assert rlds_cli.CachedDataset is catalog.CachedDataset
    assert rlds_cli.RegistryDataset is catalog.RegistryDataset


def test_list_datasets(
    tmp_path: Path, isolated_cache: Path, golden_file: Path, golden_next_file: Path
) -> None:
    assert catalog.list_datasets() == []
    source = golden_file
    convert(source, "golden")
    convert(golden_next_file, "golden-next", backend="zarr")
    convert(source, "other")

    found = catalog.list_datasets()
    assert [d.name for d in found] == ["golden", "golden-next", "other"]  # sorted by name
    golden = found[0]
    expected = golden_expected(with_next=False)
    assert (golden.num_steps, golden.num_episodes) == (expected["num_steps"], expected["num_episodes"])
    assert (golden.backend, golden.format, golden.source) == ("memmap", "d4rl", str(source.resolve()))
    assert golden.derived_from == [] and golden.created_at
    assert golden.size_bytes == sum(
        p.stat().st_blocks * 512 for p in (isolated_cache / "datasets" / "golden").rglob("*") if p.is_file()
    )
    assert found[1].backend == "zarr"

    # a pattern: a substring, or a glob over the whole name; any case
    assert [d.name for d in catalog.list_datasets("GOLDEN")] == ["golden", "golden-next"]
    assert [d.name for d in catalog.list_datasets("g*n")] == ["golden"]
    assert catalog.list_datasets("zzz") == []
    # another root, given as a path
    assert catalog.list_datasets(root=tmp_path / "elsewhere") == []

    # `rlds list --json` prints these records
    listing = cli_json("list")
    assert listing == {"root": str(isolated_cache), "datasets": [d.to_dict() for d in found]}
    assert list(golden.to_dict()) == [
        "name", "num_steps", "num_episodes", "size_bytes", "backend", "source", "format",
        "derived_from", "created_at", "damaged",
    ]  # fmt: skip


def test_list_registry() -> None:
    door = catalog.list_registry("D4RL/door/*")
    assert [e.id for e in door] == ["D4RL/door/cloned-v2", "D4RL/door/expert-v2", "D4RL/door/human-v2"]
    cloned = door[0]
    # published figures only (Minari's table): approximate, never the exact counts
    assert (cloned.approx_num_steps, cloned.approx_size_bytes, cloned.num_episodes) == (
        1_000_000,
        1_077_700_000,
        4356,
    )
    assert cloned.published is not None and "Minari" in cloned.published["source"]
    assert cloned.size_bytes is None and (cloned.downloaded, cloned.cached) == (False, False)
    # found by an alias or the description too; everything without a pattern
    assert [e.id for e in catalog.list_registry("pointmass")] == ["pointmass-demo-v0"]
    assert "pointmass-demo-v0" in [e.id for e in catalog.list_registry("rlds/pointmass")]  # an alias
    assert "hopper-medium-v2" in [e.id for e in catalog.list_registry("gym_mujoco_v2")]
    assert catalog.list_registry("zzz") == []
    everything = catalog.list_registry()
    assert len(everything) > len(door) and [e.id for e in everything] == sorted(e.id for e in everything)

    rows = cli_json("list", "--remote", "D4RL/door/*")["datasets"]
    assert rows == [e.to_dict() for e in door]


def test_registry_status(isolated_cache: Path) -> None:
    demo = catalog.registry_status("demo")  # an alias
    assert demo.id == "pointmass-demo-v0" and "demo" in demo.aliases
    assert (demo.cached, demo.num_steps, demo.num_steps_origin) == (False, 5000, "registry")
    assert [f["name"] for f in demo.files] == ["pointmass-demo-v0.hdf5"]
    assert cli_json("info", "demo") == demo.to_dict()

    download("demo", root=isolated_cache)
    converted = catalog.registry_status("pointmass-demo-v0", root=isolated_cache)
    assert (converted.cached, converted.num_steps_origin) == (True, "cache")
    cached = catalog.list_datasets(root=isolated_cache)
    assert [(d.name, d.num_steps) for d in cached] == [(converted.cache_name, converted.num_steps)]

    with pytest.raises(UnknownDatasetIdError):
        catalog.registry_status("no-such-dataset-v0")


def test_a_dataset_named_like_an_entry_is_not_that_entry(isolated_cache: Path) -> None:
    """A view named ``hopper-medium-v2`` was shown by ``rlds info`` and ``list --remote`` as the
    D4RL entry converted, with the view's step count."""
    download("demo", root=isolated_cache)
    result = CliRunner().invoke(app, ["view", "demo", "-e", "0:3", "-n", "hopper-medium-v2"])
    assert result.exit_code == 0, result.output
    hopper = catalog.registry_status("hopper-medium-v2", root=isolated_cache)
    assert not hopper.cached and hopper.num_steps_origin != "cache"
    info = cli_json("info", "hopper-medium-v2")
    view_steps = rlds_cli.open_dataset("hopper-medium-v2", root=isolated_cache).num_steps
    assert info["cached"] is False and info["num_steps"] != view_steps
    assert catalog.registry_status("demo", root=isolated_cache).cached  # the real one still is


def test_list_and_inspect_show_one_size(isolated_cache: Path, golden_file: Path) -> None:
    """One dataset has one size: ``rlds list`` and ``rlds inspect`` (and ``rlds du``) show the
    same figure, its directory's disk use in allocated blocks, for memmap, zarr and a view."""
    convert(golden_file, "golden")
    convert(golden_file, "golden-zarr", backend="zarr")
    CliRunner().invoke(app, ["split", "golden", "--val", "0.34"])
    listed = {row["name"]: row["size_bytes"] for row in cli_json("list")["datasets"]}  # type: ignore[index, union-attr]
    assert set(listed) == {"golden", "golden-zarr", "golden-train", "golden-val"}
    usage = cli_json("du")["datasets"]
    for name, size in listed.items():
        directory = isolated_cache / "datasets" / name
        blocks = sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())
        assert size == blocks == cli_json("inspect", name)["size_bytes"] == usage[name]  # type: ignore[index]
        assert rlds_cli.open_dataset(name).size_bytes() == size
        human = CliRunner().invoke(app, ["inspect", name, "--no-stats"]).stdout.splitlines()[0]
        assert f"{human_bytes(size)} on disk" in human, human
        assert human.endswith(str(directory)), human  # the path whole on the first line, not wrapped
