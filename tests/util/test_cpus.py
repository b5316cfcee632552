"""usable_cpus: the affinity mask where there is one, else the machine's count."""

from __future__ import annotations

import os

import pytest

from rlds_cli._util import cpus


def test_the_affinity_mask_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert cpus.usable_cpus() == 3


def test_without_an_affinity_mask_the_machine_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cpus.usable_cpus() == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert cpus.usable_cpus() == 6
