"""The one benchmark harness every section uses: its command line (``--write``, ``--quick``,
``--repeats``, ``--seconds``, ``--work``, ``--keep``, usually ``--steps``), its run settings (one
torch intra-op thread, the load average before and after, the defaults of a quick run, a disk
check), the in-process measuring (cases visited in rounds, paired ratios), the report's pieces
(header facts, tables, verdicts) and the end of a run (print the section, write it into the
Markdown file through :mod:`bench_doc`); below those, the measured runs in fresh child processes.

A script builds its parser with :func:`parser`, turns the parsed arguments into a :class:`Run`
with :func:`start`, and ends with :meth:`Run.publish`::

    p = _harness.parser("what it measures", "frame-stack", work="framestack", steps=(60_000, 10_000))
    run = _harness.start(p.parse_args(argv))
    ...
    run.publish("frame-stack", section, log)

Every script takes ``--write FILE`` (replace its ``<!-- bench:NAME:start/end -->`` section of FILE)
and keeps its work data under ``benchmarks/_work/NAME`` (git-ignored, deleted unless ``--keep``).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import importlib
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_doc
import data as bench_data

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MB = 1e6


# ----------------------------------------------------------------------------- facts for the report


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpus() -> str:
    """``N usable of M online``: what this process may run on."""
    return f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()} online"


def version(dist: str) -> str:
    """Installed version of a distribution, or ``not installed``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions(*dists: str) -> str:
    """``name version, ...`` of ``dists``."""
    return ", ".join(f"{d} {version(d)}" for d in dists)


def commit() -> str:
    """The short commit, marked when tracked files have uncommitted changes."""
    try:
        git = ["git", "-C", str(REPO)]
        out = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def now() -> str:
    """The current UTC time as the reports print it."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def logger(name: str) -> Callable[[str], None]:
    """Progress lines of section ``name`` on stderr (stdout carries the section)."""
    return lambda message: print(f"[{name}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- command line and run


def add_common_flags(p: argparse.ArgumentParser, *, write: str, quick: str, repeats: str, work: Path) -> None:
    """The flags every benchmark script takes: ``--write FILE``, ``--quick``, ``--repeats N``,
    ``--work DIR`` and ``--keep``."""
    p.add_argument("--write", type=Path, help=write)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--repeats", type=int, help=repeats)
    p.add_argument("--work", type=Path, default=work, help="work directory")
    p.add_argument("--keep", action="store_true", help="keep the generated data afterwards")


def parser(
    description: str,
    section: str,
    *,
    work: str,
    steps: tuple[int, int] | None = None,
    repeats: int | tuple[int, int] = 3,
    seconds: tuple[float, float] = (2.0, 0.3),
) -> argparse.ArgumentParser:
    """The shared command line of a benchmark script writing section ``section``.

    Args:
        work: The work directory's name under ``benchmarks/_work``.
        steps: ``(default, quick)`` generated steps, when the script takes ``--steps``.
        repeats: Default rounds, or ``(default, quick)``.
        seconds: ``(default, quick)`` seconds per configuration and round.
    """
    p = argparse.ArgumentParser(description=description)
    reps = repeats if isinstance(repeats, tuple) else (repeats, repeats)
    add_common_flags(
        p,
        write=f"Markdown file whose '{section}' section is replaced",
        quick="a small dataset and short runs (a smoke test)",
        repeats=f"interleaved rounds (default {reps[0]}; quick: {reps[1]})",
        work=HERE / "_work" / work,
    )
    if steps is not None:
        p.add_argument(
            "--steps", type=int, help=f"steps to generate (default {steps[0]:,}; quick: {steps[1]:,})"
        )
    p.add_argument(
        "--seconds", type=float, help=f"seconds per configuration and round (default {seconds[0]:g})"
    )
    p.set_defaults(_steps=steps, _repeats=reps, _seconds=seconds)
    return p


@dataclass
class Run:
    """One benchmark run's settings and the facts its report needs."""

    args: argparse.Namespace
    repeats: int
    seconds: float
    steps: int
    work: Path
    t0: float = field(default_factory=time.perf_counter)
    load_before: float = field(default_factory=lambda: os.getloadavg()[0])

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    def need_disk(self, nbytes: float) -> None:
        """Stop with a message when the work directory's file system has less than ``nbytes`` free."""
        free = shutil.disk_usage(self.work).free
        if free < nbytes:
            raise SystemExit(f"need about {nbytes / 1e9:.1f} GB free in {self.work}, have {free / 1e9:.1f}")

    def info(self, **extra: Any) -> dict[str, Any]:
        """What the report's header says: date, CPU, commit, settings, duration and load."""
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem_kb = int(next((line for line in meminfo if line.startswith("MemTotal:")), "0 0").split()[1])
        df = subprocess.run(["df", "-T", str(self.work)], capture_output=True, text=True).stdout.splitlines()
        return {
            "date": now(),
            "cpu": cpu_model(),
            "cpus": cpus(),
            "ram": f"{mem_kb / 2**20:.1f} GiB",
            "os": f"{platform.system()} {platform.release()}, "
            f"work dir on {df[-1].split()[1] if df[1:] else '?'}",
            "python": platform.python_version(),
            "commit": commit(),
            "repeats": self.repeats,
            "seconds": self.seconds,
            "quick": self.quick,
            "minutes": (time.perf_counter() - self.t0) / 60,
            "load_before": self.load_before,
            "load_after": os.getloadavg()[0],
            **extra,
        }

    def remove(self, *paths: Path) -> None:
        """Delete generated data, unless ``--keep``."""
        if not self.args.keep:
            for path in paths:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def publish(self, section_name: str, section: str, log: Callable[[str], None]) -> None:
        """Print the section and, with ``--write FILE``, replace it in FILE."""
        print(section)
        if self.args.write:
            bench_doc.write_section(self.args.write, section_name, section)
            log(f"wrote the '{section_name}' section of {self.args.write}")


