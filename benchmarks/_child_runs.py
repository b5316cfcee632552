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

import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _page_cache import disk_usage, evict, page_cache_fraction, warm

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: The Minari dataset id of the conversion section's TorchRL side.
DATASET_ID = "bench/synthetic-v0"
#: TorchRL's replay-buffer batch size (only its cache build or fill is timed).
BATCH_SIZE = 256
#: Rows per ``rb.extend`` call in TorchRL's fill from a D4RL file (42 MB of frames per key a call
#: on pixels, which keeps its memory bounded; one ``extend`` of the whole file needs it all in RAM).
FILL_ROWS = 2_000
#: What rlds's D4RL conversion imports, itself or lazily: imported before its timer in a warm run,
#: as the peers' h5py, torch, tensordict and torchrl are before theirs.
RLDS_WARM = (
    "h5py",
    "rlds_cli.sources.convert",
    "rlds_cli.formats.d4rl",
    "rlds_cli.formats.select",
    "rlds_cli.cache.views",
    "concurrent.futures.thread",
    "queue",
)
#: What the TorchRL workers import before their timers in a warm run (tensordict imports orjson,
#: when installed, the first time it writes a memmap's metadata).
TORCHRL_WARM = ("h5py", "numpy", "torch", "tensordict", "torchrl.data", "orjson")


# ----------------------------------------------------------------------------- TorchRL's TED data


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


def d4rl_chunks(source: Path, rows: int = FILL_ROWS) -> Iterator[Any]:
    """The D4RL file ``source`` as TED ``TensorDict`` s of ``rows`` rows (``episode`` and
    ``next/done`` computed from the flags)."""
    import h5py
    import numpy as np

    episode = 0
    with h5py.File(source, "r") as f:
        n = int(f["observations"].shape[0])
        for start in range(0, n, rows):
            cut = slice(start, min(start + rows, n))
            term, trunc = f["terminals"][cut].reshape(-1, 1), f["timeouts"][cut].reshape(-1, 1)
            ends = (term | trunc).reshape(-1).astype(np.int64)
            ep = episode + np.cumsum(ends) - ends
            episode = int(ep[-1]) + int(ends[-1])
            yield ted(
                {
                    "observation": f["observations"][cut],
                    "action": f["actions"][cut],
                    "episode": ep,
                    "next/observation": f["next_observations"][cut],
                    "next/reward": f["rewards"][cut].reshape(-1, 1),
                    "next/done": term | trunc,
                    "next/terminated": term,
                    "next/truncated": trunc,
                }
            )


def torchrl_fill(source: Path, storage: Any) -> Any:
    """A ``TensorDictReplayBuffer`` over ``storage`` holding the D4RL file ``source`` as TED,
    filled :data:`FILL_ROWS` rows per ``rb.extend``."""
    from torchrl.data import TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=storage, batch_size=BATCH_SIZE)
    for td in d4rl_chunks(source):
        rb.extend(td)
    return rb


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


def warm_imports(names: tuple[str, ...]) -> float:
    """Import ``names`` (orjson only when installed); the seconds it took (in a fresh child: the
    cold import cost)."""
    t0 = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            if name != "orjson":
                raise
    return time.perf_counter() - t0


