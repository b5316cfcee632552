"""Pixel batches in fresh processes: time and page faults per batch, across batch sizes.

Each configuration runs in a fresh child process (``_harness.run_once``): it opens a memmap
dataset of gray 84x84 frames, maps every page of its columns in once (so the faults counted are
the batches' own, not first touches of the dataset's file), then draws batches with
``Loader.sample()`` the way a training loop does (the previous batch is still held while the next
one is made) and records, per batch, the wall time and the minor page faults
(``getrusage(RUSAGE_SELF).ru_minflt``).

Configurations, interleaved over rounds:

* ``reuse``: the library as shipped (output buffers reused, :mod:`rlds_cli.cache.buffers`),
  default allocator settings: what a training job gets;
* ``fresh``: no reuse (every batch new arrays, as before), default allocator settings;
* ``warmed``: no reuse, with glibc's thresholds raised for the process
  (``MALLOC_MMAP_THRESHOLD_`` at its 32 MiB maximum, ``MALLOC_TRIM_THRESHOLD_`` at 4 GiB):
  the allocator keeps and recycles freed batches, which is the rate a long-warmed process reaches
  below 32 MiB a batch (above it glibc maps every allocation whatever the settings).

The rate of a configuration is its median batch time over the batches after the first two
(a fresh process's pool fills with the first two); the first batch is reported apart.

Usage::

    python benchmarks/fault_bench.py [--steps 30000] [--quick] [--repeats 3] [--sizes 32 256 4096]

Frames: smooth synthetic gray frames (a moving gradient plus a patch per frame): page faults do
not depend on content.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import _harness
import data as bench_data
import numpy as np

SIZES = (32, 128, 256, 1024, 2048, 4096, 8192)
WARM_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
FRAME = (84, 84)


def write_gray_d4rl(path: Path, n_steps: int, episode_len: int = 1000, seed: int = 0) -> Path:
    """A D4RL-format file of smooth gray 84x84 uint8 frames (``observations`` and
    ``next_observations``), one action and reward per step, episodes ending by time limit."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0 : FRAME[0], 0 : FRAME[1]].astype(np.float32)
    with bench_data.d4rl_file(path, n_steps, (*FRAME, np.uint8), (1, np.int64)) as f:
        obs, nxt = f["observations"], f["next_observations"]
        f["actions"][:] = rng.integers(0, 18, (n_steps, 1)).astype(np.int64)
        f["rewards"][:] = rng.standard_normal(n_steps).astype(np.float32)
        timeouts = np.zeros(n_steps, bool)
        timeouts[episode_len - 1 :: episode_len] = True
        timeouts[-1] = True
        f["timeouts"][:] = timeouts
        for start in range(0, n_steps, episode_len):
            n = min(episode_len, n_steps - start)
            t = np.arange(n + 1, dtype=np.float32)[:, None, None]
            frames = (127 + 100 * np.sin((xx + 2 * t) / 9) * np.cos((yy - t) / 13)).astype(np.uint8)
            for i in range(n + 1):
                y, x = (7 * i + start) % 72, (5 * i) % 72
                frames[i, y : y + 12, x : x + 12] = 255
            obs[start : start + n] = frames[:-1]
            nxt[start : start + n] = frames[1:]
    return path


