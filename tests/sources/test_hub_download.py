"""``rlds download hf://datasets/ORG/REPO[/PATH][@REVISION]`` (issue 28, parts 1-2), offline
against a local stand-in for the Hub (tests/hub_standin.py) that serves the API calls
huggingface_hub makes. The LeRobot repo is the fixture written by lerobot itself; the Minari repo
is a dataset written by minari's own DataCollector.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlds_cli.errors import (
    ChecksumMismatchError,
    DownloadFailedError,
    HTTPStatusError,
    OfflineError,
    SourceFormatError,
    UnsupportedSourceError,
)
from rlds_cli.net import hub as hub_repo
from rlds_cli.net.http import HttpConfig
from rlds_cli.sources.convert import convert
from rlds_cli.sources.download import download
from tests.hub_standin import TOKEN, HubStandin, Repo, folder_files, is_lfs, record_minari

pytest.importorskip("huggingface_hub")
pytest.importorskip("pyarrow")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot-v3-tiny"
DATA = "data/chunk-000/file-000.parquet"
VIDEO = "videos/observation.image/chunk-000/file-000.mp4"


@pytest.fixture
def hub(hub: HubStandin) -> HubStandin:
    """The stand-in (tests/conftest.py: no token anywhere) with ``lerobot-test/tiny`` (the
    fixture plus the Hub's own files)."""
    files = {**folder_files(FIXTURE), ".gitattributes": b"*.parquet filter=lfs\n", "README.md": b"# tiny\n"}
    hub.add_repo("lerobot-test/tiny", files)
    return hub


def _arrays(root: Path, name: str) -> dict[str, bytes]:
    folder = root / "datasets" / name
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _source(root: Path, name: str) -> dict[str, object]:
    manifest = json.loads((root / "datasets" / name / "manifest.json").read_text())
    source = manifest["source"]
    assert isinstance(source, dict)
    return source


def test_lerobot_repo_converts_like_the_local_files(hub: HubStandin, isolated_cache: Path) -> None:
    download("hf://datasets/lerobot-test/tiny")
    convert(FIXTURE, "local")
    assert _arrays(isolated_cache, "tiny") == _arrays(isolated_cache, "local")
    # the listing came in pages (3 entries each), and only the reader's folders were fetched
    assert sum("/tree/" in e["path"] for e in hub.log) > 2
    fetched = set(hub.downloads())
    assert fetched == {p for p in folder_files(FIXTURE)}
    assert ".gitattributes" not in fetched and "README.md" not in fetched
    sha = hub.repos["lerobot-test/tiny"].refs["main"]
    source = _source(isolated_cache, "tiny")
    assert source["hub"] == {"repo": "lerobot-test/tiny", "path": "", "revision": "main", "commit": sha}
    assert source["url"] == f"hf://datasets/lerobot-test/tiny@{sha}"


def test_revision_is_pinned_to_its_commit(hub: HubStandin, isolated_cache: Path) -> None:
    repo = hub.repos["lerobot-test/tiny"]
    first = repo.refs["main"]
    files = folder_files(FIXTURE)
    files["meta/extra.json"] = b"{}\n"  # a later commit on main
    later = repo.add_commit(files)
    download(f"hf://datasets/lerobot-test/tiny@{first}", name="old")
    download("hf://datasets/lerobot-test/tiny", name="new")
    assert _source(isolated_cache, "old")["hub"]["commit"] == first  # type: ignore[index]
    assert _source(isolated_cache, "new")["hub"]["commit"] == later  # type: ignore[index]
    # every file was read at the commit, never at the moving branch
    assert all(first in e["path"] or later in e["path"] for e in hub.log if "/resolve/" in e["path"])
    # offline, a pinned commit that was downloaded needs no Hub; a branch name does
    hub.log.clear()
    download(f"hf://datasets/lerobot-test/tiny@{first}", name="again", offline=True)
    assert hub.log == []
    # a downloaded file touched since (its mtime alone: a backup restore) is hashed again and used;
    # offline it was "not downloaded yet", online it was fetched again
    for path in isolated_cache.joinpath("raw").rglob("*"):
        if path.is_file() and ".rlds" not in path.parts:
            os.utime(path, ns=(1, 1))
    download(f"hf://datasets/lerobot-test/tiny@{first}", name="touched", offline=True)
    download(f"hf://datasets/lerobot-test/tiny@{first}", name="touched-online")
    assert not [e for e in hub.log if "/resolve/" in e["path"]]
    # a copy whose bytes changed is named as such offline (it said "not downloaded yet")
    changed = next(p for p in isolated_cache.joinpath("raw").rglob("*.parquet") if ".rlds" not in p.parts)
    data = bytearray(changed.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    with pytest.raises(OfflineError, match="does not match its expected size or sha256"):
        for n, commit in enumerate((first, later)):
            download(f"hf://datasets/lerobot-test/tiny@{commit}", name=f"changed-{n}", offline=True)
    with pytest.raises(OfflineError, match="offline"):
        download("hf://datasets/lerobot-test/tiny", name="x", offline=True)


def test_rate_limit_is_waited_out_as_retry_after_asks(
    hub: HubStandin, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each 429 is followed by a wait of its ``Retry-After`` (3 s: neither back-off starts
    there, rlds's at 0.5-1 s, the client's at 1 s), then by the same request again. The waits
    are recorded, not slept: rlds's own (the revision lookup, :func:`with_rate_limit`; LFS files)
    through its ``HttpConfig.sleep``, the client's (listing pages, small git files) through
    ``time.sleep``."""
    ours: list[tuple[float, str]] = []
    theirs: list[tuple[float, str]] = []

    def waited(into: list[tuple[float, str]], seconds: float) -> None:
        last = hub.log[-1]  # the request answered 429 (requests are made one at a time)
        into.append((seconds, f"{last['method']} {last['path']} {last.get('status')}"))

    monkeypatch.setenv("RLDS_DOWNLOAD_WORKERS", "1")
    monkeypatch.setattr(
        hub_repo, "HttpConfig", functools.partial(HttpConfig, sleep=functools.partial(waited, ours))
    )
    monkeypatch.setattr(time, "sleep", functools.partial(waited, theirs))
    hub.retry_after = "3"
    # the client asks a file's HEAD again at once after a first 429 (no wait: file_download.py
    # retries a failed metadata call with retries on), and waits from the second 429 on
    hub.throttle = {"/revision/": 1, "/tree/": 1, "HEAD /datasets/": 2, "GET /datasets/": 2}
    download("hf://datasets/lerobot-test/tiny")
    sha = hub.repos["lerobot-test/tiny"].refs["main"]
    files = sorted(folder_files(FIXTURE))
    lfs = f"/datasets/lerobot-test/tiny/resolve/{sha}/{next(f for f in files if is_lfs(f))}"
    git = f"/datasets/lerobot-test/tiny/resolve/{sha}/{next(f for f in files if not is_lfs(f))}"
    assert ours == [
        (3.0, "GET /api/datasets/lerobot-test/tiny/revision/main 429"),
        (3.0, f"GET {lfs} 429"),
        (3.0, f"GET {lfs} 429"),
    ]
    # the client's waits: Retry-After plus the 1 s it adds "to avoid rounding issues"
    assert theirs == [
        (4.0, f"GET /api/datasets/lerobot-test/tiny/tree/{sha} 429"),
        (4.0, f"HEAD {git} 429"),
    ]
    heads = [e.get("status") for e in hub.log if e["path"] == git and e["method"] == "HEAD"]
    assert heads == [429, 429, None]
    for key in ("/revision/", "/tree/", "/resolve/"):  # each 429 was followed by the same request, answered
        hits = [e for e in hub.log if key in e["path"]]
        assert hits[0].get("status") == 429 and hits[-1].get("status") is None


def test_lfs_sha_mismatch_publishes_nothing_and_a_rerun_recovers(
    hub: HubStandin, isolated_cache: Path
) -> None:
    good = (FIXTURE / DATA).read_bytes()
    hub.corrupt[DATA] = bytes(len(good))  # same size, other bytes
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        download("hf://datasets/lerobot-test/tiny")
    assert not (isolated_cache / "datasets" / "tiny").exists()
    assert not any(p.name == "file-000.parquet" and p.parent.name == "chunk-000" and "data" in p.parts
                   and ".rlds" not in p.parts for p in isolated_cache.rglob("*"))  # fmt: skip
    del hub.corrupt[DATA]
    download("hf://datasets/lerobot-test/tiny")
    assert (isolated_cache / "datasets" / "tiny" / "manifest.json").is_file()


def test_an_interrupted_transfer_resumes_where_it_stopped(hub: HubStandin, isolated_cache: Path) -> None:
    hub.cut[VIDEO] = [50_000]
    download("hf://datasets/lerobot-test/tiny")
    gets = [e for e in hub.log if e["method"] == "GET" and e.get("file") == VIDEO]
    assert [g["range"] for g in gets] == [None, "bytes=50000-"]
    convert(FIXTURE, "local")
    assert _arrays(isolated_cache, "tiny") == _arrays(isolated_cache, "local")


def test_a_failed_run_keeps_its_verified_files_and_the_rerun_fetches_the_rest(
    hub: HubStandin, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The video's transfer is cut after 50,000 bytes, then its retries get nothing: the run
    fails, and the rerun fetches only what did not verify, resuming the video where it stopped
    (a large LFS file is not fetched again from its first byte)."""
    monkeypatch.setenv("RLDS_DOWNLOAD_WORKERS", "1")  # the LFS files in order, the video last
    monkeypatch.setenv("RLDS_HTTP_RETRIES", "2")
    monkeypatch.setenv("RLDS_RETRY_BASE_DELAY", "0")
    hub.cut[VIDEO] = [50_000, 0, 0]
    with pytest.raises(DownloadFailedError, match=r"file-000\.mp4"):
        download("hf://datasets/lerobot-test/tiny")
    assert not (isolated_cache / "datasets" / "tiny").exists()
    lfs = sorted(f for f in folder_files(FIXTURE) if is_lfs(f))
    assert lfs[-1] == VIDEO and set(hub.downloads()) == set(lfs)
    hub.cut[VIDEO] = []
    hub.log.clear()
    download("hf://datasets/lerobot-test/tiny")
    assert sorted(hub.downloads()) == sorted([VIDEO, *(f for f in folder_files(FIXTURE) if not is_lfs(f))])
    gets = [e for e in hub.log if e["method"] == "GET" and e.get("file") == VIDEO]
    assert [g["range"] for g in gets] == ["bytes=50000-"]
    convert(FIXTURE, "local")
    assert _arrays(isolated_cache, "tiny") == _arrays(isolated_cache, "local")


def test_nothing_is_written_outside_the_cache_and_no_keep_raw_drops_the_files(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    before = {p for p in tmp_path.rglob("*") if not p.is_relative_to(isolated_cache)}
    download("hf://datasets/lerobot-test/tiny", keep_raw=False)
    after = {p for p in tmp_path.rglob("*") if not p.is_relative_to(isolated_cache)}
    assert after == before  # HF_HOME (the client's cache and token folder) included
    raw = [p for p in (isolated_cache / "raw").rglob("*") if p.is_file() and ".rlds" not in p.parts]
    assert raw == []
    assert (isolated_cache / "datasets" / "tiny" / "manifest.json").is_file()


def test_format_option_overrides_the_layout(hub: HubStandin) -> None:
    # read as D4RL, not LeRobot: every file but the Hub's own is handed to the d4rl reader
    with pytest.raises(SourceFormatError, match="6 D4RL files"):
        download("hf://datasets/lerobot-test/tiny", format="d4rl")


def test_reader_options_apply_to_a_hub_source(hub: HubStandin, isolated_cache: Path) -> None:
    download("hf://datasets/lerobot-test/tiny", options={"episodes": "1:2"})
    convert(FIXTURE, "local", options={"episodes": "1:2"})
    assert _arrays(isolated_cache, "tiny") == _arrays(isolated_cache, "local")
    manifest = json.loads((isolated_cache / "datasets" / "tiny" / "manifest.json").read_text())
    assert manifest["num_episodes"] == 1 and manifest["num_steps"] == 25


def test_a_second_download_fetches_nothing(hub: HubStandin, isolated_cache: Path) -> None:
    download("hf://datasets/lerobot-test/tiny")
    hub.log.clear()
    download("hf://datasets/lerobot-test/tiny", name="twice")
    assert hub.downloads() == []


@pytest.mark.parametrize(
    "source",
    [
        "hf://models/org/x",
        "hf://datasets/org",
        "hf://datasets/org/../x",
        "hf://datasets/org/x/a/../../y",
        "hf://datasets/org/x@",
    ],
)
def test_malformed_hub_urls_are_refused(hub: HubStandin, source: str) -> None:
    with pytest.raises(UnsupportedSourceError, match=f"cannot read '{re.escape(source)}'"):
        download(source)


def test_a_path_leaving_the_repo_is_named_not_the_repo_id(hub: HubStandin) -> None:
    """``hf://datasets/org/repo/../..`` was 'org/repo is not a valid repo id'."""
    with pytest.raises(UnsupportedSourceError, match=r"its path inside the repo holds '\.\.'"):
        download("hf://datasets/org/repo/a/../..")
    with pytest.raises(UnsupportedSourceError, match=r"its revision holds '\.\.'"):
        download("hf://datasets/org/repo@v1/../x")


def test_missing_repo_and_revision_name_what_is_missing(hub: HubStandin) -> None:
    with pytest.raises(HTTPStatusError, match="no hf://datasets/lerobot-test/nope@main"):
        download("hf://datasets/lerobot-test/nope")
    with pytest.raises(HTTPStatusError, match="HTTP 404"):
        download("hf://datasets/lerobot-test/tiny@v9")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    code = "from rlds_cli.cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_gated_repo_needs_a_token_that_is_never_shown(hub: HubStandin, isolated_cache: Path) -> None:
    hub.repos["lerobot-test/tiny"].gated = True
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    refused = _cli(env, "download", "hf://datasets/lerobot-test/tiny")
    assert refused.returncode == 1
    assert refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert "gated or private" in lines[0] and "HF_TOKEN" in refused.stderr
    assert "Traceback" not in refused.stderr
    ok = _cli({**env, "HF_TOKEN": TOKEN}, "download", "hf://datasets/lerobot-test/tiny")
    assert ok.returncode == 0, ok.stderr
    assert any(e["auth"] for e in hub.log)
    for text in (refused.stdout, refused.stderr, ok.stdout, ok.stderr):
        assert TOKEN not in text
    for path in isolated_cache.rglob("*"):  # manifests, provenance, hashes, listings, logs
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_a_token_from_the_clients_token_file_is_used_and_never_shown(
    hub: HubStandin, isolated_cache: Path
) -> None:
    """No ``HF_TOKEN``: the token comes from ``$HF_HOME/token``, where ``hf auth login`` writes
    it. A stale one is refused without being shown; the right one reads the gated repo."""
    hub.repos["lerobot-test/tiny"].gated = True
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_TOKEN_PATH")}
    token_file = Path(env["HF_HOME"]) / "token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    stale = "hf_staleTokenOfAnotherAccount98765"
    token_file.write_text(stale + "\n")
    refused = _cli(env, "download", "hf://datasets/lerobot-test/tiny")
    assert refused.returncode == 1 and "gated or private" in refused.stderr
    assert any(e["auth"] for e in hub.log)  # the file's token was sent (and refused)
    token_file.write_text(TOKEN + "\n")
    hub.log.clear()
    ok = _cli(env, "download", "hf://datasets/lerobot-test/tiny")
    assert ok.returncode == 0, ok.stderr
    assert hub.log and all(e["auth"] for e in hub.log)  # every request, listing and files, carried it
    for text in (refused.stdout, refused.stderr, ok.stdout, ok.stderr):
        assert TOKEN not in text and stale not in text
    for path in isolated_cache.rglob("*"):  # manifests, provenance, hashes, listings, logs
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and stale.encode() not in data, path


def test_minari_repo_written_by_minari_converts_end_to_end(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    pytest.importorskip("gymnasium")
    pytest.importorskip("minari")
    pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")
    local = record_minari(tmp_path / "minari", "hubtest/pendulum/random-v0")
    files = {**folder_files(local, "pendulum/random-v0/"), "README.md": b"# mirror\n"}
    hub.add_repo("minari-test/pendulum", files)
    download("hf://datasets/minari-test/pendulum/pendulum/random-v0", name="hub-pendulum")
    convert(local, "local-pendulum")
    assert _arrays(isolated_cache, "hub-pendulum") == _arrays(isolated_cache, "local-pendulum")
    assert set(hub.downloads()) == {f"pendulum/random-v0/{p}" for p in folder_files(local)}


def _tfds_repo(hub: HubStandin, tmp_path: Path) -> tuple[Path, Repo, dict[str, bytes]]:
    """An RLDS/TFDS dataset folder written by the fixture writer (2 train shards, a val shard
    beside them, as TFDS writes several splits into one folder), and the stand-in's repo
    ``oxe-test/mirror`` holding it as an Open X-Embodiment mirror does: ``oxe_fixture/0.1.0/``,
    with the Hub's own files. Returns the folder, the repo and the repo's files."""
    pytest.importorskip("tfrecord")
    from tests.rlds_tfrecord_fixtures import write_rlds_dataset

    fx = write_rlds_dataset(tmp_path / "oxe_fixture" / "0.1.0", (3, 4, 2), shards=2)
    val = write_rlds_dataset(tmp_path / "val", (5,), split="val", seed=9)
    (fx.root / val.shards[0].name).write_bytes(val.shards[0].read_bytes())
    info = json.loads((fx.root / "dataset_info.json").read_text())
    info["splits"] += json.loads((val.root / "dataset_info.json").read_text())["splits"]
    (fx.root / "dataset_info.json").write_text(json.dumps(info))
    files = {**folder_files(fx.root, "oxe_fixture/0.1.0/"), ".gitattributes": b"*.tfrecord* filter=lfs\n"}
    files["README.md"] = b"# an OXE mirror\n"
    return fx.root, hub.add_repo("oxe-test/mirror", files), files


@pytest.mark.parametrize("path", ["", "/oxe_fixture/0.1.0"])
@pytest.mark.parametrize("fmt", [None, "rlds"])
def test_rlds_tfds_folder_converts_like_the_local_files(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path, path: str, fmt: str | None
) -> None:
    local, _, files = _tfds_repo(hub, tmp_path)
    download(f"hf://datasets/oxe-test/mirror{path}", name="hub-oxe", format=fmt)
    convert(local, "local-oxe")
    assert _arrays(isolated_cache, "hub-oxe") == _arrays(isolated_cache, "local-oxe")
    # the folder's metadata and the train split's shards only: not the val shard, not the card
    folder = "oxe_fixture/0.1.0/"
    assert sorted(hub.downloads()) == sorted(p for p in files if p.startswith(folder) and "-val." not in p)
    assert _source(isolated_cache, "hub-oxe")["hub"]["path"] == path.strip("/")  # type: ignore[index]


def test_rlds_split_option_fetches_that_split_and_several_folders_are_refused(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    local, repo, files = _tfds_repo(hub, tmp_path)
    download("hf://datasets/oxe-test/mirror/oxe_fixture/0.1.0", options={"split": "val"})
    convert(local, "local-val", options={"split": "val"})
    # named after the dataset and its version folder, not "0.1.0"
    assert _arrays(isolated_cache, "oxe_fixture-0.1.0") == _arrays(isolated_cache, "local-val")
    assert not any("-train." in p for p in hub.downloads())
    hub.log.clear()
    with pytest.raises(SourceFormatError, match=r"no shards of split 'test' \(splits: 'train', 'val'\)"):
        download("hf://datasets/oxe-test/mirror", name="x", options={"split": "test"})
    # a mirror of several datasets (or versions): the user names one; nothing is fetched
    both = {**files, **{p.replace("0.1.0", "0.2.0"): b for p, b in files.items() if p.startswith("oxe")}}
    repo.add_commit(both)
    with pytest.raises(SourceFormatError, match="2 RLDS/TFDS dataset folders") as refused:
        download("hf://datasets/oxe-test/mirror", name="y")
    assert "hf://datasets/oxe-test/mirror/oxe_fixture/0.1.0" in str(refused.value.hint)
    assert hub.downloads() == []


def test_a_hidden_copy_of_the_tfds_folder_is_left_out_as_locally(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    """The Hub plan and the local layout share one rule: a TFDS folder under a hidden folder (a
    tool's copy) is not a second dataset folder, and none of its files is fetched."""
    local, repo, files = _tfds_repo(hub, tmp_path)
    hidden = {f".backup/{p}": b for p, b in files.items() if p.startswith("oxe_fixture/")}
    repo.add_commit({**files, **hidden})
    download("hf://datasets/oxe-test/mirror", name="hub-oxe")
    convert(local, "local-oxe")
    assert _arrays(isolated_cache, "hub-oxe") == _arrays(isolated_cache, "local-oxe")
    assert not any(p.startswith(".backup/") for p in hub.downloads())


def test_rlds_splits_without_train_are_refused_before_any_shard_is_fetched(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    """Several splits, none ``train``, none asked for: the reader would refuse after the whole
    download; the plan refuses first, with the reader's words and how to pick one."""
    pytest.importorskip("tfrecord")
    from tests.rlds_tfrecord_fixtures import write_rlds_dataset

    val = write_rlds_dataset(tmp_path / "ds" / "1.0.0", (3, 2), split="val")
    test = write_rlds_dataset(tmp_path / "test", (4,), split="test", seed=3)
    (val.root / test.shards[0].name).write_bytes(test.shards[0].read_bytes())
    hub.add_repo("oxe-test/nosplit", folder_files(val.root, "ds/1.0.0/"))
    with pytest.raises(SourceFormatError, match=r"splits 'test', 'val' and none is 'train'") as refused:
        download("hf://datasets/oxe-test/nosplit", name="z")
    assert "--option split=NAME" in str(refused.value.hint)
    assert hub.downloads() == []
    download("hf://datasets/oxe-test/nosplit", name="z", options={"split": "test"})
    assert sorted(p for p in hub.downloads() if ".tfrecord" in p) == [f"ds/1.0.0/{test.shards[0].name}"]


def _d4rl(folder: Path) -> Path:
    from tests.d4rl_fixtures import golden_three_episodes

    folder.mkdir(parents=True, exist_ok=True)
    return golden_three_episodes(folder / "hopper-medium-v2.hdf5", with_next=True)


def _vd4rl(folder: Path) -> Path:
    from tests.vd4rl_fixtures import dreamer_episode, write_dreamer_episodes

    episodes = [dreamer_episode(6, side=8, seed=1), dreamer_episode(9, side=8, seed=2, terminal=True)]
    write_dreamer_episodes(folder / "64px", episodes)
    return folder / "64px"


def _ogbench(folder: Path) -> Path:
    from tests.formats_fixtures import golden_ogbench

    folder.mkdir(parents=True, exist_ok=True)
    return golden_ogbench(folder / "pointmaze-medium-navigate-v0.npz")


@pytest.mark.parametrize(
    ("fmt", "write"),
    [("d4rl", _d4rl), ("vd4rl", _vd4rl), ("ogbench", _ogbench)],
    ids=["d4rl", "vd4rl", "ogbench"],
)
def test_file_formats_are_detected_from_the_fetched_files(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path, fmt: str, write: Callable[[Path], Path]
) -> None:
    """A repo of D4RL HDF5, V-D4RL Dreamer episodes or an OGBench npz (each beside the Hub's own
    files, in a folder of the repo): detected from the downloaded files, and converted as the
    same files on disk are."""
    pytest.importorskip("h5py")
    local = write(tmp_path / "src")
    files = folder_files(local, "data/") if local.is_dir() else {f"data/{local.name}": local.read_bytes()}
    hub.add_repo("files-test/x", {**files, ".gitattributes": b"*.npz filter=lfs\n", "README.md": b"# card\n"})
    download("hf://datasets/files-test/x/data", name="hub-files")
    convert(local, "local-files")
    assert _arrays(isolated_cache, "hub-files") == _arrays(isolated_cache, "local-files")
    source = _source(isolated_cache, "hub-files")
    assert source["format"] == _source(isolated_cache, "local-files")["format"] == fmt
    assert sorted(hub.downloads()) == sorted(files)