def timed(call: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """Run ``call`` once in a benchmark child, measured as every conversion row reports it: wall
    and CPU seconds (``process_time``: all threads), the peak RSS (``VmHWM``) just before and
    right after, and the modules it imported (none when the side is measured warm). Returns what
    ``call`` returned and those measures."""
    modules = set(sys.modules)
    rss_before = hwm_mb()
    cpu0 = time.process_time()
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    imported = sorted(set(sys.modules) - modules)
    return result, {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "rss_before_mb": rss_before,
        "peak_rss_mb": hwm_mb(),
        "imports_in_timer": len(imported),
        "imported": imported[:20],
    }


def worker_rlds(spec: dict[str, Any]) -> dict[str, Any]:
    """Convert ``spec["source"]`` with rlds (``format``: d4rl unless said, ``backend``: memmap
    unless said). ``fsync: False`` sets ``RLDS_FSYNC=0`` (the default, fsync on, is what the other
    rows measure); ``warm``: :data:`RLDS_WARM` imported before the timer; ``code``: the rlds_cli
    package under that folder (another commit's, for a before/after pair); ``check_minari``: the
    cache compared with its Minari source afterwards, untimed."""
    if spec.get("fsync") is False:
        os.environ["RLDS_FSYNC"] = "0"
    if "code" in spec:
        sys.path.insert(0, spec["code"])
    t0 = time.perf_counter()
    if spec.get("warm"):
        warm_imports(RLDS_WARM)
    import rlds_cli
    from rlds_cli.sources.convert import convert

    import_seconds = time.perf_counter() - t0
    if "code" in spec:
        assert str(rlds_cli.__file__).startswith(spec["code"]), rlds_cli.__file__
    fmt, backend = spec.get("format", "d4rl"), spec.get("backend", "memmap")
    result, measured = timed(
        lambda: convert(spec["source"], "bench", format=fmt, root=spec["root"], backend=backend)
    )
    out = {**measured, "import_seconds": import_seconds, "steps": result.manifest.num_steps}
    if spec.get("check_minari"):
        out["content_ok"] = same_as_minari(Path(spec["source"]) / "data" / "main_data.hdf5", result.path)
    return out


def same_as_minari(h5: Path, dataset_dir: Path) -> bool:
    """Whether every episode of the rlds dataset at ``dataset_dir`` holds the Minari file's
    observations, next observations, actions and rewards."""
    import h5py
    import numpy as np

    from rlds_cli.cache import Dataset

    ds = Dataset(dataset_dir)
    with h5py.File(h5, "r") as f:
        for i in range(ds.num_episodes):
            group, ep = f[f"episode_{i}"], ds.episode(i)
            obs = group["observations"][()]
            same = (
                np.array_equal(ep["observation"], obs[:-1])
                and np.array_equal(ep["next/observation"], obs[1:])
                and np.array_equal(ep["action"], group["actions"][()])
                and np.array_equal(ep["next/reward"][:, 0], group["rewards"][()])
            )
            if not same:
                return False
    return True


def _patch_memmap_like() -> None:
    """Make tensordict's ``memmap_like`` (content-less) write the content, like ``memmap``.

    TorchRL 0.14.1 builds the TED data in RAM and then calls ``td.memmap_like(path)``, which
    creates zero-filled files of the right shapes and drops the data; this patch shows what a
    cache that holds the data costs (time and disk).
    """
    from tensordict import TensorDict, TensorDictBase

    def memmap_with_content(self: Any, prefix: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self.memmap(prefix)

    for cls in (TensorDictBase, TensorDict):
        if "memmap_like" in vars(cls):
            cls.memmap_like = memmap_with_content  # type: ignore[method-assign]


def worker_torchrl(spec: dict[str, Any]) -> dict[str, Any]:
    """Build TorchRL's TED cache from the local Minari dataset (``with_content``: see
    :func:`_patch_memmap_like`), then check, untimed, whether it holds the source's data."""
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


def worker_rb_fill(spec: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's ``LazyMemmapStorage`` filled from the D4RL file (:func:`torchrl_fill`; ``warm``:
    :data:`TORCHRL_WARM` imported before the timer)."""
    t0 = time.perf_counter()
    if spec.get("warm"):
        warm_imports(TORCHRL_WARM)
    import h5py
    from torchrl.data import LazyMemmapStorage

    import_seconds = time.perf_counter() - t0
    with h5py.File(spec["source"], "r") as f:
        n = int(f["observations"].shape[0])
    storage = LazyMemmapStorage(n, scratch_dir=Path(spec["root"]) / "storage")
    rb, measured = timed(lambda: torchrl_fill(Path(spec["source"]), storage))
    return {**measured, "import_seconds": import_seconds, "steps": len(rb)}


def worker_td_memmap(spec: dict[str, Any]) -> dict[str, Any]:
    """The bare memmap fill TorchRL's storages are built on: the D4RL file's arrays read whole
    (h5py) as one TED ``TensorDict``, written by ``td.memmap_(dir)`` (no fsync), warm."""
    import_seconds = warm_imports(TORCHRL_WARM)

    def fill() -> int:
        td = next(d4rl_chunks(Path(spec["source"]), rows=1 << 62))
        td.memmap_(spec["root"])
        return int(td.shape[0])

    steps, measured = timed(fill)
    return {**measured, "import_seconds": import_seconds, "steps": steps}


WORKERS = {
    "rlds": worker_rlds,
    "torchrl": worker_torchrl,
    "rb-fill": worker_rb_fill,
    "td-memmap": worker_td_memmap,
}


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
    """One measured configuration: the worker ``spec`` (``kind`` names it), the file whose
    page-cache state matters, the output removed before each run, extra environment variables."""

    key: str
    label: str
    source: Path
    spec: dict[str, Any]
    output: Path
    cold: bool = False
    env: dict[str, str] = field(default_factory=dict)
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
    result = spawn(cfg.spec, work, work / f"{cfg.key}.log", cfg.env)
    result.update(cached=cached, load1=load1)
    if cfg.disk is None:
        cfg.disk = disk_usage(cfg.output)
        if cfg.spec["kind"] == "torchrl":
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


def rlds_config(key: str, label: str, source: Path, work: Path, **spec: Any) -> Config:
    """An rlds conversion of ``source`` (``spec``: :func:`worker_rlds`'s options; ``cold``: the
    source evicted from the page cache first)."""
    root = work / "out" / key
    cold = spec.pop("cold", False)
    return Config(
        key, label, source, {"kind": "rlds", "source": str(source), "root": str(root), **spec}, root, cold
    )


def torchrl_config(
    key: str, label: str, minari_root: Path, work: Path, *, dataset_id: str = DATASET_ID, **spec: Any
) -> Config:
    """A TorchRL cache build from the Minari dataset ``dataset_id`` under ``minari_root``."""
    root = work / "out" / key
    cold = spec.pop("cold", False)
    spec |= {"kind": "torchrl", "minari_root": str(minari_root), "dataset_id": dataset_id, "root": str(root)}
    return Config(key, label, minari_root / dataset_id / "data" / "main_data.hdf5", spec, root, cold)


def spawn(
    spec: dict[str, Any], work: Path, log_path: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``WORKERS[spec["kind"]]`` (of module ``spec["module"]``, else this one's) on ``spec`` in
    a fresh process (this file's ``__main__``), without ``RLDS_FSYNC`` and ``MINARI_DATASETS_PATH``
    from this environment, with ``env`` added; its result, with the process's ``wall`` seconds and
    ``ru_maxrss_mb``."""
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    child_env = {k: v for k, v in os.environ.items() if k not in ("RLDS_FSYNC", "MINARI_DATASETS_PATH")}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), json.dumps(spec), str(result_path)]
    log_path = log_path or work / f"{spec['kind']}.log"
    with open(log_path, "w") as log:
        wall0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env | (env or {}), cwd=REPO
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - wall0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{spec['kind']}: worker failed:\n{log_path.read_text()[-4000:]}")
    return {**json.loads(result_path.read_text()), "wall": wall, "ru_maxrss_mb": usage.ru_maxrss / 1024}


def generate(kind: str, out: Path, steps: int, dataset_id: str | None = None) -> Path:
    """Write benchmark data (``benchmarks/data.py KIND``) in a child process, so that this process
    never holds its arrays (its RSS is what a spawned child's ``ru_maxrss`` starts from)."""
    cmd = [sys.executable, str(HERE / "data.py"), kind, str(out), "--steps", str(steps)]
    subprocess.run(
        cmd + (["--dataset-id", dataset_id] if dataset_id else []), check=True, stdout=subprocess.DEVNULL
    )
    return out


if __name__ == "__main__":  # the child of run_once
    worker_main(*sys.argv[1:3])
