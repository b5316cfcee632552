"""Registry ids whose files are listed from a Hub folder (``[dataset.listing]``: RoboSet, V-D4RL;
issue 28, item 2), against the local stand-in for the Hub (tests/hub_standin.py, 127.0.0.1): the
folder is listed through huggingface_hub at one commit, every file is fetched by rlds's own
fetcher from that commit (never from the moving branch), the commit is in the provenance, and a
configured token goes with every request without ever being shown or written.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlds_cli.catalog import registry
from rlds_cli.errors import DownloadFailedError, HTTPStatusError, OfflineError, RegistryFormatError
from rlds_cli.net.hub import list_folder
from rlds_cli.net.layout import listing_path
from rlds_cli.sources.convert import convert
from rlds_cli.sources.download import download
from tests.hub_standin import TOKEN, HubStandin, Repo, folder_files

pytest.importorskip("huggingface_hub")

FOLDER = "Set(a)/x-v1"
ENTRY = f"""
[[dataset]]
id = "{FOLDER}"
aliases = ["toy/roboset-v1"]
format = "roboset"
[dataset.listing]
hf_repo = "org/rs"
path = "{FOLDER}"
suffix = ".h5"
"""


@pytest.fixture
def hub(hub: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    """The stand-in (tests/conftest.py: no token anywhere) and a registry file with one
    RoboSet-like id listed from ``org/rs`` (its repo not made yet)."""
    extra = tmp_path / "hub-registry.toml"
    extra.write_text(ENTRY)
    monkeypatch.setenv("RLDS_REGISTRY", str(extra))
    monkeypatch.setenv("RLDS_RETRY_BASE_DELAY", "0.01")
    registry._load.cache_clear()
    yield hub
    registry._load.cache_clear()  # the next test reads its own registry


def _roboset(root: Path) -> Path:
    from tests.formats_fixtures import golden_roboset

    return golden_roboset(root)  # a_trace.h5 (2 episodes) and b_trace.h5 (1): 7 steps


def _repo(hub: HubStandin, tmp_path: Path) -> tuple[Repo, dict[str, bytes]]:
    """``org/rs``: the RoboSet files in the entry's folder, a file of another suffix beside them,
    another folder, and the Hub's own files."""
    files = {
        **folder_files(_roboset(tmp_path / "rs"), f"{FOLDER}/"),
        f"{FOLDER}/notes.txt": b"not a trace\n",
        "Other(b)/y-v1/c.h5": b"another entry's\n",
        ".gitattributes": b"*.h5 filter=lfs\n",
        "README.md": b"# RoboSet-like\n",
    }
    return hub.add_repo("org/rs", files), files


def _source(root: Path, name: str) -> dict[str, Any]:
    source = json.loads((root / "datasets" / name.replace("/", "--") / "manifest.json").read_text())["source"]
    assert isinstance(source, dict)
    return source


def _arrays(root: Path, name: str) -> dict[str, bytes]:
    folder = root / "datasets" / name.replace("/", "--")  # an entry name's '/' is '--' on disk
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _h5(files: dict[str, bytes]) -> set[str]:
    return {p for p in files if p.startswith(f"{FOLDER}/") and p.endswith(".h5")}


def test_folder_listing_through_the_client(hub: HubStandin, tmp_path: Path) -> None:
    """Names below the folder (nested too), the suffix kept, names that would escape the folder
    or land in rlds's bookkeeping skipped, LFS files with the Hub's sha256, every URL at the
    commit the revision pointed at ('(' quoted as the Hub does), the listing paged."""
    data = b"trace bytes" * 100
    repo = Repo()
    sha = repo.add_commit(
        {
            "F(x)/b.h5": data,
            "F(x)/sub/a.h5": b"small",
            "F(x)/info.json": b"{}",
            "F(x)/.rlds/hashes.json": b"{}",
            "F(x)/../evil.h5": b"x",
            "G/c.h5": b"elsewhere",
        }
    )
    hub.repos["org/repo"] = repo
    listing = list_folder("org/repo", "F(x)", suffix=".h5")
    assert listing.commit == sha
    assert [f.name for f in listing.files] == ["b.h5", "sub/a.h5"]
    b = listing.files[0]
    assert (b.sha256, b.size, b.hash_origin) == (hashlib.sha256(data).hexdigest(), len(data), "hub")
    assert b.urls == (f"{hub.endpoint}/datasets/org/repo/resolve/{sha}/F%28x%29/b.h5",)
    assert sum("/tree/" in e["path"] for e in hub.log) > 1  # paged: 3 entries a page
    assert [f.name for f in list_folder("org/repo", "F(x)").files] == ["b.h5", "info.json", "sub/a.h5"]
    assert list_folder("org/repo", "F(x)").files[1].sha256 is None  # a git file: no LFS sha256
    with pytest.raises(HTTPStatusError, match="HTTP 404"):
        list_folder("org/repo", "nothing", suffix=".h5")
    with pytest.raises(RegistryFormatError, match=r"no file ending in '\.npz'"):
        list_folder("org/repo", "F(x)", suffix=".npz")


