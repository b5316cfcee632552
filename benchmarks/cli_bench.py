"""How fast the CLI starts: ``rlds --help`` must not pay for importing torch.

Runs each command in fresh processes (10 each, after one warm-up, median and fastest), writes the
``<!-- bench:cli:start/end -->`` section of docs/benchmarks.md with ``--write``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import _harness

SECTION = "cli"
RUNS = 10


def wall(cmd: list[str]) -> list[float]:
    """Wall seconds of :data:`RUNS` fresh processes (one warm-up first)."""
    subprocess.run(cmd, capture_output=True, check=True)
    out = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and optionally write) the section."""
    run = _harness.start(_harness.parser(__doc__.split("\n\n")[0], SECTION, work="cli").parse_args(argv))
    py = sys.executable
    commands = {
        "`rlds --help`": [py, "-m", "rlds_cli.cli.app", "--help"],
        "`rlds download --help`": [py, "-m", "rlds_cli.cli.app", "download", "--help"],
        "`python -c 'import torch'` (for scale)": [py, "-c", "import torch"],
        "`python -c 'pass'` (interpreter start)": [py, "-c", "pass"],
    }
    rows = [
        [name, f"{statistics.median(v):.3f}", f"{min(v):.3f}"]
        for name, v in ((n, wall(c)) for n, c in commands.items())
    ]
    lines = [
        *_harness.opening(SECTION, "CLI start-up", False),
        f"Median wall time of {RUNS} fresh processes each (`benchmarks/cli_bench.py`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). `rlds --help` imports neither torch, "
        "zarr, h5py nor requests (a test checks it): the commands import what they need when run.",
        "",
        *_harness.table(["command", "median s", "min s"], rows),
    ]
    run.publish(SECTION, "\n".join(lines + _harness.closing(SECTION, None)), _harness.logger(SECTION))
    return 0


if __name__ == "__main__":
    sys.exit(main())
