"""``rlds download hf://datasets/ORG/REPO --episodes A:B`` on a LeRobot repo fetches ``meta/``
and then only the data and video files holding those episodes (issue 28), against the local
Hub stand-in (tests/hub_standin.py). The repos are built from the fixture written by lerobot
itself: the v3.0 tree split over two data and two video files (episodes 0-1, then 2) and its
v2.1 rewrite (one parquet and one mp4 per episode), both from :mod:`tests.lerobot_fixtures`.

Each subset is compared with the same episodes of the whole tree converted locally: the same
values and the same episode numbering (``source_id``), whatever part of the repo is on disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import InvalidSelectionError, SourceFormatError
from rlds_cli.sources.convert import convert
from rlds_cli.sources.download import download
from tests.hub_standin import HubStandin, folder_files
from tests.lerobot_fixtures import DATA, FIXTURE, LENGTHS, VIDEO, split_v3_tree, v21_tree

pytest.importorskip("huggingface_hub")
pytest.importorskip("pyarrow")
pytest.importorskip("av")

DATA1 = DATA.with_name("file-001.parquet").as_posix()
VIDEO1 = VIDEO.with_name("file-001.mp4").as_posix()


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The split v3.0 tree and the v2.1 tree, written once for the module (read only)."""
    base = tmp_path_factory.mktemp("lerobot")
    split = base / "split"
    shutil.copytree(FIXTURE, split)
    for p in split.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    split_v3_tree(split)
    return {"split": split, "v21": v21_tree(FIXTURE, base / "v21")}


@pytest.fixture
def hub(hub: HubStandin, trees: dict[str, Path]) -> HubStandin:
    """The stand-in (tests/conftest.py) with ``lr/split`` and ``lr/v21`` (each tree plus the Hub's
    own files)."""
    hub_files = {".gitattributes": b"*.mp4 filter=lfs\n", "README.md": b"# lr\n"}
    for name, root in trees.items():
        hub.add_repo(f"lr/{name}", {**folder_files(root), **hub_files})
    return hub


def _meta(root: Path) -> set[str]:
    return {n for n in folder_files(root) if n.startswith("meta/")}


def _arrays(root: Path, name: str) -> dict[str, bytes]:
    folder = root / "datasets" / name
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _same_as_whole(sub: str, whole: str, first: int) -> None:
    """Every episode ``i`` of ``sub`` is episode ``first + i`` of ``whole``: the same source id
    and length, the same steps (observation, next observation, action, reward...) value for value."""
    a, b = open_dataset(sub), open_dataset(whole)
    assert a.num_episodes > 0
    ids = b.episodes["source_id"][first : first + a.num_episodes].tolist()
    assert a.episodes["source_id"].tolist() == ids
    for e in range(a.num_episodes):
        start, length = int(a.episodes["start"][e]), int(a.episodes["length"][e])
        assert length == int(b.episodes["length"][first + e])
        got = a.gather(np.arange(start, start + length))
        want = b.gather(
            np.arange(int(b.episodes["start"][first + e]), int(b.episodes["start"][first + e]) + length)
        )
        assert set(got) == set(want)
        for key in got:
            if key not in ("index", "episode"):
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize(
    ("episodes", "files", "first"),
    [
        ("2:3", {DATA1, VIDEO1}, 2),  # the last episode lies in files of its own
        ("0:1", {DATA.as_posix(), VIDEO.as_posix()}, 0),  # file-000 holds episodes 0 and 1: fetched whole
        ("1:", {DATA.as_posix(), VIDEO.as_posix(), DATA1, VIDEO1}, 1),  # to the end: both files
    ],
)
def test_v3_subset_fetches_only_the_files_of_its_episodes(
    hub: HubStandin, isolated_cache: Path, trees: dict[str, Path], episodes: str, files: set[str], first: int
) -> None:
    download("hf://datasets/lr/split", name="sub", options={"episodes": episodes})
    fetched = hub.downloads()
    assert sorted(fetched) == sorted(_meta(trees["split"]) | files)  # each file once, nothing else
    # the same episodes of the whole tree on disk: the same arrays, the same numbering
    convert(trees["split"], "local", options={"episodes": episodes})
    assert _arrays(isolated_cache, "sub") == _arrays(isolated_cache, "local")
    convert(trees["split"], "whole")
    _same_as_whole("sub", "whole", first)
    source = json.loads((isolated_cache / "datasets" / "sub" / "manifest.json").read_text())["source"]
    assert sorted(d["name"] for d in source["downloads"]) == sorted(fetched)  # provenance: what was fetched
    whole = len(folder_files(trees["split"]))
    assert source["hub"].get("subset") == (
        {"files": len(fetched), "of": whole} if len(fetched) < whole else None
    )


