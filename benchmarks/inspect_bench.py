"""``rlds inspect`` and ``rlds inspect --check`` on low-dim datasets of growing size: wall time and
peak RSS of the whole process, for one or more checkouts of rlds side by side (issue 38)::

    git archive HEAD | tar -x -C /tmp/rlds-before      # the code before a change
    python benchmarks/inspect_bench.py --steps 1000000 10000000 50000000 \\
        --tree before=/tmp/rlds-before --tree after=.

Each dataset (:func:`data.lowdim_blocks`: 17 float32 observations, 6 float32 actions, a float32
reward, 1000-step episodes; memmap storage, ~98 bytes a step on disk) is written once under a
temporary cache root (``--root``), removed at the end unless ``--keep``. Every command runs
``--repeats`` times, the trees interleaved, each in a fresh process
(``python -m rlds_cli.cli.app`` with the tree first on ``PYTHONPATH``); its peak RSS is the
child's ``ru_maxrss`` (:func:`os.wait4`): anonymous memory and the pages of memory maps alike;
its CPU seconds (user + system, from the same call) vary less than wall time on a shared
machine. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data import ensure, lowdim_blocks


def run(tree: Path, root: Path, args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (bytes) of one ``rlds`` process of
    ``tree``."""
    env = {**os.environ, "RLDS_HOME": str(root), "PYTHONPATH": str(tree.resolve())}
    start = time.perf_counter()
    # cwd: the cache root, so that `python -m` finds no other rlds_cli in its working directory
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlds_cli.cli.app", *args], env=env, cwd=root, stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"rlds {' '.join(args)} of {tree} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH", help="a checkout of rlds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--root", type=Path, default=None, help="cache root for the datasets (default: a temp dir)"
    )
    p.add_argument("--keep", action="store_true", help="keep the datasets")
    a = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in a.tree) or {"this": str(Path(__file__).resolve().parents[1])}
    root = a.root or Path(tempfile.mkdtemp(prefix="rlds-inspect-bench-"))
    os.environ["RLDS_FSYNC"] = "0"  # written once, read many times: no need for durability
    rows = []
    try:
        for steps in a.steps:
            name = f"lowdim-{steps}"
            ensure(root, name, lambda steps=steps: lowdim_blocks(steps))
            for command in ([name], [name, "--check"]):
                runs: dict[str, list[tuple[float, float, int]]] = {label: [] for label in trees}
                for _ in range(a.repeats):
                    for label, tree in trees.items():
                        runs[label].append(run(Path(tree), root, ["inspect", *command]))
                for label, got in runs.items():
                    walls, cpus = [w for w, _, _ in got], [c for _, c, _ in got]
                    rows.append(
                        f"| {steps:,} | {label} | `rlds inspect {' '.join(command)}` | "
                        f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) | "
                        f"{statistics.median(cpus):.2f} | {max(r for _, _, r in got) / 2**20:,.0f} |"
                    )
                    print(rows[-1], file=sys.stderr, flush=True)
            if not a.keep:
                shutil.rmtree(root / "datasets" / name, ignore_errors=True)
    finally:
        if not a.keep and a.root is None:
            shutil.rmtree(root, ignore_errors=True)
    print("| steps | code | command | wall s, median (range) | CPU s, median | peak RSS MiB, max |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
