"""A reader of another package, installed the way ``pip install`` leaves one: the package
``rlds_tiny`` and its ``rlds_tiny-0.1.dist-info`` folder, whose ``entry_points.txt`` registers the
reader in the ``rlds_cli.readers`` group, in a folder a test puts on ``PYTHONPATH`` (nothing is
installed). Used by the plugin tests and the third-party contract test."""

from __future__ import annotations

import textwrap
from pathlib import Path

PLUGIN = '''
"""A reader of ".tiny" files: one float per line, each line a step; an empty line ends an
episode (the line before it is that episode's final observation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock


@dataclass(frozen=True)
class TinyOptions(ReaderOptions):
    scale: float = 1.0


class TinyReader(Reader):
    format_name = "tiny"
    expected_files = "a .tiny file"
    Options = TinyOptions

    @staticmethod
    def sniff(path: Path) -> bool:
        return path.suffix == ".tiny" and path.is_file()

    def __init__(self, path: Path, *, scale: float = 1.0) -> None:
        self.path = Path(path)
        self.scale = scale
        self.report = ConversionReport(rules="tiny-v1")
        text = self.path.read_text()
        self.episodes = [[float(x) for x in chunk.split()] for chunk in text.split("\\n\\n") if chunk.strip()]

    def total_rows(self) -> int:
        return sum(len(e) for e in self.episodes)

    def blocks(self, progress=None):
        for values in self.episodes:
            obs = np.asarray(values, np.float32)[:, None] * self.scale
            n = len(values) - 1
            yield StepBlock(
                steps={
                    "action": np.zeros((n, 1), np.float32),
                    "next/reward": np.ones(n, np.float32),
                    "next/terminated": np.arange(n) == n - 1,
                    "next/truncated": np.zeros(n, bool),
                },
                observations={"observation": obs},
                ends=np.array([n - 1]),
            )

    def source_metadata(self) -> dict:
        return {"scale": self.scale}

    def source_arrays(self) -> dict:
        return {}
'''


def install_tiny_plugin(site: Path, source: str = PLUGIN) -> Path:
    """``site`` holding the package ``rlds_tiny`` (its reader module being ``source``) and its
    distribution's metadata; returns ``site``."""
    (site / "rlds_tiny").mkdir(parents=True)
    (site / "rlds_tiny" / "__init__.py").write_text("")
    (site / "rlds_tiny" / "reader.py").write_text(textwrap.dedent(source))
    info = site / "rlds_tiny-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlds-tiny\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rlds_cli.readers]\ntiny = rlds_tiny.reader:TinyReader\n")
    return site
