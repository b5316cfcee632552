"""Side-by-side conversion benchmark: rlds (D4RL file -> cache) vs TorchRL (Minari -> TED cache).

What it measures, in one run on one machine:

* time to convert a 1,000,000-step D4RL file (obs 17 float32, action 6 float32, 1000-step
  episodes) with ``rlds_cli.convert.convert`` (memmap and zarr backends, fsync on: the default),
  and time for TorchRL's ``MinariExperienceReplay(..., load_from_local_minari=True)`` to build
  its TED cache from a Minari dataset holding the same episodes; their ratio;
* peak RSS of the rlds conversion at 1e6 and 1e7 steps (is memory flat as the file grows?);
* disk bytes of each cache.

Every measured operation runs in a fresh Python process (this script with ``--worker``), so
imports, allocator state and peak RSS belong to that operation alone. Peak RSS is the child's
``VmHWM`` (its own address space); its ``ru_maxrss`` from ``wait4`` is logged as a cross-check
but can read high, because Linux starts a spawned child's ``ru_maxrss`` at its parent's RSS
(so this driver keeps no data in memory: it generates the files in child processes too).
Repeats are interleaved (all configurations, then all again) so drift on a shared machine hits
every configuration alike; medians are reported. Before each run the parent deletes
the previous output, calls ``sync()`` (so no earlier write-back overlaps the run) and records
how much of the source file is in the page cache (``mincore``). "Warm" runs read a source that is
in the page cache; "cold" runs evict the source first with ``posix_fadvise(DONTNEED)`` (the only
cache drop possible without root; the hypervisor may still cache the disk).

This module is also ``make bench``'s driver: after its own section it runs the other sections'
scripts in turn (minari, preprocess, cli, pixel, zarr, loader; ``--only NAME...`` picks some, and
the extra sections ``framestack`` and ``dataloader`` run only when named).

Usage::

    python benchmarks/run_all.py [--write docs/benchmarks.md] [--quick] [--only pixel loader]

``--write FILE`` replaces the section between ``<!-- bench:conversion:start -->`` and
``<!-- bench:conversion:end -->`` in FILE (creating the file if needed), and each other section
between its own markers. Work data goes to ``benchmarks/_work/`` (git-ignored) and
the generated sources are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_doc  # noqa: E402  (benchmarks/bench_doc.py)
import data as bench_data  # noqa: E402  (benchmarks/data.py, next to this script)

SECTION = "conversion"
START_MARK, END_MARK = bench_doc.markers(SECTION)
DATASET_ID = "bench/synthetic-v0"
BATCH_SIZE = 256
#: rlds must convert in at most this fraction of TorchRL's cache-build time.
TARGET_RATIO = 3.0
#: Peak RSS at 10x the steps may be at most this factor of the 1x peak to count as flat.
FLAT_FACTOR = 1.10
MB = 1e6


# ----------------------------------------------------------------------------- page cache


def page_cache_fraction(path: Path) -> float:
    """Fraction of ``path``'s pages that are in the page cache (``mincore`` on a mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore on {path} failed")
            resident = sum(1 for v in bytes(vec) if v & 1)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident / pages


