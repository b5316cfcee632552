"""``rlds export NAME hf://datasets/ORG/REPO --to lerobot`` (issue 28): a LeRobot v3.0 export
committed to a Hub dataset repo in one commit, offline against the Hub stand-in
(tests/hub_standin.py).

The ``lerobot`` package is not installed here, so its loader cannot be run: the pushed files are
compared with the fixture lerobot itself wrote (tests/fixtures/lerobot-v3-tiny, the same files as
/work/shared/fixtures/lerobot-v3-tiny) instead: the layout, ``info.json``'s keys and the parquet
schemas of each kind of file, feature names aside (the data differ). Then ``rlds download`` of
the repo converts it back through rlds's own LeRobot reader.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from tests.hub_standin import HubStandin
from tests.remote.test_hub_push import REPO_URL, hub, main_files  # noqa: F401 - the fixture
from tests.remote.test_remote import make_demo, runner

pytest.importorskip("huggingface_hub")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("av")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot-v3-tiny"
#: Columns every LeRobot v3.0 file of a kind has, whatever the features (the fixture's names).
BOOKKEEPING = {"timestamp", "frame_index", "episode_index", "index", "task_index"}


def _export(name: str, url: str, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["export", name, url, "--to", "lerobot", "--json", *extra])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _pattern(rel: str) -> str:
    """A file's kind: chunk and file numbers, and a video's feature name, generalised."""
    rel = re.sub(r"chunk-\d{3}", "chunk-NNN", re.sub(r"file-\d{3}", "file-NNN", rel))
    return re.sub(r"^videos/[^/]+/", "videos/KEY/", rel)


def _schema(path: Path, features: set[str]) -> dict[str, str]:
    """Column -> arrow type, a feature's column (and its ``stats/<feature>/...``) named by kind."""
    out: dict[str, str] = {}
    for field in pq.read_schema(path):
        name = field.name
        for feature in sorted(features, key=len, reverse=True):
            if name == feature or name.startswith((f"stats/{feature}/", f"videos/{feature}/")):
                name = name.replace(feature, "FEATURE", 1)
                break
        out.setdefault(name, str(field.type))
    return out


def _same_kinds(pushed: dict[str, bytes], tmp: Path) -> None:
    """The pushed files against the fixture's, kind by kind."""
    root = tmp / "pushed"
    for rel, data in pushed.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    ours = {_pattern(r) for r in pushed}
    theirs = {_pattern(p.relative_to(FIXTURE).as_posix()) for p in FIXTURE.rglob("*") if p.is_file()}
    has_video = any(r.startswith("videos/") for r in pushed)
    assert ours == (theirs if has_video else {p for p in theirs if not p.startswith("videos/")})
    info, fixture_info = (json.loads((r / "meta/info.json").read_text()) for r in (root, FIXTURE))
    assert set(info) == set(fixture_info) and info["codebase_version"] == "v3.0"
    assert info["data_path"] == fixture_info["data_path"]
    if has_video:
        assert info["video_path"] == fixture_info["video_path"]
    for name in ("observation.image", "timestamp", "action", "index"):
        if name in info["features"]:
            assert set(info["features"][name]) == set(fixture_info["features"][name]), name
    for rel in (
        "meta/tasks.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
        "data/chunk-000/file-000.parquet",
    ):
        ours_schema = _schema(root / rel, set(info["features"]))
        theirs_schema = _schema(FIXTURE / rel, set(fixture_info["features"]))
        # the same bookkeeping columns, types, and every feature column typed as lerobot types one
        assert {k: v for k, v in ours_schema.items() if "FEATURE" not in k} == {
            k: v for k, v in theirs_schema.items() if "FEATURE" not in k
        }, rel
        feature_types = {v for k, v in theirs_schema.items() if "FEATURE" in k}
        extra = {k: v for k, v in ours_schema.items() if "FEATURE" in k and v not in feature_types}
        assert not [k for k in extra if k.startswith("stats/")], (rel, extra)  # stats: lerobot's types
        # the schema metadata lerobot's files carry (pandas' index of the tasks, datasets' features)
        assert set(pq.read_schema(root / rel).metadata or {}) == set(
            pq.read_schema(FIXTURE / rel).metadata or {}
        )
    tasks = json.loads(pq.read_schema(root / "meta/tasks.parquet").metadata[b"pandas"])
    assert tasks["index_columns"] == ["__index_level_0__"]  # pd.read_parquet: the task text is the index
    data = pq.read_schema(root / "data/chunk-000/file-000.parquet")
    assert list(json.loads(data.metadata[b"huggingface"])["info"]["features"]) == data.names
    stats = json.loads((root / "meta/stats.json").read_text())
    fixture_stats = json.loads((FIXTURE / "meta/stats.json").read_text())
    assert {frozenset(s) for s in stats.values()} == {frozenset(s) for s in fixture_stats.values()}
    assert set(info["features"]) >= BOOKKEEPING


