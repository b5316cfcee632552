"""Pixel section of ``make bench``: rlds against TorchRL and the lean raw gather on pixel data
(``benchmarks/data.py pixels``: a D4RL-format HDF5 file of ``uint8`` (3, 84, 84) patch frames,
30,000 steps by default, see :data:`STEPS`).

Measured: the conversion in fresh processes (``_harness.run_configs``; rlds memmap, zarr and
memmap without fsync against TorchRL's ``LazyMemmapStorage`` fill, :data:`FILL_ROWS` rows a
``rb.extend``) and where rlds's time goes (cProfile); every sampling path in this process
(uniform, slices, ``FrameStack(4)`` against TorchRL's ``CatFrames``, zarr, in RAM) beside the
lean raw gathers, as rates and paired ratios; ``TedDataLoader`` with 2 workers against the
in-process loader. Usage: ``python benchmarks/pixel_bench.py [--write FILE] [--quick]``; the raw
figures are also saved in the work directory as ``results.json``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent

import _harness  # noqa: E402  (benchmarks/_harness.py: command line, run settings, rounds, report)
import data as bench_data  # noqa: E402  (benchmarks/data.py: the pixel generator)
import dataloader_bench  # noqa: E402  (DataLoader cases and their rounds)
import framestack_bench  # noqa: E402  (its rounds; the raw gather of 4x the frames)
import loader_bench  # noqa: E402  (the lean raw gather)
import zarr_bench  # noqa: E402  (the note on generated frames)

SECTION = "pixel"
BATCH = 256
K = 4
NUM_SLICES, SLICE_LEN = loader_bench.NUM_SLICES, loader_bench.SLICE_LEN
#: Default and quick steps. 30,000 frames are 0.64 GB per copy: several times any CPU cache (every
#: random frame read goes to DRAM, as with real datasets), while the source file (two copies),
#: the three caches and the in-RAM copies (about 4.5 GB in all) fit in the page cache and memory
#: of a 24 GB machine shared with other jobs, and a conversion takes seconds, so every
#: configuration runs 3 times, interleaved, and the section stays at a few minutes.
STEPS = (30_000, 3_000)
#: Rows per ``rb.extend`` call in TorchRL's fill (42 MB of frames per key a call).
FILL_ROWS = 2_000
#: The issue's targets, checked on the ratios measured in this run.
TARGETS = {"zarr": 0.25, "framestack": 0.5, "dataloader": 0.5, "ram": 0.8, "memmap": 0.9}
TARGETS |= {"trl-uniform": 5.0, "trl-slice": 10.0, "trl-conversion": 4.0}
#: (rlds, reference) pairs measured by alternating their calls (``_harness.paired_ratio``).
PAIRS = _harness.pairs(
    "rlds-mm/raw-mm rlds-slice/raw-slice rlds-fs/raw-4x rlds-zarr/rlds-mm rlds-ram/raw-ram "
    "rlds-mm/trl-uniform rlds-slice/trl-slice rlds-ram/trl-ram"
)
MB = 1e6


_log = _harness.logger("pixel")


# ----------------------------------------------------------------------------- TorchRL's side


def torchrl_fill(source: Path, storage: Any, rows: int = FILL_ROWS) -> Any:
    """A ``TensorDictReplayBuffer`` over ``storage`` holding the D4RL file ``source`` as TED
    (``observation``, ``action``, ``episode``; ``next/`` ``observation``, ``reward``, ``done``,
    ``terminated``, ``truncated``), filled ``rows`` rows per ``rb.extend``."""
    import h5py
    import numpy as np
    from torchrl.data import TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=storage, batch_size=BATCH)
    episode = 0
    with h5py.File(source, "r") as f:
        n = int(f["observations"].shape[0])
        for start in range(0, n, rows):
            cut = slice(start, min(start + rows, n))
            term, trunc = f["terminals"][cut].reshape(-1, 1), f["timeouts"][cut].reshape(-1, 1)
            ends = (term | trunc).reshape(-1).astype(np.int64)
            ep = episode + np.cumsum(ends) - ends
            episode = int(ep[-1]) + int(ends[-1])
            columns = {"observation": f["observations"][cut], "action": f["actions"][cut], "episode": ep}
            columns |= {
                "next/observation": f["next_observations"][cut],
                "next/reward": f["rewards"][cut].reshape(-1, 1),
            }
            td = _harness.ted(
                columns | {"next/done": term | trunc, "next/terminated": term, "next/truncated": trunc}
            )
            rb.extend(td)
    return rb


def worker_torchrl_fill(spec: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's fill of a ``LazyMemmapStorage`` from the D4RL file (in ``_harness.run_once``'s child)."""
    t0 = time.perf_counter()
    import h5py
    from torchrl.data import LazyMemmapStorage

    imported = time.perf_counter()
    with h5py.File(spec["source"], "r") as f:
        n = int(f["observations"].shape[0])
    storage = LazyMemmapStorage(n, scratch_dir=Path(spec["root"]) / "storage")
    rb, measured = _harness.timed(lambda: torchrl_fill(Path(spec["source"]), storage))
    return {**measured, "import_seconds": imported - t0, "steps": len(rb)}


