"""Preprocessing section: ``rlds preprocess`` vs TorchRL 0.14.1's
``BaseDatasetExperienceReplay.preprocess`` on the same generated 1,000,000-step dataset (TorchRL:
a ``TensorStorage`` over a memory-mapped TED TensorDict of the same arrays); each run in a fresh
process, configurations interleaved: observation normalization (TorchRL and rlds, 1 worker, rlds
with and without fsync), a CPU-heavy per-step function and per-episode returns-to-go (rlds, 1 and
2 workers), and a 2-process CPU-burn control. Usage: ``python benchmarks/preprocess_bench.py
[--write FILE] [--quick]`` (in the bench environment).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _harness

SECTION = "preprocess"
#: The heavy function's iterations: about 2 s for 1M steps on one core here.
HEAVY_ROUNDS = 8
MEAN, STD = 0.1, 1.2
_log = _harness.logger(SECTION)

# ----------------------------------------------------------------------------- user functions


def obs_norm(batch: Any) -> Any:
    """rlds: observation normalization (cheap, vectorized)."""
    import numpy as np

    out = dict(batch)
    for key in ("observation", "next/observation"):
        out[key] = (batch[key] - np.float32(MEAN)) / np.float32(STD)
    return out


def heavy(batch: Any) -> Any:
    """rlds: a CPU-heavy per-step feature (a few transcendental functions per element)."""
    import numpy as np

    out = dict(batch)
    x = batch["observation"].astype(np.float64)
    for _ in range(HEAVY_ROUNDS):
        x = np.tanh(x) + np.sin(x) * 0.5
    out["feature"] = x.astype(np.float32)
    return out


def returns_to_go(batch: Any) -> Any:
    """rlds, per episode: undiscounted returns-to-go, one reversed cumsum per episode."""
    import numpy as np

    out = dict(batch)
    reward = batch["next/reward"][:, 0].astype(np.float64)
    rtg = np.empty_like(reward)
    start = 0
    for end in np.flatnonzero(batch["next/done"][:, 0]):
        rtg[start : end + 1] = np.cumsum(reward[start : end + 1][::-1])[::-1]
        start = end + 1
    out["return_to_go"] = rtg[:, None].astype(np.float32)
    return out


def trl_obs_norm(td: Any) -> Any:
    """TorchRL: the same observation normalization on a TensorDict chunk."""
    td.set("observation", (td.get("observation") - MEAN) / STD)
    td.set(("next", "observation"), (td.get(("next", "observation")) - MEAN) / STD)
    return td


# ----------------------------------------------------------------------------- children


def _setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Convert the D4RL file into the rlds cache and write TorchRL's TED memmap of the same data."""
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.sources.convert import convert

    convert(spec["d4rl"], "bench", format="d4rl", root=spec["root"])
    ds = open_dataset("bench", spec["root"])
    data = ds[:]
    n = ds.num_steps
    td = _harness.ted({k: data[k] for k in _harness.TED_KEYS})
    td.memmap(spec["trl_src"])
    return {"steps": n, "episodes": ds.num_episodes}


def _rlds(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["nofsync"]:
        os.environ["RLDS_FSYNC"] = "0"
    from rlds_cli.preprocess import run  # before the timer: this process's imports are not timed

    start, cpu0 = time.perf_counter(), os.times()
    r = run(
        "bench",
        f"{Path(__file__).resolve()}:{spec['fn']}",
        "out",
        by=spec.get("by", "step"),
        workers=spec["workers"],
        root=spec["root"],
        force=True,
    )
    seconds, cpu = time.perf_counter() - start, os.times()
    return {
        "seconds": seconds,
        "steps": r.manifest.num_steps,
        "chunks": r.num_chunks,
        # CPU seconds of this (coordinating) process and of its worker processes
        "cpu_self": cpu.user + cpu.system - cpu0.user - cpu0.system,
        "cpu_workers": cpu.children_user + cpu.children_system - cpu0.children_user - cpu0.children_system,
    }


def _torchrl(spec: dict[str, Any]) -> dict[str, Any]:
    from tensordict import TensorDict
    from torchrl.data import TensorStorage
    from torchrl.data.datasets.common import BaseDatasetExperienceReplay

    class _Dataset:  # preprocess only uses the storage (see docs/benchmarks.md)
        _storage = TensorStorage(TensorDict.load_memmap(spec["trl_src"]))

    start = time.perf_counter()
    out = BaseDatasetExperienceReplay.preprocess(
        _Dataset(), trl_obs_norm, num_workers=1, dest=spec["dest"], mp_start_method=spec.get("start")
    )
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": int(out._storage.shape[0])}


def _burn(n: int) -> float:
    x = 0
    for i in range(n):
        x += i * i
    return float(x)


def _machine(spec: dict[str, Any]) -> dict[str, Any]:
    """Control: the same pure-Python CPU burn in 1 process, then in 2 at once. On an idle
    2-core machine both take the same time; the ratio is the parallelism the machine offers now.

    Both run in the same started pool, and the single burn is timed before and after the pair
    (the faster counts): a single burn timed alone at start-up caught the previous configuration's
    writeback and made ratios above 2 possible."""
    import multiprocessing

    n = spec["n"]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_burn, [1, 1])  # started before timing
        singles = []
        start = time.perf_counter()
        pool.apply(_burn, (n,))
        singles.append(time.perf_counter() - start)
        start = time.perf_counter()
        pool.map(_burn, [n, n], chunksize=1)
        two = time.perf_counter() - start
        start = time.perf_counter()
        pool.apply(_burn, (n,))
        singles.append(time.perf_counter() - start)
    one = min(singles)
    return {"seconds": two, "one": one, "parallelism": 2 * one / two}