def _round_trip(source: str, back: str) -> None:
    """``back`` (downloaded from the Hub) holds ``source``'s steps: the LeRobot rules of
    rlds_cli/export/lerobot.py read backwards (observations without the final ones)."""
    a, b = open_dataset(source), open_dataset(back)
    assert a.episodes["length"].tolist() == b.episodes["length"].tolist()
    for key in ("action", "next/reward", "next/terminated", "next/truncated"):
        np.testing.assert_array_equal(np.asarray(a.column(key)[:]), np.asarray(b.column(key)[:]), err_msg=key)
    flat_a = a.episodes["start"] + np.arange(a.num_episodes)
    flat_b = b.episodes["start"] + np.arange(b.num_episodes)
    lengths = a.episodes["length"]
    for key, spec in a.stored_fields.items():
        if spec.storage != "flat":
            continue
        other = "observation/state" if key == "observation" else key
        x, y = np.asarray(a.column(key)[:]), np.asarray(b.column(other)[:])
        x = np.concatenate([x[s : s + n] for s, n in zip(flat_a, lengths, strict=True)])
        y = np.concatenate([y[s : s + n] for s, n in zip(flat_b, lengths, strict=True)])
        if x.dtype == np.uint8 and x.ndim == 4:  # a camera: AV1 is lossy
            psnr = 10 * np.log10(255**2 / np.mean((x.astype(np.float64) - y) ** 2))
            assert psnr > 25, (key, psnr)
        else:
            np.testing.assert_array_equal(y, x, err_msg=key)


@pytest.mark.parametrize("source", ["demo", "tiny"])
def test_an_export_pushed_to_the_hub_is_laid_out_as_lerobot_writes_and_round_trips(
    hub: HubStandin,  # noqa: F811 - the fixture
    source: str,
    tmp_path: Path,
) -> None:
    if source == "demo":  # never LeRobot: other feature names, no camera
        make_demo("demo", "zarr")
    else:  # the fixture itself, a camera included
        copy = tmp_path / "src" / "lerobot-v3-tiny"
        shutil.copytree(FIXTURE, copy)
        assert runner.invoke(app, ["download", str(copy), "--name", "tiny", "-q"]).exit_code == 0
    before = len(hub.commits())
    row = _export(source, REPO_URL)
    assert row["uploaded"] == row["files"] and not row["up_to_date"] and row["url"] == REPO_URL
    assert len(hub.commits()) == before + 1  # one commit holds the whole export
    files = main_files(hub)
    assert {"README.md", ".gitattributes"} <= set(files)  # the repo owner's files stay
    _same_kinds({r: d for r, d in files.items() if r.startswith(("meta/", "data/", "videos/"))}, tmp_path)
    assert not any(CacheRoot().tmp_dir.iterdir())  # the export's folder is gone
    result = runner.invoke(app, ["download", REPO_URL, "--name", "back", "-q"])
    assert result.exit_code == 0, result.output
    _round_trip(source, "back")


def test_a_second_identical_export_uploads_nothing(hub: HubStandin) -> None:  # noqa: F811
    make_demo("demo", "zarr")
    _export("demo", f"{REPO_URL}/lerobot")
    uploads, commits = len(hub.uploads()), len(hub.commits())
    again = _export("demo", f"{REPO_URL}/lerobot")
    assert again["up_to_date"] and (again["uploaded"], again["bytes_uploaded"]) == (0, 0)
    assert (len(hub.uploads()), len(hub.commits())) == (uploads, commits)
    text = runner.invoke(app, ["export", "demo", f"{REPO_URL}/lerobot", "--to", "lerobot"])
    assert text.exit_code == 0 and "nothing to upload" in text.stdout


def test_an_export_that_fails_before_its_commit_leaves_the_repo_unchanged(hub: HubStandin) -> None:  # noqa: F811
    make_demo("demo", "zarr")
    before = dict(main_files(hub))
    hub.fail_commits = 1
    result = runner.invoke(app, ["export", "demo", REPO_URL, "--to", "lerobot"])
    assert result.exit_code == 1 and "HTTP 500" in result.stderr and "Traceback" not in result.stderr
    assert main_files(hub) == before and hub.uploads()  # uploaded, never committed
    assert not any(CacheRoot().tmp_dir.iterdir())  # nothing left behind in the cache either
    row = _export("demo", REPO_URL)  # the same command: the LFS objects are there already
    assert not row["up_to_date"] and len(hub.commits()) == 1 and "meta/info.json" in main_files(hub)