def evict(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    """Read ``path`` once so that it is in the page cache (through one small reused buffer)."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass


def disk_usage(path: Path) -> dict[str, float]:
    """Apparent bytes (sum of sizes), allocated bytes (blocks) and file count under ``path``."""
    apparent = allocated = files = 0
    for p in [path, *path.rglob("*")] if path.exists() else []:
        st = p.lstat()
        if p.is_file():
            apparent += st.st_size
            allocated += st.st_blocks * 512
            files += 1
    return {"apparent": apparent, "allocated": allocated, "files": files}


# ----------------------------------------------------------------------------- workers (child side)


def _hwm_mb() -> float:
    """Peak RSS of this process's own address space (``VmHWM``), in MiB.

    Unlike ``ru_maxrss``, it starts afresh at ``exec``: Linux carries the parent's peak RSS over
    into a spawned child's ``ru_maxrss``, so a child can never report less than its parent had.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource  # not Linux: fall back to ru_maxrss

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_rlds(spec: dict[str, Any]) -> dict[str, Any]:
    """Convert the D4RL file with rlds (runs in the child); ``spec["fsync"] = False`` sets
    ``RLDS_FSYNC=0`` (the default, fsync on, is what the other rows measure)."""
    if spec.get("fsync") is False:
        os.environ["RLDS_FSYNC"] = "0"
    t0 = time.perf_counter()
    from rlds_cli.convert import convert

    imported = time.perf_counter()
    rss_before = _hwm_mb()
    cpu0 = time.process_time()
    start = time.perf_counter()
    result = convert(spec["source"], "bench", format="d4rl", root=spec["root"], backend=spec["backend"])
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    peak = _hwm_mb()
    m = result.manifest
    return {
        "seconds": seconds,
        "import_seconds": imported - t0,
        "cpu_seconds": cpu,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak,
        "steps": m.num_steps,
        "episodes": m.num_episodes,
        "dataset_dir": str(result.path),
        "conversion": m.conversion,
    }


def _patch_memmap_like() -> None:
    """Make tensordict's ``memmap_like`` (content-less) write the content, like ``memmap``.

    TorchRL 0.14.1 builds the TED data in RAM and then calls ``td.memmap_like(path)``, which
    creates zero-filled files of the right shapes and drops the data; this patch shows what a
    cache that holds the data costs (time and disk).
    """
    from tensordict import TensorDict, TensorDictBase

    def memmap_with_content(self: Any, prefix: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``memmap_like`` that keeps the data."""
        return self.memmap(prefix)

    for cls in (TensorDictBase, TensorDict):
        if "memmap_like" in vars(cls):
            cls.memmap_like = memmap_with_content  # type: ignore[method-assign]


def worker_torchrl(spec: dict[str, Any]) -> dict[str, Any]:
    """Build TorchRL's TED cache from the local Minari dataset (runs in the child)."""
    os.environ["MINARI_DATASETS_PATH"] = spec["minari_root"]
    t0 = time.perf_counter()
    import h5py
    import torch
    from torchrl.data.datasets.minari_data import MinariExperienceReplay

    if spec.get("with_content"):
        _patch_memmap_like()
    imported = time.perf_counter()
    rss_before = _hwm_mb()
    cpu0 = time.process_time()
    start = time.perf_counter()
    rb = MinariExperienceReplay(
        spec["dataset_id"], batch_size=BATCH_SIZE, load_from_local_minari=True, root=spec["root"]
    )
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    peak = _hwm_mb()  # before the check below maps the cache's files in
    # untimed check: does the cache hold the source's first episode?
    td = rb._storage._storage
    h5 = Path(spec["minari_root"]) / spec["dataset_id"] / "data" / "main_data.hdf5"
    with h5py.File(h5, "r") as f:
        first = torch.from_numpy(f["episode_0/observations"][:-1])
    obs = torch.as_tensor(td["observation"][: len(first)])
    return {
        "seconds": seconds,
        "import_seconds": imported - t0,
        "cpu_seconds": cpu,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak,
        "steps": int(td.shape[0]),
        "content_ok": bool(torch.equal(obs, first)),
        "observation_all_zero": bool(not torch.as_tensor(td["observation"]).any()),
    }


WORKERS = {"rlds": worker_rlds, "torchrl": worker_torchrl}


def worker_main(spec_json: str, out: str) -> None:
    """Child entry point: run one operation and write its result as JSON. ``spec["module"]``
    names another benchmark module whose own ``WORKERS`` table has the operation."""
    spec = json.loads(spec_json)
    table = importlib.import_module(spec["module"]).WORKERS if "module" in spec else WORKERS
    result = table[spec["kind"]](spec)
    Path(out).write_text(json.dumps(result))


# ----------------------------------------------------------------------------- parent side


@dataclass
class Config:
    """One measured configuration."""

    key: str
    label: str
    kind: str  # "rlds" | "torchrl"
    source: Path  # the file whose page-cache state matters
    spec: dict[str, Any]
    output: Path  # removed before each run
    cold: bool = False
    runs: list[dict[str, Any]] = field(default_factory=list)
    disk: dict[str, float] | None = None
    extra_disk: dict[str, dict[str, float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """Median of one measurement over the runs."""
        return statistics.median(r[name] for r in self.runs)

    def span(self, name: str) -> tuple[float, float]:
        """Smallest and largest value of one measurement over the runs."""
        values = [r[name] for r in self.runs]
        return min(values), max(values)


def run_once(cfg: Config, work: Path) -> dict[str, Any]:
    """Run one configuration once in a fresh child process; return its measurements."""
    shutil.rmtree(cfg.output, ignore_errors=True)
    os.sync()
    if cfg.cold:
        evict(cfg.source)
    else:
        warm(cfg.source)
    cached = page_cache_fraction(cfg.source)
    load1 = os.getloadavg()[0]
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RLDS_FSYNC", "MINARI_DATASETS_PATH")}
    log_path = work / f"{cfg.key}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg.spec), str(result_path)]
    with open(log_path, "w") as log:
        wall0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - wall0
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(f"{cfg.label}: worker failed with exit code {proc.returncode}:\n{tail}")
    result = json.loads(result_path.read_text())
    result.update(wall=wall, ru_maxrss_mb=usage.ru_maxrss / 1024, cached=cached, load1=load1)
    if cfg.disk is None:
        cfg.disk = disk_usage(cfg.output)
        if cfg.kind == "torchrl":
            nxt = cfg.output / DATASET_ID / "next" / "observation.memmap"
            cfg.extra_disk["next/observation"] = disk_usage(nxt) if nxt.exists() else {}
    return result


def run_configs(configs: list[Config], repeats: int, work: Path, log: Any, *, keep: bool = False) -> None:
    """Run every configuration ``repeats`` times, interleaved; ``keep``: leave the last run's
    outputs in place (for the caller to read), else delete them."""
    for rep in range(repeats):
        for cfg in configs:
            r = run_once(cfg, work)
            cfg.runs.append(r)
            log(
                f"  [{rep + 1}/{repeats}] {cfg.label}: {r['seconds']:.3f} s (CPU {r['cpu_seconds']:.2f} s) "
                f"(process {r['wall']:.2f} s), peak RSS {r['peak_rss_mb']:.0f} MB "
                f"(ru_maxrss {r['ru_maxrss_mb']:.0f}), source cached {100 * r['cached']:.0f}%"
            )
    if not keep:
        for cfg in configs:
            shutil.rmtree(cfg.output, ignore_errors=True)


def rlds_config(
    key: str, label: str, source: Path, backend: str, work: Path, *, cold: bool = False, fsync: bool = True
) -> Config:
    """An rlds conversion of the D4RL file ``source`` with ``backend``."""
    root = work / "out" / key
    spec = {"kind": "rlds", "source": str(source), "root": str(root), "backend": backend, "fsync": fsync}
    return Config(key, label, "rlds", source, spec, root, cold=cold)


def torchrl_config(
    key: str, label: str, minari_root: Path, work: Path, *, with_content: bool = False, cold: bool = False
) -> Config:
    """A TorchRL cache build from the Minari dataset under ``minari_root``."""
    root = work / "out" / key
    spec = {
        "kind": "torchrl",
        "minari_root": str(minari_root),
        "dataset_id": DATASET_ID,
        "root": str(root),
        "with_content": with_content,
    }
    source = bench_data.minari_data_dir(minari_root, DATASET_ID) / "main_data.hdf5"
    return Config(key, label, "torchrl", source, spec, root, cold=cold)


# ----------------------------------------------------------------------------- report


def _version(dist: str) -> str:
    """Installed version of a distribution."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    mem_kb = 0
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    fs = "?"
    try:
        out = subprocess.run(["df", "-T", str(HERE)], capture_output=True, text=True).stdout.splitlines()
        fs = out[1].split()[1] if len(out) > 1 else "?"
    except OSError:
        pass
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": f"{len(os.sched_getaffinity(0))} usable ({os.cpu_count()} online), {model}",
        "ram": f"{mem_kb / 2**20:.1f} GiB",
        "os": f"{platform.system()} {platform.release()}, work dir on {fs}",
        "python": platform.python_version(),
        "versions": ", ".join(
            f"{d} {_version(d)}"
            for d in (
                "rlds-cli",
                "torch",
                "torchrl",
                "tensordict",
                "minari",
                "gymnasium",
                "h5py",
                "numpy",
                "zarr",
            )
        ),
        "commit": commit,
    }


def _fmt_s(cfg: Config) -> str:
    """Median seconds with the range."""
    lo, hi = cfg.span("seconds")
    return f"{cfg.median('seconds'):.2f} ({lo:.2f}-{hi:.2f})"


def _cached(cfg: Config) -> str:
    """Page-cache residency of the source over the runs."""
    lo, hi = cfg.span("cached")
    return f"{100 * lo:.0f}%" if round(100 * lo) == round(100 * hi) else f"{100 * lo:.0f}-{100 * hi:.0f}%"


def _steps(n: int) -> str:
    """``1000000`` -> ``1M``, ``100000`` -> ``100k``."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else f"{n:,}"


def _mb(n: float) -> str:
    """Bytes as MB (10^6) with one decimal."""
    return f"{n / MB:,.1f}"


def _verdict(ok: bool) -> str:
    """Markdown verdict for a goal."""
    return "**met**" if ok else "**NOT met**"


def render(
    info: dict[str, str],
    sizes: dict[str, int],
    speed: list[Config],
    memory: dict[str, tuple[Config, Config]],
    source_bytes: dict[str, int],
    repeats: int,
    quick: bool,
    total_seconds: float,
) -> str:
    """The Markdown section (between the markers)."""
    driver_rss = _hwm_mb()
    loads = [r["load1"] for c in [*speed, *(b for pair in memory.values() for b in pair)] for r in c.runs]
    by_key = {c.key: c for c in speed}
    trl = by_key["torchrl"]
    n_main, n_big = sizes["main"], sizes["big"]
    lines: list[str] = [START_MARK, "", "## Conversion: rlds vs TorchRL `MinariExperienceReplay`", ""]
    if quick:
        lines += ["> **Quick run** (`--quick`): less data, fewer repeats; not the reference workload.", ""]
    lines += [
        f"Workload: {n_main:,} steps, observation {bench_data.OBS_DIM} float32, action "
        f"{bench_data.ACT_DIM} float32, reward float32, {bench_data.EPISODE_LEN}-step episodes ending "
        f"by timeout ({n_main // bench_data.EPISODE_LEN:,} episodes), synthetic data from "
        "`benchmarks/data.py`. rlds converts the D4RL-format file "
        f"({_mb(source_bytes['d4rl'])} MB: observations, actions, rewards, terminals, timeouts, "
        "next_observations; contiguous, uncompressed); TorchRL builds its TED cache from a Minari 0.5.x "
        f"HDF5 dataset with the same episodes ({_mb(source_bytes['minari'])} MB, T+1 observations per "
        "episode). Each number is the median of "
        f"{repeats} runs (range in brackets), each run in a fresh process; the timed part excludes "
        "interpreter start and imports (the process column includes them).",
        "",
        f"- Measured {info['date']} on {info['cpus']}; {info['ram']} RAM; {info['os']}.",
        f"- Python {info['python']}; {info['versions']}.",
        f"- rlds commit {info['commit']}.",
        f"- Whole benchmark run (data generation included): {total_seconds / 60:.1f} min.",
        f"- 1-minute load average just before the runs: {min(loads):.1f}-{max(loads):.1f} on "
        f"{os.cpu_count()} CPUs (this benchmark's own previous run adds up to about 1)"
        + (
            "; other processes were competing for the CPUs, so wall times (zarr's, which uses "
            "threads, most) are noisier than the CPU-time column."
            if max(loads) > 0.75 * (os.cpu_count() or 1)
            else "."
        ),
        "",
        "### Time to build the cache",
        "",
        "| operation | seconds, median (range) | CPU s | process wall s | RSS after imports MB | "
        "peak RSS MB | source in page cache | TorchRL time / this |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cfg in speed:
        ref = by_key["torchrl-cold"] if cfg.cold and "torchrl-cold" in by_key else trl
        ratio = ref.median("seconds") / cfg.median("seconds")
        lines.append(
            f"| {cfg.label} | {_fmt_s(cfg)} | {cfg.median('cpu_seconds'):.2f} | {cfg.median('wall'):.2f} | "
            f"{cfg.median('rss_before_mb'):,.0f} | {cfg.median('peak_rss_mb'):,.0f} | "
            f"{_cached(cfg)} | {ratio:.1f}x |"
        )
    mm, zr = by_key["rlds-memmap"], by_key["rlds-zarr"]
    r_mm = trl.median("seconds") / mm.median("seconds")
    r_zr = trl.median("seconds") / zr.median("seconds")
    w_mm = trl.median("wall") / mm.median("wall")
    w_zr = trl.median("wall") / zr.median("wall")
    lines += [
        "",
        f"Goal: rlds converts in at most 1/{TARGET_RATIO:.0f} of TorchRL's time. memmap backend: "
        f"{r_mm:.1f}x faster, {_verdict(r_mm >= TARGET_RATIO)}; zarr backend: {r_zr:.1f}x faster, "
        f"{_verdict(r_zr >= TARGET_RATIO)}. Whole processes, imports included: {w_mm:.1f}x and "
        f"{w_zr:.1f}x (TorchRL's imports alone take about "
        f"{statistics.median(r['import_seconds'] for r in trl.runs):.1f} s).",
    ]
    shipped_zero = all(r.get("observation_all_zero") for r in trl.runs)
    patched = by_key.get("torchrl-content")
    lines += [
        "",
        "The foundation issue quotes 7.8 s for TorchRL's build, measured in an earlier session on "
        "this machine type; absolute times drift between sessions on these shared machines, which "
        "is why the goal is checked against TorchRL measured in the same run.",
        "",
        "TorchRL check: the cache TorchRL 0.14.1 writes here "
        + (
            "**holds only zeros** (every run): it builds the TED data in RAM, then calls "
            "`td.memmap_like(path)`, which makes zero-filled (sparse) files of the right shapes and "
            "drops the data. Its time therefore leaves out writing the data, so the ratio above "
            "favours TorchRL."
            if shipped_zero
            else "holds the source's data."
        ),
    ]
    if patched is not None:
        ok = all(r.get("content_ok") for r in patched.runs)
        lines.append(
            "The row *with content* swaps `memmap_like` for `memmap` (same TorchRL code otherwise) to "
            f"show what a cache that holds the data costs; its first episode "
            f"{'matches' if ok else 'does NOT match'} the source."
        )
    lines += [
        "",
        "### Peak memory as the file grows (rlds)",
        "",
        f"Peak RSS (`VmHWM` of the converting process, interpreter and imports included) for "
        f"{n_main:,} and {n_big:,} steps (the larger file is {_mb(source_bytes['d4rl_big'])} MB, "
        "generated in chunks and deleted afterwards).",
        "",
        f"| backend | RSS after imports MB | peak RSS {_steps(n_main)} MB | peak RSS {_steps(n_big)} MB | "
        f"growth | seconds {_steps(n_main)} | seconds {_steps(n_big)} |",
        "|---|---|---|---|---|---|---|",
    ]
    flat_ok = True
    for backend, (small, big) in memory.items():
        growth = big.median("peak_rss_mb") / small.median("peak_rss_mb")
        flat_ok &= growth <= FLAT_FACTOR
        lines.append(
            f"| {backend} | {small.median('rss_before_mb'):.0f} | {small.median('peak_rss_mb'):.0f} | "
            f"{big.median('peak_rss_mb'):.0f} | {100 * (growth - 1):+.1f}% | {_fmt_s(small)} | "
            f"{_fmt_s(big)} |"
        )
    lines += [
        "",
        f"Goal: peak memory flat from {_steps(n_main)} to {_steps(n_big)} steps (growth at most "
        f"{100 * (FLAT_FACTOR - 1):.0f}%): {_verdict(flat_ok)}. For contrast, TorchRL's build peaks at "
        f"{trl.median('peak_rss_mb'):,.0f} MB for {_steps(n_main)} steps: it reads the whole HDF5 file into "
        "memory (`PersistentTensorDict.from_h5(...).to_tensordict()`) and builds the TED in RAM, so its "
        "memory grows with the dataset.",
        "",
        "### Disk use of the caches",
        "",
        "| cache | apparent MB | allocated MB | files |",
        "|---|---|---|---|",
    ]
    for cfg in speed:
        if cfg.cold or cfg.disk is None:
            continue
        d = cfg.disk
        lines.append(f"| {cfg.label} | {_mb(d['apparent'])} | {_mb(d['allocated'])} | {d['files']:.0f} |")
    if patched is not None and patched.disk:
        nxt = patched.extra_disk.get("next/observation", {})
        full = patched.disk["allocated"]
        less = full - nxt.get("allocated", 0)
        mine = mm.disk["allocated"] if mm.disk else 0
        lines += [
            "",
            f"TorchRL's TED stores observations twice (`observation` and `next/observation`, "
            f"{_mb(nxt.get('allocated', 0))} MB each) plus an int64 `episode` column and three done "
            f"flags. Its cache with content, minus `next/observation`, is {_mb(less)} MB; the rlds "
            f"memmap cache is {_mb(mine)} MB ({100 * mine / full:.0f}% of TorchRL's, "
            f"{100 * mine / less:.0f}% of TorchRL's without `next/observation`): observations once "
            "plus one final observation per episode, two flags (`done` and `episode` are derived at "
            "read time), and a small episode index. TorchRL's cache as shipped allocates almost "
            "nothing because its files are never written (see above).",
        ]
    lines += [
        "",
        "### How it is measured",
        "",
        "```text",
        "make bench   # = bash benchmarks/setup_env.sh .venv-bench 2.13.0",
        "             #   .venv-bench/bin/python benchmarks/run_all.py --write docs/benchmarks.md",
        "```",
        "",
        "- rlds, timed: `rlds_cli.convert.convert(path, 'bench', format='d4rl', root=DIR, "
        "backend='memmap'|'zarr')` with `RLDS_FSYNC` unset, i.e. the default: the source is hashed "
        "(sha256) and every file is fsynced before the dataset is published.",
        "- TorchRL, timed: `MinariExperienceReplay('bench/synthetic-v0', batch_size=256, "
        "load_from_local_minari=True, root=DIR)` with `MINARI_DATASETS_PATH` pointing at the "
        "generated Minari root (TorchRL does not fsync).",
        "- Each run: previous output deleted, `sync()`, then the source is read once (warm) or "
        "evicted with `posix_fadvise(POSIX_FADV_DONTNEED)` (cold); the page-cache column is the "
        "`mincore` residency of the source just before the run. Configurations are interleaved "
        "across repeats. CPU s is the child's `process_time()` (all threads) over the timed call.",
        "- Peak RSS is the child's `VmHWM` right after the timed call (interpreter and imports "
        "included; the 'after imports' figure is `VmHWM` just before the call). The child's "
        "`ru_maxrss` (from `wait4`) agrees where it exceeds the driver's own RSS "
        f"({driver_rss:.0f} MB), which Linux copies into a spawned child's `ru_maxrss`.",
        "- Disk: apparent = sum of file sizes, allocated = blocks actually used (sparse files "
        "count only what was written).",
        "",
        END_MARK,
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def _log(message: str) -> None:
    """Progress line on stdout."""
    print(message, flush=True)


def generate(kind: str, out: Path, steps: int) -> None:
    """Write benchmark data with ``benchmarks/data.py`` in a child process, so that this process
    never holds numpy arrays (its RSS is what a spawned child's ``ru_maxrss`` starts from)."""
    cmd = [sys.executable, str(HERE / "data.py"), kind, str(out), "--steps", str(steps)]
    if kind == "minari":
        cmd += ["--dataset-id", DATASET_ID]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _timed(label: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` and log how long it took."""
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    _log(f"{label} ({time.perf_counter() - t:.1f} s)")
    return out


#: What ``make bench`` runs, in this order (``--only`` picks some).
SECTIONS = ("conversion", "minari", "preprocess", "cli", "pixel", "zarr", "loader")
#: Sections run only when named: the before/after records of issue 14's frame-stack and DataLoader
#: changes. The pixel section measures both paths again (as they are now) in every ``make bench``.
EXTRA_SECTIONS = ("framestack", "dataloader")


def main(argv: Iterable[str] | None = None) -> int:
    """Run the benchmarks; print progress and the resulting Markdown."""
    parser = argparse.ArgumentParser(description="rlds vs its peers: every section of docs/benchmarks.md")
    parser.add_argument("--write", type=Path, help="Markdown file whose sections are replaced")
    parser.add_argument("--quick", action="store_true", help="small data, 1 repeat (a smoke test)")
    parser.add_argument("--repeats", type=int, help="runs per configuration (default 3; quick: 1)")
    parser.add_argument("--work", type=Path, default=HERE / "_work", help="work directory")
    parser.add_argument("--keep", action="store_true", help="keep the generated data afterwards")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS + EXTRA_SECTIONS,
        help=f"run only these sections (default: {', '.join(SECTIONS)}, in that order)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.worker:
        worker_main(*args.worker)
        return 0
    t0 = time.perf_counter()
    chosen = args.only or SECTIONS
    status = 0
    for name in (*SECTIONS, *EXTRA_SECTIONS):
        if name in chosen:
            t = time.perf_counter()
            _log(f"== {name}")
            status |= RUNNERS[name](args) or 0
            _log(f"== {name} took {(time.perf_counter() - t) / 60:.1f} min")
    _log(
        f"all sections ({', '.join(n for n in SECTIONS + EXTRA_SECTIONS if n in chosen)}) took "
        f"{(time.perf_counter() - t0) / 60:.1f} min"
    )
    return status


def _repeats(args: argparse.Namespace) -> int:
    return int(args.repeats or (1 if args.quick else 3))


def _n_main(args: argparse.Namespace) -> int:
    return 100_000 if args.quick else 1_000_000


def _section_argv(args: argparse.Namespace, work: Path | None = None) -> list[str]:
    """The shared options, as a section script's own command line takes them."""
    return (
        (["--work", str(work)] if work is not None else [])
        + (["--quick"] if args.quick else [])
        + (["--write", str(args.write)] if args.write else [])
        + (["--keep"] if args.keep else [])
    )


def run_conversion(args: argparse.Namespace) -> int:
    """This module's own section: D4RL file -> cache, rlds vs TorchRL's Minari cache build."""
    t_start = time.perf_counter()
    repeats = _repeats(args)
    n_main = _n_main(args)
    n_big = 10 * n_main
    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    need = 2.2 * 166 * n_big + 3 * 166 * n_main  # the big file, one big cache, the 1x files
    if free < need:
        raise SystemExit(f"need about {need / 1e9:.1f} GB free in {work}, have {free / 1e9:.1f} GB")

    d4rl_main = work / f"d4rl_{n_main}.hdf5"
    d4rl_big = work / f"d4rl_{n_big}.hdf5"
    minari_root = work / "minari"
    _timed(f"wrote {d4rl_main.name}", generate, "d4rl", d4rl_main, n_main)
    _timed(f"wrote Minari dataset {DATASET_ID}", generate, "minari", minari_root, n_main)
    minari_file = bench_data.minari_data_dir(minari_root, DATASET_ID) / "main_data.hdf5"
    source_bytes = {"d4rl": d4rl_main.stat().st_size, "minari": minari_file.stat().st_size}

    trl, rlds = torchrl_config, rlds_config
    speed = [
        trl("torchrl", "TorchRL `MinariExperienceReplay` build (as shipped)", minari_root, work),
        trl("torchrl-content", "TorchRL build, written with content", minari_root, work, with_content=True),
        rlds("rlds-memmap", "rlds `convert`, memmap backend", d4rl_main, "memmap", work),
        rlds("rlds-zarr", "rlds `convert`, zarr backend", d4rl_main, "zarr", work),
        trl("torchrl-cold", "cold source: TorchRL build (as shipped)", minari_root, work, cold=True),
        rlds("rlds-memmap-cold", "cold source: rlds `convert`, memmap", d4rl_main, "memmap", work, cold=True),
    ]
    _log(f"conversion of {n_main:,} steps, {repeats} repeats:")
    run_configs(speed, repeats, work, _log)

    _timed(f"wrote {d4rl_big.name}", generate, "d4rl", d4rl_big, n_big)
    source_bytes["d4rl_big"] = d4rl_big.stat().st_size
    by_key = {c.key: c for c in speed}
    big = [
        rlds_config("rlds-memmap-big", f"rlds memmap {n_big:.0e}", d4rl_big, "memmap", work),
        rlds_config("rlds-zarr-big", f"rlds zarr {n_big:.0e}", d4rl_big, "zarr", work),
    ]
    _log(f"conversion of {n_big:,} steps, {repeats} repeats:")
    try:
        run_configs(big, repeats, work, _log)
    finally:
        if not args.keep:
            d4rl_big.unlink(missing_ok=True)
    memory = {"memmap": (by_key["rlds-memmap"], big[0]), "zarr": (by_key["rlds-zarr"], big[1])}

    section = render(
        machine_info(),
        {"main": n_main, "big": n_big},
        speed,
        memory,
        source_bytes,
        repeats,
        args.quick,
        time.perf_counter() - t_start,
    )
    if not args.keep:
        shutil.rmtree(work / "out", ignore_errors=True)
        d4rl_main.unlink(missing_ok=True)
        shutil.rmtree(minari_root, ignore_errors=True)
    print()
    print(section)
    if args.write:
        bench_doc.write_section(args.write, SECTION, section)
        _log(f"wrote the '{SECTION}' section of {args.write}")
    return 0


def run_minari(args: argparse.Namespace) -> int:
    """rlds reading a Minari dataset itself vs TorchRL, same session (benchmarks/minari_bench.py)."""
    import minari_bench

    work: Path = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    section = minari_bench.run(work, steps=_n_main(args), repeats=_repeats(args), log=_log)
    print(section)
    if args.write:
        bench_doc.write_section(args.write, minari_bench.SECTION, section)
        _log(f"wrote the '{minari_bench.SECTION}' section of {args.write}")
    return 0


def run_preprocess(args: argparse.Namespace) -> int:
    """rlds preprocess vs TorchRL preprocess (benchmarks/preprocess_bench.py)."""
    import preprocess_bench

    argv = ["--work", str(args.work.resolve()), "--repeats", str(_repeats(args))]
    argv += ["--quick"] if args.quick else []
    return preprocess_bench.main(argv + (["--write", str(args.write)] if args.write else []))


def run_cli(args: argparse.Namespace) -> int:
    """CLI start-up time (benchmarks/cli_bench.py)."""
    import cli_bench

    return cli_bench.main(["--write", str(args.write)] if args.write else []) or 0


def run_pixel(args: argparse.Namespace) -> int:
    """The pixel section: conversion, disk and every sampling path on pixels, side by side with
    TorchRL and the lean raw gather (benchmarks/pixel_bench.py)."""
    import pixel_bench

    return pixel_bench.main(_section_argv(args, args.work.resolve() / "pixel"))


def run_zarr(args: argparse.Namespace) -> int:
    """zarr against memmap: conversion CPU, pixel and low-dim random access (benchmarks/zarr_bench.py)."""
    import zarr_bench

    return zarr_bench.main(_section_argv(args, args.work.resolve() / "zarr"))


def run_framestack(args: argparse.Namespace) -> int:
    """FrameStack before/after vs the raw gather of 4x the frames (benchmarks/framestack_bench.py)."""
    import framestack_bench

    return framestack_bench.main(_section_argv(args, args.work.resolve() / "framestack"))


def run_dataloader(args: argparse.Namespace) -> int:
    """DataLoader workers with and without the ring (benchmarks/dataloader_bench.py)."""
    import dataloader_bench

    return dataloader_bench.main(_section_argv(args, args.work.resolve() / "dataloader"))


def run_loader(args: argparse.Namespace) -> int:
    """The sampling benchmark (benchmarks/loader_bench.py): rlds loader vs TorchRL vs raw numpy."""
    import loader_bench

    _log("loader (sampling):")
    lb_argv = (["--quick"] if args.quick else []) + (["--write", str(args.write)] if args.write else [])
    return loader_bench.main(lb_argv)


RUNNERS = {
    "conversion": run_conversion,
    "minari": run_minari,
    "preprocess": run_preprocess,
    "cli": run_cli,
    "pixel": run_pixel,
    "zarr": run_zarr,
    "framestack": run_framestack,
    "dataloader": run_dataloader,
    "loader": run_loader,
}


if __name__ == "__main__":
    sys.exit(main())
