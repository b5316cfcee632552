"""``rlds audit`` against the disk's sequential read rate, and views of chosen episodes (issue 43)::

    python benchmarks/audit_bench.py --steps 1000000 --length 50

One low-dim dataset (:func:`data.lowdim_blocks`: 17 float32 observations, 6 float32 actions, a
float32 reward, episodes of ``--length`` steps; memmap) is written under a temporary cache root.

* **Read rate.** Its files' pages are dropped from the page cache (``posix_fadvise``), then read
  end to end with plain 1 MiB ``read`` calls: the disk's sequential rate on these very files.
  The pages are dropped again and :func:`rlds_cli.audit` runs over the dataset (every stored
  key: the low-dim columns; its digest check first); its rate is the dataset's bytes over its
  wall time, and the digest check (``verify_parent``) is timed alone for its share. All are
  also timed with the files in the page cache (``warm``). Best of ``--repeats``.
* **Views.** ``create_selection`` of ``--chosen`` episodes drawn at random (seeded), published
  (manifest, episode index, atomic rename), and ``select_episodes`` (the unpublished view of
  ``Loader(NAME, episodes=...)``): wall time and the view's bytes on disk.

With ``--baseline PATH/rlds_cli/inspection/audit.py`` (another checkout's ``measure``) it times
that scan's ``measure`` and this one's instead, alternating with the sequential read in one
process (``--repeats`` rounds, best and median, and the process CPU time of each), for a
before/after on a busy machine where separate runs swing too much to compare.

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from _page_cache import evict
from data import ensure, lowdim_blocks


def files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def read_all(paths: list[Path]) -> int:
    """Read every file end to end in 1 MiB calls; the bytes read."""
    total = 0
    buf = bytearray(1 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def best(fn, repeats: int, cold: list[Path] | None) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        for p in cold or []:
            evict(p)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def paired(ds, baseline: Path, repeats: int, paths: list[Path], mb: float) -> None:  # type: ignore[no-untyped-def]
    """Sequential read, the baseline's ``measure`` and this one's, alternating in rounds."""
    from rlds_cli.inspection import audit

    spec = importlib.util.spec_from_file_location("baseline_audit_scan", baseline)
    assert spec is not None and spec.loader is not None
    before = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = before  # dataclasses look their module up
    spec.loader.exec_module(before)
    runs = {"read": lambda: read_all(paths), "before": lambda: before.measure(ds),
            "now": lambda: audit.measure(ds)}  # fmt: skip
    print("| files | sequential read MB/s | audit before MB/s | audit now MB/s | audit / read, before -> now"
          " | CPU ms before -> now |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for label, cold in (("cold (pages dropped)", True), ("warm (page cache)", False)):
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(repeats):
            for k, fn in runs.items():
                for p in paths if cold else []:
                    evict(p)
                start, clock = time.perf_counter(), time.process_time()
                fn()
                wall[k].append(time.perf_counter() - start)
                cpu[k].append(time.process_time() - clock)
        best = {k: min(v) for k, v in wall.items()}
        med = {k: statistics.median(v) for k, v in wall.items()}
        print(f"| {label} | {mb / best['read']:,.0f} ({mb / med['read']:,.0f}) "
              f"| {mb / best['before']:,.0f} ({mb / med['before']:,.0f}) "
              f"| {mb / best['now']:,.0f} ({mb / med['now']:,.0f}) "
              f"| {best['read'] / best['before']:.2f}x -> {best['read'] / best['now']:.2f}x "
              f"({med['read'] / med['before']:.2f}x -> {med['read'] / med['now']:.2f}x) "
              f"| {min(cpu['before']) * 1e3:.0f} -> {min(cpu['now']) * 1e3:.0f} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--length", type=int, default=50)
    p.add_argument("--chosen", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--root", type=Path, default=None)
    p.add_argument("--baseline", type=Path, default=None, help="another checkout's inspection/audit.py")
    a = p.parse_args(argv)
    root = a.root or Path(tempfile.mkdtemp(prefix="rlds-audit-bench-"))
    os.environ["RLDS_HOME"] = str(root)
    os.environ.setdefault("RLDS_FSYNC", "0")
    import numpy as np

    from rlds_cli.cache.compose import verify_parent
    from rlds_cli.cache.derive import create_selection, select_episodes
    from rlds_cli.inspection.audit import audit

    try:
        ds = ensure(root, "lowdim", lambda: lowdim_blocks(a.steps, a.length))
        paths = files(ds.directory)
        size = sum(p.stat().st_size for p in paths)
        mb = size / 1e6
        if a.baseline is not None:
            print(
                f"dataset: {ds.num_steps:,} steps, {ds.num_episodes:,} episodes of {a.length}, {mb:.0f} MB\n"
            )
            paired(ds, a.baseline, a.repeats, paths, mb)
            return 0
        rows = []
        for label, cold in (("cold (pages dropped)", paths), ("warm (page cache)", None)):
            read_s = best(lambda: read_all(paths), a.repeats, cold)
            audit_s = best(lambda: audit("lowdim", root=root), a.repeats, cold)
            digest_s = best(lambda: verify_parent(ds), a.repeats, cold)  # audit's first step
            rows.append((label, mb / read_s, mb / audit_s, read_s / audit_s, digest_s / audit_s))
        ids = np.sort(np.random.default_rng(0).choice(ds.num_episodes, a.chosen, replace=False))
        counter = iter(range(10**6))
        view_s = best(
            lambda: create_selection("lowdim", f"v{next(counter)}", ids, root=root, replace=True),
            a.repeats,
            None,
        )
        view_bytes = sum(p.stat().st_size for p in files(root / "datasets" / "v0"))
        sel_s = best(lambda: select_episodes(ds, ids), a.repeats, None)
        print(f"dataset: {ds.num_steps:,} steps, {ds.num_episodes:,} episodes of {a.length}, {mb:.0f} MB\n")
        print("| files | sequential read MB/s | audit MB/s | audit / read | its digest check alone / audit |")
        print("|---|---:|---:|---:|---:|")
        for label, r, au, ratio, share in rows:
            print(f"| {label} | {r:,.0f} | {au:,.0f} | {ratio:.2f}x | {share:.2f} |")
        print(f"\n| view of {a.chosen:,} chosen episodes | seconds | bytes on disk |")
        print("|---|---:|---:|")
        print(f"| `create_selection` (published) | {view_s:.3f} | {view_bytes:,} |")
        print(f"| `select_episodes` (`Loader(NAME, episodes=...)`) | {sel_s:.3f} | 0 |")
    finally:
        if a.root is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
