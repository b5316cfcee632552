"""docs/benchmarks.md is written by several benchmark scripts, each owning one section between
``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->``; this module is the one writer."""

from __future__ import annotations

import re
from pathlib import Path

INTRO = """# Benchmarks

Side-by-side measurements of rlds against its peers (TorchRL, Minari), run in one session on one
machine so the ratios are comparable. Regenerate with `make bench` (`benchmarks/run_all.py`: the
conversion, minari, preprocess, cli, pixel, real, zarr and loader sections, about 15 minutes; `--only
NAME...` runs some, and the frame-stack, dataloader and record sections run only when named); each section
is rewritten between its `<!-- bench:NAME:start/end -->` markers.

"""


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of section ``name``."""
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def write_section(path: Path, name: str, section: str) -> None:
    """Replace section ``name`` in ``path`` with ``section`` (which includes its markers);
    append it when absent, create the file (with :data:`INTRO`) when missing."""
    start, end = markers(name)
    text = path.read_text() if path.exists() else INTRO
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
