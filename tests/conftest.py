"""Shared test set-up: every test gets its own cache root and never touches the network."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the cache at a fresh temp dir; skip fsync (tests that need it turn it on)."""
    root = tmp_path / "rlds-home"
    monkeypatch.setenv("RLDS_HOME", str(root))
    monkeypatch.setenv("RLDS_FSYNC", "0")
    monkeypatch.delenv("RLDS_REGISTRY", raising=False)
    monkeypatch.delenv("RLDS_DEBUG", raising=False)
    return root