#: Operations ``_harness.spawn`` runs for this module in a fresh process.
WORKERS = {"setup": _setup, "rlds": _rlds, "torchrl": _torchrl, "machine": _machine}


# ----------------------------------------------------------------------------- driver

#: The configurations, run in this order every round: label and spec (``machine``: the 2-process
#: CPU-burn control, not a table row).
_TRL, _RLDS = {"kind": "torchrl"}, {"kind": "rlds", "workers": 1, "nofsync": True}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "trl-norm": (
        "TorchRL `preprocess`, obs-norm, `num_workers=1`, default chunking, fork pool",
        {**_TRL, "start": "fork"},
    ),
    "trl-norm-default": ("TorchRL `preprocess`, same, default start method (spawn)", _TRL),
    "rlds-norm": ("rlds `preprocess`, obs-norm, 1 worker (`RLDS_FSYNC=0`)", {**_RLDS, "fn": "obs_norm"}),
    "rlds-norm-fsync": (
        "rlds `preprocess`, obs-norm, 1 worker, fsync on (default)",
        {**_RLDS, "fn": "obs_norm", "nofsync": False},
    ),
    "machine": ("", {"kind": "machine", "n": 10_000_000}),
    "rlds-heavy-1": ("rlds, CPU-heavy per-step function, 1 worker", {**_RLDS, "fn": "heavy"}),
    "rlds-heavy-2": ("rlds, CPU-heavy per-step function, 2 workers", {**_RLDS, "fn": "heavy", "workers": 2}),
    "rlds-episode-1": (
        "rlds `--by episode`, returns-to-go, 1 worker",
        {**_RLDS, "fn": "returns_to_go", "by": "episode"},
    ),
    "rlds-episode-2": (
        "rlds `--by episode`, returns-to-go, 2 workers",
        {**_RLDS, "fn": "returns_to_go", "by": "episode", "workers": 2},
    ),
}


def measure(steps: int, repeats: int, work: Path) -> dict[str, Any]:
    """Generate the data, then run every configuration ``repeats`` times, interleaved, each run in
    a fresh process."""
    d4rl, root = work / f"pp_d4rl_{steps}.hdf5", work / "pp-root"
    paths = {"root": str(root), "trl_src": str(work / "trl-src"), "dest": str(work / "trl-out")}
    for path in (root, work / "trl-src"):
        shutil.rmtree(path, ignore_errors=True)
    _harness.generate("d4rl", d4rl, steps)
    facts = _harness.spawn({"module": "preprocess_bench", "kind": "setup", "d4rl": str(d4rl), **paths}, work)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in CONFIGS}
    loads = []
    for rep in range(repeats):
        for key, (_, spec) in CONFIGS.items():
            shutil.rmtree(work / "trl-out", ignore_errors=True)
            loads.append(os.getloadavg()[0])
            runs[key].append(_harness.spawn({"module": "preprocess_bench", **spec, **paths}, work))
            _log(f"  [{rep + 1}/{repeats}] {key}: {runs[key][-1]['seconds']:.3f} s")
    for path in (work / "trl-out", work / "trl-src", root):
        shutil.rmtree(path, ignore_errors=True)
    d4rl.unlink()
    return {"facts": facts, "runs": runs, "loads": loads, "steps": steps}