def start(args: argparse.Namespace, *, threads: int = 1) -> Run:
    """Resolve the defaults (quick or not), set torch's intra-op threads, create the work directory.

    One intra-op thread for every configuration: with torch's default on these small shared
    machines, per-batch ops spend their time synchronizing threads (41-396 batches/s for TorchRL's
    `RandomSampler` in a trial run against 1,600-3,800 with one thread), which would flatter rlds.
    """
    q = 1 if args.quick else 0
    run = Run(
        args=args,
        repeats=args.repeats or args._repeats[q],
        seconds=args.seconds or args._seconds[q],
        steps=(getattr(args, "steps", None) or args._steps[q]) if args._steps else 0,
        work=args.work.resolve(),
    )
    import torch

    torch.set_num_threads(threads)
    run.work.mkdir(parents=True, exist_ok=True)
    return run


# ----------------------------------------------------------------------------- report pieces


def save_json(path: Path, figures: Any) -> None:
    """The raw figures as JSON: measured objects (cases, configurations) as their data fields,
    pair keys as ``a / b``."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {" / ".join(k) if isinstance(k, tuple) else str(k): plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        if hasattr(x, "__dict__"):
            return {k: plain(v) for k, v in vars(x).items() if not k.startswith("_") and not callable(v)}
        return x if isinstance(x, int | float | str | bool | None) else str(x)

    path.write_text(json.dumps(plain(figures), indent=1))


def header(info: dict[str, Any], versions: str) -> list[str]:
    """The two lines under a section's workload paragraph: where, when, with what, under which load."""
    return [
        f"- Measured {info['date']} on {info['cpu']} ({info['cpus']} CPUs, shared), {info['ram']} RAM, "
        f"{info['os']}; Python {info['python']}; {versions}.",
        f"- rlds commit {info['commit']}; run took {info['minutes']:.1f} min; 1-minute load average "
        f"before/after: {info['load_before']:.1f}/{info['load_after']:.1f}.",
    ]


