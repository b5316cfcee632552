"""Every exporter against the shared contract (:mod:`rlds_cli.testing.contracts`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from rlds_cli.export import EXPORTERS
from rlds_cli.testing.contracts import ExporterContract


def test_every_exporter_has_a_contract_class() -> None:
    tested = {cls.format for cls in ExporterContract.__subclasses__()}
    assert tested == set(EXPORTERS)


class TestTorchRLExporter(ExporterContract):
    format = "torchrl"


class TestD4RLExporter(ExporterContract):
    format = "d4rl"

    def out_path(self, tmp_path: Path) -> Path:
        return tmp_path / "out" / "exported.hdf5"


class TestNpzExporter(ExporterContract):
    format = "npz"

    def out_path(self, tmp_path: Path) -> Path:
        return tmp_path / "out" / "exported.npz"


class TestMinariExporter(ExporterContract):
    format = "minari"

    @pytest.fixture(autouse=True)
    def _minari(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        pytest.importorskip("minari")
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "out"))

    def out_path(self, tmp_path: Path) -> Path:
        return tmp_path / "out" / "golden-v0"  # a Minari dataset id names the folder


class TestLeRobotExporter(ExporterContract):
    format = "lerobot"
    # LeRobot names a state vector observation.state, and keeps no final observation (an
    # episode's last next/observation is not in its frames)
    renamed: ClassVar[dict[str, str]] = {"observation": "observation/state"}
    dropped = frozenset({"next/observation"})

    @pytest.fixture(autouse=True)
    def _extras(self) -> None:
        pytest.importorskip("pyarrow")


class TestLeRobotV21Exporter(TestLeRobotExporter):
    options: ClassVar[dict[str, object]] = {"version": "2.1"}


class TestAmagoExporter(ExporterContract):
    format = "amago"
    dropped = frozenset({"info/qpos"})  # AMAGO's trajectory files hold no info keys


class TestRobomimicExporter(ExporterContract):
    format = "robomimic"
    # robomimic keeps observations under obs/<name>: a single 'observation' becomes obs/observation
    renamed: ClassVar[dict[str, str]] = {
        "observation": "observation/observation",
        "next/observation": "next/observation/observation",
    }

    def out_path(self, tmp_path: Path) -> Path:
        return tmp_path / "out" / "exported.hdf5"


class TestRldsExporter(ExporterContract):
    format = "rlds"

    @pytest.fixture(autouse=True)
    def _extras(self) -> None:
        pytest.importorskip("crc32c")