def worker_batches(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: draw ``spec["batches"]`` batches of ``spec["batch"]``, time and faults each."""
    import torch

    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.loader.loader import Loader

    torch.set_num_threads(1)
    ds = open_dataset(spec["name"], spec["root"])
    loader = Loader(ds, batch_size=spec["batch"], sampler="uniform", seed=0, in_memory=False, epochs=None)
    if not spec["reuse"]:  # the path before buffer reuse: new output arrays every batch
        assert loader._host is not None
        loader._host.pool = None
        loader._host._reader.pool = None
    for key in ds.manifest.fields:  # map the dataset's pages in, untimed
        np.asarray(ds.column(key)).sum()
    times, faults = [], []
    batch = None
    for _ in range(spec["batches"]):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        batch = loader.sample()  # the previous batch is still held, as in a training loop
        t1 = time.perf_counter()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        times.append(t1 - t0)
    assert batch is not None and batch["observation"].shape == (spec["batch"], *spec["frame"])
    return {"times": times, "faults": faults}


WORKERS = {"batches": worker_batches}


def sweep(
    root: Path,
    sizes: list[int],
    modes: dict[str, Any],
    repeats: int,
    frames: int,
    work: Path,
    log: Any,
    *,
    name: str = "gray",
    frame: tuple[int, ...] = FRAME,
) -> list[dict[str, Any]]:
    """Each mode (name -> (reuse, extra environment)) at each batch size in a fresh process, rounds
    interleaved, ``frames`` frames drawn a run (12-200 batches); per size the medians over rounds
    of the steady batch seconds (after the first two), the first batch's and the faults a steady
    batch, and per round each mode's steady time over the last mode's (``MODE_ratios``)."""
    dataset_file = next(p for p in sorted(root.rglob("*observation*")) if p.is_file())
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rep in range(repeats):
        for size in sizes:
            for mode, (reuse, env) in modes.items():
                key = f"{name}-{mode}-{size}"
                spec = {
                    "module": "fault_bench",
                    "kind": "batches",
                    "root": str(root),
                    "name": name,
                    "frame": list(frame),
                }
                spec |= {"batch": size, "batches": max(12, min(200, frames // size)), "reuse": reuse}
                r = _harness.run_once(
                    _harness.Config(key, key, dataset_file, spec, work / "none", env=env), work
                )
                runs.setdefault((mode, size), []).append(r)
                steady = statistics.median(r["times"][2:])
                log(
                    f"  [{rep + 1}/{repeats}] {key}: {steady * 1e3:.3f} ms/batch ({steady / size * 1e9:,.0f} "
                    f"ns/frame), first {r['times'][0] * 1e3:.2f} ms, faults/batch "
                    f"{statistics.median(r['faults'][2:]):.0f} (first {r['faults'][0]})"
                )
    rows = []
    last = list(modes)[-1]
    for size in sizes:
        row: dict[str, Any] = {"batch": size}
        for mode in modes:
            rs = runs[mode, size]
            row[mode] = statistics.median(statistics.median(r["times"][2:]) for r in rs)
            row[f"{mode}_first"] = statistics.median(r["times"][0] for r in rs)
            row[f"{mode}_faults"] = statistics.median(statistics.median(r["faults"][2:]) for r in rs)
            row[f"{mode}_ratios"] = [  # per round, so each ratio is from one round's pair
                statistics.median(w["times"][2:]) / statistics.median(x["times"][2:])
                for x, w in zip(rs, runs[last, size], strict=True)
            ]
            row[f"{mode}_runs"] = rs
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = _harness.parser(__doc__.splitlines()[0], None, work="fault", steps=(30_000, 5_000), repeats=(3, 1))
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="batch sizes")
    p.add_argument(
        "--frames", type=int, help="frames drawn per configuration (default 200,000; quick 20,000)"
    )
    run = _harness.start(p.parse_args(argv))
    src, root = run.work / f"gray-{run.steps}.hdf5", run.work / f"cache-{run.steps}"
    if not src.exists():
        write_gray_d4rl(src, run.steps)
    if not any(root.glob("**/gray*")):
        from rlds_cli.sources.convert import convert

        convert(src, "gray", format="d4rl", root=root)
    modes = {"reuse": (True, {}), "fresh": (False, {}), "warmed": (False, WARM_ENV)}
    frames = run.args.frames or (20_000 if run.quick else 200_000)
    summary = sweep(
        root, run.args.sizes, modes, run.repeats, frames, run.work, lambda m: print(m, flush=True)
    )
    rows = []
    for row in summary:
        b = row["batch"]
        reuse = f"{row['reuse'] * 1e3:.3f} ({row['reuse'] / b * 1e9:.0f}, {row['reuse_faults']:.0f})"
        cells = [f"{row[m] * 1e3:.3f} ({row[f'{m}_faults']:.0f})" for m in ("fresh", "warmed")]
        ratios = f"reuse {row['warmed'] / row['reuse']:.2f}x, fresh {row['warmed'] / row['fresh']:.2f}x"
        rows.append([f"{b:,}", reuse, *cells, ratios])
    head = [
        "batch",
        "reuse ms (ns/frame, faults)",
        "fresh ms (faults)",
        "warmed ms (faults)",
        "rate vs warmed",
    ]
    print("\n".join(["", *_harness.table(head, rows)]))
    (run.work / "results.json").write_text(json.dumps({"summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
