"""The one benchmark harness every script uses: its command line (``--write``, ``--quick``,
``--repeats``, ``--seconds``, ``--work``, ``--keep``, usually ``--steps``), its run settings (one
torch intra-op thread, the load average before and after, the defaults of a quick run, a disk
check), the in-process measuring (cases visited in rounds, paired ratios), the report's pieces
(header facts, tables, verdicts: from :mod:`_report`), the end of a run (print the section, write
it between its ``<!-- bench:NAME:start/end -->`` markers of the Markdown file); and, from
:mod:`_child_runs`, the measured runs in fresh child processes.

A script builds its parser with :func:`parser`, turns the parsed arguments into a :class:`Run`
with :func:`start`, and ends with :meth:`Run.publish`::

    p = _harness.parser("zarr against memmap", "zarr", work="zarr", seconds=(1.5, 0.3))
    run = _harness.start(p.parse_args(argv))
    ...
    run.publish("zarr", section, log)

In-process sections measure :class:`Case` s in :func:`rounds` and :func:`measure_pairs` and report
them with :func:`rates_table` and :func:`ratios_table` (goals given as ``"mine/ref>=0.9"``).

Work data lives under ``benchmarks/_work/NAME`` (git-ignored) and is deleted unless ``--keep``;
scripts that only print their tables (no section) take the same flags except ``--write``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
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

from _child_runs import (  # noqa: F401  (the measured runs in child processes, one harness to import)
    TED_KEYS,
    Config,
    disk_usage,
    generate,
    rlds_config,
    run_configs,
    run_once,
    spawn,
    ted,
    torchrl_config,
    warm,
)
from _report import (  # noqa: F401  (the report's pieces, one harness to import)
    INTRO,
    PAIRED_NOTE,
    closing,
    commit,
    cpu_model,
    goal,
    header,
    load_note,
    markers,
    opening,
    save_json,
    span,
    table,
    verdict,
    version,
    versions,
    write_section,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MB = 1e6


def logger(name: str) -> Callable[[str], None]:
    """Progress lines of section ``name`` on stderr (stdout carries the section)."""
    return lambda message: print(f"[{name}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- command line and run


def add_common_flags(
    p: argparse.ArgumentParser, *, write: str | None, quick: str, repeats: str, work: Path
) -> None:
    """The flags every benchmark script takes: ``--write FILE`` (unless it only prints), ``--quick``,
    ``--repeats N``, ``--work DIR`` and ``--keep``."""
    if write is not None:
        p.add_argument("--write", type=Path, help=write)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--repeats", type=int, help=repeats)
    p.add_argument("--work", type=Path, default=work, help="work directory")
    p.add_argument("--keep", action="store_true", help="keep the generated data afterwards")


def parser(
    description: str,
    section: str | None,
    *,
    work: str,
    steps: tuple[int, int] | None = None,
    repeats: int | tuple[int, int] = 3,
    seconds: tuple[float, float] = (2.0, 0.3),
) -> argparse.ArgumentParser:
    """The shared command line of a benchmark script writing section ``section`` (``None``: a
    script that prints its tables, no ``--write``).

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
        write=f"Markdown file whose '{section}' section is replaced" if section else None,
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
    p.set_defaults(_steps=steps, _repeats=reps, _seconds=seconds, write=None)
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
        fs = df[-1].split()[1] if df[1:] else "?"
        return {
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_model(),
            "cpus": f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()} online",
            "ram": f"{mem_kb / 2**20:.1f} GiB",
            "os": f"{platform.system()} {platform.release()}, work dir on {fs}",
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
            write_section(self.args.write, section_name, section)
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
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(threads)
    run.work.mkdir(parents=True, exist_ok=True)
    return run


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

    def visit(self, settle: int, calls: int, per_visit: bool) -> None:
        """``settle`` untimed calls (the allocator settles after the other cases' allocations), then
        ``calls`` timed ones: each timed alone, or (``per_visit``) all together as one rate."""
        for _ in range(settle):
            self.fn()
        if per_visit:
            faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            for _ in range(calls):
                self.fn()
            self._samples.append(calls / (time.perf_counter() - t))
            self._faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        else:
            for _ in range(calls):
                faults, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                self.fn()
                self._samples.append(time.perf_counter() - t)
                self._faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        self._calls += calls

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

    @property
    def rate(self) -> float:
        """The median rate: batches per second (an epoch case: epochs per second)."""
        return 1 / self.median if self.epoch else self.median

    def fmt(self) -> str:
        """The rates' median (range): batches/s (2 decimals below 10 a second), or an epoch's seconds."""
        if self.epoch:
            return span(self.rates, ".2f", " s")
        return span(self.rates, ",.2f" if self.median < 10 else ",.0f")


