"""Minari section: rlds converting a Minari dataset (``convert(..., format="minari")``, its
defaults: sha256 and fsync) vs TorchRL's ``MinariExperienceReplay(..., load_from_local_minari=True)``
on the same generated Minari 0.5.x dataset; each run a fresh process (``_harness.spawn``), the
source in the page cache, sides interleaved; the rlds cache is checked against the source,
untimed. Usage: ``python benchmarks/minari_bench.py [--write FILE] [--quick]``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import _harness

SECTION = "minari"
DATASET_ID = "bench/minari-synthetic-v0"
TARGET_RATIO = 3.0


# ----------------------------------------------------------------------------- workers (child side)


def worker_rlds(spec: dict[str, Any]) -> dict[str, Any]:
    """Convert the Minari dataset with rlds, then (untimed) compare it with the source."""
    from rlds_cli.convert import convert

    source = Path(spec["minari_root"]) / DATASET_ID
    result, measured = _harness.timed(
        lambda: convert(source, "bench", format="minari", root=spec["root"], backend="memmap")
    )
    return {
        **measured,
        "steps": result.manifest.num_steps,
        "episodes": result.manifest.num_episodes,
        "content_ok": _same_as_source(spec, result.path),
    }


def _same_as_source(spec: dict[str, Any], path: Path) -> bool:
    import h5py
    import numpy as np

    from rlds_cli.cache import Dataset

    ds = Dataset(path)
    h5 = Path(spec["minari_root"]) / DATASET_ID / "data" / "main_data.hdf5"
    with h5py.File(h5, "r") as f:
        for i in range(ds.num_episodes):
            g, ep = f[f"episode_{i}"], ds.episode(i)
            obs = g["observations"][()]
            if not (
                np.array_equal(ep["observation"], obs[:-1])
                and np.array_equal(ep["next/observation"], obs[1:])
                and np.array_equal(ep["action"], g["actions"][()])
                and np.array_equal(ep["next/reward"][:, 0], g["rewards"][()])
            ):
                return False
    return True


WORKERS = {
    "rlds": worker_rlds,
    "torchrl": lambda spec: _harness.worker_torchrl({**spec, "with_content": False}),
}


# ----------------------------------------------------------------------------- parent side


def measure(run: _harness.Run, log: Any) -> str:
    """Generate the dataset, run both sides interleaved (``_harness.run_configs``: each run a fresh
    process, the source in the page cache), and return the Markdown section."""
    steps, work = (100_000 if run.quick else 1_000_000), run.work
    minari_root = _harness.generate("minari", work / "minari-bench", steps, DATASET_ID)
    source = minari_root / DATASET_ID / "data" / "main_data.hdf5"
    spec = {"module": "minari_bench", "minari_root": str(minari_root), "dataset_id": DATASET_ID}
    configs = [
        _harness.Config(
            kind, kind, kind, source, {**spec, "kind": kind, "root": str(work / kind)}, work / kind
        )
        for kind in ("torchrl", "rlds")
    ]
    try:
        _harness.run_configs(configs, run.repeats, work, log)
    finally:
        shutil.rmtree(minari_root, ignore_errors=True)
    info = run.info(
        versions=_harness.versions("rlds-cli", "torch", "torchrl", "tensordict", "minari", "h5py")
    )
    runs = {c.key: [{**r, "disk": c.disk} for r in c.runs] for c in configs}
    return render(runs, steps, repeats=run.repeats, total=info["minutes"] * 60, info=info)


def _median(rs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def render(
    runs: dict[str, list[dict[str, Any]]], steps: int, repeats: int, total: float, info: dict[str, Any]
) -> str:
    """The Markdown section."""
    trl, rl = runs["torchrl"], runs["rlds"]
    ratio = _median(trl, "seconds") / _median(rl, "seconds")
    wall_ratio = _median(trl, "wall") / _median(rl, "wall")
    ok = ratio >= TARGET_RATIO

    def row(name: str, rs: list[dict[str, Any]], base: float) -> str:
        m = {k: _median(rs, k) for k in ("seconds", "cpu_seconds", "wall", "peak_rss_mb")}
        return (
            f"| {name} | {_harness.span([r['seconds'] for r in rs], '.2f')} | {m['cpu_seconds']:.2f} | "
            f"{m['wall']:.2f} | {m['peak_rss_mb']:.0f} | {rs[0]['disk']['allocated'] / 1e6:.1f} | "
            f"{base / m['seconds']:.1f}x |"
        )

    base = _median(trl, "seconds")
    lines = [
        *_harness.opening(
            SECTION, "Minari dataset -> cache: rlds vs TorchRL `MinariExperienceReplay`", False
        ),
        f"Workload: one Minari 0.5.x HDF5 dataset (`benchmarks/data.py minari`), {steps // 1000:,} "
        f"episodes of 1,000 steps ({steps:,} steps), observation 17 float32, action 6 float32, read from "
        "the page cache by both sides. rlds converts it (`convert(<dataset dir>, format='minari')`, with "
        "its defaults: sha256 of the source files, fsync before publishing); TorchRL builds its TED cache "
        "(`MinariExperienceReplay(id, load_from_local_minari=True)`). "
        f"Median of {repeats} runs per side, interleaved, each in a fresh process; the timed part excludes "
        "interpreter start and imports (the process column includes them).",
        "",
        *_harness.header(info, info["versions"])[:1],
        f"- rlds commit {info['commit']}. Whole run (data generation included): {total / 60:.1f} min.",
        "",
        *_harness.table(
            [
                "operation",
                "seconds, median (range)",
                "CPU s",
                "process wall s",
                "peak RSS MB",
                "cache MB",
                "TorchRL / this",
            ],
            [
                row("TorchRL `MinariExperienceReplay` build", trl, base),
                row("rlds `convert` (format minari, memmap)", rl, base),
            ],
        ),
        "",
        f"Goal: rlds at least {TARGET_RATIO:.0f}x faster than TorchRL: **{ratio:.1f}x**, "
        f"**{'met' if ok else 'NOT met'}** (whole processes, imports included: {wall_ratio:.1f}x).",
        "",
        f"Content check (untimed): every episode of the rlds cache equals the source's observations, next "
        f"observations, actions and rewards: **{'yes' if all(r['content_ok'] for r in rl) else 'NO'}**. "
        f"TorchRL's cache holds the data: **{'yes' if all(r['content_ok'] for r in trl) else 'no'}** "
        "(TorchRL 0.14.1 writes its cache with `memmap_like`, which keeps shapes but not values; see the "
        "conversion section above).",
    ]
    command = "python benchmarks/minari_bench.py --write docs/benchmarks.md   # also run by make bench"
    return "\n".join(lines + _harness.closing(SECTION, command))


def main(argv: list[str] | None = None) -> int:
    """Run the section and print (and optionally write) its Markdown."""
    p = _harness.parser("rlds vs TorchRL: Minari dataset to cache", SECTION, work="minari", repeats=(3, 1))
    run = _harness.start(p.parse_args(argv))
    log = _harness.logger(SECTION)
    run.publish(SECTION, measure(run, log), log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