#: Operations ``_harness.worker_main`` runs for this module (``spec["module"] = "pixel_bench"``).
WORKERS = {"torchrl-fill": worker_torchrl_fill}


def catframes_buffer(storage: Any, *, next_too: bool = True) -> Any:
    """TorchRL's documented frame stacking from a buffer of single frames:
    ``CatFrames(N=4).make_rb_transform_and_sampler`` (slices of 4 steps inside an episode, the
    frames concatenated along the channels, the last step of each slice kept), stacking
    ``observation`` and ``next/observation``; ``next_too=False`` builds the same by hand for
    ``observation`` alone."""
    from torchrl.data import ReplayBuffer, SliceSampler
    from torchrl.envs import CatFrames, Compose

    cat = CatFrames(N=K, dim=-3, in_keys=["observation"], done_key="done", reset_key="_reset")
    if next_too:
        transform, sampler = cat.make_rb_transform_and_sampler(BATCH, traj_key="episode", cache_values=True)
    else:
        sampler = SliceSampler(slice_len=K, traj_key="episode", cache_values=True)
        sampler._batch_size_multiplier = K
        transform = Compose(lambda td: td.reshape(-1, K), cat, lambda td: td[:, -1])
    return ReplayBuffer(storage=storage, sampler=sampler, transform=transform, batch_size=BATCH)


def check_catframes(rb: Any, frames: np.ndarray, first_row: np.ndarray, episode: np.ndarray) -> None:
    """A CatFrames batch holds, for its index ``t``, the frames ``t-3..t`` of ``t``'s episode (and
    ``t-2..t+1`` as ``next/observation``): the peer is set up right (untimed)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        td = rb.sample()
    for row in range(4):
        t = int(td["index"][row])
        e = int(episode[t])
        rows = np.maximum(t + e + np.arange(1 - K, 1), first_row[e])  # flat rows, as FrameStack's
        want = torch.from_numpy(frames[rows].reshape(K * 3, 84, 84))
        assert torch.equal(td["observation"][row], want), (row, t)
        if td["next", "observation"].shape[-3] == K * 3:  # stacked too (not with next_too=False)
            nxt = torch.from_numpy(frames[np.maximum(rows + 1, first_row[e])].reshape(K * 3, 84, 84))
            assert torch.equal(td["next", "observation"][row], nxt), (row, t)


# ----------------------------------------------------------------------------- the run


def convert_all(source: Path, work: Path, repeats: int) -> list[Any]:
    """Conversion runs (``_harness.run_configs``); the last run's rlds caches are kept."""
    rl = _harness.rlds_config
    out = work / "out"
    fill = _harness.Config(
        "torchrl-fill",
        f"TorchRL `LazyMemmapStorage` fill (`rb.extend`, {FILL_ROWS:,} rows a call)",
        "torchrl-fill",
        source,
        {
            "module": "pixel_bench",
            "kind": "torchrl-fill",
            "source": str(source),
            "root": str(out / "torchrl"),
        },
        out / "torchrl",
    )
    configs = [
        rl("rlds-memmap", "rlds `convert`, memmap", source, "memmap", work),
        rl("rlds-zarr", "rlds `convert`, zarr", source, "zarr", work),
        rl(
            "rlds-memmap-nofsync",
            "rlds `convert`, memmap, `RLDS_FSYNC=0`",
            source,
            "memmap",
            work,
            fsync=False,
        ),
        fill,
    ]
    _harness.run_configs(configs, repeats, work, _log, keep=True)
    for cfg in configs[2:]:
        shutil.rmtree(cfg.output, ignore_errors=True)
    return configs


