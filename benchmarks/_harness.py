"""What every in-process benchmark script repeats: its command line (``--write``, ``--quick``,
``--repeats``, ``--seconds``, ``--work``, ``--keep``, usually ``--steps``), its run settings (one
torch intra-op thread, the load average before and after, the defaults of a quick run, a disk
check), the facts its report opens with (date, CPU model, commit, versions) and the end of a run
(print the section, write it into the Markdown file through :mod:`bench_doc`).

A script builds its parser with :func:`parser`, turns the parsed arguments into a :class:`Run`
with :func:`start`, and ends with :meth:`Run.publish`::

    p = _harness.parser("what it measures", "frame-stack", work="framestack", steps=(60_000, 10_000))
    run = _harness.start(p.parse_args(argv), seconds=(2.0, 0.3))
    ...
    run.publish("frame-stack", section, log)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_doc

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# ----------------------------------------------------------------------------- facts for the report


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``lscpu``, else ``platform``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
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


def commit() -> str:
    """The short commit, marked when tracked files have uncommitted changes."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return out + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def now() -> str:
    """The current UTC time as the reports print it."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


# ----------------------------------------------------------------------------- command line and run


def parser(
    description: str,
    section: str,
    *,
    work: str,
    steps: tuple[int, int] | None = None,
    repeats: int = 3,
    seconds: tuple[float, float] = (2.0, 0.3),
) -> argparse.ArgumentParser:
    """The shared command line of a benchmark script writing section ``section``.

    Args:
        work: The work directory's name under ``benchmarks/_work``.
        steps: ``(default, quick)`` generated steps, when the script takes ``--steps``.
        repeats: Default rounds.
        seconds: ``(default, quick)`` seconds per configuration and round.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--write", type=Path, help=f"Markdown file whose '{section}' section is replaced")
    if steps is not None:
        p.add_argument(
            "--steps", type=int, help=f"steps to generate (default {steps[0]:,}; quick: {steps[1]:,})"
        )
    p.add_argument("--quick", action="store_true", help="a small dataset and short runs (a smoke test)")
    p.add_argument("--repeats", type=int, help=f"interleaved rounds (default {repeats})")
    p.add_argument(
        "--seconds", type=float, help=f"seconds per configuration and round (default {seconds[0]:g})"
    )
    p.add_argument("--work", type=Path, default=HERE / "_work" / work, help="work directory")
    p.add_argument("--keep", action="store_true", help="keep the generated data afterwards")
    p.set_defaults(_steps=steps, _repeats=repeats, _seconds=seconds)
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
        out = {
            "date": now(),
            "cpu": cpu_model(),
            "cpus": cpus(),
            "python": platform.python_version(),
            "commit": commit(),
            "repeats": self.repeats,
            "seconds": self.seconds,
            "quick": self.quick,
            "minutes": (time.perf_counter() - self.t0) / 60,
            "load_before": self.load_before,
            "load_after": os.getloadavg()[0],
        }
        out.update(extra)
        return out

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
    machines, per-batch ops spend their time synchronizing threads.
    """
    run = Run(
        args=args,
        repeats=args.repeats or args._repeats,
        seconds=args.seconds or args._seconds[1 if args.quick else 0],
        steps=(getattr(args, "steps", None) or args._steps[1 if args.quick else 0]) if args._steps else 0,
        work=args.work.resolve(),
    )
    import torch

    torch.set_num_threads(threads)
    run.work.mkdir(parents=True, exist_ok=True)
    return run


def header(info: dict[str, Any], versions: str) -> list[str]:
    """The two lines under a section's workload paragraph: where, when, with what, under which load."""
    return [
        f"- Measured {info['date']} on {info['cpu']} ({info['cpus']} CPUs, shared); Python "
        f"{info['python']}; {versions}.",
        f"- rlds commit {info['commit']}; run took {info['minutes']:.1f} min; 1-minute load average "
        f"before/after: {info['load_before']:.1f}/{info['load_after']:.1f}.",
    ]
