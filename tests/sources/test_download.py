"""``rlds download`` end to end against a local server: registry entries, faults, a killed
process, concurrent downloads, offline mode, verification, ``info``/``verify``/``list --remote``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

import rlds_cli
from rlds_cli.catalog import registry
from rlds_cli.cli import output
from rlds_cli.cli.app import app
from rlds_cli.errors import OfflineError
from rlds_cli.net.layout import HashStore, part_path
from rlds_cli.sources.download import download
from tests.http_faults import Fault, FaultServer, bounded, serving
from tests.waits import HANG_SECONDS

DEMO = registry.resolve("demo").files[0].bundled_path().read_bytes()
DEMO_SHA = hashlib.sha256(DEMO).hexdigest()
CORRUPT = DEMO[:1000] + bytes([DEMO[1000] ^ 0xFF]) + DEMO[1001:]
CORRUPT_SHA = hashlib.sha256(CORRUPT).hexdigest()
REPO_ROOT = Path(__file__).resolve().parents[2]


def registry_toml(base: str) -> str:
    return f"""
[[dataset]]
id = "local-points-v0"
aliases = ["lp"]
format = "d4rl"
max_episode_steps = 100
description = "the demo file, served over HTTP"

[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{base}/d4rl/pointmass.hdf5"]

[[dataset]]
id = "local-points-long-v0"
format = "d4rl"
max_episode_steps = 50

[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{base}/d4rl/pointmass.hdf5"]

[[dataset]]
id = "local-known-v0"
format = "d4rl"
max_episode_steps = 100

[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{base}/d4rl/known.hdf5"]
size = {len(DEMO)}
sha256 = "{DEMO_SHA}"

[[dataset]]
id = "local-corrupt-v0"
format = "d4rl"

[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{base}/d4rl/corrupt.hdf5"]
sha256 = "{DEMO_SHA}"

[[dataset]]
id = "local-hashes-v0"
format = "d4rl"
max_episode_steps = 100

[[dataset.files]]
name = "hashes.json"
urls = ["{base}/d4rl/pointmass.hdf5"]

[[dataset]]
id = "local-unreachable-v0"
format = "d4rl"

[[dataset.files]]
name = "hopper_medium-v2.hdf5"
urls = ["http://nonexistent.invalid/d4rl/hopper_medium-v2.hdf5"]

[[dataset]]
id = "org/minari-like-v0"
format = "minari"

[[dataset.files]]
name = "data/metadata.json"
urls = ["{base}/m/metadata.json"]

[[dataset.files]]
name = "data/main_data.hdf5"
urls = ["{base}/m/main_data.hdf5"]
"""


@pytest.fixture
def server(server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    # conftest's server with these files, and the downloader pointed at it by a registry
    files = {"/d4rl/pointmass.hdf5": DEMO, "/d4rl/known.hdf5": DEMO, "/d4rl/corrupt.hdf5": CORRUPT}
    with serving(server, files, monkeypatch, registry=registry_toml, where=tmp_path):
        yield server


pytestmark = pytest.mark.usefixtures("consoles")  # tests/conftest.py: fixed console widths


def invoke(*args: object, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def ok_json(*args: object) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def raw(home: Path, key: str = "local-points-v0") -> Path:
    return home / "raw" / key.replace("/", "--")


def published(home: Path) -> list[str]:
    folder = home / "datasets"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_download_id_through_faults(server: FaultServer, isolated_cache: Path) -> None:
    path = "/d4rl/pointmass.hdf5"
    server.add_faults(
        path,
        Fault("status", code=503),
        Fault("status", code=503),
        Fault("cut", after=120_000),
        Fault("status", code=429, headers={"Retry-After": "0"}),
        Fault("cut", after=90_000),
    )
    result = invoke("download", "lp")
    assert result.exit_code == 0, result.output
    assert "local-points-v0: converted: 5,000 steps, 94 episodes" in result.stdout
    statuses = [(r.range is not None, r.status) for r in server.requests_for(path)]
    assert statuses[:3] == [(False, 503), (False, 503), (False, 200)]
    assert (True, 206) in statuses
    assert (raw(isolated_cache) / "pointmass.hdf5").read_bytes() == DEMO
    info = ok_json("inspect", "local-points-v0")
    assert info["source"]["id"] == "local-points-v0"
    assert info["source"]["sha256"] == DEMO_SHA
    assert info["source"]["options"] == {"max_episode_steps": 100}
    (d,) = info["source"]["downloads"]
    assert (d["url"], d["sha256"], d["hash_origin"]) == (server.url(path), DEMO_SHA, "recorded")
    # info, list --remote and verify see it, without a request
    before = len(server.log)
    entry = ok_json("info", "lp")
    assert entry["files"][0]["sha256"] == DEMO_SHA and entry["files"][0]["sha256_origin"] == "recorded"
    assert entry["files"][0]["size"] == len(DEMO)
    assert entry["downloaded"] and entry["cached"]
    rows = {r["id"]: r for r in ok_json("list", "--remote")["datasets"]}
    assert rows["local-points-v0"]["cached"] and rows["local-points-v0"]["size_bytes"] == len(DEMO)
    assert not rows["local-known-v0"]["cached"] and rows["local-known-v0"]["size_bytes"] == len(DEMO)
    assert "hopper-medium-v2" in rows and rows["hopper-medium-v2"]["size_bytes"] is None
    report = ok_json("verify", "local-points-v0")
    assert report["ok"] and [f["status"] for f in report["files"]] == ["ok"]
    assert all(c["ok"] for c in report["manifest"])
    assert len(server.log) == before
    # again: nothing downloaded, nothing converted
    again = ok_json("download", "local-points-v0")
    assert again["reused"] is True and len(server.log) == before


def test_ids_sharing_a_url_download_it_once(server: FaultServer, isolated_cache: Path) -> None:
    assert invoke("download", "lp").exit_code == 0
    data = ok_json("download", "local-points-long-v0")
    assert data["num_steps"] == 5000 and data["downloads"][0]["sha256"] == DEMO_SHA
    assert len(server.requests_for("/d4rl/pointmass.hdf5")) == 1
    linked = raw(isolated_cache, "local-points-long-v0") / "pointmass.hdf5"
    assert linked.read_bytes() == DEMO
    assert ok_json("verify", "local-points-long-v0")["ok"]


def test_corrupt_file_rejected_nothing_published(server: FaultServer, isolated_cache: Path) -> None:
    result = invoke("download", "local-corrupt-v0")
    assert result.exit_code == 1
    line = result.stderr.splitlines()[0]
    assert line.startswith("error: pointmass.hdf5 downloaded from ")
    assert f"has sha256 {CORRUPT_SHA}, expected {DEMO_SHA} (from the registry)" in line
    assert "--force" in result.stderr.splitlines()[1]
    assert published(isolated_cache) == []
    assert [
        p.name for p in raw(isolated_cache, "local-corrupt-v0").iterdir() if not p.name.startswith(".")
    ] == []


def test_known_hash_and_size_verified(server: FaultServer, isolated_cache: Path) -> None:
    data = ok_json("download", "local-known-v0")
    assert data["downloads"][0]["hash_origin"] == "registry"
    report = ok_json("verify", "local-known-v0")
    assert report["files"][0]["origin"] == "registry" and report["ok"]


def test_verify_detects_tampering(server: FaultServer, isolated_cache: Path) -> None:
    assert invoke("download", "lp").exit_code == 0
    (raw(isolated_cache) / "pointmass.hdf5").write_bytes(CORRUPT)
    result = invoke("verify", "lp")
    assert result.exit_code == 1
    assert "fail    downloaded file pointmass.hdf5: " in result.stdout
    assert f"expected {DEMO_SHA} (recorded)" in result.stdout
    assert "verification failed" in result.stderr
    assert invoke("verify", "--json", "local-points-v0").exit_code == 1
    assert "nothing to verify" in invoke("verify", "nothing-v0").stderr


def test_no_keep_raw_keeps_hashes(server: FaultServer, isolated_cache: Path) -> None:
    assert invoke("download", "lp", "--no-keep-raw").exit_code == 0
    folder = raw(isolated_cache)
    assert not (folder / "pointmass.hdf5").exists()
    record = HashStore(folder).get("pointmass.hdf5")
    assert record is not None and record.sha256 == DEMO_SHA and record.pinned
    report = ok_json("verify", "lp")
    assert report["ok"] and report["files"][0]["status"] == "not kept"
    assert "--no-keep-raw" in invoke("verify", "lp").stdout


def test_a_kept_raw_file_removed_since_is_not_said_to_be_no_keep_raw(
    server: FaultServer, isolated_cache: Path
) -> None:
    """``verify`` reported any missing downloaded file as removed by ``--no-keep-raw``."""
    assert invoke("download", "lp").exit_code == 0
    (raw(isolated_cache) / "pointmass.hdf5").unlink()
    report = ok_json("verify", "lp")
    assert report["ok"] and report["files"][0]["status"] == "gone"
    text = " ".join(invoke("verify", "lp").stdout.split())
    assert "--no-keep-raw" not in text and "kept after its download and removed since" in text


def test_offline(server: FaultServer, isolated_cache: Path) -> None:
    for args, env in ((("--offline",), None), ((), {"RLDS_OFFLINE": "1"})):
        result = invoke("download", "lp", *args, env=env)
        assert result.exit_code == 1
        assert "pointmass.hdf5 is not downloaded" in result.stderr and "offline mode is on" in result.stderr
        assert "without --offline" in result.stderr
    assert server.log == [] and published(isolated_cache) == []
    assert invoke("download", "lp").exit_code == 0
    n = len(server.log)
    forced = ok_json("download", "lp", "--offline", "--force")
    assert forced["reused"] is False  # re-converted from the verified local file
    assert len(server.log) == n


def test_url_download(server: FaultServer, isolated_cache: Path) -> None:
    url = server.url("/d4rl/pointmass.hdf5")
    data = ok_json(
        "download", url, "--sha256", DEMO_SHA.upper(), "--name", "adhoc", "--max-episode-steps", "100"
    )
    assert data["name"] == "adhoc" and data["num_steps"] == 5000
    assert data["downloads"][0]["hash_origin"] == "user"
    assert ok_json("verify", "adhoc")["files"][0]["origin"] == "user"
    bad = invoke("download", server.url("/d4rl/corrupt.hdf5"), "--sha256", DEMO_SHA, "--name", "bad")
    assert bad.exit_code == 1 and f"expected {DEMO_SHA} (given with --sha256)" in bad.stderr
    assert published(isolated_cache) == ["adhoc"]
    assert invoke("download", url, "--sha256", "xyz").exit_code == 2
    missing = invoke("download", server.url("/nope.hdf5"))
    assert missing.exit_code == 1
    assert f"GET {server.url('/nope.hdf5')} answered HTTP 404" in missing.stderr


def test_url_schemes(server: FaultServer, isolated_cache: Path) -> None:
    """``HTTP://`` and ``file://`` sources were taken for paths ("source file HTTP:/... does not
    exist"); ``ftp://`` too. A scheme is any case; ``file://`` is the local path; one rlds does not
    fetch is named."""
    url = server.url("/d4rl/pointmass.hdf5").replace("http://", "HTTP://")
    assert ok_json("download", url, "--name", "upper", "--max-episode-steps", "100")["num_steps"] == 5000
    local = isolated_cache / "raw-copy.hdf5"
    local.write_bytes(server.files["/d4rl/pointmass.hdf5"])
    data = ok_json("download", local.as_uri(), "--name", "local", "--max-episode-steps", "100")
    assert data["num_steps"] == 5000
    for source in ("ftp://example.com/x.hdf5", "S3://bucket/x.hdf5"):
        result = invoke("download", source)
        assert result.exit_code == 1, result.output
        scheme = source.split(":")[0].lower()
        assert result.stderr.startswith(
            f"error: {source}: rlds downloads http://, https:// and hf:// URLs, not {scheme}://"
        )
    localhost = "file://localhost" + local.as_uri()[len("file://") :]
    assert (
        ok_json("download", localhost, "--name", "localhost", "--max-episode-steps", "100")["num_steps"]
        == 5000
    )
    elsewhere = invoke("download", "file://nas" + local.as_uri()[len("file://") :])  # was read as /PATH
    assert elsewhere.exit_code == 1 and "names a file on another machine" in elsewhere.stderr
    assert published(isolated_cache) == ["local", "localhost", "upper"]


def test_minari_entry_passes_its_folder(
    server: FaultServer, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.files["/m/metadata.json"] = b'{"dataset_id": "x"}'
    server.files["/m/main_data.hdf5"] = DEMO
    calls: list[Any] = []
    monkeypatch.setattr("rlds_cli.sources.download.convert", lambda source, name, **kw: calls.append(source))
    download("org/minari-like-v0")
    folder = raw(isolated_cache, "org/minari-like-v0")
    assert calls == [folder]
    assert (folder / "data" / "main_data.hdf5").read_bytes() == DEMO


def test_remote_entries_of_the_packaged_registry_are_well_formed_offline(isolated_cache: Path) -> None:
    """Packaged remote ids resolve and fail cleanly offline (no network in tests)."""
    with pytest.raises(OfflineError):
        download("hopper-medium-v2", offline=True)
    with pytest.raises(OfflineError):
        download("DAPG(expert)/door_v2d-v1", offline=True)


def _subprocess_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("RLDS_", "PATH", "HOME", "LANG", "PYTHON"))}
    env.update({"RLDS_HOME": str(home), "COLUMNS": "200"})
    return env


def _rlds(home: Path, *args: str) -> subprocess.Popen[bytes]:
    code = "from rlds_cli.cli.app import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env=_subprocess_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_killed_download_resumes(server: FaultServer, isolated_cache: Path) -> None:
    # the server holds the rest of the file until the download is killed: it cannot finish first
    sent_before_kill = len(DEMO) // 2
    release = threading.Event()
    server.add_faults("/d4rl/pointmass.hdf5", Fault("pause", after=sent_before_kill, wait=release))
    proc = _rlds(isolated_cache, "download", "lp")
    part = part_path(raw(isolated_cache), "pointmass.hdf5")
    deadline = time.monotonic() + HANG_SECONDS  # only a bound on a hang: the loop ends on the bytes
    while (not part.is_file() or part.stat().st_size < 40_000) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    release.set()
    have = part.stat().st_size
    assert 40_000 <= have <= sent_before_kill
    assert published(isolated_cache) == []
    server.throttle = None
    result = invoke("download", "lp")
    assert result.exit_code == 0, result.output
    last = server.requests_for("/d4rl/pointmass.hdf5")[-1]
    assert (last.range, last.status) == (f"bytes={have}-", 206)
    assert (raw(isolated_cache) / "pointmass.hdf5").read_bytes() == DEMO
    assert not part.exists()
    assert ok_json("verify", "lp")["ok"]


def test_two_threads_download_once(server: FaultServer, isolated_cache: Path) -> None:
    # the first download holds half the file until the other thread has found it locked (its
    # "wait" event): the two surely overlap
    other_is_waiting = threading.Event()
    server.add_faults("/d4rl/pointmass.hdf5", Fault("pause", after=len(DEMO) // 2, wait=other_is_waiting))

    def progress(event: str, name: str, value: int) -> None:
        if event == "wait":
            other_is_waiting.set()

    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(download("lp", download_progress=progress)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert other_is_waiting.is_set()
    assert sorted(r.reused for r in results) == [False, True]
    assert len(server.requests_for("/d4rl/pointmass.hdf5")) == 1


@pytest.mark.slow
def test_two_processes_download_once(server: FaultServer, isolated_cache: Path) -> None:
    server.throttle = (16384, 0.05)  # about 1 s for the file
    procs = [_rlds(isolated_cache, "download", "lp", "--json") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
    results = [json.loads(out) for out, _ in outs]
    assert sorted(r["reused"] for r in results) == [False, True]
    assert len(server.requests_for("/d4rl/pointmass.hdf5")) == 1
    assert published(isolated_cache) == ["local-points-v0"]


# --------------------------------------------------------------------------- real readers, multi-file


def _serve_dir(server: FaultServer, folder: Path, prefix: str) -> dict[str, str]:
    """Serve every file under ``folder`` at ``prefix/<relative path>``; return name -> sha256."""
    hashes = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        server.files[f"{prefix}/{rel}"] = path.read_bytes()
        hashes[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def test_multi_file_entries_convert_with_the_real_readers(
    server: FaultServer, isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import formats_fixtures as ff

    src = tmp_path / "src"
    (src / "og").mkdir(parents=True)
    ff.golden_ogbench(src / "og" / "toy-v0.npz")
    ff.golden_ogbench(src / "og" / "toy-v0-val.npz")
    ff.write_minari_by_hand(src / "mn", [ff.minari_episode(3), ff.minari_episode(2, terminated=False)])
    _serve_dir(server, src / "og", "/og")
    _serve_dir(server, src / "mn", "/mn")
    extra = tmp_path / "multi.toml"
    extra.write_text(
        f"""
[[dataset]]
id = "toy-og-v0"
format = "ogbench"
[[dataset.files]]
name = "toy-v0.npz"
urls = ["{server.base}/og/toy-v0.npz"]
[[dataset.files]]
name = "toy-v0-val.npz"
urls = ["{server.base}/og/toy-v0-val.npz"]

[[dataset]]
id = "toy/minari-v0"
format = "minari"
[[dataset.files]]
name = "data/metadata.json"
urls = ["{server.base}/mn/data/metadata.json"]
[[dataset.files]]
name = "data/main_data.hdf5"
urls = ["{server.base}/mn/data/main_data.hdf5"]
"""
    )
    monkeypatch.setenv("RLDS_REGISTRY", os.pathsep.join([os.environ["RLDS_REGISTRY"], str(extra)]))
    registry._load.cache_clear()
    for dataset_id, name in (
        ("toy-og-v0", "toy-og-v0"),
        ("toy/minari-v0", "toy/minari-v0"),
    ):
        data = ok_json("download", dataset_id)
        assert data["name"] == name and data["num_steps"] > 0, dataset_id
        assert ok_json("verify", name)["ok"]


def test_a_d4rl_entry_records_its_environment_at_download(
    server: FaultServer, isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's D4RL id becomes the manifest's ``env`` (read later with no registry);
    an entry that names none records none."""
    extra = tmp_path / "env.toml"
    extra.write_text(
        f"""
[[dataset]]
id = "points-env-v0"
format = "d4rl"
max_episode_steps = 100
ids = {{ d4rl = "pointmass-open-v0" }}
[[dataset.files]]
name = "pointmass.hdf5"
urls = ["{server.base}/d4rl/pointmass.hdf5"]
"""
    )
    before = os.environ["RLDS_REGISTRY"]
    monkeypatch.setenv("RLDS_REGISTRY", os.pathsep.join([before, str(extra)]))
    registry._load.cache_clear()
    ok_json("download", "points-env-v0")
    ok_json("download", "local-points-v0")
    monkeypatch.setenv("RLDS_REGISTRY", before)  # read where the registry knows no such entry
    registry._load.cache_clear()
    assert not registry.is_known("points-env-v0")
    ds = rlds_cli.open_dataset("points-env-v0")
    assert ds.manifest.env["source"] == "registry"
    spec = ds.env_spec
    assert spec is not None
    assert (spec.id, spec.max_episode_steps, spec.source) == ("pointmass-open-v0", 100, "registry")
    assert "registry entry 'points-env-v0'" in spec.origin
    assert rlds_cli.open_dataset("local-points-v0").env_spec is None
    shown = ok_json("inspect", "points-env-v0")
    assert shown["env"]["id"] == "pointmass-open-v0"


def test_progress_bars_on_a_terminal(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import io

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=120, highlight=False)
    monkeypatch.setattr(output, "err_console", terminal)
    server.add_faults("/d4rl/pointmass.hdf5", Fault("status", code=503))
    result = invoke("download", "lp")
    assert result.exit_code == 0, result.output
    text = screen.getvalue()
    assert "pointmass.hdf5" in text and "converting" in text
    # each retry is said once, by the library's log record with its reason (the CLI shows it);
    # no second line from the progress bars, and no source location such as "x.py:62"
    said = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(said) == 1 and "HTTP 503" in said[0] and "retry 1/5" in said[0], said
    assert "retry" not in text
    assert not re.search(r"\w\.py:\d+", text + result.stderr)


def test_a_captive_portal_page_is_never_pinned(server: FaultServer, isolated_cache: Path) -> None:
    """Issue 11.5: the first download is an HTML page (a captive portal), so conversion fails.
    Its hash must not become the trusted one: the next download of the real file succeeds."""
    portal = b"<!DOCTYPE html><html><body>Please log in to the hotel Wi-Fi</body></html>\n" * 40
    server.files["/d4rl/pointmass.hdf5"] = portal
    first = invoke("download", "lp")
    assert first.exit_code == 1 and "as HDF5" in first.stderr and "run the same command again" in first.stderr
    record = HashStore(raw(isolated_cache)).get("pointmass.hdf5")
    assert record is not None and record.sha256 == hashlib.sha256(portal).hexdigest() and not record.pinned
    assert ok_json("info", "lp")["files"][0]["sha256_origin"] == "unconfirmed"
    assert published(isolated_cache) == []
    # verify passed it: "matches the recorded sha256", a hash that vouches for nothing
    checked = invoke("verify", "lp", "--json")
    assert checked.exit_code == 1, checked.output
    checks = json.loads(checked.stdout)["checks"]
    (check,) = [c for c in checks if c["check"] == "downloaded file pointmass.hdf5"]
    assert check["status"] == "fail" and "its last download did not convert" in check["detail"]
    # --sha256 names one file's hash: it was dropped without a word for a registry id
    refused = invoke("download", "lp", "--sha256", "0" * 64)
    assert refused.exit_code == 1 and "--sha256 checks a URL or a local file; 'lp' is a registry id" in (
        refused.stderr
    )
    server.files["/d4rl/pointmass.hdf5"] = DEMO  # the network works now
    # another id of the same URL does not borrow the unconverted file
    assert ok_json("download", "local-points-long-v0")["downloads"][0]["sha256"] == DEMO_SHA
    second = invoke("download", "lp")  # the same command: the failed file is fetched again
    assert second.exit_code == 0, second.output
    record = HashStore(raw(isolated_cache)).get("pointmass.hdf5")
    assert record is not None and (record.sha256, record.pinned) == (DEMO_SHA, True)
    assert ok_json("verify", "lp")["ok"]


def test_a_registry_file_named_hashes_json(server: FaultServer, isolated_cache: Path) -> None:
    """A dataset file called hashes.json took the hash store's lock and path (a deadlock)."""
    result = bounded(lambda: download("local-hashes-v0"), HANG_SECONDS)
    assert result.manifest.num_steps == 5000
    folder = raw(isolated_cache, "local-hashes-v0")
    assert (folder / "hashes.json").read_bytes() == DEMO
    assert HashStore(folder).get("hashes.json").sha256 == DEMO_SHA  # type: ignore[union-attr]
    assert ok_json("verify", "local-hashes-v0")["ok"]


def test_offline_without_dns_fails_at_once_and_names_offline(
    server: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 17.6: offline, a download failed after 25 s of retries printed twice, and the hint
    did not mention --offline. getaddrinfo is replaced: no lookup leaves the machine."""
    import socket

    real = socket.getaddrinfo
    lookups: list[str] = []

    def offline_dns(host: Any, *args: Any, **kw: Any) -> Any:
        if host == "nonexistent.invalid":
            lookups.append(host)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", offline_dns)
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RLDS_RETRY_BASE_DELAY", "1")  # the default: retries would take seconds
    started = time.monotonic()
    result = invoke("download", "local-unreachable-v0")
    assert time.monotonic() - started < 5 and lookups == ["nonexistent.invalid"]
    assert result.exit_code == 1
    error, hint = result.stderr.splitlines()
    url = "http://nonexistent.invalid/d4rl/hopper_medium-v2.hdf5"
    assert error.startswith(f"error: GET {url}: cannot resolve the host name 'nonexistent.invalid'")
    assert hint.startswith("hint: ") and "--offline" in hint and "RLDS_OFFLINE=1" in hint
    assert not [r for r in caplog.records if "retry" in r.getMessage()]
    assert not re.search(r"\w\.py:\d+", result.stderr)


def test_a_pipe_a_device_and_a_malformed_url_are_one_line_each(isolated_cache: Path, tmp_path: Path) -> None:
    """A FIFO (and /dev/zero as d4rl) never ended; malformed URLs were 'unexpected ...'."""
    fifo = tmp_path / "fifo.hdf5"
    os.mkfifo(fifo)
    for args in ([str(fifo)], ["/dev/zero", "--format", "d4rl"]):
        result = bounded(lambda args=args: invoke("download", *args), HANG_SECONDS)
        assert (
            result.exit_code == 1
            and "is not a file or a folder (a pipe, a device or a socket)" in result.stderr
        )
    for url, said in [
        ("http://[::1/file.hdf5", "is not a valid URL (Invalid IPv6 URL)"),
        ("http://127.0.0.1:99999/f.hdf5", "InvalidURL"),
        ("http:///f.hdf5", "No host supplied"),
    ]:
        result = invoke("download", url)
        assert result.exit_code == 1 and said in result.stderr and "unexpected" not in result.stderr
    assert published(isolated_cache) == []


def test_a_source_changed_while_it_converts_publishes_nothing(
    isolated_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file rewritten in place during the conversion gave a dataset mixing both versions,
    'converted', exit 0."""
    from rlds_cli.formats import d4rl

    source = tmp_path / "demo.hdf5"
    source.write_bytes(DEMO)
    real = d4rl.D4RLReader.blocks

    def rewritten(self: Any, *args: Any, **kwargs: Any) -> Any:
        for i, block in enumerate(real(self, *args, **kwargs)):
            if i == 0:
                os.utime(source, ns=(1, 1))  # as a rewrite in place changes it
            yield block

    monkeypatch.setattr(d4rl.D4RLReader, "blocks", rewritten)
    result = invoke("download", str(source), "--name", "demo")
    assert result.exit_code == 1 and f"source file {source} changed while it was converted" in result.stderr
    assert published(isolated_cache) == []


@pytest.mark.parametrize("source", ["the root", "a folder holding it"])
def test_the_cache_itself_is_no_source(isolated_cache: Path, source: str) -> None:
    """``rlds download $RLDS_HOME`` converted a stray HDF5 file found at the cache's top, as a
    folder source; a folder holding the cache would walk its datasets and downloads."""
    runner = CliRunner()
    assert runner.invoke(app, ["demo", "-q"]).exit_code == 0
    stray = isolated_cache / "stray.hdf5"
    stray.write_bytes((Path(rlds_cli.__file__).parent / "data" / "pointmass-demo-v0.hdf5").read_bytes())
    given = isolated_cache if source == "the root" else isolated_cache.parent
    result = runner.invoke(app, ["download", str(given), "-n", "x"])
    how = "is" if source == "the root" else "holds"
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == f"error: source {given} {how} the rlds cache ({isolated_cache})"
    assert not (isolated_cache / "datasets" / "x").exists()
