"""One chunk of a job, as run by every executor (in-process, a spawned worker, a Ray task).

A task gets the job's *spec* (plain strings, numbers and paths; the function as a reference string)
and a chunk's bounds. It reads the chunk from the source, calls the function, checks the output,
writes it (into the preallocated output columns, or to a chunk file in the job directory) and last
writes the chunk's summary file, its done-marker: a chunk is finished exactly when its summary
exists. Errors come back as plain data (exceptions of user code need not pickle).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.io import atomic_write
from rlds_cli.cache import stats
from rlds_cli.cache.backends import get_backend, save_npz
from rlds_cli.cache.compose import copied_metadata
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import JOB_CHUNKS_DIR, JOB_OUTPUT_DIR, MANIFEST_FILE
from rlds_cli.cache.manifest import read_manifest
from rlds_cli.cache.opening import open_published
from rlds_cli.errors import (
    CacheNotVisibleError,
    DatasetReplacedError,
    DiskFullError,
    OutputSchemaError,
    RldsError,
    is_disk_full,
)
from rlds_cli.preprocess import fnref, schema
from rlds_cli.preprocess.plan import read_chunk

#: Per-process state: the opened source and the resolved function.
_STATE: dict[str, Any] = {}


def chunk_name(i: int) -> str:
    return f"{i:08d}"


def summary_path(job_dir: Path, i: int) -> Path:
    return job_dir / JOB_CHUNKS_DIR / f"{chunk_name(i)}.done.npz"


def data_path(job_dir: Path, i: int) -> Path:
    return job_dir / JOB_CHUNKS_DIR / f"{chunk_name(i)}.data.npz"


def forget() -> None:
    """Drop this process's per-job state (the opened source of a finished run)."""
    _STATE.clear()


def _state(spec: Mapping[str, Any]) -> dict[str, Any]:
    key = spec["run_id"]  # unique per run: a re-run of the same job never sees old memory maps
    st = _STATE.get(key)
    if st is None:
        if spec.get("on_cluster"):
            _check_visible(spec)
        cwd = spec.get("cwd")
        if cwd and os.path.isdir(cwd) and cwd not in sys.path:
            # last: a module the Ray executor shipped (py_modules, early on sys.path) wins over
            # the caller's directory, which only a node on the same filesystem sees
            sys.path.append(cwd)
        if spec.get("source_url"):  # read where it lies: no node needs the coordinator's cache
            from rlds_cli.remote.reader import open_remote

            ds: Dataset = open_remote(spec["source_url"])
        else:  # by its layout's reader: a merge or trim reads its parents' arrays
            ds = open_published(Path(spec["source_dir"]), read_manifest(Path(spec["source_dir"])))
        if ds.manifest.digest() != spec["source_digest"]:
            raise DatasetReplacedError(f"source dataset {ds.name!r} changed since the job started")
        st = {
            "ds": ds,
            "fn": fnref.get(spec["fn"], spec.get("fn_source")),
            "instructions": copied_metadata(ds)[1],
        }
        _STATE.clear()  # one job per process at a time: drop an older job's source
        _STATE[key] = st
    return st