def render(res: dict[str, Any], info: dict[str, Any]) -> str:
    """The Markdown section."""
    runs, steps, episodes = res["runs"], res["steps"], res["facts"]["episodes"]

    def med(key: str, field: str = "seconds") -> float:
        return statistics.median(r[field] for r in runs[key])

    rows = []
    for key, (label, spec) in CONFIGS.items():
        if spec["kind"] != "machine":
            seconds = _harness.span([r["seconds"] for r in runs[key]], ".2f")
            cpu = (
                f"{med(key, 'cpu_self'):.2f} + {med(key, 'cpu_workers'):.2f}"
                if spec["kind"] == "rlds"
                else "-"
            )
            rows.append([label, seconds, f"{steps / med(key):,.0f}", cpu])
    trl, norm, ep = med("trl-norm"), med("rlds-norm"), med("rlds-episode-2")
    speedup = med("rlds-heavy-1") / med("rlds-heavy-2")
    one = med("rlds-heavy-1", "cpu_self")
    share = max(med("rlds-heavy-2", "cpu_self"), med("rlds-heavy-2", "cpu_workers"))
    load = res["loads"]
    ok = _harness.verdict
    lines = [
        *_harness.opening(
            SECTION,
            "Preprocessing: `rlds preprocess` vs TorchRL `BaseDatasetExperienceReplay.preprocess`",
            info["quick"],
        ),
        f"Workload: {steps:,} steps ({episodes:,} episodes of 1000 steps), observation 17 float32, action 6 "
        "float32 (`benchmarks/data.py`), in the rlds cache (memmap) and, for TorchRL, as a `TensorStorage` "
        "over a memory-mapped TED TensorDict of the same arrays. Each number is the median of "
        f"{info['repeats']} runs (range in brackets), each run in a fresh process; configurations "
        "interleaved. Timed: the whole `preprocess.run` call, after `from rlds_cli.preprocess import run` "
        "(the calling process's imports are excluded; a spawned worker's start-up, imports included, is "
        "timed).",
        "",
        *_harness.header(info, _harness.versions("torch", "torchrl", "tensordict", "numpy")),
        f"- 1-minute load average before the runs: {min(load):.1f}-{max(load):.1f} (other processes share "
        "this machine; ratios measured in one run are steadier than absolute times).",
        "",
        *_harness.table(
            ["operation", "seconds, median (range)", "steps/s", "CPU s: coordinator + workers"], rows
        ),
        "",
        f"- Cheap vectorized function: rlds {norm:.2f} s vs TorchRL {trl:.2f} s with one worker (TorchRL's "
        f"fastest setting, a fork pool; {trl / norm:.2f}x TorchRL's speed): at least as fast, "
        f"{ok(norm <= trl)}.",
        f"- CPU-heavy function: 2 workers are {speedup:.2f}x faster than 1 (goal 1.7x): "
        f"{ok(speedup >= 1.7)}. The work itself splits evenly (CPU column: with 2 workers the coordinator "
        f"and the spawned worker each do about half); CPU-bound limit here: {one:.2f} CPU s for 1 worker vs "
        f"a largest share of {share:.2f} CPU s for 2 ({one / share:.2f}x). A shortfall in wall time comes "
        "from the other processes on these 2 cores. With both cores free the wall time is about the larger "
        "of the two shares (the worker's includes its start-up) plus up to one chunk (1/16 of the job) that "
        "the last busy process runs alone. Control measured in the same run: two independent pure-Python "
        f"CPU burners ran {med('machine', 'parallelism'):.2f}x as fast as one (2.00x on an idle 2-core "
        "machine), which is the most any 2-worker job could gain here at that moment.",
        f"- Per-episode mode over {episodes:,} episodes: {ep:.2f} s with 2 workers (goal: seconds, not "
        f"minutes): {ok(ep < 30)}.",
        "",
        "Notes:",
        "- TorchRL's `preprocess` maps the function over the storage with `TensorDict.map` (a fork pool "
        "even with one worker) into a `memmap_like` copy of the first output; it writes `observation` and "
        "`next/observation` as two arrays. With its default start method it spawns the worker (torchrl "
        "selects spawn when imported), which costs seconds of start-up; with a fork pool it is fast. rlds "
        "writes observation-like keys once (flat layout), checks `next/K[t] == K[t+1]` inside episodes, and "
        "runs one worker in-process (no pool to start); with N workers it spawns N-1 processes as soon as "
        "the chunks are planned (they import numpy and the function's module while the coordinator infers "
        "the schema), the coordinator works as the N-th, and every process claims the next chunk when it is "
        "free.",
        "- The rlds rows include everything `preprocess.run` does: reading the input, the function, the "
        "checks, writing the output, the episode index and manifest, and the atomic publish.",
        "- Per-episode mode writes finished chunks to files and appends them in order (the output size is "
        "not known in advance), so it does more I/O than per-step mode.",
    ]
    command = (
        "make bench   # or: .venv-bench/bin/python benchmarks/preprocess_bench.py --write docs/benchmarks.md"
    )
    return "\n".join(lines + _harness.closing(SECTION, command))


def main(argv: list[str] | None = None) -> int:
    """Run the section and print (and optionally write) its Markdown."""
    p = _harness.parser("rlds preprocess vs TorchRL preprocess", SECTION, work="preprocess", repeats=(3, 1))
    run = _harness.start(p.parse_args(argv))
    res = measure(100_000 if run.quick else 1_000_000, run.repeats, run.work)
    run.publish(SECTION, render(res, run.info()), _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