def opening(section: str, title: str, quick: bool, *notes: str) -> list[str]:
    """A section's first lines: its start marker, its title, its notes as quotes, the quick-run note."""
    lines = [bench_doc.markers(section)[0], "", f"## {title}", ""]
    for note in notes:
        lines += [f"> {note}", ""]
    if quick:
        lines += ["> **Quick run** (`--quick`): a small dataset and short runs; not the reference run.", ""]
    return lines


def closing(section: str, command: str, notes: Iterable[str] = ()) -> list[str]:
    """A section's last lines: how it is measured (the command, then ``notes``) and its end marker."""
    return [
        "",
        "### How it is measured",
        "",
        "```text",
        command,
        "```",
        "",
        *notes,
        "",
        bench_doc.markers(section)[1],
        "",
    ]


def verdict(ok: bool) -> str:
    """Markdown verdict for a goal."""
    return "**met**" if ok else "**not met**"


def span(values: Iterable[float], fmt: str = ",.0f", unit: str = "") -> str:
    """``median (min-max)`` of ``values``."""
    v = list(values)
    return f"{statistics.median(v):{fmt}}{unit} ({min(v):{fmt}}-{max(v):{fmt}})"


def table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    """A Markdown table (a row: its cells, or its line)."""
    head = list(head)
    lines = ["| " + " | ".join(map(str, r)) + " |" if not isinstance(r, str) else r for r in rows]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines]


PAIRED_NOTE = (
    "- Paired ratios: the two sides' calls alternate one by one for about {seconds:g} s, and the ratio "
    "is that of their median call times (both see the same moments of the shared machine); median "
    "of the rounds, range in brackets. Ratios to TorchRL are those of the rates, the paired ones "
    "beside them."
)


# ----------------------------------------------------------------------------- in-process measuring


class Case:
    """One measured configuration: a callable, its rate (batches/s) per round and its minor page
    faults per call (``epoch`` cases: seconds per epoch instead of a rate)."""

    def __init__(self, key: str, label: str, fn: Callable[[], Any], *, epoch: bool = False) -> None:
        self.key, self.label, self.fn, self.epoch = key, label, fn, epoch
        self.rates: list[float] = []
        self.faults: list[float] = []
        self._samples: list[float] = []
        self._faults = self._calls = 0

    def visit(self, settle: int, timed: int, per_visit: bool) -> None:
        """``settle`` untimed calls (the allocator settles after the other cases' allocations), then
        ``timed`` timed ones: each timed alone, or (``per_visit``) all together as one rate."""
        for _ in range(settle):
            self.fn()
        if per_visit:
            faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            for _ in range(timed):
                self.fn()
            self._samples.append(timed / (time.perf_counter() - t))
            self._faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        else:
            for _ in range(timed):
                faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                self.fn()
                self._samples.append(time.perf_counter() - t)
                self._faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        self._calls += timed

    def end_round(self, per_visit: bool) -> float:
        """Close a round: its rate (the median visit's, else one over the median call time)."""
        med = statistics.median(self._samples)
        self.rates.append(med if per_visit else 1.0 / med)
        self.faults.append(self._faults / self._calls)
        self._samples, self._faults, self._calls = [], 0, 0
        return self.rates[-1]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def fmt(self, digits: int = 0) -> str:
        return span(self.rates, ".2f", " s") if self.epoch else span(self.rates, f",.{digits}f")

    def ms(self) -> str:
        return f"{1e3 / self.median:.1f}"


def run_round(
    cases: list[Case],
    seconds: float,
    *,
    settle: int = 2,
    timed: int = 4,
    per_visit: bool = False,
    budget: bool = False,
) -> None:
    """One round: visit the cases in turn (see :meth:`Case.visit`), so that a burst of load from the
    machine's other users hits every case alike, until each has had about ``seconds`` of calls
    (``budget``: a case that has had them is not visited again for each slower one's visits; else
    the round lasts ``seconds`` per case and at least 3 visits)."""
    spent, visits, t0 = [0.0] * len(cases), 0, time.perf_counter()
    while min(spent) < seconds if budget else (time.perf_counter() - t0 < seconds * len(cases) or visits < 3):
        for i, case in enumerate(cases):
            if not (budget and spent[i] >= seconds):
                t = time.perf_counter()
                case.visit(settle, timed, per_visit)
                spent[i] += time.perf_counter() - t
        visits += 1
    for case in cases:
        case.end_round(per_visit)


