"""Bigger than the disk (issue 42): epoch-order batches of real frames read from object storage
behind a slow link, by rlds and by Mosaic Streaming, with the local cache bounded to a tenth of
the dataset.

The store: a moto S3 server on 127.0.0.1 behind :class:`rlds_cli.testing.slow_link.Link` (both in
a child process, started and killed here): every request waits a first-byte latency drawn from
``--latency-ms`` (default 20-50 ms, uniform) and the responses share a ``--bandwidth-mbs`` cap
(default 400 MB/s). Uploads go to moto directly (set-up, not measured); every read goes through
the link, which counts requests and bytes.

The data: ``--size`` steps (default 24,000, about 530 MB; quick 12,000) of 224x224 RGB MuJoCo
renders (``camera_frames.py``, 1,200 renders cycled) in episodes of 200, each frame one JPEG file (the
quality rlds's ``--frames jpeg`` writes) with low-dim keys beside it (``state`` 17 float32,
``action`` 6 float32, ``reward``):

* rlds: a zarr dataset built with ``frames="keep"`` (the JPEG files stored as they are), pushed
  with ``rlds push`` and pulled back with ``rlds pull`` (the local copy);
* Mosaic: the same JPEG bytes as a ``bytes`` column of MDS shards (``MDSWriter``, no
  compression, shards of ``--shard-fraction`` of the cache limit: Mosaic asks for a limit of at
  least four shards) uploaded to the same store, read by ``StreamingDataset(remote=s3://...,
  local=DIR, cache_limit=..., shuffle=True, batch_size=...)`` through a torch ``DataLoader`` of
  ``--workers`` workers; each frame decoded with PIL in ``__getitem__``, as Mosaic's ``jpeg``
  encoding does (``Image.open`` of the bytes), to a ``(224, 224, 3)`` uint8 array.

The cases, each in a fresh child process, one epoch (or ``--seconds`` of it) of batches of 256
steps of ``pixels``, ``state``, ``action``, ``next/reward`` (every frame decoded): rlds's
``Loader`` on the pulled copy (the baseline), straight from S3 (ranged reads), through today's
file cache (``open_dataset(url, cache=DIR)``: whole files, no limit), and with the bounded cache
(``cache=DIR, cache_limit=...``, with ``read_ahead`` and the ``blocks`` sampler where the installed
rlds has them; the blocks sampler's ``shuffle_window`` spans as many steps as Mosaic's shuffle
block in blocks of about 8 MiB of stored frames); Mosaic on S3 with the same cache limit
(``shuffle_block_size``: ``--block-fraction`` of
the steps the cache holds), and on a local copy of its shards; ``mosaic-default`` (only when
named): Mosaic with its default shuffle block. ``--repeats`` rounds, the cases in turn. The disk
use of each case's cache folder is sampled every 50 ms while it runs.

Usage (the benchmark environment: ``mosaicml-streaming``, ``moto[server]``, ``gymnasium[mujoco]``,
the ``remote`` extra)::

    python benchmarks/remote_scale_bench.py [--size 12000] [--latency-ms 20,50] [--bandwidth-mbs 100]
        [--cases local,ranged,filecache,bounded,mosaic,mosaic-local,mosaic-default] [--cache-fraction 0.1]
        [--read-ahead 4] [--workers 2] [--learner-cpus 2] [--repeats 2] [--seconds 30]
        [--write docs/benchmarks.md] [--quick]

``--learner-cpus N`` pins every case to N CPUs and the store to the rest: on a machine of more
cores, a learner of N cores reading a store that does not share them.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness
import camera_frames
import numpy as np
from _report import closing, header, opening, span, table, verdict, versions

SECTION = "remote"
_log = _harness.logger(SECTION)
HERE = Path(__file__).resolve().parent
BATCH = 256
EPISODE = 200
KEYS = ["pixels", "state", "action", "next/reward"]
BUCKET = "bench"
RLDS_URL = f"s3://{BUCKET}/rlds/frames"
MDS_URL = f"s3://{BUCKET}/mds/frames"
#: Goals of issue 42: bounded cache over the pulled copy; rlds over Mosaic.
LOCAL_GOAL, MOSAIC_GOAL = 0.8, 1.0
#: Blocks of the rlds blocks sampler's shuffle window.
HEAD = ["case", "batches", "batches/s", "frames/s", "first batch s", "requests", "MB fetched", "max cache MB"]
CASES = ("local", "ranged", "filecache", "bounded", "mosaic", "mosaic-local")
#: Run only when named: Mosaic with its default shuffle block (its cache thrashes: Mosaic #339).
EXTRA_CASES = ("mosaic-default",)


# ----------------------------------------------------------------------------- what rlds offers


def rlds_features() -> dict[str, bool]:
    """Which issue-42 features the installed rlds has: the bounded cache (``cache_limit`` of
    ``Loader`` and ``open_dataset``), read-ahead (``read_ahead``), the ``blocks`` sampler."""
    from rlds_cli import Loader, open_dataset
    from rlds_cli.loader import factory

    loader = inspect.signature(Loader.__init__).parameters
    return {
        "cache_limit": "cache_limit" in loader
        and "cache_limit" in inspect.signature(open_dataset).parameters,
        "read_ahead": "read_ahead" in loader,
        "blocks": "blocks" in getattr(factory, "SAMPLERS", ()),
    }


# ----------------------------------------------------------------------------- the data


def jpeg_frames(count: int) -> tuple[list[bytes], Any]:
    """``count`` MuJoCo renders as JPEG files (rlds's default quality) and their format."""
    from rlds_cli.frames.codecs import DEFAULT_JPEG_QUALITY, encode_many, frame_format

    frames = np.load(camera_frames.cached(count), mmap_mode="r")
    fmt = frame_format(frames.shape[1:], frames.dtype, "jpeg")
    return list(encode_many(frames, fmt, DEFAULT_JPEG_QUALITY)), fmt


def episodes(size: int, jpegs: list[bytes], fmt: Any) -> Any:
    """The steps as builder blocks, one an episode of :data:`EPISODE` steps: the renders cycled
    (observations ``EPISODE + 1`` a block: the final one too), random low-dim keys (seed 0)."""
    from rlds_cli.cache.ted import StepBlock
    from rlds_cli.frames.codecs import EncodedFrames

    rng = np.random.default_rng(0)
    frame = 0
    for lo in range(0, size, EPISODE):
        n = min(EPISODE, size - lo)
        rows = [(frame + i) % len(jpegs) for i in range(n + 1)]
        frame += n + 1
        done = np.zeros(n, bool)
        done[-1] = True
        yield StepBlock(
            steps={
                "action": rng.standard_normal((n, 6), dtype=np.float32),
                "next/reward": rng.standard_normal(n, dtype=np.float32),
                "next/terminated": np.zeros(n, bool),
                "next/truncated": done,
            },
            observations={
                "pixels": EncodedFrames([jpegs[r] for r in rows], fmt),
                "state": rng.standard_normal((n + 1, 17), dtype=np.float32),
            },
            ends=np.array([n - 1]),
        )


def build_rlds(size: int, jpegs: list[bytes], fmt: Any) -> None:
    from rlds_cli.cache.builder import DatasetBuilder

    with DatasetBuilder("frames", backend="zarr", frames="keep", replace=True) as builder:
        for block in episodes(size, jpegs, fmt):
            builder.append(block)
        builder.commit()


def build_mds(size: int, jpegs: list[bytes], fmt: Any, out: Path, shard_bytes: int) -> None:
    """The same steps as MDS shards: each step's frame (its JPEG bytes), state, action, reward."""
    MDSWriter = mosaic().MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    columns = {
        "jpeg": "bytes",
        "state": "ndarray:float32:17",
        "action": "ndarray:float32:6",
        "reward": "float32",
    }
    with MDSWriter(out=str(out), columns=columns, size_limit=shard_bytes) as writer:
        for block in episodes(size, jpegs, fmt):
            pixels, state = block.observations["pixels"], block.observations["state"]
            for t in range(len(block.steps["action"])):
                writer.write(
                    {
                        "jpeg": pixels.data[t],
                        "state": state[t],
                        "action": block.steps["action"][t],
                        "reward": float(block.steps["next/reward"][t]),
                    }
                )


def mosaic() -> Any:
    """Mosaic Streaming's ``streaming.base`` (``MDSWriter``, ``StreamingDataset``).

    ``import streaming`` also imports its torchvision datasets, and torchvision from PyPI is a CUDA
    build that does not load against a CPU-only torch ("operator torchvision::nms does not
    exist"): there, the package is entered without running its ``__init__``, whose other imports
    (vision, text, multimodal datasets) neither the writer nor the dataset needs.
    """
    try:
        import streaming
    except (RuntimeError, OSError, ImportError):
        import importlib.util
        import types

        found = importlib.util.find_spec("streaming")
        if found is None or found.submodule_search_locations is None:
            raise SystemExit("Mosaic Streaming is not installed: pip install mosaicml-streaming") from None
        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        package = types.ModuleType("streaming")
        package.__path__ = list(found.submodule_search_locations)
        sys.modules["streaming"] = package
        import streaming.base

        return streaming.base
    return streaming.base


# ----------------------------------------------------------------------------- the store


class Store:
    """moto behind the slow link, in a child process (killed in :meth:`close`)."""

    def __init__(self, latency_ms: str, bandwidth_mbs: float, cpus: set[int] | None = None) -> None:
        cmd = [sys.executable, "-m", "rlds_cli.testing.slow_link", "--moto", "--latency-ms", latency_ms]
        cmd += ["--bandwidth-mbs", str(bandwidth_mbs)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=pinned(cpus)
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.close()
            raise SystemExit(f"the store did not start: {' '.join(cmd)}")
        urls = json.loads(line)
        self.direct, self.link = urls["store"], urls["link"]

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.link + "/__link__/stats", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def split_cpus(learner: int) -> tuple[set[int] | None, set[int] | None]:
    """The CPUs of the learner (each case) and of the store: the first ``learner`` usable CPUs and
    the rest, or no pinning (``learner`` 0). Pinned, the store has cores of its own, as a store on
    other machines has, and every case (the pulled copy too) decodes on the same ``learner``."""
    if not learner:
        return None, None
    usable = sorted(os.sched_getaffinity(0))
    if learner >= len(usable):
        raise SystemExit(f"--learner-cpus {learner}: {len(usable)} usable CPUs here; leave some to the store")
    return set(usable[:learner]), set(usable[learner:])


def pinned(cpus: set[int] | None) -> Any:
    """A ``preexec_fn`` that pins the child to ``cpus`` (None: no pinning)."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def env_for(endpoint: str) -> dict[str, str]:
    """The S3 settings of a process reading ``endpoint``: rlds's (botocore's ``AWS_ENDPOINT_URL``)
    and Mosaic's (``S3_ENDPOINT_URL``, read by its S3 downloader)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": endpoint,
        "S3_ENDPOINT_URL": endpoint,
    }


