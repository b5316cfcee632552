"""The first download as a whole process: ``rlds download ./file.hdf5`` against TorchRL's
``MinariExperienceReplay`` build of the same episodes (issue 38, item 7).

Every rlds run is the command a user types, in a fresh process with an empty ``RLDS_HOME``, timed
from spawn to exit (interpreter start, imports, the source's sha256, the conversion, the fsyncs,
the publish, the summary line). Two sources of the same 1,000,000 steps: the plain D4RL file of
the conversion section, and the file as D4RL's generator writes it (``data.py d4rl-generated``:
every array gzip-compressed in h5py's automatic chunks, plus ``infos/`` and ``metadata/``), which
is what ``rlds download hopper-medium-v2`` fetches. TorchRL builds its cache from a Minari dataset
of the same episodes (``_child_runs.worker_torchrl``: its build timed, and its whole process).
The process is then taken apart: start-up alone (``rlds --version``), the run without fsync
(``RLDS_FSYNC=0``), the source's sha256 in-process, and reading every array of the generated file
with h5py against :class:`rlds_cli.formats.hdf5_util.ChunkRows`. Rounds interleave the cases,
the order turned every round; the source is in the page cache for every run.

Usage::

    python benchmarks/download_bench.py [--write docs/benchmarks.md] [--quick] [--repeats N]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _harness
from _child_runs import DATASET_ID, Config
from _page_cache import warm

SECTION = "first-download"
#: The goal: the whole ``rlds download`` process at least this many times faster than TorchRL's build.
TARGET_RATIO = 4.0
_log = _harness.logger(SECTION)


def cli_run(args: list[str], home: Path, env: dict[str, str] | None = None) -> float:
    """Wall seconds of one ``rlds ARGS`` process with an empty cache at ``home``."""
    shutil.rmtree(home, ignore_errors=True)
    os.sync()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("RLDS_")}
    child_env |= {"RLDS_HOME": str(home), "NO_COLOR": "1", **(env or {})}
    cmd = [sys.executable, "-m", "rlds_cli.cli.app", *args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=child_env, cwd=_harness.REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"rlds {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return seconds


def sha256_seconds(path: Path) -> float:
    """Seconds to hash ``path`` as the download does (1 MiB reads)."""
    t0 = time.perf_counter()
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return time.perf_counter() - t0


def read_seconds(path: Path) -> tuple[float, float]:
    """Seconds to read every array of ``path`` (the 1M-row ones, in 28,000-row blocks as the D4RL
    reader does): with h5py's slicing, and with ``ChunkRows`` (its default threads)."""
    import h5py

    from rlds_cli.formats.hdf5_util import ChunkRows, inflatable

    with h5py.File(path, "r") as f:
        keys: list[str] = []
        f.visititems(lambda k, v: keys.append(k) if isinstance(v, h5py.Dataset) and v.chunks else None)
        datasets = [f[k] for k in keys]
        n = datasets[0].shape[0]
        out = []
        rows = ChunkRows()
        for use_threads in (False, True):
            t0 = time.perf_counter()
            for start in range(0, n, 28_000):
                stop = min(start + 28_001, n)  # one row of lookahead, as the reader reads
                for d in datasets:
                    if use_threads and inflatable(d):
                        rows.read(d, start, stop)
                    else:
                        d[start:stop]
            out.append(time.perf_counter() - t0)
        rows.close()
    return out[0], out[1]


