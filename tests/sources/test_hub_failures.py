"""What the Hub paths say and leave behind when something is wrong (found by a hostile-input
hunt): a listed file the Hub no longer serves, a file of another size than listed, a token the
client cannot send, a damaged listing kept for ``--offline``, a pull refused by a 5xx, the
client's retry lines, a killed transfer's partial file and a killed Hub export's build. Each is
one line naming what and what to do, and the same command succeeds once the cause is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlds_cli.cache.growing import private_build
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import (
    ChecksumMismatchError,
    HTTPStatusError,
    OfflineError,
    RemoteAccessError,
    SettingError,
)
from rlds_cli.export.lerobot import HUB_EXPORT_MARK
from rlds_cli.net.hub import STAGING
from rlds_cli.net.layout import meta_dir
from rlds_cli.remote import store
from rlds_cli.sources.download import download
from tests.hub_standin import HubStandin
from tests.sources import test_hub_download
from tests.sources.test_hub_download import DATA, FIXTURE, VIDEO, _cli

pytest.importorskip("huggingface_hub")
URL = "hf://datasets/lerobot-test/tiny"
#: The stand-in with the LeRobot fixture repo, the client pointed at it, no token (a fixture).
hub = test_hub_download.hub


def test_a_listed_file_the_hub_no_longer_serves_is_a_404_not_the_network(hub: HubStandin) -> None:
    hub.missing.add(VIDEO)
    with pytest.raises(HTTPStatusError, match=r"has no .*file-000\.mp4.*HTTP 404") as caught:
        download(URL)
    assert "connection" not in (caught.value.hint or "")
    hub.missing.clear()
    assert download(URL).manifest.num_steps > 0


@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_an_lfs_file_of_another_size_is_a_mismatch_and_the_rerun_recovers(
    hub: HubStandin, change: str
) -> None:
    good = (FIXTURE / DATA).read_bytes()
    hub.corrupt[DATA] = good + b"xx" if change == "longer" else good[:-10]
    with pytest.raises(
        ChecksumMismatchError, match=r"file-000\.parquet .* bytes, expected 11,020; the file was del"
    ):
        download(URL)
    del hub.corrupt[DATA]
    assert download(URL).manifest.num_steps > 0


def test_a_small_git_file_is_checked_against_its_blob_id(hub: HubStandin, isolated_cache: Path) -> None:
    """A file kept in git (no LFS sha256) of the listed size but other bytes (``meta/info.json``
    with its fps changed) is refused before any conversion, by the blob id the Hub lists."""
    info = (FIXTURE / "meta" / "info.json").read_bytes()
    changed = info.replace(b'"fps": 10', b'"fps": 90')
    assert changed != info and len(changed) == len(info)
    hub.corrupt["meta/info.json"] = changed
    with pytest.raises(ChecksumMismatchError, match=r"info\.json.*git blob"):
        download(URL)
    assert not (isolated_cache / "datasets" / "tiny").exists()
    del hub.corrupt["meta/info.json"]
    assert download(URL).manifest.num_steps > 0


@pytest.mark.parametrize("token", ["tokén", "hf_\x7fdel"])
def test_a_token_the_client_cannot_send_is_one_line(
    hub: HubStandin, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(SettingError, match="HF_TOKEN") as caught:
        download(URL)
    assert token not in str(caught.value) and token not in (caught.value.hint or "")
    with pytest.raises(SettingError, match="HF_TOKEN"):
        store.hub_filesystem()
    monkeypatch.delenv("HF_TOKEN")
    assert download(URL).manifest.num_steps > 0


@pytest.mark.parametrize(
    "damage",
    [
        "{broken",
        "[]",
        '{"sha": "x"}',
        '{"files": [{"path": "a"}]}',
        '{"files": [{"path": "../x", "size": 1}]}',
    ],
)
def test_a_damaged_listing_kept_for_offline_is_one_line(
    hub: HubStandin, isolated_cache: Path, damage: str
) -> None:
    """An offline re-run reads the listing the first download kept: damaged or edited (a name
    outside the download folder included), it is one line saying to download online again."""
    result = download(URL, name="first")
    sha = result.manifest.source["hub"]["commit"]  # type: ignore[index]
    (listing,) = isolated_cache.rglob("hub-listing.json")
    listing.write_text(damage)
    with pytest.raises(
        OfflineError, match=r"hub-listing\.json: the listing kept by an earlier download is damaged"
    ):
        download(f"{URL}@{sha}", name="again", offline=True)
    assert download(f"{URL}@{sha}", name="again").manifest.num_steps > 0  # online, it is listed afresh


def test_a_pull_refused_by_a_5xx_gets_no_push_hint() -> None:
    class Refused(Exception):
        __module__ = "huggingface_hub.errors"
        response = type("R", (), {"status_code": 503})()

    read = store.access_error("hf://datasets/o/r", Refused())
    assert "HTTP 503" in str(read) and "uploaded" not in (read.hint or "")
    write = store.access_error("hf://datasets/o/r", Refused(), write=True)
    assert "uploaded" in (write.hint or "")
    assert isinstance(read, RemoteAccessError)


def test_the_clients_retry_lines_stay_off_the_cli_output(hub: HubStandin) -> None:
    """The client logs each retry of a 5xx on stderr; the CLI says what failed in one line."""
    hub.throttle["GET /api/datasets/lerobot-test/tiny/tree"] = 2
    hub.retry_after = "0"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_VERBOSITY"}
    done = _cli(env, "download", URL, "--name", "quiet")
    assert done.returncode == 0, done.stderr
    assert "Retrying" not in done.stderr and "HTTP Error" not in done.stderr


def test_a_killed_transfers_partial_file_is_removed_by_the_next_fetch(
    hub: HubStandin, isolated_cache: Path
) -> None:
    download(URL, name="first")
    (listing,) = isolated_cache.rglob("hub-listing.json")
    staging = meta_dir(listing.parent.parent) / STAGING
    partial = staging / ".cache" / "huggingface" / "download" / "videos" / "x.etag.1a2b3c4d.incomplete"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"\0" * 12_288)  # what a killed run's transfer leaves, named anew each run
    download(URL, name="second", force=True)
    assert not partial.exists()


def test_a_killed_hub_exports_build_is_removed_by_gc(isolated_cache: Path, tmp_path: Path) -> None:
    """The export's build in tmp/ holds a lock of its own: gc leaves it while its process runs
    and removes it once that process is gone (SIGKILL: nothing of its own cleanup ran)."""
    cache = CacheRoot()
    owner = f"demo{HUB_EXPORT_MARK}0123456789ab"
    with private_build(cache, owner) as build:
        build.mkdir()
        (build / "export.bin").write_bytes(b"x" * 1000)
        assert cache.clean_stale_builds() == []  # its lock is held: a live export
    assert not build.exists()
    code = (
        "import os\n"
        "from rlds_cli.cache.root import CacheRoot\n"
        "from rlds_cli.cache.growing import private_build\n"
        f"with private_build(CacheRoot(), {owner!r}) as b:\n"
        "    b.mkdir(); print(b, flush=True); os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    left = Path(killed.stdout.strip())
    assert killed.returncode == -9 and left.is_dir()
    assert cache.clean_stale_builds() == [left] and not left.exists()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_command_says_the_same_when_the_hub_cannot_be_reached(isolated_cache: Path) -> None:
    """download, pull, push, export and a remote read: one message shape, with the endpoint
    tried, the cause in words and RLDS_HF_ENDPOINT in the hint (push/pull once said the client's
    class name and HF_ENDPOINT, download the cause and RLDS_HF_ENDPOINT)."""
    download("demo")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RLDS_"))}
    env.update(RLDS_HOME=str(isolated_cache), RLDS_HF_ENDPOINT=endpoint, NO_COLOR="1", COLUMNS="300")
    env["HF_HOME"] = str(isolated_cache.parent / "hf-home")
    repo = "hf://datasets/org/repo/x"
    commands = {
        "download": ["download", repo],
        "pull": ["pull", repo],
        "push": ["push", "demo", repo],
        "export": ["export", "demo", repo, "--to", "lerobot"],
        "inspect": ["inspect", repo],
    }
    for command, args in commands.items():
        run = _cli(env, *args)
        assert run.returncode == 1, (command, run.stderr)
        first, hint = run.stderr.strip().splitlines()[:2]
        assert (
            first == f"error: cannot reach the Hub at {endpoint} for {repo}@main: the connection was refused"
        ), command
        assert hint.startswith("hint: check the network") and "RLDS_HF_ENDPOINT" in hint, (command, hint)


def test_a_full_disk_while_the_client_writes_is_said_as_such() -> None:
    """huggingface_hub's OSError (ENOSPC) for a write it could not finish read as "cannot reach
    the Hub", with a hint about the network and --offline."""
    import errno

    from rlds_cli.errors import DiskFullError
    from rlds_cli.net.hub import HubPath, translated

    for raised in (
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("the client's wrapper"),  # raised from one
    ):
        with (
            pytest.raises(
                DiskFullError, match=r"no space left on the disk for hf://datasets/o/r@main file 'x\.h5'"
            ),
            translated(HubPath("o/r"), "x.h5"),
        ):
            if isinstance(raised, OSError):
                raise raised
            try:
                raise OSError(errno.EDQUOT, "Disk quota exceeded")
            except OSError as cause:
                raise raised from cause


def test_a_repo_of_no_data_or_of_no_known_format_names_the_repo(
    hub: HubStandin, isolated_cache: Path
) -> None:
    """Both named the download folder inside the cache ('cannot tell the format of
    .../raw/url-...'), and the first suggested --format, which cannot help."""
    from rlds_cli.errors import SourceFormatError, UnknownFormatError

    hub.add_repo("org/card-only", {"README.md": b"# soon\n", ".gitattributes": b""})
    with pytest.raises(SourceFormatError, match=r"hf://datasets/org/card-only@main holds no data files"):
        download("hf://datasets/org/card-only")
    hub.add_repo("org/json", {"data.json": b"{}", "README.md": b"# x\n"})
    with pytest.raises(UnknownFormatError) as info:
        download("hf://datasets/org/json")
    assert info.value.message.startswith("cannot tell the format of hf://datasets/org/json@main (its files: ")
    assert "data.json" in info.value.message and "raw" not in info.value.message