def test_v21_subset_fetches_one_parquet_and_one_mp4(
    hub: HubStandin, isolated_cache: Path, trees: dict[str, Path]
) -> None:
    download("hf://datasets/lr/v21", name="sub", options={"episodes": "1:2"})
    assert sorted(hub.downloads()) == sorted(
        _meta(trees["v21"])
        | {"data/chunk-000/episode_000001.parquet", "videos/chunk-000/observation.image/episode_000001.mp4"}
    )
    ds = open_dataset("sub")
    assert ds.episodes["source_id"].tolist() == [1] and ds.num_steps == LENGTHS[1]
    convert(trees["v21"], "local", options={"episodes": "1:2"})
    assert _arrays(isolated_cache, "sub") == _arrays(isolated_cache, "local")
    convert(trees["v21"], "whole")
    _same_as_whole("sub", "whole", 1)
    # a second subset download of the same episodes is served from the verified files
    hub.log.clear()
    download("hf://datasets/lr/v21", name="again", options={"episodes": "1:2"})
    assert hub.downloads() == []


def test_episodes_out_of_range_fetch_nothing_beyond_meta(
    hub: HubStandin, isolated_cache: Path, trees: dict[str, Path]
) -> None:
    with pytest.raises(InvalidSelectionError, match="selects none of the 3 episodes") as caught:
        download("hf://datasets/lr/v21", options={"episodes": "5:7"})
    assert caught.value.hint == "ask for A:B with A < 3"
    assert set(hub.downloads()) == _meta(trees["v21"])
    # through the CLI: one line, exit 1, nothing published
    hub.log.clear()
    result = CliRunner().invoke(
        app, ["download", "hf://datasets/lr/split", "--episodes", "3:", "--name", "x"]
    )
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: episodes 3: selects none of the 3 episodes") and len(lines) <= 2, lines
    assert "Traceback" not in result.output
    assert set(hub.downloads()) == _meta(trees["split"])
    assert not (isolated_cache / "datasets" / "x").exists()


def test_meta_naming_a_file_the_repo_lacks_is_one_error(hub: HubStandin, trees: dict[str, Path]) -> None:
    files = folder_files(trees["split"])
    del files[DATA1]  # the episodes table still names it for episode 2
    hub.repos["lr/split"].add_commit(files)
    with pytest.raises(SourceFormatError, match=r"names 'data/chunk-000/file-001\.parquet' .* does not hold"):
        download("hf://datasets/lr/split", options={"episodes": "2:3"})
    assert set(hub.downloads()) == _meta(trees["split"])


def test_local_folder_episodes_read_the_same_as_before(isolated_cache: Path, trees: dict[str, Path]) -> None:
    """A local folder with ``--episodes`` keeps what it gave: the episodes of the whole stream,
    with their source ids and values, and the whole source's counts in the conversion report."""
    convert(trees["split"], "sub", options={"episodes": "1:3"})
    convert(trees["split"], "whole")
    _same_as_whole("sub", "whole", 1)
    sub, whole = open_dataset("sub"), open_dataset("whole")
    assert sub.episodes["source_id"].tolist() == [1, 2]
    # the same report but for the final observations made up: one per episode read, now the kept ones
    assert sub.manifest.conversion["synthesized_final_observations"] == 2
    assert {**sub.manifest.conversion, "synthesized_final_observations": 3} == whole.manifest.conversion
    assert sub.manifest.source["checks"] == whole.manifest.source["checks"] | {
        "nan_counts": sub.manifest.source["checks"]["nan_counts"]
    }
    # and the files of the other episodes need not be there
    partial = isolated_cache.parent / "partial"
    shutil.copytree(trees["split"], partial)
    (partial / DATA).unlink()
    (partial / VIDEO).unlink()
    convert(partial, "tail", options={"episodes": "2:"})
    _same_as_whole("tail", "whole", 2)
    with pytest.raises(
        SourceFormatError,
        match=r"file-000\.mp4 is missing \(named by meta/info.json.s video_path for episode 1\)",
    ):
        convert(partial, "head", options={"episodes": "1:2"})


def test_a_format_that_cannot_tell_fetches_every_file(hub: HubStandin, trees: dict[str, Path]) -> None:
    """A reader without the hooks (D4RL, named by --format) gets every file, as without --episodes."""
    with pytest.raises(SourceFormatError, match="8 D4RL files"):
        download("hf://datasets/lr/split", format="d4rl", options={"episodes": "2:3"})
    assert sorted(hub.downloads()) == sorted(folder_files(trees["split"]))