def first_download(run: _harness.Run) -> str:
    n = 100_000 if run.quick else 1_000_000
    work = run.work
    run.need_disk(8 * 200 * n)
    plain = _harness.generate("d4rl", work / "plain.hdf5", n)
    generated = _harness.generate("d4rl-generated", work / "hopper-like.hdf5", n)
    minari = _harness.generate("minari", work / "minari", n, DATASET_ID)
    torchrl = _harness.torchrl_config("torchrl", "TorchRL `MinariExperienceReplay` build", minari, work)
    home = work / "home"
    cases: dict[str, tuple[Path, list[str], dict[str, str]]] = {
        "plain": (plain, ["download", str(plain)], {}),
        "generated": (generated, ["download", str(generated)], {}),
        "generated, no fsync": (generated, ["download", str(generated)], {"RLDS_FSYNC": "0"}),
        "start-up": (generated, ["--version"], {}),
    }
    seconds: dict[str, list[float]] = {k: [] for k in cases}
    hashes: list[float] = []
    reads: list[tuple[float, float]] = []
    loads: list[float] = []
    order: list[str | Config] = [torchrl, *cases]
    for rep in range(run.repeats):
        loads.append(os.getloadavg()[0])
        shift = rep % len(order)
        for case in order[shift:] + order[:shift]:
            if isinstance(case, Config):
                case.runs.append(_harness.run_once(case, work))
                _log(f"  [{rep + 1}] {case.label}: {case.runs[-1]['seconds']:.2f} s")
                continue
            source, args, env = cases[case]
            warm(source)
            seconds[case].append(cli_run(args, home, env))
            _log(f"  [{rep + 1}] rlds {case}: {seconds[case][-1]:.2f} s")
        warm(generated)
        hashes.append(sha256_seconds(generated))
        reads.append(read_seconds(generated))
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(torchrl.output, ignore_errors=True)
    sizes = {"plain": plain.stat().st_size, "generated": generated.stat().st_size}
    run.remove(plain, generated, minari)
    return render(run.info(), n, torchrl, seconds, hashes, reads, loads, sizes)


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def render(
    info: dict[str, Any],
    n: int,
    torchrl: Config,
    seconds: dict[str, list[float]],
    hashes: list[float],
    reads: list[tuple[float, float]],
    loads: list[float],
    sizes: dict[str, int],
) -> str:
    build, process = torchrl.median("seconds"), torchrl.median("wall")
    med = {k: statistics.median(v) for k, v in seconds.items()}
    labels = {
        "plain": f"`rlds download ./plain.hdf5` (uncompressed, {sizes['plain'] / 1e6:.0f} MB)",
        "generated": f"`rlds download ./hopper-like.hdf5` (as D4RL's generator writes it, "
        f"{sizes['generated'] / 1e6:.0f} MB)",
        "generated, no fsync": "the same with `RLDS_FSYNC=0`",
        "start-up": "`rlds --version` (interpreter and CLI start-up alone)",
    }
    rows = [
        [
            "TorchRL `MinariExperienceReplay` build (timed part; imports excluded)",
            f"{build:.2f} ({torchrl.span('seconds')[0]:.2f}-{torchrl.span('seconds')[1]:.2f})",
            "1.0x",
            "-",
        ],
        [
            "TorchRL, the whole process (imports included)",
            _cell([r["wall"] for r in torchrl.runs]),
            "-",
            "1.0x",
        ],
    ]
    for key, label in labels.items():
        rows.append([label, _cell(seconds[key]), f"{build / med[key]:.1f}x", f"{process / med[key]:.1f}x"])
    ratio = build / med["generated"]
    h5py_read = statistics.median(r[0] for r in reads)
    threaded = statistics.median(r[1] for r in reads)
    lines = [
        *_harness.opening(
            SECTION, "The first download: `rlds download ./file.hdf5` as a whole process", info["quick"]
        ),
        f"Workload: {n:,} steps of the conversion section's episodes (observation 17 float32, action 6 "
        "float32, 1,000-step episodes). Each rlds figure is a whole `rlds download` process with an empty "
        "cache, timed from spawn to exit with its defaults (the source's sha256, every file fsynced before "
        "the atomic publish); TorchRL builds its cache from a Minari dataset of the same episodes. Median "
        f"(range) of {len(hashes)} rounds, cases interleaved, the source in the page cache. "
        "(`benchmarks/download_bench.py`)",
        "",
        *_harness.header(info, _harness.versions("rlds-cli", "torch", "torchrl", "h5py", "numpy")),
        _harness.load_note(
            [min(loads), max(loads)], "at each round, lowest and highest", "wall times are noisier"
        ),
        "",
        *_harness.table(
            ["operation", "seconds, median (range)", "TorchRL build / this", "TorchRL process / this"], rows
        ),
        "",
        f"Goal: the whole `rlds download` of the generated file at least {TARGET_RATIO:.0f}x faster than "
        f"TorchRL's build: **{ratio:.2f}x**, {_harness.verdict(ratio >= TARGET_RATIO)} "
        f"(the plain file: {build / med['plain']:.1f}x).",
        "",
        "Where the generated file's process goes (medians): start-up "
        f"{med['start-up']:.2f} s; the sha256 of the source {statistics.median(hashes):.2f} s; the fsyncs "
        f"{max(0.0, med['generated'] - med['generated, no fsync']):.2f} s; reading every array "
        f"{threaded:.2f} s with `ChunkRows` against {h5py_read:.2f} s through h5py "
        f"({h5py_read / threaded:.1f}x: h5py inflates the gzip chunks one at a time under its global lock; "
        "rlds reads the compressed chunks itself and inflates them with libdeflate on a thread per core); "
        "the rest is the conversion.",
    ]
    command = "python benchmarks/download_bench.py --write docs/benchmarks.md"
    return "\n".join(lines + _harness.closing(SECTION, command))


def main(argv: list[str] | None = None) -> int:
    args = _harness.parser(__doc__.split("\n\n")[0], SECTION, work="download", repeats=(5, 1)).parse_args(
        argv
    )
    run = _harness.start(args)
    run.publish(SECTION, first_download(run), _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
