"""Every ``RLDS_*`` variable is parsed in ``rlds_cli.settings``, and a value that cannot be used is
one :class:`SettingError` naming the variable and what to set, never a silent default."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from rlds_cli import settings
from rlds_cli.errors import SeedError, SettingError

READERS: dict[str, Callable[[], Any]] = {
    "RLDS_HTTP_TIMEOUT": settings.http_timeout,
    "RLDS_HTTP_RETRIES": settings.http_retries,
    "RLDS_RETRY_BASE_DELAY": settings.retry_base_delay,
    "RLDS_HTTP_MIN_SPEED": settings.http_min_speed,
    "RLDS_HTTP_SPEED_WINDOW": settings.http_speed_window,
    "RLDS_DOWNLOAD_WORKERS": settings.download_workers,
    "RLDS_MEMORY_BUDGET": settings.memory_budget,
    "RLDS_SEED": settings.seed,
    "RLDS_ARCHIVE_MAX_BYTES": settings.archive_max_bytes,
    "RLDS_ARCHIVE_MAX_RATIO": lambda: settings.archive_max_ratio(200.0),
    "RLDS_SOURCE_MAX_RATIO": lambda: settings.source_max_ratio(100.0),
    "RLDS_SIDE_ARRAY_MAX_BYTES": lambda: settings.side_array_max_bytes(64 << 20),
    "RLDS_HF_ENDPOINT": settings.hf_endpoint,
}


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("bad", ["soon", "nan", "-3", "1,2,3", "\u00b2"])
def test_a_bad_value_is_one_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, bad: str
) -> None:
    monkeypatch.setenv(name, bad)
    with pytest.raises(SettingError) as info:
        READERS[name]()
    assert str(info.value).startswith(f"{name}={bad!r} is not ")
    assert name in info.value.hint


@pytest.mark.parametrize(
    ("name", "value", "want"),
    [
        ("RLDS_HTTP_TIMEOUT", "5", (5.0, 5.0)),
        ("RLDS_HTTP_TIMEOUT", "3,30", (3.0, 30.0)),
        ("RLDS_HTTP_RETRIES", "0", 0),
        ("RLDS_HTTP_MIN_SPEED", "0", 0.0),
        ("RLDS_DOWNLOAD_WORKERS", "8", 8),
        ("RLDS_MEMORY_BUDGET", "2G", 2 << 30),
        ("RLDS_MEMORY_BUDGET", "512MiB", 512 << 20),
        ("RLDS_MEMORY_BUDGET", "0", 0),
        ("RLDS_SEED", "1234", 1234),
        ("RLDS_ARCHIVE_MAX_BYTES", "1M", 1 << 20),
        ("RLDS_ARCHIVE_MAX_RATIO", "5000", 5000.0),
        ("RLDS_SIDE_ARRAY_MAX_BYTES", "4096", 4096),
        ("RLDS_HF_ENDPOINT", "http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ],
)
def test_good_values_are_read(monkeypatch: pytest.MonkeyPatch, name: str, value: str, want: Any) -> None:
    monkeypatch.setenv(name, value)
    assert READERS[name]() == want


def test_unset_and_empty_mean_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in READERS:
        monkeypatch.setenv(name, "")
    assert settings.http_timeout() == (10.0, 60.0)
    assert settings.download_workers() == 4
    assert settings.memory_budget() is None and settings.seed() is None
    assert settings.archive_max_ratio(200.0) == 200.0


def test_a_bad_seed_is_still_a_seed_error_for_the_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlds_cli.loader.run_state import run_seed

    monkeypatch.setenv("RLDS_SEED", "soon")
    with pytest.raises(SeedError, match="RLDS_SEED='soon'"):
        run_seed(None)


CLI = "import sys; from rlds_cli.cli.app import main; sys.argv[0] = 'rlds'; main()"


def test_the_cli_says_one_line_and_exits_1(tmp_path: Any) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
        "RLDS_HOME": str(tmp_path),
        "RLDS_HTTP_TIMEOUT": "soon",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CLI, "download", "http://127.0.0.1:9/data.hdf5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "RLDS_HTTP_TIMEOUT='soon' is not" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["RLDS_DEBUG", "RLDS_FSYNC", "RLDS_NUMBA", "RLDS_OFFLINE"])
def test_an_on_off_variable_is_on_off_or_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    read = {
        "RLDS_DEBUG": settings.debug,
        "RLDS_FSYNC": settings.fsync_enabled,
        "RLDS_NUMBA": settings.numba_enabled,
        "RLDS_OFFLINE": settings.offline,
    }[name]
    pairs = [("1", True), ("ON", True), (" yes ", True), ("0", False), ("False", False), ("off", False)]
    for raw, want in pairs:
        monkeypatch.setenv(name, raw)
        assert read() is want
    monkeypatch.setenv(name, "maybe")  # was on, without a word
    with pytest.raises(SettingError, match=f"^{name}='maybe' is not 1 or 0"):
        read()


@pytest.mark.parametrize("name", ["RLDS_DEBUG", "RLDS_FSYNC"])
def test_the_cli_refuses_a_bad_on_off_variable_before_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, name: str
) -> None:
    from typer.testing import CliRunner

    from rlds_cli.cli.app import app

    monkeypatch.setenv("RLDS_HOME", str(tmp_path))
    monkeypatch.setenv(name, "maybe")
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0] == f"error: {name}='maybe' is not 1 or 0 (on or off)"
    assert not (tmp_path / "datasets").exists()  # nothing started
