"""Subprocess side of tests/cache/test_atomicity.py: convert (or rebuild) a dataset and report.

Usage::

    python tests/_helper_convert.py SOURCE NAME [--backend B] [--block-rows K] [--delay S]
        [--hang-after N] [--force] [--repeat R] [--alternate OTHER_SOURCE]

Prints ``advance`` (flushed) after every block it appended, then one JSON line with the
result. ``--hang-after N`` stops after the N-th block until the process is killed, so a test
that kills it after N ``advance`` lines kills a build in progress, however fast the machine;
``--delay`` sleeps after each block (two concurrent builds then overlap: the contention the
test exercises, not what makes it pass); ``--repeat``/``--alternate`` rebuild the dataset
with ``force`` again and again, switching between two sources.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("name")
    parser.add_argument("--backend", default="memmap")
    parser.add_argument("--block-rows", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--alternate", default=None)
    args = parser.parse_args()

    from rlds_cli.sources.convert import convert

    advances = 0

    def progress(event: str, amount: int) -> None:
        nonlocal advances
        if event == "advance":
            print("advance", flush=True)
            advances += 1
            if advances == args.hang_after:
                threading.Event().wait()  # until the test kills this process
            if args.delay:
                time.sleep(args.delay)

    results = []
    for i in range(args.repeat):
        source = args.alternate if (args.alternate and i % 2) else args.source
        result = convert(
            source,
            args.name,
            backend=args.backend,
            force=args.force,
            options={"block_rows": args.block_rows},
            progress=progress if (args.delay or args.hang_after or args.repeat == 1) else None,
        )
        results.append({"reused": result.reused, "num_steps": result.manifest.num_steps})
    print(json.dumps(results[-1] if args.repeat == 1 else results), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
