"""``rlds merge``, ``drop``, ``trim`` and ``downsample`` end to end through the CLI: the results
list, inspect, ``--check``, verify, sample and export like any dataset; refusals are one line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from rlds_cli.cli.app import app
from tests.formats_fixtures import refused
from tests.loader_fixtures import make_ted

runner = CliRunner()
pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(250, 250)]


def invoke(*args: str) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


@pytest.fixture
def ab() -> None:
    home = Path(os.environ["RLDS_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    make_ted(home, "a", [3, 4, 5])
    make_ted(home, "b", [2, 6])


@pytest.mark.usefixtures("ab")
def test_merge_drop_trim_downsample_from_the_cli(tmp_path: Path) -> None:
    from rlds_cli import Loader, open_dataset

    assert ok_json("merge", "a", "b", "--name", "c") == {
        "name": "c",
        "parents": ["a", "b"],
        "layout": "composed",
        "num_steps": 20,
        "num_episodes": 5,
    }
    assert (
        "c: merged from a, b (5 episodes, 20 steps), sharing its parents' arrays"
        in ok("merge", "a", "b", "-n", "c", "--force", "--no-verify").stdout
    )
    assert ok_json("drop", "c", "--episodes", "0,3-4", "--name", "cd")["num_episodes"] == 2
    trimmed = ok_json("trim", "c", "--start", "1", "--end", "1", "--name", "ct")
    assert (trimmed["num_episodes"], trimmed["num_steps"]) == (4, 10)  # the 2-step episode is left out
    assert ok_json("downsample", "ct", "--every", "2", "--name", "cts")["num_steps"] == 6
    # a split or view of a merged dataset is a composed selection, reported as views are
    split = ok_json("split", "c", "--val", "0.4", "--name", "cs")
    assert [s["num_episodes"] for s in split] == [3, 2] and split[0]["parent"] == "c"
    assert "episodes 1:3 of c" in ok("view", "c", "--episodes", "1:3", "--name", "cv").stdout
    listing = ok("list").stdout
    assert "merge of a, b" in listing and "trim of c" in listing and "one step in 2 of ct" in listing
    for name in ("c", "cd", "ct", "cts"):
        assert "check passed" in ok("inspect", name, "--check").stdout
        assert "verified" in ok("verify", name).stdout
    shown = ok("inspect", "c").stdout
    assert "derived from a" in shown and "by merge" in shown and "the arrays: its parents'" in shown
    batch = next(iter(Loader("ct", batch_size=4, seed=0)))
    assert tuple(batch["observation"].shape) == (4, 3)
    ok("export", "ct", tmp_path / "ct.hdf5", "--to", "d4rl")
    ok("download", tmp_path / "ct.hdf5", "--name", "ct-copy")
    np.testing.assert_array_equal(
        open_dataset("ct-copy")[:]["next/reward"], open_dataset("ct")[:]["next/reward"]
    )
    refused(
        invoke("rm", "a", "--yes"),
        "'a' is the parent of c",
        published=("a", "b", "c", "cd", "ct", "cts", "ct-copy", "cs-train", "cs-val", "cv"),
    )


@pytest.mark.usefixtures("ab")
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("merge", "a", "--name", "x"), ("needs two datasets or more",)),
        (("merge", "a", "a", "--name", "x"), ("'a' is named twice",)),
        (("merge", "a", "nope", "--name", "x"), ("nope",)),
        (("drop", "a", "--episodes", "0-2", "--name", "x"), ("would leave dataset 'a' with none",)),
        (("drop", "a", "--episodes", "1,7", "--name", "x"), ("episode 7 in '1,7' is outside",)),
        (
            ("drop", "a", "--episodes", "1,b", "--name", "x"),
            ("'b' in --episodes '1,b' is no episode position or range",),
        ),
        (("drop", "a", "--episodes", "2:2", "--name", "x"), ("--episodes '2:2' selects no episode",)),
        (("trim", "a", "--name", "x"), ("--start 0 --end 0",)),
        (
            ("trim", "a", "--start", "3", "--end", "3", "--name", "x"),
            ("no episode of dataset 'a' is longer than 6",),
        ),
        (("downsample", "a", "--every", "1", "--name", "x"), ("--every must be 2 or more",)),
    ],
)
def test_refusals_are_one_line_and_publish_nothing(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    refused(invoke(*args), *needles, hint=True, published=("a", "b"))


@pytest.mark.usefixtures("ab")
def test_one_range_a_b_selects_in_every_command_that_takes_episodes() -> None:
    """``drop --episodes 0:2`` was refused ("no episode position or range") though its hint offered
    "one range A:B"; ``--episodes`` is a list (``0,5,9-20``) or one range (``A:B``) everywhere."""
    assert ok_json("drop", "a", "--episodes", "-2:", "--name", "first")["num_steps"] == 3
    assert (
        ok_json("view", "b", "--episodes", "1:", "--where", "length > 0", "--name", "late")["num_steps"] == 6
    )
    val = ok_json("split", "a", "--val-episodes", "0:2", "--name", "s")[1]
    assert (val["name"], val["num_steps"]) == ("s-val", 7)
    mixed = invoke("view", "a", "--episodes", "0:2,b", "--name", "x")  # the hint gives both forms
    published = ("a", "b", "first", "late", "s-train", "s-val")
    refused(mixed, "episode range '0:2,b' is not of the form A:B", hint=True, published=published)
    assert "e.g. 0,5,9-20 (or one range A:B)" in mixed.stderr
    empty = invoke("split", "a", "--val-episodes", "0:0", "--name", "s2")  # it named --episodes
    refused(empty, "--val-episodes '0:0' selects no episode", hint=True, published=published)


@pytest.mark.usefixtures("ab")
def test_a_schema_difference_is_named() -> None:
    home = Path(os.environ["RLDS_HOME"])
    ok("downsample", "a", "--every", "2", "--name", "a2")
    assert "observation" in ok_json("inspect", "a2")["fields"]
    # another schema: a dataset whose reward key is float64
    from rlds_cli.cache import DatasetBuilder
    from rlds_cli.cache.ted import StepBlock

    block = StepBlock(
        steps={
            "action": np.zeros((2, 2), np.float32),
            "next/reward": np.zeros(2, np.float64),
            "next/terminated": np.array([False, True]),
            "next/truncated": np.zeros(2, bool),
        },
        observations={"observation": np.zeros((3, 3), np.float32)},
        ends=np.array([1]),
    )
    with DatasetBuilder("f64", root=home) as builder:
        builder.append(block)
        builder.commit()
    refused(
        invoke("merge", "a", "f64", "--name", "x"),
        "cannot merge 'a' and 'f64': key 'next/reward' has dtype float32 in 'a' and float64 in 'f64'",
        hint=True,
        published=("a", "b", "a2", "f64"),
    )


def test_the_json_of_a_selection_lists_its_episodes(ab: None) -> None:
    """``view -e 0,2 --json`` and ``split --json`` gave only the span of the episodes chosen
    (``"episodes": [0, 3]``), not which they are."""
    row = ok_json("view", "a", "-e", "0,2", "-n", "sel")
    assert row["episode_ids"] == [0, 2] and row["num_episodes"] == 2
    rows = ok_json("split", "a", "--val", "0.5", "-n", "sp")
    chosen = [r.get("episode_ids", list(range(*r["episodes"]))) for r in rows]  # a run is stored as a range
    assert sorted(chosen[0] + chosen[1]) == [0, 1, 2]
    assert "episode_ids" not in ok_json("view", "a", "-e", "0:2", "-n", "rng")  # a range is its span


def test_a_selection_of_a_replaced_merge_still_protects_the_parents_it_reads(ab: None) -> None:
    """A selection of a merge reads the merge's parents; its lineage names the merge alone. Once the
    merge was replaced, 'rm a' deleted a dataset the selection read (exit 0), and 'view ... -n a -f'
    replaced a with a view of itself (a's arrays deleted, neither opened again)."""
    ok("view", "a", "-e", "0:2", "-n", "a2")
    ok("merge", "a2", "b", "-n", "m")
    ok("view", "m", "-e", "0,3", "-n", "pick")
    ok("view", "b", "-e", "0:1", "-n", "b1")
    ok("merge", "b", "b1", "-n", "m", "--force")  # the merge no longer reads a2
    every = ("a", "a2", "b", "b1", "m", "pick")
    refused(invoke("rm", "a2", "--yes"), "dataset 'a2' is the parent of pick", hint=True, published=every)
    replace = invoke("view", "pick", "-e", "0", "-n", "a2", "--force")
    refused(replace, "dataset 'a2' cannot be replaced by a dataset made from it", hint=True, published=every)
    ok("inspect", "pick", "--check")
    # verify checks the parents it reads (it failed on the replaced merge, which it does not read)
    checks = {c["check"]: c["status"] for c in ok_json("verify", "pick")["checks"]}
    assert checks["parent a2 version"] == checks["parent b version"] == "pass"
    assert checks["parent m version"] == "skipped"
    ok("view", "a", "-e", "0:1", "-n", "a2", "--force")
    assert invoke("verify", "pick").exit_code == 1


def test_rm_of_a_parent_names_every_dataset_made_from_it_and_what_force_does(ab: None) -> None:
    """The hint's command named the direct children alone (it then refused again for theirs), and
    said --force leaves a downsampled copy unreadable (it keeps its own arrays)."""
    ok("view", "a", "-e", "0:2", "-n", "a2")
    ok("merge", "a2", "b", "-n", "m")
    ok("downsample", "b", "-k", "2", "-n", "bd")
    every = ("a", "a2", "b", "m", "bd")
    result = invoke("rm", "a2", "--yes")
    refused(result, "dataset 'a2' is the parent of m", hint=True, published=every)
    assert "('rlds rm a2 m --yes'), or pass --force to leave m unreadable" in result.stderr
    result = invoke("rm", "b", "--yes")
    refused(result, "dataset 'b' is the parent of bd, m", hint=True, published=every)
    assert "'rlds rm b bd m --yes'" in result.stderr
    ok("rm", "a", "a2", "m", "--yes")
    result = invoke("rm", "b", "--yes")
    refused(result, "dataset 'b' is the parent of bd", hint=True, published=("b", "bd"))
    assert "pass --force to remove it anyway (copies made from it keep their own data)" in result.stderr


def test_damage_to_a_file_two_parts_read_is_named_once_with_its_owner(ab: None) -> None:
    """A merge of two views of 'a' listed a damaged file of 'a' twice (verify, inspect --check),
    with the hint to make the merge again, which reads the same damaged file."""
    from rlds_cli.cache.root import CacheRoot

    ok("view", "a", "-e", "0:1", "-n", "v1")
    ok("view", "a", "-e", "1:3", "-n", "v2")
    ok("merge", "v1", "v2", "-n", "m")
    path = CacheRoot().dataset_dir("a") / "arrays" / "action.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    checks = json.loads(invoke("verify", "m", "--json").stdout)["checks"]
    failed = [c for c in checks if c["status"] == "fail"]
    assert [c["check"] for c in failed] == ["content digest of action"]
    assert "the file is 'a''s, changed on disk: 'rlds verify a'" in failed[0]["hint"]
    assert invoke("inspect", "m", "--check").stdout.count(f"{path}: content changed") == 1
    path.write_bytes(bytes(data[:-3]))
    checks = json.loads(invoke("verify", "m", "--json").stdout)["checks"]
    failed = [c for c in checks if c["status"] == "fail"]
    assert [c["check"] for c in failed] == ["files complete"] and failed[0]["detail"].count(str(path)) == 1


def test_a_shaping_command_that_replaces_a_parent_names_what_now_refuses_to_read(ab: None) -> None:
    """'rlds download --force' warned of the views it left unreadable; view, trim, merge... with
    --force said nothing."""
    ok("trim", "a", "--start", "1", "-n", "t")
    ok("merge", "t", "b", "-n", "tb")
    replaced = ok("view", "a", "-e", "0:2", "-n", "t", "--force")
    assert "1 dataset(s) made from the replaced 't' now refuse to read: tb" in replaced.stderr
    again = ok("downsample", "b", "-k", "2", "-n", "t", "--force")
    assert "now refuse to read: tb" in again.stderr
    assert "refuse to read" not in ok("view", "a", "-e", "0:1", "-n", "fresh", "--force").stderr


def test_gc_keeps_a_dataset_folder_that_lost_its_manifest(ab: None) -> None:
    """A published folder never lacks its manifest: gc took one without it for a leftover and
    deleted the arrays its views read. It is kept and named; an empty folder is still removed."""
    from rlds_cli.cache.root import CacheRoot

    ok("view", "a", "-e", "0:2", "-n", "v")
    folder = CacheRoot().dataset_dir("a")
    manifest = (folder / "manifest.json").read_bytes()
    (folder / "manifest.json").unlink()
    empty = CacheRoot().datasets_dir / "empty-leftover"
    empty.mkdir()
    result = ok("gc")
    assert f"kept {folder}: it holds files but no manifest.json" in result.stderr
    assert folder.is_dir() and not empty.exists()
    assert ok_json("gc", "--dry-run")["damaged"] == [str(folder)]
    (folder / "manifest.json").write_bytes(manifest)
    ok("inspect", "v", "--check")