def test_another_export_needs_force_and_replaces_the_old_files(
    hub: HubStandin,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    from rlds_cli.sources.convert import convert
    from tests.d4rl_fixtures import golden_three_episodes

    make_demo("demo", "zarr")
    convert(golden_three_episodes(tmp_path / "g.hdf5", with_next=False), "other")
    _export("demo", REPO_URL)
    repo = hub.repos["rlds-test/shared"]
    stale = "data/chunk-000/file-001.parquet"  # a file of a bigger, older export
    repo.add_commit({**main_files(hub), stale: b"PAR1 old"})
    refused = runner.invoke(app, ["export", "other", REPO_URL, "--to", "lerobot"])
    assert refused.exit_code == 1 and "holds another version (its meta/info.json differs)" in refused.stderr
    row = _export("other", REPO_URL, "--force")
    assert row["replaced"] and stale not in main_files(hub) and "README.md" in main_files(hub)


def test_only_lerobot_goes_to_the_hub(hub: HubStandin) -> None:  # noqa: F811
    make_demo("demo", "zarr")
    result = runner.invoke(app, ["export", "demo", REPO_URL, "--to", "torchrl"])
    assert result.exit_code == 1 and not hub.commits()
    assert "cannot export 'torchrl' to hf://datasets/rlds-test/shared" in result.stderr


def test_a_commit_or_a_missing_repo_is_one_line_before_any_export(
    hub: HubStandin,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rlds_cli.export

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("exported for a URL that cannot be pushed to")

    make_demo("demo", "zarr")
    monkeypatch.setattr(rlds_cli.export, "export_dataset", never)
    sha = hub.repos["rlds-test/shared"].refs["main"]
    for url, needle, hint in (
        (f"{REPO_URL}@{sha}", "is a commit, not a branch", "push to a branch"),
        ("hf://datasets/rlds-test/missing", "HTTP 404", "hf repo create ORG/REPO --repo-type dataset"),
    ):
        result = runner.invoke(app, ["export", "demo", url, "--to", "lerobot"])
        assert result.exit_code == 1 and "Traceback" not in result.stderr, result.output
        lines = result.stderr.splitlines()
        assert needle in lines[0] and any(hint in line for line in lines[1:]), result.stderr
        assert not any(CacheRoot().tmp_dir.iterdir())
    assert not hub.commits()


def test_files_of_something_else_where_the_export_goes_need_force(hub: HubStandin) -> None:  # noqa: F811
    """A repo laid out as ``datasets`` lays out parquet (``data/train-*.parquet``, no
    ``meta/info.json``) is not an export to update: its files are not deleted without --force."""
    make_demo("demo", "zarr")
    repo = hub.repos["rlds-test/shared"]
    theirs = "data/train-00000-of-00001.parquet"
    repo.add_commit({**main_files(hub), theirs: b"PAR1 theirs"})
    commits = len(hub.commits())
    refused = runner.invoke(app, ["export", "demo", REPO_URL, "--to", "lerobot"])
    assert refused.exit_code == 1 and "Traceback" not in refused.stderr, refused.output
    assert theirs in refused.stderr and "--force" in refused.stderr
    assert theirs in main_files(hub) and len(hub.commits()) == commits
    row = _export("demo", REPO_URL, "--force")
    assert row["replaced"] and theirs not in main_files(hub) and "README.md" in main_files(hub)


def test_a_v21_export_goes_to_the_hub_and_round_trips(hub: HubStandin) -> None:  # noqa: F811
    """``--lerobot-version 2.1`` to the Hub: lerobot 0.3's per-episode files in one commit, read
    back through rlds's v2.1 reading."""
    make_demo("demo", "zarr")
    row = _export("demo", REPO_URL, "--lerobot-version", "2.1")
    assert row["uploaded"] == row["files"]
    files = main_files(hub)
    info = json.loads(files["meta/info.json"])
    assert info["codebase_version"] == "v2.1"
    assert {"meta/episodes.jsonl", "meta/tasks.jsonl", "meta/episodes_stats.jsonl"} <= set(files)
    assert "data/chunk-000/episode_000000.parquet" in files
    result = runner.invoke(app, ["download", REPO_URL, "--name", "back", "-q"])
    assert result.exit_code == 0, result.output
    _round_trip("demo", "back")