def rounds(cases: list[Case], repeats: int, seconds: float, log: Callable[[str], None], **how: Any) -> None:
    """``repeats`` rounds of :func:`run_round`, each case's rate logged per round."""
    for rep in range(repeats):
        run_round(cases, seconds, **how)
        for case in cases:
            log(f"  [{rep + 1}/{repeats}] {case.label}: {case.rates[-1]:,.1f} batches/s")


def paired_ratio(
    mine: Callable[[], Any], peer: Callable[[], Any], seconds: float
) -> tuple[float, float, float]:
    """``mine``'s rate over ``peer``'s, from calls that alternate one by one for about ``seconds``:
    the ratio of their median call times (returned too, in microseconds). Both see the same
    moments of a shared machine, and the medians drop the calls another job interrupted."""
    for _ in range(10):
        mine()
        peer()
    a: list[int] = []
    b: list[int] = []
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    while clock() < end:
        for _ in range(10):
            t0 = clock()
            mine()
            t1 = clock()
            peer()
            t2 = clock()
            a.append(t1 - t0)
            b.append(t2 - t1)
    ma, mb = statistics.median(a), statistics.median(b)
    return mb / ma, ma / 1e3, mb / 1e3


def measure_pairs(
    cases: dict[str, Case],
    pairs: list[tuple[str, str]],
    repeats: int,
    seconds: float,
    log: Callable[[str], None],
) -> dict[tuple[str, str], list[float]]:
    """The ``pairs`` of cases (both present) measured with :func:`paired_ratio`, ``repeats`` rounds."""
    out: dict[tuple[str, str], list[float]] = {}
    for rep in range(repeats):
        for mine, peer in pairs:
            if mine in cases and peer in cases:
                value, us_mine, us_peer = paired_ratio(cases[mine].fn, cases[peer].fn, seconds)
                out.setdefault((mine, peer), []).append(value)
                log(
                    f"  [{rep + 1}/{repeats}] {mine} / {peer} (paired): {value:.2f} "
                    f"(median calls {us_mine:.1f} / {us_peer:.1f} us)"
                )
    return out


#: The keys of a TED transition, rlds-style.
TED_KEYS = (
    "observation",
    "action",
    "episode",
    *(f"next/{k}" for k in ("observation", "reward", "done", "terminated", "truncated")),
)


def ted(columns: dict[str, Any]) -> Any:
    """TorchRL's TED ``TensorDict`` of rlds-keyed columns (``next/K`` nested under ``next``)."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    t = {k: torch.as_tensor(np.ascontiguousarray(v)) for k, v in columns.items()}
    root = {k: v for k, v in t.items() if not k.startswith("next/")}
    nxt = {k[5:]: v for k, v in t.items() if k.startswith("next/")}
    return TensorDict({**root, "next": nxt}, batch_size=[len(t["action"])])


def generate(kind: str, out: Path, steps: int, dataset_id: str | None = None) -> Path:
    """Write benchmark data (``benchmarks/data.py KIND``) in a child process, so that this process
    never holds its arrays (its RSS is what a spawned child's ``ru_maxrss`` starts from)."""
    cmd = [sys.executable, str(HERE / "data.py"), kind, str(out), "--steps", str(steps)]
    subprocess.run(
        cmd + (["--dataset-id", dataset_id] if dataset_id else []), check=True, stdout=subprocess.DEVNULL
    )
    return out


def warm_dataset(ds: Any) -> None:
    """Read every file of a dataset once, so that runs start from the page cache."""
    for path in ds.directory.rglob("*"):
        if path.is_file():
            warm(path)


# ----------------------------------------------------------------------------- measured runs
# Each measured operation runs in a fresh child process (``python benchmarks/_harness.py SPEC
# OUT``), so imports, allocator state and peak RSS belong to that operation alone; the page
# cache state of its source is set and recorded first. run_all (conversion), minari_bench and
# pixel_bench share these.

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