def run_round(
    cases: list[Case],
    seconds: float,
    *,
    settle: int = 2,
    calls: int = 4,
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
                case.visit(settle, calls, per_visit)
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


def ratio_goals(text: str) -> dict[tuple[str, str], float | None]:
    """``"a/b>=0.9 c/d"`` -> ``{("a", "b"): 0.9, ("c", "d"): None}``: pairs of case keys, mine over
    my reference, each with the goal its ratio must reach, if any."""
    out: dict[tuple[str, str], float | None] = {}
    for item in text.split():
        pair, _, target = item.partition(">=")
        mine, ref = pair.split("/")
        out[mine, ref] = float(target) if target else None
    return out


def pairs(text: str) -> list[tuple[str, str]]:
    """``"a/b c/d"`` -> ``[("a", "b"), ("c", "d")]``: the pairs of :func:`ratio_goals`."""
    return list(ratio_goals(text))


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
                    f"  [{rep + 1}/{repeats}] {mine} / {peer} (paired): {value:.2f} (median calls "
                    f"{us_mine:.1f} / {us_peer:.1f} us)"
                )
    return out


def warm_dataset(ds: Any) -> None:
    """Read every file of a dataset once, so that runs start from the page cache."""
    for path in ds.directory.rglob("*"):
        if path.is_file():
            warm(path)


# ----------------------------------------------------------------------------- the report tables


def rates_table(cases: Iterable[Case], extra: dict[str, Callable[[Case], str]] | None = None) -> list[str]:
    """The rate table of an in-process section: a row a case (its key, its label, batches/s median
    (range) over the rounds, or seconds for an epoch; ms a batch; minor page faults a call, where
    they were counted), then the ``extra`` columns."""
    extra = extra or {}
    rows = []
    for c in cases:
        faults = f"{statistics.median(c.faults):,.0f}" if c.faults else "-"
        ms = "-" if c.epoch else f"{1e3 / c.rate:.3g}"
        rows.append([c.key, c.label, c.fmt(), ms, faults, *(f(c) for f in extra.values())])
    return table(
        ["case", "configuration", "batches/s (range)", "ms a batch", "page faults a call", *extra], rows
    )


def ratios_table(
    cases: dict[str, Case],
    goals: dict[tuple[str, str], float | None],
    paired: dict[tuple[str, str], list[float]],
) -> list[str]:
    """The ratio table of an in-process section, under its heading: a row a pair of ``goals`` whose
    cases both ran,
    ``mine / ref``: the ratio of their rates, the paired ratio's median (range) where it was
    measured, and the goal (at least the target), judged on the paired ratio, except against
    TorchRL (``trl-`` cases): its calls touch far more memory a batch and slow the calls after them
    in the pairs, so there on the rates."""
    rows = []
    for (mine, ref), target in goals.items():
        if mine in cases and ref in cases:
            rates = cases[mine].rate / cases[ref].rate
            values = paired.get((mine, ref))
            judged = statistics.median(values) if values and not ref.startswith("trl-") else rates
            goal = "-" if target is None else f">= {target:g}x: {verdict(judged >= target)}"
            rows.append(
                [f"{mine} / {ref}", f"{rates:.2f}x", span(values, ".2f", "x") if values else "-", goal]
            )
    head = ["ratio", "of the rates", "paired, median (range)", "goal"]
    return ["### Goals and ratios (measured in this run)", "", *table(head, rows)]
