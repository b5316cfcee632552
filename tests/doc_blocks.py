"""The code blocks of README.md and docs/*.md, and how the suite runs them.

A page is one session, as a reader would type it: its ``bash`` blocks run in order in one
working directory with one cache (``RLDS_HOME``), and its ``python`` blocks run in order in one
Python process, so a later block sees what an earlier one defined. ``json`` and ``toml`` blocks
must parse. Other languages (``text``, and fences without one) are shown output, not code.

An HTML comment on the line just before a fence changes how its block runs (it is invisible on a
rendered page)::

    <!-- doc-test: network -->            downloads: run against a local server (see the test)
    <!-- doc-test: hub -->                hf:// downloads: run against the local Hub stand-in
                                           (tests/hub_standin.py; repos in tests/meta/test_doc_blocks.py)
    <!-- doc-test: skip-line=make test --> lines containing this text are not run (the reason
                                           must be obvious: here, the suite itself)
    <!-- doc-test: expect-exit=1 -->      the block shows a failure; it must exit with this code
    <!-- doc-test: skip=REASON -->        not run at all; REASON says why (kept rare: a test
                                           lists them)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: Languages whose blocks are run or parsed.
CODE_LANGUAGES = ("bash", "python", "json", "toml")

_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def skipped_lines(self) -> list[str]:
        return [s for s in self.options.get("skip-line", "").split("|") if s]


def parse_options(text: str) -> dict[str, str]:
    """``network; skip-line=make test`` -> ``{"network": "", "skip-line": "make test"}``."""
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in ("network", "hub", "skip-line", "expect-exit", "skip"):
            raise ValueError(f"unknown doc-test option {key!r}")
        if key in options and key == "skip-line":
            value = options[key] + "|" + value.strip()
        options[key] = value.strip()
    return options


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order, with the options of its marker."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page.name}:{start + 1}: a code fence is never closed")
        marker = _MARKER.match(lines[start - 1]) if start > 0 else None
        options = parse_options(marker.group(1)) if marker else {}
        code = "\n".join(lines[start + 1 : end]) + "\n"
        found.append(Block(page, start + 1, m.group(1).lower(), code, options))
        i = end + 1
    return found


def runnable_script(block: Block) -> str:
    """A bash block as it is run: the lines the marker excludes left out."""
    return "".join(
        line + "\n"
        for line in block.code.splitlines()
        if not any(skip in line for skip in block.skipped_lines)
    )