def test_registry_folder_converts_from_one_commit_and_offline(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, files = _repo(hub, tmp_path)
    sha = repo.refs["main"]
    result = download("toy/roboset-v1")
    assert result.manifest.num_steps == 7 and result.manifest.num_episodes == 3
    convert(sorted((tmp_path / "rs").glob("*.h5")), "local", format="roboset")
    assert _arrays(isolated_cache, "toy/roboset-v1") == _arrays(isolated_cache, "local")
    # listed through the client (the revision resolved, then the tree at that commit), and only
    # the folder's .h5 files fetched, each at the commit
    assert hub.log[0]["path"] == "/api/datasets/org/rs/revision/main"
    gets = [e["path"] for e in hub.log if e["method"] == "GET" and "/resolve/" in e["path"]]
    assert sorted(gets) == sorted(f"/datasets/org/rs/resolve/{sha}/{p}" for p in _h5(files))
    source = _source(isolated_cache, "toy/roboset-v1")  # the id holds '(': the alias names it
    assert source["hub"] == {"repo": "org/rs", "path": FOLDER, "revision": "main", "commit": sha}
    assert source["url"] == f"hf://datasets/org/rs/{FOLDER}@{sha}" and source["id"] == FOLDER
    assert [d["hash_origin"] for d in source["downloads"]] == ["hub", "hub"]
    home = isolated_cache / "raw" / "toy--roboset-v1"
    assert json.loads(listing_path(home).read_text())["commit"] == sha
    # offline: the remembered listing (and its commit), no request
    n = len(hub.log)
    again = download("toy/roboset-v1", name="offline-copy", offline=True)
    assert again.manifest.num_steps == 7 and len(hub.log) == n
    assert _source(isolated_cache, "offline-copy")["hub"]["commit"] == sha
    # online, the Hub unreachable: the remembered listing too
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    monkeypatch.setenv("HF_ENDPOINT", closed)
    download("toy/roboset-v1", name="hub-down")
    assert _source(isolated_cache, "hub-down")["hub"]["commit"] == sha
    # a listing remembered by an rlds that kept only the files (a JSON list): still read offline
    old = json.loads(listing_path(home).read_text())["files"]
    listing_path(home).write_text(json.dumps(old))
    download("toy/roboset-v1", name="old-listing", offline=True)
    assert "hub" not in _source(isolated_cache, "old-listing")
    # a damaged one is named (it was 'unexpected JSONDecodeError', naming no file)
    listing_path(home).write_text('{"files": [')
    with pytest.raises(OfflineError, match="the file list kept by an earlier download is damaged"):
        download("toy/roboset-v1", name="damaged-listing", offline=True, force=True)
    with pytest.raises(DownloadFailedError):  # online, the Hub's failure is what is said
        download("toy/roboset-v1", name="damaged-listing", force=True)


def test_listing_offline_before_any_download(hub: HubStandin) -> None:
    with pytest.raises(OfflineError, match=r"file list of 'Set\(a\)/x-v1' has never been fetched"):
        download("toy/roboset-v1", offline=True)
    assert hub.log == []


def test_a_branch_moving_mid_download_changes_no_file(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main gets a new commit (other traces) after the listing and before the files are fetched:
    every file still comes from the listed commit, and the provenance names that commit."""
    from rlds_cli.sources import download as download_module
    from tests.formats_fixtures import roboset_trial, write_roboset

    repo, files = _repo(hub, tmp_path)
    listed = repo.refs["main"]
    write_roboset(tmp_path / "new_b.h5", {7: roboset_trial(1, 7, 5, done_last=True)})
    moved = {**files, f"{FOLDER}/b_trace.h5": (tmp_path / "new_b.h5").read_bytes()}
    real = download_module.fetch_files

    def fetch_after_a_push(*args: Any, **kw: Any) -> Any:
        repo.add_commit(moved)  # someone pushes to main between the listing and the files
        return real(*args, **kw)

    monkeypatch.setattr(download_module, "fetch_files", fetch_after_a_push)
    result = download("toy/roboset-v1")
    assert repo.refs["main"] != listed
    assert result.manifest.num_steps == 7  # the listed commit's traces, not the new b_trace.h5
    home = isolated_cache / "raw" / "toy--roboset-v1"
    for path in _h5(files):
        assert (home / path.removeprefix(f"{FOLDER}/")).read_bytes() == files[path]
    assert all(listed in e["path"] for e in hub.log if "/resolve/" in e["path"])
    assert _source(isolated_cache, "toy/roboset-v1")["hub"]["commit"] == listed


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    code = "from rlds_cli.cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**{k: v for k, v in os.environ.items() if k != "HF_TOKEN"}, **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_token_is_sent_for_a_registry_hub_download_and_never_shown(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    """A gated repo: without a token, one line says so; with ``HF_TOKEN``, the token goes with
    every request (the listing through the client, each file through rlds's fetcher, a retried
    one too), and appears in no output and no file of the cache."""
    repo, _ = _repo(hub, tmp_path)
    repo.gated = True
    refused = _cli("download", "toy/roboset-v1")
    assert refused.returncode == 1 and "gated or private" in refused.stderr.splitlines()[0]
    assert "HF_TOKEN" in refused.stderr and "Traceback" not in refused.stderr
    hub.log.clear()
    hub.retry_after = "0"
    hub.throttle = {"GET /datasets/org/rs/resolve/": 1}  # a file answered 429 once: retried, logged
    ok = _cli("download", "toy/roboset-v1", "--json", HF_TOKEN=TOKEN)
    assert ok.returncode == 0, ok.stderr
    files = [e for e in hub.log if "/resolve/" in e["path"]]
    assert len(files) == 3 and [e.get("status") for e in files].count(429) == 1
    assert hub.log and all(e["auth"] for e in hub.log)  # the listing and every file request
    info = _cli("info", "toy/roboset-v1", "--json", HF_TOKEN=TOKEN)
    inspect = _cli("inspect", "toy/roboset-v1", "--json", HF_TOKEN=TOKEN)
    for out in (refused, ok, info, inspect):
        assert TOKEN not in out.stdout + out.stderr
    for path in isolated_cache.rglob("*"):  # manifests, provenance, hashes, listing, part records
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
