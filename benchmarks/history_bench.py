"""Open time against the length of a growing dataset's history (issue 37, item 7).

For each count N of ``--commits``, one writer makes N one-episode commits of 10 low-dim steps
(``flush()`` after each, fsync off, the writer's defaults otherwise: it merges its small segments
as it goes and keeps the commit log's checkpoint), then a fresh process opens the dataset and
draws a first gather, ``--repeats`` times (median): as the writer left it (its checkpoint
at most ~4,096 records behind the log's end), and with the checkpoint removed before each open
(the whole log replayed: what an open cost before the checkpoint). Not part of ``make bench``
(100,000 commits take ~7 minutes to write on one core).

    python benchmarks/history_bench.py --commits 100 1000 10000 100000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from writer_bench import episode, subprocess_json

OPEN = (
    "import json, time; t = time.perf_counter(); import rlds_cli; t1 = time.perf_counter();"
    "ds = rlds_cli.open_dataset({name!r}, {root!r}); t2 = time.perf_counter();"
    "ds.gather(list(range(0, ds.num_steps, 97))); t3 = time.perf_counter();"
    "print(json.dumps({{'open_s': t2 - t1, 'first_gather_s': t3 - t2}}))"
)


def build(root: Path, name: str, commits: int) -> float:
    import rlds_cli

    eps = [episode(10, (17,), np.float32, i) for i in range(min(commits, 1000))]
    start = time.perf_counter()
    with rlds_cli.DatasetWriter(name, root=root) as w:
        for i in range(commits):
            w.add_episode(eps[i % len(eps)])
            w.flush()
    return commits / (time.perf_counter() - start)


def open_once(root: Path, name: str, without_checkpoint: bool) -> dict[str, float]:
    from rlds_cli.cache import log_checkpoint

    if without_checkpoint:
        log_checkpoint.checkpoint_path(root / "datasets" / name).unlink(missing_ok=True)
    return subprocess_json(OPEN.format(name=name, root=str(root)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commits", type=int, nargs="+", default=[100, 1000, 10000, 100000])
    p.add_argument("--repeats", type=int, default=9, help="rounds of opens, every dataset and mode in each")
    p.add_argument("--root", type=Path, default=None, help="build here, and keep (default: a temporary one)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    os.environ["RLDS_FSYNC"] = "0"
    from rlds_cli.cache import log_checkpoint
    from rlds_cli.cache.commit_log import RECORD_SIZE

    with tempfile.TemporaryDirectory(prefix="rlds-history-") as tmp:
        root = args.root or Path(tmp)
        results: dict[int, dict[str, float]] = {}
        left: dict[int, bytes] = {}  # each writer's checkpoint, put back after the whole-log opens
        for n in args.commits:
            name = f"c{n}"
            directory = root / "datasets" / name
            rate = build(root, name, n) if not directory.exists() else float("nan")
            log_bytes = (directory / "commits.log").stat().st_size
            saved = log_checkpoint.read_checkpoint(directory)
            if saved is not None:
                left[n] = log_checkpoint.checkpoint_path(directory).read_bytes()
            results[n] = {
                "commits_per_s": rate,
                "log_records": log_bytes // RECORD_SIZE,
                "records_after_checkpoint": (log_bytes - (saved.position if saved else 0)) // RECORD_SIZE,
                "checkpoint_bytes": log_checkpoint.checkpoint_path(directory).stat().st_size if saved else 0,
            }
        os.sync()  # the builds' dirty pages written back before the opens are timed
        time.sleep(2)
        # interleaved rounds: a busy moment of the machine slows one round, not one dataset
        runs: dict[tuple[int, bool], list[dict[str, float]]] = {}
        for _ in range(args.repeats):
            for n in args.commits:
                for whole in (False, True):
                    runs.setdefault((n, whole), []).append(open_once(root, f"c{n}", whole))
            for n, data in left.items():
                log_checkpoint.checkpoint_path(root / "datasets" / f"c{n}").write_bytes(data)
        for (n, whole), got in runs.items():
            suffix = "_whole_log" if whole else ""
            for key in got[0]:
                results[n][key + suffix] = statistics.median(r[key] for r in got)
        for n, row in results.items():
            print(n, json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
