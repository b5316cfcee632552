"""Damaged caches: a manifest or an episode index edited, truncated or written wrong is refused
when the dataset is opened, with one error naming the file (never ``unexpected ...``, never data
served through a wrong index), through the CLI and the library alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli import open_dataset
from rlds_cli.cache.integrity import check_episode_index, check_manifest_data
from rlds_cli.cache.manifest import parse_manifest, read_manifest
from rlds_cli.cache.ted import EPISODE_DTYPE
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError
from tests.dataset_fixtures import make_dataset, rewrite_manifest

LENGTHS = [3, 4, 5]
runner = CliRunner()


def _dataset_dir() -> Path:
    make_dataset("d", LENGTHS)
    return open_dataset("d").directory


def _edit_manifest(edit: Callable[[dict[str, Any]], None]) -> Path:
    """The manifest written wrong with a valid own digest: the checks behind the digest must catch it."""
    return rewrite_manifest(_dataset_dir(), edit)


def _edit_index(edit: Callable[[np.ndarray], np.ndarray]) -> Path:
    path = _dataset_dir() / "episodes.npy"
    np.save(path, edit(np.load(path)), allow_pickle=False)
    return path


def _set(index: np.ndarray, field: str, values: list[int]) -> np.ndarray:
    index[field] = values
    return index


def _set_field_spec(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda m: m["fields"].__setitem__(key, value)


def _field(key: str, entry: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda m: m["fields"][key].__setitem__(entry, value)


#: name -> (damage, the file it damages, what the message says)
MANIFEST_DAMAGE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "declared field dropped": (lambda m: m["fields"].pop("next/terminated"), "declares no 'next/terminated'"),
    "observation dropped": (lambda m: m["fields"].pop("observation"), "no observation-like field"),
    "fields a list": (lambda m: m.__setitem__("fields", list(m["fields"])), "'fields' must be a JSON object"),
    "field spec a string": (_set_field_spec("action", "float32"), "field 'action': its spec"),
    "shape a string": (_field("action", "shape", "1"), "field 'action': 'shape' must be a list"),
    "shape negative": (_field("observation", "shape", [-2]), "'shape' must be a list of integers >= 0"),
    "dtype float99": (_field("action", "dtype", "float99"), "'float99' is no numpy dtype"),
    "dtype object": (_field("action", "dtype", "O"), "holds Python objects"),
    "storage unknown": (_field("action", "storage", "ragged"), "'storage' must be one of flat, step"),
    "num_steps negative": (lambda m: m.__setitem__("num_steps", -1), "'num_steps' must be an integer >= 0"),
    "num_steps a bool": (lambda m: m.__setitem__("num_steps", True), "got True"),
    "num_steps a string": (lambda m: m.__setitem__("num_steps", "12"), "got '12'"),
    "num_episodes missing": (lambda m: m.pop("num_episodes"), "'num_episodes' must be an integer"),
    "more episodes than steps": (lambda m: m.__setitem__("num_episodes", 13), "13 episodes cannot fit in 12"),
    "name not a string": (lambda m: m.__setitem__("name", 5), "'name' must be a non-empty string"),
    "backend unknown": (lambda m: m.__setitem__("backend", "hdf5"), "'backend' is 'hdf5'"),
    "source a list": (lambda m: m.__setitem__("source", []), "'source' must be a JSON object"),
}

INDEX_DAMAGE: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "starts shuffled": (lambda i: _set(i, "start", [0, 7, 3]), "episode 2 starts at step 3, not after"),
    "first start not 0": (lambda i: _set(i, "start", [1, 3, 7]), "episode 0 starts at step 1, not 0"),
    "gap between episodes": (lambda i: _set(i, "start", [0, 4, 7]), "not right after episode 0 (steps 0..2)"),
    "lengths not summing": (lambda i: _set(i, "length", [3, 4, 6]), "hold 13 steps, the manifest says 12"),
    "zero length": (lambda i: _set(i, "length", [0, 7, 5]), "episode 0 has length 0"),
    "negative length": (lambda i: _set(i, "length", [-1, 8, 5]), "episode 0 has length -1"),
    "huge length": (lambda i: _set(i, "length", [2**62, 4, 5]), "more than the 12 steps"),
    "episode dropped": (lambda i: i[:2], "it has 2 episodes, the manifest says 3"),
    "plain int64 rows": (lambda i: i["length"].copy(), "its rows are int64"),
    "int32 starts": (
        lambda i: i.astype([("start", "<i4"), ("length", "<i8"), ("source_id", "<i8"), ("final_known", "?")]),
        "not the episode index's",
    ),
    "2-d": (lambda i: i.reshape(1, 3), "2-d"),
}


def _damage(case: str) -> tuple[Path, str]:
    if case in MANIFEST_DAMAGE:
        edit, says = MANIFEST_DAMAGE[case]
        return _edit_manifest(edit), says
    damage, says = INDEX_DAMAGE[case]
    return _edit_index(damage), says


ALL_CASES = [*MANIFEST_DAMAGE, *INDEX_DAMAGE]


def _clean_failure(args: list[str]) -> tuple[str, str]:
    """Run the CLI; assert exit 1, an ``error:`` line (plus at most a hint), no traceback."""
    result = runner.invoke(app, args, env={"NO_COLOR": "1", "COLUMNS": "400"})
    assert result.exit_code == 1, (result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), lines
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint: ")), lines
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr + result.stdout
    return lines[0], result.stdout


@pytest.mark.parametrize("case", ALL_CASES)
@pytest.mark.parametrize("command", [["inspect", "d"], ["inspect", "d", "--check"]])
def test_inspect_refuses_a_damaged_cache(case: str, command: list[str]) -> None:
    path, says = _damage(case)
    line, _ = _clean_failure(command)
    assert str(path) in line and says in line, line


@pytest.mark.parametrize("case", ALL_CASES)
def test_verify_names_the_damage(case: str) -> None:
    path, says = _damage(case)
    line, stdout = _clean_failure(["verify", "d"])
    # a malformed manifest stops verify at once; a damaged index fails its "dataset opens" check
    assert (str(path) in line and says in line) or (str(path) in stdout and says in stdout), (line, stdout)


def test_every_flipped_byte_of_a_manifest_is_refused() -> None:
    """One flipped bit anywhere in manifest.json (a value, a key's name, the digest, the layout)
    is damage: no flip yields a manifest that reads."""
    path = _dataset_dir() / "manifest.json"
    good = path.read_bytes()
    read_manifest(path.parent)
    for offset in range(len(good)):
        flipped = bytearray(good)
        flipped[offset] ^= 0x01
        with pytest.raises(CorruptDatasetError):
            parse_manifest(bytes(flipped), path)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["conversion"].__setitem__("dropped_rows", 1),  # a value no other check reads
        lambda m: m.__setitem__("content_digesu", m.pop("content_digest")),  # the digests' name
        lambda m: m["content_digest"].__setitem__("columnz", m["content_digest"].pop("columns")),
    ],
)
def test_a_manifest_edited_after_rlds_wrote_it_fails_every_check(
    edit: Callable[[dict[str, Any]], Any],
) -> None:
    path = _dataset_dir() / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))
    for command in (["inspect", "d", "--check"], ["verify", "d"]):
        line, out = _clean_failure(command)  # verify: its failed check says it, the error sums up
        assert f"manifest {path} does not match its own digest" in line + out, (line, out)


def test_an_older_manifest_holding_a_key_no_rlds_writes_is_refused() -> None:
    """Without its own digest (an older rlds's manifest) a damaged key name is still damage."""
    path = rewrite_manifest(
        _dataset_dir(), lambda m: m.__setitem__("manifest_sha257", "0" * 64), signed=False
    )
    line, _ = _clean_failure(["inspect", "d", "--check"])
    assert f"manifest {path} holds 'manifest_sha257', a key no rlds writes" in line, line
    rewrite_manifest(path, lambda m: m.pop("manifest_sha257"), signed=False)
    assert runner.invoke(app, ["verify", "d"]).exit_code == 0  # an older manifest: still read


def test_the_hint_says_verify_and_how_to_rebuild_or_remove() -> None:
    _damage("starts shuffled")
    result = runner.invoke(app, ["inspect", "d"], env={"NO_COLOR": "1", "COLUMNS": "400"})
    hint = result.stderr.splitlines()[1]
    assert "rlds verify d" in hint and "how to make this dataset again" in hint and "rlds rm d" in hint, hint
    # verify names the command for this kind of dataset (it said 'rlds download ... --force' for all)
    verified = runner.invoke(app, ["verify", "d"], env={"NO_COLOR": "1", "COLUMNS": "400"})
    assert verified.exit_code == 1 and "--name d --force" in verified.stderr, verified.stderr


@pytest.mark.parametrize("case", ALL_CASES)
def test_the_library_refuses_a_damaged_cache(case: str) -> None:
    path, says = _damage(case)
    with pytest.raises(CorruptDatasetError) as info:
        open_dataset("d")
    assert str(path) in info.value.message and says in info.value.message
    with pytest.raises(CorruptDatasetError, match=str(path.name)):
        rlds_cli.Loader("d", batch_size=4, seed=0)


def test_a_healthy_index_and_a_view_still_open() -> None:
    make_dataset("d", LENGTHS)
    assert open_dataset("d").num_episodes == 3
    result = runner.invoke(app, ["view", "d", "--episodes", "1:3", "--name", "v"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    view = open_dataset("v")
    assert view.num_steps == 9 and list(view.episodes["start"]) == [0, 4]


def test_an_empty_index_matches_an_empty_manifest_only() -> None:
    empty = np.zeros(0, EPISODE_DTYPE)
    assert check_episode_index(empty, 0, 0, "episodes.npy") is empty
    with pytest.raises(CorruptDatasetError, match="no episodes, the manifest says 5 steps"):
        check_episode_index(empty, 5, 0, "x/episodes.npy")


def test_a_growing_head_need_not_declare_every_field() -> None:
    head = {"name": "g", "backend": "memmap", "num_steps": 0, "num_episodes": 0, "fields": {}}
    head["layout"] = "segmented"
    check_manifest_data(head, "g/manifest.json")
    with pytest.raises(CorruptDatasetError, match="declares no 'action'"):
        check_manifest_data({**head, "layout": "flat-ted"}, "g/manifest.json")


@pytest.mark.parametrize("case", ["fields a list", "dtype float99", "starts shuffled", "plain int64 rows"])
def test_rm_removes_a_damaged_dataset(case: str) -> None:
    """The hint's way out works: 'rlds rm' does not need a readable manifest."""
    path, _ = _damage(case)
    result = runner.invoke(app, ["rm", "d", "--yes"])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert not path.parent.exists()


def test_a_damaged_segment_of_a_growing_dataset_is_refused() -> None:
    from tests.write.test_writer import episode

    with rlds_cli.DatasetWriter("g") as writer:
        writer.add_episode(episode(3))
        writer.add_episode(episode(4, 10.0))
    grown = open_dataset("g")
    assert grown.num_episodes == 2
    index_file = sorted(grown.directory.glob("segments/*/episodes.npy"))[0]
    index = np.load(index_file)
    index["start"] += 1
    np.save(index_file, index, allow_pickle=False)
    with pytest.raises(
        CorruptDatasetError, match=r"segments/.*episodes\.npy is damaged: episode 0 starts at step 1"
    ):
        open_dataset("g")


def test_a_pushed_dataset_with_a_damaged_index_is_refused_where_it_lies() -> None:
    """A dataset read in place from a store (rlds_cli.remote.reader) passes the same check: here
    an index whose starts were shuffled, its files-index entry made to match (a store the push
    did not write that way)."""
    import hashlib
    import io

    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    from rlds_cli.remote.push import push
    from rlds_cli.remote.store import INDEX_FILE, index_bytes

    url = "memory://bucket/damaged/z"
    try:
        make_dataset("z", LENGTHS, backend="zarr")
        push("z", url)
        assert open_dataset(url).num_episodes == 3
        fs = fsspec.filesystem("memory")
        index = np.load(io.BytesIO(fs.cat(f"{url}/episodes.npy")))
        index["start"] = [0, 7, 3]
        buffer = io.BytesIO()
        np.save(buffer, index, allow_pickle=False)
        data = buffer.getvalue()
        fs.pipe(f"{url}/episodes.npy", data)
        files = json.loads(fs.cat(f"{url}/{INDEX_FILE}"))
        files["files"]["episodes.npy"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        fs.pipe(f"{url}/{INDEX_FILE}", index_bytes(files))  # an index edited to match
        with pytest.raises(
            CorruptDatasetError, match=r"episodes\.npy is damaged: episode 2 starts at step 3"
        ):
            open_dataset(url)
    finally:
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]


def test_list_says_which_dataset_it_cannot_list() -> None:
    path, says = _damage("fields a list")
    make_dataset("ok", [2, 2])
    result = runner.invoke(app, ["list"], env={"NO_COLOR": "1", "COLUMNS": "400"})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "ok" in result.stdout and "\nd " not in result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith("warning: not listed: ") and str(path) in line and says in line
    assert "rlds verify d" in line
    result = runner.invoke(app, ["list", "--json"], env={"NO_COLOR": "1", "COLUMNS": "400"})
    assert [d["name"] for d in json.loads(result.stdout)["datasets"]] == ["ok"]
    # a deleted manifest: the folder of arrays left the listing without a word (gc named it)
    path.unlink()
    result = runner.invoke(app, ["list"], env={"NO_COLOR": "1", "COLUMNS": "400"})
    (line,) = result.stderr.splitlines()
    assert line.startswith("warning: not listed: ") and "holds files but no manifest.json" in line
    assert str(path.parent) in line
