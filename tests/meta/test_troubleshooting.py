"""docs/troubleshooting.md names every error class rlds raises on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import rlds_cli
from rlds_cli.errors import RldsError

PAGE = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"


def _error_classes() -> set[type]:
    found: set[type] = set()
    for module in pkgutil.walk_packages(rlds_cli.__path__, "rlds_cli."):
        if module.name.startswith(("rlds_cli.cli", "rlds_cli.loader", "rlds_cli.preprocess.executors")):
            continue  # command modules and torch-only modules define no errors
        mod = importlib.import_module(module.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, RldsError) and cls is not RldsError and cls.__module__.startswith("rlds_cli"):
                found.add(cls)
    return found


def test_every_error_is_documented() -> None:
    text = PAGE.read_text(encoding="utf-8")
    missing = sorted(cls.__name__ for cls in _error_classes() if f"`{cls.__name__}`" not in text)
    assert not missing, f"docs/troubleshooting.md does not mention {missing}"
