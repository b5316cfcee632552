"""The benchmark harness's measured runs in fresh child processes (re-exported by
:mod:`_harness`, which every section imports): each measured operation runs in a fresh process
(``python benchmarks/_child_runs.py SPEC OUT``), so imports, allocator state and peak RSS belong
to that operation alone; the page cache state of its source is set and recorded first. Peak RSS
is the child's ``VmHWM`` (its own address space); its ``ru_maxrss`` from ``wait4`` is logged as a
cross-check but can read high, because Linux starts a spawned child's ``ru_maxrss`` at its
parent's RSS (so a driver keeps no data in memory: it generates its files in child processes too).
Before each run the parent deletes the previous output and calls ``sync()`` (so no earlier
write-back overlaps the run); "cold" runs evict the source with ``posix_fadvise(DONTNEED)`` (the
only cache drop possible without root; the hypervisor may still cache the disk).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import data as bench_data

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: The Minari dataset id of the conversion section's TorchRL side.
DATASET_ID = "bench/synthetic-v0"
#: TorchRL's replay-buffer batch size (only its cache build is timed).
BATCH_SIZE = 256


# ----------------------------------------------------------------------------- page cache


def page_cache_fraction(path: Path) -> float:
    """Fraction of ``path``'s pages that are in the page cache (``mincore`` on a mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
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


def hwm_mb() -> float:
    """Peak RSS of this process's own address space (``VmHWM``), in MiB.

    Unlike ``ru_maxrss``, it starts afresh at ``exec``: Linux carries the parent's peak RSS over
    into a spawned child's ``ru_maxrss``, so a child can never report less than its parent had.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource  # not Linux: fall back to ru_maxrss

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(call: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Run ``call`` once in a benchmark child, measured as every conversion row reports it: wall
    and CPU seconds (``process_time``: all threads), and the peak RSS (``VmHWM``) just before and
    right after. Returns what ``call`` returned and those measures."""
    rss_before = hwm_mb()
    cpu0 = time.process_time()
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    return result, {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "rss_before_mb": rss_before,
        "peak_rss_mb": hwm_mb(),
    }


def worker_rlds(spec: dict[str, Any]) -> dict[str, Any]:
    """Convert the D4RL file with rlds (runs in the child); ``spec["fsync"] = False`` sets
    ``RLDS_FSYNC=0`` (the default, fsync on, is what the other rows measure)."""
    if spec.get("fsync") is False:
        os.environ["RLDS_FSYNC"] = "0"
    t0 = time.perf_counter()
    from rlds_cli.convert import convert

    imported = time.perf_counter()
    result, measured = timed(
        lambda: convert(spec["source"], "bench", format="d4rl", root=spec["root"], backend=spec["backend"])
    )
    m = result.manifest
    return {
        **measured,
        "import_seconds": imported - t0,
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
    # (the peak RSS is taken before the check below maps the cache's files in)
    rb, measured = timed(
        lambda: MinariExperienceReplay(
            spec["dataset_id"], batch_size=BATCH_SIZE, load_from_local_minari=True, root=spec["root"]
        )
    )
    # untimed check: does the cache hold the source's first episode?
    td = rb._storage._storage
    h5 = Path(spec["minari_root"]) / spec["dataset_id"] / "data" / "main_data.hdf5"
    with h5py.File(h5, "r") as f:
        first = torch.from_numpy(f["episode_0/observations"][:-1])
    obs = torch.as_tensor(td["observation"][: len(first)])
    return {
        **measured,
        "import_seconds": imported - t0,
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
    result = spawn(cfg.spec, work, work / f"{cfg.key}.log")
    result.update(cached=cached, load1=load1)
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


def spawn(spec: dict[str, Any], work: Path, log_path: Path | None = None) -> dict[str, Any]:
    """Run ``WORKERS[spec["kind"]]`` (of module ``spec["module"]``, else this one's) on ``spec`` in
    a fresh process (this file's ``__main__``), without ``RLDS_FSYNC`` and ``MINARI_DATASETS_PATH``
    from this environment; its result, with the process's ``wall`` seconds and ``ru_maxrss_mb``."""
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RLDS_FSYNC", "MINARI_DATASETS_PATH")}
    cmd = [sys.executable, str(Path(__file__).resolve()), json.dumps(spec), str(result_path)]
    log_path = log_path or work / f"{spec['kind']}.log"
    with open(log_path, "w") as log:
        wall0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - wall0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{spec['kind']}: worker failed:\n{log_path.read_text()[-4000:]}")
    return {**json.loads(result_path.read_text()), "wall": wall, "ru_maxrss_mb": usage.ru_maxrss / 1024}


if __name__ == "__main__":  # the child of run_once
    worker_main(*sys.argv[1:3])


def generate(kind: str, out: Path, steps: int, dataset_id: str | None = None) -> Path:
    """Write benchmark data (``benchmarks/data.py KIND``) in a child process, so that this process
    never holds its arrays (its RSS is what a spawned child's ``ru_maxrss`` starts from)."""
    cmd = [sys.executable, str(HERE / "data.py"), kind, str(out), "--steps", str(steps)]
    subprocess.run(
        cmd + (["--dataset-id", dataset_id] if dataset_id else []), check=True, stdout=subprocess.DEVNULL
    )
    return out


def read_seconds(
    reader: Callable[..., Any],
    src: Path,
    repeats: int = 2,
    count: Callable[[Any], int] | None = None,
    **kw: Any,
) -> tuple[float, int]:
    """Best wall seconds of a format reader alone (``reader(src, **kw)``) over ``repeats`` passes of
    all its blocks, and the rows they held (``count`` of a block, default its steps)."""
    best, rows = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        with reader(src, **kw) as r:
            rows = sum(count(b) if count else b.num_steps for b in r.blocks())
        best = min(best, time.perf_counter() - t)
    return best, rows


_CONVERT_CHILD = """
import json, sys, time
from rlds_cli.convert import convert
t = time.perf_counter()
convert(sys.argv[1], "bench", root=sys.argv[2], backend="memmap", options=json.loads(sys.argv[3]))
seconds = time.perf_counter() - t
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "peak_kb": peak}))
"""


def convert_in_child(src: Path, home: Path, options: dict[str, Any] | None = None) -> dict[str, float]:
    """Convert ``src`` (memmap backend, reader ``options``) in a fresh interpreter: its wall
    seconds and peak RSS (``VmHWM`` of that process, interpreter and imports included)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    args = [sys.executable, "-c", _CONVERT_CHILD, str(src), str(home), json.dumps(options or {})]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    if out.returncode:
        raise SystemExit(out.stderr)
    return dict(json.loads(out.stdout.splitlines()[-1]))