def node_name() -> str:
    """This machine as a user finds it in a cluster: the host name, and in a Ray worker the node's
    IP address."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            return f"{host} ({ray.util.get_node_ip_address()})"
        except Exception:  # not in a Ray process after all: the host name says enough
            pass
    return host


def _check_visible(spec: Mapping[str, Any]) -> None:
    """Check, before any work, that this process sees the source dataset and the job directory at
    the coordinator's paths (else a Ray node without the shared filesystem fails with a misleading
    "not an rlds dataset")."""
    paths = []
    if not spec.get("source_url"):
        paths.append(Path(spec["source_dir"]) / MANIFEST_FILE)
    if not spec.get("job_url"):  # else chunks go to the job's area on the store
        paths.append(Path(spec["job_dir"]) / JOB_CHUNKS_DIR)
    for path in paths:
        if not path.exists():
            raise CacheNotVisibleError(
                f"node {node_name()} cannot see {path}: the job needs the rlds cache at the same "
                "path on every node (a shared filesystem)",
                hint=CacheNotVisibleError.default_hint + "; or push the source (rlds push NAME URL) "
                "and give the job URLs (rlds preprocess URL --name URL): then no node needs the cache",
            )


def run_chunk(spec: Mapping[str, Any], i: int, start: int, stop: int) -> dict[str, Any]:
    """Process chunk ``i`` (steps ``[start, stop)``); returns ``{"ok": True, ...}`` or an error
    description ``{"ok": False, "type", "message", "hint", "traceback"}``."""
    try:
        try:
            return {"ok": True, "i": i, **_run(spec, i, start, stop)}
        except OSError as exc:  # numpy's writes name no file: the job's folder is named
            if isinstance(exc, RldsError) or not is_disk_full(exc):
                raise
            raise disk_full(Path(spec["job_dir"])) from exc
    except RldsError as exc:
        return {
            "ok": False,
            "type": type(exc).__name__,
            "message": exc.message,
            "hint": exc.hint,
            "traceback": getattr(exc, "user_traceback", ""),
        }


def _run(spec: Mapping[str, Any], i: int, start: int, stop: int) -> dict[str, Any]:
    st = _state(spec)
    ds: Dataset = st["ds"]
    batch = read_chunk(ds, start, stop, spec["keys"], spec["limit"], st["instructions"])
    e0, e1 = int(batch["episode"][0]), int(batch["episode"][-1])
    where = f"function {spec['fn_ref']}, chunk {i} (steps {start}-{stop - 1}, episodes {e0}-{e1})"
    out = fnref.call_user(st["fn"], batch, where)
    episode_out = out.get("episode") if isinstance(out, Mapping) else None
    arrays = schema.normalize(out, batch, where)
    expected = schema.schema_from_json(spec["schema"])
    schema.check_same(schema.infer(arrays, where), expected, where)
    done = (arrays["next/terminated"] | arrays["next/truncated"]).reshape(-1)
    by_step = spec["by"] == "step"
    _check_structure(arrays, batch, done, by_step, where)
    flat = schema.flat_keys(arrays)
    ends = np.flatnonzero(done)
    for key in flat:
        schema.check_flat(key, arrays, ends, where, start if by_step else 0)
    extra: dict[str, np.ndarray] = {}
    if spec["stats"]:
        for key in expected:
            if stats.wants_stats(arrays[key]) and (p := stats.partial(arrays[key])) is not None:
                extra.update(p.to_arrays(f"stats/{key}/"))
    n = len(done)
    if n:
        for key in flat:
            extra[f"first/{key}"] = arrays[key][0]
            if not done[-1]:
                extra[f"last/{key}"] = arrays[f"next/{key}"][-1]
    job_dir = Path(spec["job_dir"])
    regions: dict[str, list[Any]] = {}
    if spec["mode"] == "direct":
        regions = _write_direct(spec, arrays, expected, ends, start, e0)
    elif n:
        parents, ids, known = _episode_facts(ds, episode_out, ends, by_step, batch)
        _write_file(
            data_path(job_dir, i),
            arrays,
            expected,
            ends,
            {"parents": parents, "ids": ids, "known": known},
            spec["fsync"],
            spec.get("job_url"),
        )
    meta = {
        "i": i,
        "rows_in": stop - start,
        "rows_out": n,
        "episodes_out": len(ends),
        "ends_done": bool(n and done[-1]),
        # a positive record: the chunk's rows are in a chunk file that must still exist
        "data_file": spec["mode"] != "direct" and bool(n),
        # the rows written into each preallocated column, and their digest: a resumed job checks them
        "regions": regions,
    }
    summary = {"meta": np.asarray(json.dumps(meta)), **extra}
    _write_npz(summary_path(job_dir, i), summary, spec["fsync"], spec.get("job_url"))
    return meta


def _check_structure(
    arrays: Mapping[str, np.ndarray],
    batch: Mapping[str, np.ndarray],
    done: np.ndarray,
    by_step: bool,
    where: str,
) -> None:
    n_in = len(batch["index"])
    if by_step:
        if len(done) != n_in:
            raise OutputSchemaError(
                f"{where} returned {len(done)} rows for {n_in} steps; per-step mode keeps every step",
                hint="use --by episode to drop steps or whole episodes",
            )
        if not np.array_equal(done, batch["next/done"].reshape(-1)):
            t = int(np.flatnonzero(done != batch["next/done"].reshape(-1))[0])
            raise OutputSchemaError(
                f"{where} moved an episode boundary (next/terminated | next/truncated) at step "
                f"{int(batch['index'][t])}; per-step mode keeps the episodes as they are",
                hint="use --by episode to change episode boundaries",
            )
    elif len(done) and not done[-1]:
        raise OutputSchemaError(
            f"{where}: the last returned step does not end an episode (next/terminated or "
            "next/truncated must be set on the last step of every returned episode)"
        )


def _episode_facts(
    ds: Dataset, episode_out: Any, ends: np.ndarray, by_step: bool, batch: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The input positions, source ids and final-observation flags of the output episodes, from
    the input's index: through the input's ``episode`` column in per-step mode, through the
    returned ``episode`` column (when the function kept it) in per-episode mode. An episode whose
    returned ``episode`` is none of the chunk's input episodes has no parent: -1, source id -1."""
    unknown = np.full(len(ends), -1, np.int64)
    if by_step:
        parent = np.asarray(batch["episode"])[ends].astype(np.int64)
    elif episode_out is not None and len(np.asarray(episode_out).reshape(-1)) > int(ends[-1]):
        returned = np.asarray(episode_out).reshape(-1)[ends]
        if returned.dtype.kind not in "iu":
            return unknown, unknown, np.ones(len(ends), bool)
        parent = np.where(np.isin(returned, batch["episode"]), returned, -1).astype(np.int64)
    else:
        return unknown, unknown, np.ones(len(ends), bool)
    index, has = ds.episode_index, parent >= 0
    ids = np.where(has, index["source_id"][np.where(has, parent, 0)], -1).astype(np.int64)
    known = np.where(has, index["final_known"][np.where(has, parent, 0)], True).astype(bool)
    return parent, ids, known


