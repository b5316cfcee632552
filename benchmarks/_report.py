"""The pieces of a benchmark report (re-exported by :mod:`_harness`, which every section
imports): the facts its header states (CPU, versions, commit), the Markdown file's sections
between their ``<!-- bench:NAME:start/end -->`` markers, and the lines a section is made of
(header, notes, tables, goals and verdicts), plus the raw figures as JSON."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: What a Markdown file written from nothing starts with (``--write`` to a new file).
INTRO = """# Benchmarks

Side-by-side measurements of rlds against its peers (TorchRL, Minari), run in one session on one
machine so the ratios are comparable. Regenerate with `make bench` (`benchmarks/run_all.py`);
each section is rewritten between its `<!-- bench:NAME:start/end -->` markers.

"""


# ----------------------------------------------------------------------------- facts for the report


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def version(dist: str) -> str:
    """Installed version of a distribution, or ``not installed``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions(*dists: str) -> str:
    """``name version, ...`` of ``dists``."""
    return ", ".join(f"{d} {version(d)}" for d in dists)


def commit() -> str:
    """The short commit, marked when tracked files have uncommitted changes."""
    git = ["git", "-C", str(REPO)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


# ----------------------------------------------------------------------------- the Markdown file


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of section ``name``."""
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def write_section(path: Path, name: str, section: str) -> None:
    """Replace section ``name`` in ``path`` with ``section`` (which includes its markers); append it
    when absent, create the file (with :data:`INTRO`) when missing."""
    start, end = markers(name)
    text = path.read_text() if path.exists() else INTRO
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ----------------------------------------------------------------------------- report pieces


def save_json(path: Path, figures: Any) -> None:
    """The raw figures as JSON: measured objects (cases, configurations) as their data fields,
    pair keys as ``a / b``."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {" / ".join(k) if isinstance(k, tuple) else str(k): plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        if hasattr(x, "__dict__"):
            return {k: plain(v) for k, v in vars(x).items() if not k.startswith("_") and not callable(v)}
        return x if isinstance(x, int | float | str | bool | None) else str(x)

    path.write_text(json.dumps(plain(figures), indent=1))


def header(info: dict[str, Any], versions: str) -> list[str]:
    """The two lines under a section's workload paragraph: where, when, with what, under which load."""
    return [
        f"- Measured {info['date']} on {info['cpu']} ({info['cpus']} CPUs, shared), {info['ram']} RAM, "
        f"{info['os']}; Python {info['python']}; {versions}.",
        f"- rlds commit {info['commit']}; run took {info['minutes']:.1f} min; 1-minute load average "
        f"before/after: {info['load_before']:.1f}/{info['load_after']:.1f}.",
    ]


def load_note(loads: list[float], when: str, busy: str) -> str:
    """The 1-minute load averages taken ``when``, and ``busy`` when other jobs kept the CPUs busy."""
    text = f"- 1-minute load average {when}: {', '.join(f'{v:.1f}' for v in loads)} on {os.cpu_count()} CPUs"
    return text + (f" ({busy})." if max(loads) > 0.75 * (os.cpu_count() or 1) else ".")


def opening(section: str, title: str, quick: bool, *notes: str) -> list[str]:
    """A section's first lines: its start marker, its title, its notes as quotes, the quick-run note."""
    lines = [markers(section)[0], "", f"## {title}", ""]
    for note in notes:
        lines += [f"> {note}", ""]
    if quick:
        lines += ["> **Quick run** (`--quick`): a small dataset and short runs; not the reference run.", ""]
    return lines


def closing(section: str, command: str | None, notes: Iterable[str] = ()) -> list[str]:
    """A section's last lines: how it is measured (the command, then ``notes``) and its end marker;
    only the end marker when there is no ``command``."""
    if command is None:
        return ["", markers(section)[1], ""]
    how = ["", "### How it is measured", "", "```text", command, "```", "", *notes]
    return [*how, "", markers(section)[1], ""]


def verdict(ok: bool) -> str:
    """Markdown verdict for a goal."""
    return "**met**" if ok else "**not met**"


def goal(what: str, shown: str, value: float, target: float) -> str:
    """A goal's line: what, the measured value as shown, the target, met or not."""
    return f"- {what}: {shown} (goal >= {target:g}x): {verdict(value >= target)}"


def span(values: Iterable[float], fmt: str = ",.0f", unit: str = "") -> str:
    """``median (min-max)`` of ``values``."""
    v = list(values)
    return f"{statistics.median(v):{fmt}}{unit} ({min(v):{fmt}}-{max(v):{fmt}})"


def table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    """A Markdown table (a row: its cells, or its line)."""
    head = list(head)
    lines = ["| " + " | ".join(map(str, r)) + " |" if not isinstance(r, str) else r for r in rows]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines]


PAIRED_NOTE = (
    "- Paired ratios: the two sides' calls alternate one by one for about {seconds:g} s, and the ratio "
    "is that of their median call times (both see the same moments of the shared machine); median "
    "of the rounds, range in brackets. Ratios to TorchRL are those of the rates, the paired ones "
    "beside them."
)