def cli(*args: str) -> None:
    """``rlds ARGS`` as a user runs it (this checkout's code)."""
    subprocess.run([sys.executable, "-m", "rlds_cli.cli.app", *args], check=True, cwd=HERE.parent)


def upload(folder: Path, url: str) -> None:
    import boto3

    s3 = boto3.client("s3")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    for path in sorted(folder.iterdir()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")


# ----------------------------------------------------------------------------- one case (child process)


def mosaic_dataset(spec: dict[str, Any]) -> Any:
    from PIL import Image

    StreamingDataset = mosaic().StreamingDataset

    class Frames(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> dict[str, Any]:
            row = super().__getitem__(index)
            image = Image.open(io.BytesIO(row["jpeg"]))  # what Mosaic's 'jpeg' encoding decodes to
            return {
                "pixels": np.array(image.convert("RGB")),
                "state": np.array(row["state"]),
                "action": np.array(row["action"]),
                "next/reward": np.float32(row["reward"]),
            }

    shuffle = {"shuffle": True, "shuffle_seed": 0, "batch_size": BATCH}
    if spec["case"] != "mosaic-default":
        shuffle["shuffle_block_size"] = spec["shuffle_block"]
    if spec["case"] == "mosaic-local":
        return Frames(local=spec["mds"], **shuffle)
    return Frames(remote=MDS_URL, local=spec["cache"], cache_limit=spec["cache_limit"], **shuffle)


def rlds_loader(spec: dict[str, Any]) -> Any:
    from rlds_cli import Loader, open_dataset

    feats, case = spec["features"], spec["case"]
    options: dict[str, Any] = {"sampler": spec["sampler"], "seed": 0, "in_memory": False, "keys": KEYS}
    if spec["sampler"] == "blocks":
        options.update(blocks_options(spec))
    if case == "local":
        return Loader("frames-local", BATCH, **options)
    if case == "ranged":
        return Loader(open_dataset(RLDS_URL), BATCH, **options)
    if case == "filecache":
        return Loader(open_dataset(RLDS_URL, cache=spec["cache"]), BATCH, **options)
    extra: dict[str, Any] = {"cache": spec["cache"], "cache_limit": spec["cache_limit"]}
    if feats["read_ahead"]:
        extra["read_ahead"] = spec["read_ahead"]
    return Loader(RLDS_URL, BATCH, **options, **extra)


def blocks_options(spec: dict[str, Any]) -> dict[str, int]:
    """The blocks sampler's window: its blocks are its default ones (about 8 MiB of stored
    frames each, four blocks of the remote cache), and the window holds as many of them as cover
    Mosaic's shuffle block (``--block-fraction`` of the steps the cache holds: the same
    randomness budget on both sides), at least one."""
    from rlds_cli.loader.block_shuffle import DEFAULT_BLOCK_BYTES

    rows = max(64, DEFAULT_BLOCK_BYTES // max(1, int(spec["frame_bytes"])))
    return {"shuffle_window": max(1, round(spec["shuffle_block"] / rows))}


def store_rate(spec: dict[str, Any]) -> dict[str, Any]:
    """What the store serves alone: the first ``spec["bytes"]`` of rlds's frames file in ranged
    GETs of 2 MiB, 16 at a time (s3fs ``cat_ranges``), nothing decoded or kept."""
    import s3fs

    fs = s3fs.S3FileSystem()
    path = RLDS_URL.removeprefix("s3://") + "/arrays/pixels@frames"
    size, step, width = min(fs.size(path), spec["bytes"]), 2 << 20, 16
    t0 = time.perf_counter()
    got = 0
    for first in range(0, size, step * width):
        starts = list(range(first, min(size, first + step * width), step))
        ends = [min(size, a + step) for a in starts]
        got += sum(map(len, fs.cat_ranges([path] * len(starts), starts, ends)))
    return {"bytes": got, "seconds": time.perf_counter() - t0}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One case: batches until the epoch ends or ``seconds`` pass; the times and frames seen."""
    if spec["case"] == "store-rate":
        return store_rate(spec)
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if spec["case"].startswith("mosaic"):
        mosaic()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        loader: Any = torch.utils.data.DataLoader(
            mosaic_dataset(spec), batch_size=BATCH, num_workers=spec["workers"], drop_last=True
        )
    else:
        loader = rlds_loader(spec)
    batches = frames = 0
    first = end = t0
    cpu_first = os.times()
    for batch in loader:
        pixels = batch["pixels"]
        if tuple(pixels.shape[1:]) != (224, 224, 3):
            raise SystemExit(f"{spec['case']}: frames of shape {tuple(pixels.shape)}")
        batches += 1
        frames += len(pixels)
        end = time.perf_counter()
        if batches == 1:
            first = end
            cpu_first = os.times()
        if end - first > spec["seconds"]:
            break
    # the CPU seconds of this process's threads after the first batch, in the log (Mosaic's
    # DataLoader workers are processes of their own: not counted)
    cpu = os.times()
    return {"setup": first - t0, "batches": batches, "frames": frames, "seconds": end - first,
            "user_s": cpu.user - cpu_first.user, "system_s": cpu.system - cpu_first.system}  # fmt: skip


def run_case(spec: dict[str, Any], store: Store, env: dict[str, str]) -> dict[str, Any]:
    """``spec``'s case in a child process, its cache folder's disk use sampled meanwhile."""
    cache = Path(spec["cache"])
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    before = store.stats()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
        preexec_fn=pinned(set(spec["cpus"]) if spec.get("cpus") else None),
    )  # fmt: skip
    peak = [0]
    listing: list[str] = []

    def sample() -> None:
        while proc.poll() is None:
            used = disk_use(cache)
            if used > peak[0]:  # what was there at the peak, for the log: shards, temporary files
                peak[0] = used
                listing[:] = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    after = store.stats()
    if proc.returncode != 0:  # reported in its row (a peer's failure is a finding), the rest runs on
        sys.stderr.write(err[-4000:])
        last = [line for line in err.strip().splitlines() if line.strip()][-1:] or [f"exit {proc.returncode}"]
        result: dict[str, Any] = {"error": last[0].strip()}
    else:
        result = json.loads(out.strip().splitlines()[-1])
    result.update(
        peak_disk=peak[0],
        peak_files=len(listing),
        peak_sample=listing[:3] + listing[-3:],
        after_disk=disk_use(cache),
        requests=after["requests"] - before["requests"],
        fetched=after["bytes_out"] - before["bytes_out"],
    )
    return result


def disk_use(folder: Path) -> int:
    """Bytes of the files under ``folder`` (apparent sizes; files vanishing meanwhile skipped)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


# ----------------------------------------------------------------------------- the report


def labels(features: dict[str, bool], sampler: str, read_ahead: int, shuffle_block: int) -> dict[str, str]:
    ahead = f", `read_ahead={read_ahead}`" if features["read_ahead"] else ""
    bounded = f"rlds, S3, bounded cache (`cache_limit`{ahead})"
    return {
        "local": f'rlds, pulled local copy (`sampler="{sampler}"`)',
        "ranged": "rlds, S3, ranged reads (no cache)",
        "filecache": "rlds, S3, file cache (`cache=`, whole files, no limit)",
        "bounded": bounded,
        "mosaic": f"Mosaic, S3, `cache_limit`, `shuffle_block_size={shuffle_block:,}`",
        "mosaic-default": "Mosaic, S3, `cache_limit`, its default `shuffle_block_size`",
        "mosaic-local": f"Mosaic, local copy of its shards, `shuffle_block_size={shuffle_block:,}`",
    }


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's rounds as one row: the median rate (and all of them), the medians of the
    rest, the largest disk use; a failure in any round is the row's (the first one's error)."""
    failed = [r for r in rounds if "error" in r]
    if failed:
        return {**failed[0], "error": f"{failed[0]['error']} ({len(failed)} of {len(rounds)} rounds)"}
    rates = [(r["batches"] - 1) / r["seconds"] if r["seconds"] > 0 else 0.0 for r in rounds]
    out = {k: statistics.median(r[k] for r in rounds) for k in ("batches", "setup", "requests", "fetched")}
    return {
        **out,
        "rate": statistics.median(rates),
        "rates": rates,
        "peak_disk": max(r["peak_disk"] for r in rounds),
    }


def report(run: Any, results: dict[str, dict[str, Any]], facts: dict[str, Any]) -> str:
    limit, total = facts["cache_limit"], facts["dataset_bytes"]
    names = labels(facts["features"], facts["sampler"], facts["read_ahead"], facts["shuffle_block"])
    rows = []
    for case, r in results.items():
        bounded = case in ("bounded", "mosaic", "mosaic-default")
        disk = f"{r['peak_disk'] / 1e6:,.1f}" + (f" ({r['peak_disk'] / limit:.2f}x limit)" if bounded else "")
        if "error" in r:
            failed = f"failed: `{r['error'][:160]}`"
            rows.append(
                [names[case], failed, "-", "-", "-", f"{r['requests']:,}", f"{r['fetched'] / 1e6:,.1f}", disk]
            )
            continue
        rate = r["rate"]
        rows.append(
            [
                names[case],
                f"{r['batches']:,.0f}",
                span(r["rates"], ",.2f") if len(r["rates"]) > 1 else f"{rate:,.2f}",
                f"{rate * BATCH:,.0f}",
                f"{r['setup']:.1f}",
                f"{r['requests']:,.0f}",
                f"{r['fetched'] / 1e6:,.1f}",
                disk if case not in ("local", "mosaic-local", "ranged") else "-",
            ]
        )
    feats = facts["features"]
    have = ", ".join(k for k, v in feats.items() if v) or "none of them"
    lines = opening(
        SECTION,
        "Bigger than the disk: epoch batches from object storage, rlds and Mosaic Streaming",
        run.quick,
        f"Which rlds this measures: of issue 42's features (the bounded cache `cache_limit`, "
        f'`read_ahead`, `sampler="blocks"`) it has {have}. Without the bounded cache, rlds reads from '
        "the store by ranged requests or through the whole-file cache (`cache=`, no limit); without "
        'the blocks sampler every rlds case uses `sampler="epoch"` (a full shuffle).',
    )
    lines += [
        f"{facts['size']:,} steps of 224x224 RGB MuJoCo renders (one JPEG each, {facts['frame_kb']:.1f} KB "
        f"on average) with low-dim keys: {total / 1e6:,.1f} MB as rlds stores them; moto S3 on 127.0.0.1 "
        f"behind a link adding {facts['latency_ms']} ms a request and capping responses at "
        f"{facts['bandwidth_mbs']:g} MB/s. Cache limit {limit / 1e6:,.1f} MB "
        f"({facts['cache_fraction']:.0%} of the dataset); Mosaic's shards "
        f"{facts['shard_bytes'] / 1e6:.1f} MB. "
        f"Batches of {BATCH} (`{'`, `'.join(KEYS)}`, every frame decoded), one epoch or its first "
        f"{run.seconds:g} s after the first batch; rlds sampler `{facts['sampler']}`, Mosaic "
        f"`shuffle=True` through a DataLoader of {facts['workers']} workers."
        + (
            f" Each case runs pinned to {facts['learner_cpus']} CPU(s) and the store to the machine's "
            "others (a learner of that many cores reading a store that has cores of its own)."
            if facts.get("learner_cpus")
            else ""
        ),
        "",
        *store_line(results, facts),
        *header(run.info(), versions("numpy", "torch", "mosaicml-streaming", "moto", "s3fs")),
        "",
        *table(HEAD, rows),
        "",
    ]
    lines += goals(results, limit)
    notes = [
        f"- batches/s: after the first batch (its wait is the 'first batch s' column: index, first "
        f"fetches); the median of {run.repeats} round(s), each case once a round in turn (range in "
        "brackets); the other columns: medians; requests and MB fetched: what went through the link "
        "during the case.",
        "- Disk: the cache folder's bytes (files in flight included: Mosaic's downloads land as "
        "`shard.N.mds.<random>` before their rename), sampled every 50 ms by another process.",
        "- Decoding: rlds decodes each batch's frames with simplejpeg on every core "
        "(`rlds_cli.frames.codecs`) in the training process; Mosaic's frames are decoded by PIL in "
        "its DataLoader workers, as its `jpeg` encoding does (`Image.open` of the bytes).",
        "- moto reads a whole object for any ranged GET (under the object's lock); the store here "
        "reads just the range, as S3 does (`rlds_cli.testing.slow_link`), else rlds's ranged reads "
        "of its 265 MB frames file would pay ~0.3 s a request that no store charges.",
    ]
    size = getattr(run.args, "size", None)
    cmd = "python benchmarks/remote_scale_bench.py" + (" --quick" if run.quick else "")
    cmd += f" --size {size}" if size else ""
    cmd += f" --latency-ms {facts['latency_ms'].replace('-', ',')} --bandwidth-mbs {facts['bandwidth_mbs']:g}"
    cmd += f" --learner-cpus {facts['learner_cpus']}" if facts.get("learner_cpus") else ""
    lines += closing(SECTION, cmd, notes)
    return "\n".join(lines)


def store_line(results: dict[str, dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    """What the store serves alone, and the rate of the pulled copy it would bound: the store
    (one Python server on this machine's cores) is part of what any reader from it shares."""
    store = facts.get("store_mbs")
    if not store:
        return []
    line = (
        f"The store alone serves {store:,.0f} MB/s here (2 MiB ranged GETs of rlds's frames file, 16 at "
        "a time, nothing decoded)"
    )
    local = results.get("local", {}).get("rate")
    if local:
        need = local * BATCH * facts["dataset_bytes"] / facts["size"] / 1e6
        line += (
            f"; the pulled copy consumes {need:,.0f} MB/s of stored bytes, so a reader fetching each "
            f"byte once is bounded by {min(1.0, store / need):.2f}x of it before decoding shares the cores"
        )
    return [line + ".", ""]


def goals(results: dict[str, dict[str, Any]], limit: int) -> list[str]:
    out = ["### Goals (issue 42)", ""]
    local = results.get("local", {}).get("rate")
    best = "bounded" if "bounded" in results else "ranged"
    mine = results.get(best, {}).get("rate")
    mosaic = results.get("mosaic", {}).get("rate")
    if mine and local:
        out.append(
            f"- rlds from S3 ({best}) over the pulled copy: {mine / local:.2f}x (goal >= {LOCAL_GOAL}x): "
            f"{verdict(mine / local >= LOCAL_GOAL)}"
        )
    if mine and mosaic:
        out.append(
            f"- rlds from S3 ({best}) over Mosaic from S3: {mine / mosaic:.2f}x (goal > 1x): "
            f"{verdict(mine / mosaic > MOSAIC_GOAL)}"
        )
    for case in ("bounded", "mosaic", "mosaic-default"):
        if case in results and "error" not in results[case]:
            peak = results[case]["peak_disk"]
            out.append(
                f"- {case}: max disk use {peak / 1e6:,.1f} MB of a {limit / 1e6:,.1f} MB limit: "
                f"{verdict(peak <= limit)}"
            )
    return [*out, ""]


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        print(json.dumps(child(json.loads(args[1]))), flush=True)
        return 0
    p = _harness.parser(
        "rlds and Mosaic Streaming from a slow S3 with a bounded cache", SECTION, work="remote-scale",
        repeats=(2, 1), seconds=(30.0, 10.0),
    )  # fmt: skip
    # the bounded cache keeps 2 MiB blocks (8 MiB for older pushes): a tenth of the dataset holds several
    p.add_argument("--size", type=int, help="steps (default 24,000: 530 MB; quick 12,000)")
    p.add_argument("--latency-ms", default="20,50", help="first-byte latency a request: N or LOW,HIGH")
    p.add_argument("--bandwidth-mbs", type=float, default=400.0, help="MB/s of the link (0: no cap)")
    p.add_argument("--cache-fraction", type=float, default=0.1, help="cache limit, of the dataset's bytes")
    p.add_argument("--shard-fraction", type=float, default=0.125, help="Mosaic shard size, of the limit")
    p.add_argument("--workers", type=int, default=2, help="Mosaic's DataLoader workers")
    p.add_argument("--read-ahead", type=int, default=4, help="rlds read_ahead (where it has it)")
    p.add_argument(
        "--block-fraction",
        type=float,
        default=0.25,
        help="Mosaic's shuffle block, of the steps the cache holds",
    )
    p.add_argument(
        "--learner-cpus",
        type=int,
        default=0,
        help="pin each case to this many CPUs and the store to the others (0: no pinning)",
    )
    p.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES + EXTRA_CASES)}"
    )
    run = _harness.start(p.parse_args(args))
    size = run.args.size or (12_000 if run.quick else 24_000)
    cases = [c for c in run.args.cases.split(",") if c]
    if unknown := sorted(set(cases) - set(CASES + EXTRA_CASES)):
        p.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    work = run.work
    os.environ.update(RLDS_HOME=str(work / "home"), RLDS_FSYNC="0", RLDS_MEMORY_BUDGET="0")
    features = rlds_features()
    if "bounded" in cases and not features["cache_limit"]:
        _log("this rlds has no cache_limit: the bounded-cache case is left out")
        cases.remove("bounded")
    sampler = "blocks" if features["blocks"] else "epoch"
    run.need_disk(size * 100e3)  # the dataset 4 times over (store, pulled copy, MDS, a cache): ~22 KB a step
    learner_cpus, store_cpus = split_cpus(run.args.learner_cpus)
    store = Store(run.args.latency_ms, run.args.bandwidth_mbs, store_cpus)
    try:
        direct = env_for(store.direct)
        os.environ.update(direct)  # set-up talks to moto directly
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        jpegs, fmt = jpeg_frames(300 if run.quick else 1200)
        _log(f"building {size:,} steps")
        build_rlds(size, jpegs, fmt)
        cli("push", "frames", RLDS_URL, "--force", "-q")
        cli("pull", RLDS_URL, "--name", "frames-local", "--force", "-q")
        local_dir = work / "home" / "datasets" / "frames-local"
        total = disk_use(local_dir)
        limit = int(total * run.args.cache_fraction)
        shard_bytes = max(1 << 16, int(limit * run.args.shard_fraction))
        # Mosaic's shuffle draws from blocks of this many samples, each block's shards resident at
        # once: sized to the cache, as its docs advise, or each sample evicts a shard (Mosaic #339)
        shuffle_block = max(1, int(run.args.block_fraction * size * limit / total))
        if any(case.startswith("mosaic") for case in cases):
            build_mds(size, jpegs, fmt, work / "mds", shard_bytes)
            upload(work / "mds", MDS_URL)
        facts = {
            "size": size, "dataset_bytes": total, "cache_limit": limit, "shard_bytes": shard_bytes,
            "frame_kb": sum(map(len, jpegs)) / len(jpegs) / 1e3, "features": features, "sampler": sampler,
            "latency_ms": run.args.latency_ms.replace(",", "-"), "bandwidth_mbs": run.args.bandwidth_mbs,
            "cache_fraction": run.args.cache_fraction, "workers": run.args.workers,
            "read_ahead": run.args.read_ahead, "shuffle_block": shuffle_block,
            "learner_cpus": run.args.learner_cpus,
        }  # fmt: skip
        rate = json.loads(
            subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child",
                 json.dumps({"case": "store-rate", "bytes": min(total, 200_000_000)})],
                check=True, capture_output=True, text=True, env={**os.environ, **env_for(store.link)},
                preexec_fn=pinned(learner_cpus),
            ).stdout.strip().splitlines()[-1]
        )  # fmt: skip
        facts["store_mbs"] = rate["bytes"] / rate["seconds"] / 1e6
        _log(f"the store alone: {facts['store_mbs']:.0f} MB/s")
        rounds: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
        for rep in range(run.repeats):  # the cases in turn, so a burst of load hits each alike
            for case in cases:
                spec = {
                    "case": case, "cache": str(work / "cache" / case), "cache_limit": limit,
                    "sampler": sampler, "features": features, "seconds": run.seconds,
                    "workers": run.args.workers, "read_ahead": run.args.read_ahead,
                    "mds": str(work / "mds"), "shuffle_block": shuffle_block,
                    "frame_bytes": facts["frame_kb"] * 1e3, "cpus": sorted(learner_cpus or ()),
                }  # fmt: skip
                _log(f"[{rep + 1}/{run.repeats}] case {case}")
                rounds[case].append(run_case(spec, store, env_for(store.link)))
                _log(f"  {rounds[case][-1]}")
        results = {case: combine(rs) for case, rs in rounds.items()}
        run.publish(SECTION, report(run, results, facts), _log)
    finally:
        store.close()
        run.remove(work / "home", work / "cache", work / "mds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