def _write_direct(
    spec: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    expected: schema.Schema,
    ends: np.ndarray,
    start: int,
    e0: int,
) -> dict[str, list[Any]]:
    """Write the chunk's disjoint region of every preallocated column (per-step mode): steps
    ``[start, stop)`` of step keys, flat rows ``[start + e0, stop + e0 + episode ends)`` of flat
    keys, through the output's backend. Returns ``{key: [first row, end row, digest]}``
    (:func:`rows_digest`) of each region written."""
    backend = get_backend(spec["storage"])
    out = Path(spec["job_dir"]) / JOB_OUTPUT_DIR
    regions: dict[str, list[Any]] = {}
    for key, fs in expected.items():
        n = len(arrays[key])
        a, b = (start + e0, start + e0 + n + len(ends)) if fs.storage == "flat" else (start, start + n)
        region = backend.open_region(out, key, a, b)
        if fs.storage == "flat":
            schema.write_flat(region.rows, 0, key, arrays, ends)
        else:
            region.rows[:] = arrays[key]
        regions[key] = [a, b, rows_digest(region.rows)]
        region.close(fsync=spec["fsync"])
    return regions


def disk_full(job_dir: Path) -> DiskFullError:
    """A job's full disk, naming its directory (numpy's writes name no file)."""
    return DiskFullError(
        f"no space left on the device writing the preprocessing job's files in {job_dir}",
        hint="free space there, then run the same command with --resume (the finished chunks are kept), "
        "or remove that directory to give its space back",
    )


def rows_digest(rows: np.ndarray) -> str:
    """The sha256 of rows' bytes (C order), as a chunk's summary records them."""
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()


def _write_file(
    path: Path,
    arrays: Mapping[str, np.ndarray],
    expected: schema.Schema,
    ends: np.ndarray,
    facts: Mapping[str, np.ndarray],
    fsync: bool,
    job_url: str | None = None,
) -> None:
    """The chunk as a block for the coordinator: flat keys with their final rows inserted, and the
    episodes' ``facts`` (``parents``, ``ids``, ``known``: see :func:`_episode_facts`)."""
    keys = sorted(expected)
    cols = {
        f"c{j}": (schema.to_flat(k, arrays, ends) if expected[k].storage == "flat" else arrays[k])
        for j, k in enumerate(keys)
    }
    meta = np.asarray(json.dumps({"keys": keys, "rows": len(arrays["action"])}))
    _write_npz(path, {"meta": meta, "ends": ends, **facts, **cols}, fsync, job_url)


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray], fsync: bool, job_url: str | None = None) -> None:
    """Write an uncompressed ``.npz`` atomically (temp file, then rename), or, for a job whose
    output goes to a URL, as one object in the job's area on the store (same name)."""
    if job_url:
        from rlds_cli.preprocess import remote_io

        remote_io.put_npz(job_url, path.name, arrays)
        return
    atomic_write(path, lambda fh: save_npz(fh, arrays), fsync=fsync)


def read_npz(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(meta, arrays)`` of a summary or chunk file."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads(str(arrays.pop("meta"))), arrays
