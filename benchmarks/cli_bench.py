"""How fast the CLI starts: ``rlds --help`` must not pay for importing torch.

Runs each command in fresh processes (10 each, median), writes the
``<!-- bench:cli:start/end -->`` section of docs/benchmarks.md with ``--write``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_doc

SECTION = "cli"
START, END = bench_doc.markers(SECTION)
RUNS = 10


def wall(cmd: list[str], runs: int = RUNS) -> list[float]:
    """Wall seconds of ``runs`` fresh processes (one warm-up first)."""
    subprocess.run(cmd, capture_output=True, check=True)
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        out.append(time.perf_counter() - t)
    return out


def render() -> str:
    """Measure and return the Markdown section."""
    py = sys.executable
    rows = {
        "`rlds --help`": wall([py, "-m", "rlds_cli.cli.app", "--help"]),
        "`rlds download --help`": wall([py, "-m", "rlds_cli.cli.app", "download", "--help"]),
        "`python -c 'import torch'` (for scale)": wall([py, "-c", "import torch"]),
        "`python -c 'pass'` (interpreter start)": wall([py, "-c", "pass"]),
    }
    lines = [
        START,
        "",
        "## CLI start-up",
        "",
        f"Median wall time of {RUNS} fresh processes each (`benchmarks/cli_bench.py`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). `rlds --help` imports neither torch, "
        "zarr, h5py nor requests (a test checks it): the commands import what they need when run.",
        "",
        "| command | median s | min s |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {statistics.median(v):.3f} | {min(v):.3f} |" for k, v in rows.items()]
    lines += ["", END, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="Markdown file whose cli section is replaced")
    args = parser.parse_args(argv)
    section = render()
    print(section)
    if args.write:
        bench_doc.write_section(args.write, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