def profile_conversion(source: Path, root: Path) -> dict[str, float]:
    """Where one rlds memmap conversion of ``source`` spends its time (cProfile, in this process,
    ``RLDS_FSYNC=0``, untimed by the table): seconds in all, waiting at the end for the source's
    sha256 (computed on its own thread beside the conversion, so cProfile of the main thread does
    not see it; its cost alone is timed apart), in sha256 of the written arrays (content
    digests), in file writes and in HDF5 reads."""
    import cProfile
    import pstats

    from rlds_cli._io import sha256_file
    from rlds_cli.convert import convert

    t = time.perf_counter()
    sha256_file(source)
    alone = time.perf_counter() - t

    shutil.rmtree(root, ignore_errors=True)
    saved = os.environ.get("RLDS_FSYNC")
    os.environ["RLDS_FSYNC"] = "0"
    profile = cProfile.Profile()
    t = time.perf_counter()
    try:
        profile.enable()
        convert(source, "bench", format="d4rl", root=root, backend="memmap")
        profile.disable()
    finally:
        total = time.perf_counter() - t
        if saved is None:
            os.environ.pop("RLDS_FSYNC", None)
        else:
            os.environ["RLDS_FSYNC"] = saved
        shutil.rmtree(root, ignore_errors=True)
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out = {
        "total": total, "source sha256": alone, "hash wait": 0.0, "content digests": 0.0, "writes": 0.0,
        "hdf5 reads": 0.0,
    }  # fmt: skip
    for (filename, _, func), (_, _, tottime, cumtime, callers) in stats.items():
        if func == "checked" and filename.endswith("convert.py"):  # SourceHash.checked: the wait
            out["hash wait"] += cumtime
        elif "_hashlib.HASH" in func and "update" in func:
            for (caller_file, _, _), (_, _, tt, _) in callers.items():
                if caller_file.endswith("digest.py"):
                    out["content digests"] += tt
        elif "'write' of '_io." in func:
            out["writes"] += tottime
        elif filename.endswith("h5py/_hl/dataset.py") and func == "__getitem__":
            out["hdf5 reads"] += cumtime
    return out


def dataloader_cases(ds: Any) -> tuple[list[Any], list[Any]]:
    """In-process loader against ``TedDataLoader`` with 2 workers and the ring."""
    from rlds_cli.loader import Loader

    dataloader_bench.check_same(ds)
    two = dataloader_bench._dataloader(ds, 2, None)
    cases = [
        _harness.Case("inproc", "in-process `Loader`", Loader(ds, BATCH, seed=0).sample),
        _harness.Case("w2", "`TedDataLoader`, 2 workers, shared ring", iter(two).__next__),
    ]
    return cases, [two]


def sampling_cases(mm: Any, zr: Any, rbs: dict[str, Any], zarr_auto: Any) -> list[Any]:
    """The rate cases: rlds, TorchRL and the raw gathers."""
    from rlds_cli.loader import FrameStack, Loader

    raw = loader_bench.Raw(mm)
    raw.load_ram()
    stacks = framestack_bench.Raw(mm)
    slices = {"sampler": "slice", "slice_len": SLICE_LEN}
    return [
        _harness.Case(*c)
        for c in [
            ("raw-mm", "lean raw gather, memmap", raw.uniform_memmap),
            ("rlds-mm", "rlds `Loader`, memmap", Loader(mm, BATCH, seed=0).sample),
            ("trl-uniform", "TorchRL `RandomSampler`, `LazyMemmapStorage`", rbs["uniform"].sample),
            ("raw-slice", "lean raw gather, slices, memmap", raw.slices_memmap),
            ("rlds-slice", "rlds slices, memmap", Loader(mm, BATCH, seed=0, **slices).sample),
            ("trl-slice", "TorchRL `SliceSampler(cache_values=True)`", rbs["slice"].sample),
            ("raw-4x", "raw `np.take` of 4x the frames, memmap", stacks.gather(stacks.memmap, K)),
            (
                "rlds-fs",
                "rlds `FrameStack(4)`, memmap",
                Loader(mm, BATCH, seed=0, transform=FrameStack(K)).sample,
            ),
            (
                "rlds-zarr",
                "rlds `Loader`, zarr, `in_memory=False`",
                Loader(zr, BATCH, seed=0, in_memory=False).sample,
            ),
            ("rlds-zarr-auto", "rlds `Loader`, zarr, default `in_memory='auto'`", zarr_auto.sample),
            ("raw-ram", "lean raw gather, RAM", raw.uniform_ram),
            ("rlds-ram", "rlds `Loader`, `in_memory=True`", Loader(mm, BATCH, seed=0, in_memory=True).sample),
            ("trl-ram", "TorchRL `RandomSampler`, `LazyTensorStorage`", rbs["ram"].sample),
        ]
    ]


def time_slow(fn: Any, calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls: for a peer too slow to visit with the others (seconds a
    call; its first, untimed call was the set-up check)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CatFrames warns on every call that 'time' is not named
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return out


def run(bench: _harness.Run) -> dict[str, Any]:
    """Generate, convert, sample; the figures for :func:`render`."""
    from torchrl.data import LazyTensorStorage, RandomSampler

    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.loader import Loader

    work = bench.work
    out: dict[str, Any] = {"loads": []}
    source = work / f"pixels_{bench.steps}.hdf5"
    t = time.perf_counter()
    cmd = [sys.executable, str(HERE / "data.py"), "pixels", str(source), "--steps", str(bench.steps)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    out["source_bytes"] = source.stat().st_size
    _log(f"wrote {source.name}: {out['source_bytes'] / MB:,.0f} MB ({time.perf_counter() - t:.1f} s)")

    _log(f"conversion, {bench.repeats} runs each, interleaved:")
    out["conversion"] = convert_all(source, work, bench.repeats)
    out["profile"] = profile_conversion(source, work / "profiled")
    _log("profiled rlds memmap conversion: " + ", ".join(f"{k} {v:.2f} s" for k, v in out["profile"].items()))
    mm = open_dataset("bench", work / "out" / "rlds-memmap")
    zr = open_dataset("bench", work / "out" / "rlds-zarr")
    out["dataset"] = {"steps": mm.num_steps, "episodes": mm.num_episodes}
    for ds in (mm, zr):
        _harness.warm_dataset(ds)

    _log("DataLoader, 2 workers against in-process:")
    dl, loaders = dataloader_cases(mm)
    try:
        out["loads"].append(os.getloadavg()[0])
        dataloader_bench.measure(dl, bench.repeats, bench.seconds)
    finally:
        for loader in loaders:
            loader.close()
    out["dataloader"] = dl

    t = time.perf_counter()
    n = mm.num_steps
    rbs = torchrl_buffers(source, n, work / "torchrl-mm")
    storage = rbs["uniform"]._storage
    rbs |= {
        "ram": _buffer(torchrl_fill(source, LazyTensorStorage(n))._storage, RandomSampler()),
        "catframes": catframes_buffer(storage),
        "catframes-obs": catframes_buffer(storage, next_too=False),
    }
    frames = np.load(mm.directory / "arrays" / "observation.npy", mmap_mode="r")
    lengths = np.asarray(mm.episodes["length"], np.int64)
    first_row = np.cumsum(lengths) - lengths + np.arange(len(lengths))
    episode = np.repeat(np.arange(len(lengths)), lengths)
    check_catframes(rbs["catframes"], frames, first_row, episode)
    check_catframes(rbs["catframes-obs"], frames, first_row, episode)
    _log(f"TorchRL buffers filled and checked ({time.perf_counter() - t:.1f} s)")

    zr_fresh = open_dataset("bench", work / "out" / "rlds-zarr")  # nothing read through it yet
    t = time.perf_counter()
    zarr_auto = Loader(zr_fresh, BATCH, seed=0)
    out["zarr_auto_load"] = time.perf_counter() - t
    out["zarr_auto_in_memory"] = bool(zarr_auto.in_memory)
    cases = sampling_cases(mm, zr, rbs, zarr_auto)
    by_key = {c.key: c for c in cases}
    slow: dict[str, list[float]] = {"catframes": [], "catframes-obs": []}
    _log(f"sampling, {bench.repeats} rounds of rates, then paired ratios:")
    for rep in range(bench.repeats):
        out["loads"].append(os.getloadavg()[0])
        framestack_bench.run_round(cases, bench.seconds)
        for key, values in slow.items():  # a call or two per round, in step with the others
            values += time_slow(rbs[key].sample, 1)
        for c in cases:
            _log(f"  [{rep + 1}/{bench.repeats}] {c.label}: {c.rates[-1]:,.1f} batches/s")
        for key, values in slow.items():
            _log(f"  [{rep + 1}/{bench.repeats}] TorchRL {key}: {values[-1]:.3f} s a batch")
    out["pairs"] = _harness.measure_pairs(by_key, PAIRS, bench.repeats, bench.seconds, _log)
    out["loads"].append(os.getloadavg()[0])
    out["sampling"] = cases
    out["slow"] = slow
    return out


def torchrl_buffers(source: Path, n: int, scratch: Path) -> dict[str, Any]:
    """TorchRL's buffers over one ``LazyMemmapStorage`` filled from ``source`` (its files read
    once): ``uniform`` (``RandomSampler``) and ``slice`` (``SliceSampler(cache_values=True)``)."""
    from torchrl.data import LazyMemmapStorage, SliceSampler

    shutil.rmtree(scratch, ignore_errors=True)
    rb = torchrl_fill(source, LazyMemmapStorage(n, scratch_dir=scratch))
    for path in scratch.rglob("*.memmap"):
        _harness.warm(path)
    slices = SliceSampler(num_slices=NUM_SLICES, traj_key="episode", cache_values=True)
    return {"uniform": rb, "slice": _buffer(rb._storage, slices)}


def _buffer(storage: Any, sampler: Any) -> Any:
    """Another ``TensorDictReplayBuffer`` over an already filled storage (no copy of the data)."""
    from torchrl.data import TensorDictReplayBuffer

    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=BATCH)


# ----------------------------------------------------------------------------- report


def render(r: dict[str, Any], info: dict[str, Any]) -> str:
    """The Markdown section."""
    c = {x.key: x for x in r["sampling"]}
    conv = {x.key: x for x in r["conversion"]}
    dl = {x.key: x for x in r["dataloader"]}
    pairs: dict[tuple[str, str], list[float]] = r["pairs"]
    slow = {k: 1 / statistics.median(v) for k, v in r["slow"].items()}
    steps, episodes = r["dataset"]["steps"], r["dataset"]["episodes"]
    gb = (steps + episodes) * 3 * 84 * 84 / 1e9

    def paired(a: str, b: str) -> float:
        return statistics.median(pairs[a, b])

    def paired_text(a: str, b: str) -> str:
        return _harness.span(pairs[a, b], ".2f", "x")

    def rate(key: str) -> float:
        return c[key].median if key in c else slow[key]

    def fmt(key: str) -> str:
        if key in c:
            return c[key].fmt()
        return _harness.span([1 / s for s in r["slow"][key]], ",.2f")

    title = "Pixels: conversion and every sampling path, rlds vs TorchRL vs the lean raw gather"
    lines = [
        *_harness.opening(SECTION, title, info["quick"], zarr_bench.NOISE_NOTE),
        f"Workload: {steps:,} steps of uint8 (3, 84, 84) observations in {episodes} episodes of "
        f"{bench_data.PIXEL_EPISODE_LENGTHS[0]}-{bench_data.PIXEL_EPISODE_LENGTHS[1]:,} steps (a random "
        "background per episode, one changing 12 x 12 patch per frame; `benchmarks/data.py pixels`), "
        f"{gb:.2f} GB of frames; the source is a D4RL-format HDF5 file with `observations` and "
        f"`next_observations` ({r['source_bytes'] / MB:,.0f} MB, uncompressed). The size: several "
        "times any CPU cache, so random frames come from DRAM as in real datasets, while the source, "
        "the three caches and the in-RAM copies fit the page cache and memory of this shared "
        f"{info['ram']} machine, and the whole section runs in a few minutes. Batch 256, every TED key.",
        "",
        *_harness.header(
            info,
            _harness.versions("torch", "torchrl", "tensordict", "numpy", "zarr", "h5py")
            + " (1 torch intra-op thread when sampling)",
        ),
        _harness.load_note(
            r["loads"],
            "at the start of each sampling round and after the paired ratios",
            "other jobs were running on this machine: trust the paired ratios over the rates",
        ),
        "",
        "### Conversion and disk",
        "",
        "| operation | seconds, median (range) | CPU s | peak RSS MB | apparent MB | allocated MB | files "
        "| TorchRL time / this |",
        "|---|---|---|---|---|---|---|---|",
    ]
    trl = conv["torchrl-fill"]
    prof = r["profile"]
    hashed = (prof["hash wait"] + prof["content digests"]) / prof["total"]
    # scaled from the run without fsync, which is what the profile measured
    no_hash = conv["rlds-memmap-nofsync"].median("seconds") * (1 - hashed)
    for cfg in r["conversion"]:
        d = cfg.disk or {"apparent": 0, "allocated": 0, "files": 0}
        lo, hi = cfg.span("seconds")
        lines.append(
            f"| {cfg.label} | {cfg.median('seconds'):.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{cfg.median('cpu_seconds'):.2f} | "
            f"{cfg.median('peak_rss_mb'):,.0f} | {d['apparent'] / MB:,.0f} | {d['allocated'] / MB:,.0f} | "
            f"{d['files']:.0f} | {trl.median('seconds') / cfg.median('seconds'):.1f}x |"
        )
    conv_ratio = trl.median("seconds") / conv["rlds-memmap"].median("seconds")
    lines += [
        "",
        "Every run a fresh process (`_harness.run_configs`, source in the page cache, peak RSS = `VmHWM` "
        "with interpreter and imports). rlds hashes the source (sha256), checks `next_observations[i] == "
        "observations[i+1]` inside episodes, stores the frames once, writes content digests and fsyncs "
        f"(the `RLDS_FSYNC=0` row: without); TorchRL stores `observation` and `next/observation` "
        f"({FILL_ROWS:,} rows a `rb.extend`, which bounds its memory) and does not fsync.",
        "",
        "Where rlds's time goes (one more memmap conversion under cProfile, `RLDS_FSYNC=0`): "
        f"{prof['total']:.2f} s in all; the source's sha256 ({prof['source sha256']:.2f} s on one core, "
        f"timed apart) runs on its own thread, and the conversion waited {prof['hash wait']:.2f} s for it "
        f"before the commit; content digests {prof['content digests']:.2f} s, file writes "
        f"{prof['writes']:.2f} s, HDF5 reads {prof['hdf5 reads']:.2f} s. Without the hash wait and the "
        f"digests it would take about {no_hash:.2f} s, {trl.median('seconds') / no_hash:.1f}x TorchRL's "
        "fill, which hashes nothing: on pixels both sides are bound by memory bandwidth, and hashing "
        "every source byte (about 1.3 GB/s on one core) keeps the low-dim section's 4x out of reach.",
        "",
        "### Sampling",
        "",
        "| workload | rlds | TorchRL 0.14.1 | reference | rlds / TorchRL | rlds / reference (paired) "
        "| target |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(label: str, mine: str, peer: str | None, ref: str | None, target: str) -> None:
        peer_text = fmt(peer) if peer else "-"
        ratio_trl = "-"
        if peer:
            ratio_trl = f"{rate(mine) / rate(peer):.1f}x"
            if (mine, peer) in pairs:
                ratio_trl += f" (paired {paired(mine, peer):.1f}x)"
        lines.append(
            f"| {label} | {fmt(mine)} | {peer_text} | {fmt(ref) + ' (' + c[ref].label + ')' if ref else '-'} "
            f"| {ratio_trl} | {paired_text(mine, ref) if ref and (mine, ref) in pairs else '-'} | {target} |"
        )

    for line in """
        uniform, memmap | rlds-mm | trl-uniform | raw-mm | >= 0.9x raw, >= 5x TorchRL
        slice 8x32, memmap | rlds-slice | trl-slice | raw-slice | >= 0.9x raw, >= 10x TorchRL
        `FrameStack(4)`, memmap (TorchRL: `CatFrames(N=4)`) | rlds-fs | catframes | raw-4x | >= 0.5x raw 4x
        zarr uniform, from the files (reference: rlds on memmap) | rlds-zarr | - | rlds-mm | >= 0.25x memmap
        """.strip().splitlines():
        label, mine, peer, ref, target = (cell.strip() for cell in line.split("|"))
        row(label, mine, None if peer == "-" else peer, ref, target)
    auto = c["rlds-zarr-auto"]
    lines.append(
        f"| zarr uniform, default `in_memory='auto'` "
        f"({'loaded into RAM' if r['zarr_auto_in_memory'] else 'read from the files'}) | {auto.fmt()} | - | "
        f"{c['rlds-mm'].fmt()} (rlds `Loader`, memmap) | - | "
        f"{auto.median / c['rlds-mm'].median:.2f}x (rates) | - |"
    )
    row("uniform, in RAM (TorchRL: `LazyTensorStorage`)", "rlds-ram", "trl-ram", "raw-ram", ">= 0.8x raw")
    w2, inproc = dl["w2"], dl["inproc"]
    dl_ratio = w2.median / inproc.median
    lines.append(
        f"| DataLoader, 2 workers (`TedDataLoader`, shared ring) | {w2.fmt()} | - | {inproc.fmt()} "
        f"(in-process `Loader`) | - | {dl_ratio:.2f}x (visits interleaved) | >= 0.5x in-process |"
    )
    lines += [
        "",
        "Batches/s, median of the rounds (range). TorchRL `CatFrames` with `observation` only (its "
        f"`next/observation` not stacked): {fmt('catframes-obs')} batches/s, so rlds is "
        f"{rate('rlds-fs') / rate('catframes-obs'):.0f}x that too. The zarr loader with the default "
        f"`in_memory='auto'` took {r['zarr_auto_load']:.2f} s to open "
        + (
            "(it loaded the frames into RAM: they fit the memory budget); "
            if r["zarr_auto_in_memory"]
            else "(it reads the files: the frames exceed the memory budget); "
        )
        + f"the zarr conversion took {conv['rlds-zarr'].median('seconds'):.2f} s.",
        "",
        "### Goals (ratios measured in this run)",
        "",
    ]
    goals = [
        (
            f"zarr uniform pixel batches >= {TARGETS['zarr']}x memmap: {paired_text('rlds-zarr', 'rlds-mm')}",
            paired("rlds-zarr", "rlds-mm") >= TARGETS["zarr"],
        ),
        (
            f"`FrameStack(4)` >= {TARGETS['framestack']}x of a raw gather of 4x the frames: "
            f"{paired_text('rlds-fs', 'raw-4x')}",
            paired("rlds-fs", "raw-4x") >= TARGETS["framestack"],
        ),
        (
            f"DataLoader with 2 workers >= {TARGETS['dataloader']}x in-process: {dl_ratio:.2f}x",
            dl_ratio >= TARGETS["dataloader"],
        ),
        (
            f"in-RAM uniform >= {TARGETS['ram']}x the lean raw gather: {paired_text('rlds-ram', 'raw-ram')}",
            paired("rlds-ram", "raw-ram") >= TARGETS["ram"],
        ),
        (
            f"memmap uniform and slice >= {TARGETS['memmap']}x the lean raw gather: "
            f"{paired_text('rlds-mm', 'raw-mm')} and {paired_text('rlds-slice', 'raw-slice')}",
            min(paired("rlds-mm", "raw-mm"), paired("rlds-slice", "raw-slice")) >= TARGETS["memmap"],
        ),
        (
            f"uniform >= {TARGETS['trl-uniform']:.0f}x TorchRL: {rate('rlds-mm') / rate('trl-uniform'):.1f}x "
            f"(in RAM {rate('rlds-ram') / rate('trl-ram'):.1f}x)",
            rate("rlds-mm") / rate("trl-uniform") >= TARGETS["trl-uniform"],
        ),
        (
            f"slice >= {TARGETS['trl-slice']:.0f}x TorchRL: {rate('rlds-slice') / rate('trl-slice'):.1f}x",
            rate("rlds-slice") / rate("trl-slice") >= TARGETS["trl-slice"],
        ),
        (
            f"conversion >= {TARGETS['trl-conversion']:.0f}x TorchRL (the issue's figure, met on the "
            f"low-dim conversion) against `LazyMemmapStorage` fill on pixels: memmap {conv_ratio:.1f}x, "
            f"zarr {trl.median('seconds') / conv['rlds-zarr'].median('seconds'):.1f}x; CPU "
            f"{trl.median('cpu_seconds') / conv['rlds-memmap'].median('cpu_seconds'):.1f}x, peak RSS "
            f"{trl.median('peak_rss_mb') / conv['rlds-memmap'].median('peak_rss_mb'):.1f}x less",
            conv_ratio >= TARGETS["trl-conversion"],
        ),
    ]
    lines += [f"- {text} -> {_harness.verdict(ok)}" for text, ok in goals]
    lines += ["- prioritized >= 4x TorchRL: low-dim only, see the sampling section.", ""]
    notes = [
        "- Rates: the configurations are visited in turn, "
        f"{framestack_bench.SETTLE} untimed then {framestack_bench.TIMED} timed calls a visit, for about "
        f"{info['seconds']:g} s each a round; a round's rate is one over its median call time. TorchRL "
        "`CatFrames` (seconds a batch) gets one timed call a round, after the others' visits.",
        _harness.PAIRED_NOTE.format(seconds=info["seconds"]),
        "- Lean raw gather: the sampling section's (`loader_bench.Raw`); for stacks, the frame-stack "
        "section's (`framestack_bench.Raw`: the `256 x 4` frames of the observation stacks alone, so "
        "about 0.8x is the stacked loader's ceiling).",
        "- TorchRL `CatFrames`: `CatFrames(N=4, dim=-3).make_rb_transform_and_sampler(256, "
        "traj_key='episode', cache_values=True)`: it samples 256 slices of 4 steps inside an episode "
        "(so never the first 3 steps of one, where rlds pads), gathers every key of the 1,024 steps, "
        "concatenates the frames and keeps the last step of each slice; its output was checked "
        "against the frames. Its `next/observation` path builds full-size masks with `cumsum` and "
        "`flip` over the stacked frames, which is where its seconds go.",
        "- DataLoader: the DataLoader section's method, measured before the in-RAM copies are made.",
        "- The frame-stack and DataLoader sections below keep the before/after figures of those two "
        "changes (the old `FrameStack`, torch's own batch transfer); `make bench` re-measures both "
        "paths here and runs those sections only when asked: `.venv-bench/bin/python "
        "benchmarks/run_all.py --only framestack dataloader --write docs/benchmarks.md`.",
        "",
        "Raw figures of this run (batches/s per round; paired ratios per round; conversion seconds per run):",
        "",
        "```text",
    ]
    raw = notes[-3:]
    notes = notes[:-4]
    for x in r["sampling"]:
        raw.append(f"{x.key:<13} " + " ".join(f"{v:,.1f}" for v in x.rates))
    for key, values in r["slow"].items():
        raw.append(f"{'trl-' + key:<13} " + " ".join(f"{1 / v:,.3f}" for v in values))
    for x in r["dataloader"]:
        raw.append(f"{'dl-' + x.key:<13} " + " ".join(f"{v:,.1f}" for v in x.rates))
    for (a, b), values in pairs.items():
        raw.append(f"{a} / {b}: " + " ".join(f"{v:.3f}" for v in values))
    for cfg in r["conversion"]:
        each = [("s", "seconds", ".2f"), ("CPU s", "cpu_seconds", ".2f"), ("peak MB", "peak_rss_mb", ".0f")]
        parts = [f"{name} " + " ".join(f"{x[k]:{f}}" for x in cfg.runs) for name, k, f in each]
        raw.append(
            f"{cfg.key}: " + "; ".join([*parts, "load " + " ".join(f"{x['load1']:.1f}" for x in cfg.runs)])
        )
    command = (
        ".venv-bench/bin/python benchmarks/pixel_bench.py --write docs/benchmarks.md   # part of make bench"
    )
    closing = _harness.closing(SECTION, command, notes)
    return "\n".join(lines[:-1] + closing[:-2] + [*raw, "```", "", *closing[-2:]])


def main(argv: list[str] | None = None) -> int:
    """Run the section and print (and optionally write) its Markdown."""
    p = _harness.parser(
        "pixels: conversion and sampling, rlds vs TorchRL vs raw",
        SECTION,
        work="pixel",
        steps=STEPS,
        seconds=(1.0, 0.3),
    )
    bench = _harness.start(p.parse_args(argv))
    # source (2 copies), memmap, zarr, TorchRL twice (child's run and this process's), slack
    bench.need_disk(7.5 * bench.steps * 3 * 84 * 84)
    try:
        results = run(bench)
        info = bench.info()
        _harness.save_json(bench.work / "results.json", {"info": info, **results})
        section = render(results, info)
    finally:
        bench.remove(*(path for path in bench.work.iterdir() if path.name != "results.json"))
    bench.publish(SECTION, section, _log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
