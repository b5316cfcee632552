"""Writing a job's output: preallocated columns written in place, region by region (per-step mode,
"direct"), or chunk files appended in order (per-episode mode, and per-step chunks a backend cannot
write in place); and which chunks of an interrupted run are finished and intact."""

from __future__ import annotations

import logging
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.backends import ColumnWriter, get_backend
from rlds_cli.cache.backends.memmap import save_npz
from rlds_cli.cache.compose import copied_source_arrays
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import JOB_OUTPUT_DIR, SOURCE_ARRAYS_FILE, is_episode_array
from rlds_cli.errors import CorruptDatasetError, DiskFullError, PreprocessError
from rlds_cli.preprocess import schema
from rlds_cli.preprocess.plan import Plan
from rlds_cli.preprocess.worker import data_path, read_npz, rows_digest, summary_path

logger = logging.getLogger(__name__)


def column_rows(plan: Plan, storage: str) -> int:
    """Rows of an output column in per-step mode: steps, plus one final row per episode if flat."""
    return plan.limit + (plan.num_episodes if storage == "flat" else 0)


def direct_possible(storage: str, inferred: schema.Schema, plan: Plan, episodes: np.ndarray) -> bool:
    """Whether workers can write their chunks in place, each into its own region of every
    preallocated column: per-step chunks whose regions all start where the backend allows (any row
    for memmap; a shard boundary for zarr, else two workers would rewrite one shard)."""
    if plan.by != "step":
        return False
    backend = get_backend(storage)
    starts = np.asarray(plan.bounds[1:-1], np.int64)
    # the flat rows before step t: t, plus a final row per episode ended before t
    ended = np.searchsorted(np.asarray(episodes["start"]), starts, side="right") - 1
    for spec in inferred.values():
        align = backend.region_rows(np.dtype(spec.dtype), spec.shape)
        firsts = starts + ended if spec.storage == "flat" else starts
        if np.any(firsts % align):
            return False
    return True


def preallocate(out: Path, inferred: schema.Schema, plan: Plan, storage: str) -> None:
    """Full-size output columns that workers fill region by region.

    Raises :class:`~rlds_cli.errors.DiskFullError`, before any work, when the disk lacks the bytes
    the backend takes at once (memmap: every column, reserved with ``posix_fallocate``). Exactly
    those bytes must be free: no margin as :func:`rlds_cli._util.io.check_disk` keeps for a growing
    download.
    """
    backend = get_backend(storage)
    rows = {key: column_rows(plan, spec.storage) for key, spec in inferred.items()}
    needed = sum(backend.preallocated_bytes(np.dtype(s.dtype), s.shape, rows[k]) for k, s in inferred.items())
    out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free
    if needed > free:
        raise DiskFullError(
            f"the output needs {needed:,} bytes and {out} has {free:,} free",
            hint="free some space (e.g. 'rlds gc', 'rlds rm'), or set RLDS_HOME to a larger disk",
        )
    for key, spec in inferred.items():
        backend.preallocate(out, key, np.dtype(spec.dtype), spec.shape, rows[key])


def preallocated_intact(out: Path, inferred: schema.Schema, plan: Plan, storage: str) -> bool:
    """Whether the preallocated output of a per-step job is still all there (a resumed job writes into it)."""
    backend = get_backend(storage)
    return all(
        backend.check_preallocated(out, key, column_rows(plan, spec.storage), spec.shape) is None
        for key, spec in inferred.items()
    )


class Assembler:
    """Appends finished chunk files to the output columns strictly in chunk order (a chunk that
    finishes early waits on disk): the output is the same whatever the scheduling."""

    def __init__(self, job_dir: Path, inferred: schema.Schema, storage: str, num_chunks: int) -> None:
        self.job_dir = job_dir
        self.inferred = inferred
        self.num_chunks = num_chunks
        self.next = 0
        out = job_dir / JOB_OUTPUT_DIR
        if out.exists():  # a resumed job rebuilds its output from the chunk files
            shutil.rmtree(out)
        out.mkdir(parents=True)
        backend = get_backend(storage)
        self.columns: dict[str, ColumnWriter] = {
            k: backend.create_column(out, k, np.dtype(s.dtype), s.shape) for k, s in inferred.items()
        }
        self.ends: list[np.ndarray] = []
        self.parents: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.known: list[np.ndarray] = []
        self.steps = 0

    def pump(self) -> None:
        while self.next < self.num_chunks and summary_path(self.job_dir, self.next).is_file():
            path = data_path(self.job_dir, self.next)
            if not path.is_file() and read_npz(summary_path(self.job_dir, self.next))[0].get("data_file"):
                raise PreprocessError(
                    f"chunk {self.next} wrote rows but its file {path} is gone; nothing was published",
                    hint="run the same command again with --resume: the chunk is computed again",
                )
            if path.is_file():  # absent when the function dropped every step of the chunk
                meta, arrays = read_npz(path)
                for j, key in enumerate(meta["keys"]):
                    self.columns[key].append(arrays[f"c{j}"])
                self.ends.append(arrays["ends"] + self.steps)
                # a chunk file of a job begun by an older rlds has none: no parents
                self.parents.append(arrays.get("parents", np.full(len(arrays["ids"]), -1)))
                self.ids.append(arrays["ids"])
                self.known.append(arrays["known"])
                self.steps += int(meta["rows"])
            self.next += 1

    def close(self, fsync: bool) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps written; the output episodes' ends, input positions (-1: none), source ids and
        final-observation flags."""
        for column in self.columns.values():
            column.close(fsync=fsync)
        return (
            self.steps,
            cat(self.ends, np.int64),
            cat(self.parents, np.int64),
            cat(self.ids, np.int64),
            cat(self.known, bool),
        )


def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def copy_source_arrays(out: Path, src: Dataset, parents: np.ndarray) -> Path | None:
    """Write the source arrays of ``src`` into ``out`` for an output whose episodes come from the
    episodes of ``src`` at positions ``parents`` (one per output episode: a dropped episode is
    left out, a split one's parts each have its facts); returns the file, or ``None`` where
    ``src`` has none or an output episode has no parent (-1: the function did not keep the
    ``episode`` column, or changed it)."""
    arrays = copied_source_arrays(src)
    if not arrays or not len(parents) or parents.min() < 0 or parents.max() >= src.num_episodes:
        return None
    path = out / SOURCE_ARRAYS_FILE
    kept = {k: v[parents] if is_episode_array(k) and v.ndim else v for k, v in arrays.items()}
    save_npz(path, {k.replace("/", "__"): v for k, v in kept.items()})
    return path


#: What reading a summary or chunk ``.npz`` that is cut or damaged raises (numpy reads the zip's
#: members, which check their CRC-32: ``BadZipFile``; a cut ``.npy`` inside: ``EOFError``).
UNREADABLE_NPZ = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def finished_chunks(job_dir: Path, num_chunks: int) -> list[int]:
    """Chunks whose results are all on disk: a summary (the done-marker, written after the chunk's
    data), and the chunk's file while the summary says it wrote rows, so a half-deleted job never
    passes for a finished one. Unreadable or orphaned summaries are removed (the chunk runs again)."""
    done = []
    for i in range(num_chunks):
        marker = summary_path(job_dir, i)
        if not marker.is_file():
            continue
        try:
            meta, _ = read_npz(marker)
        except UNREADABLE_NPZ:
            marker.unlink(missing_ok=True)  # unreadable or damaged: run the chunk again
            continue
        if meta.get("data_file") and not data_path(job_dir, i).is_file():
            marker.unlink()
            continue
        done.append(i)
    return done


def intact_chunks(job_dir: Path, done: list[int], mode: str, storage: str) -> list[int]:
    """The finished chunks of an earlier run whose rows are as written: per-step (direct), each
    output region's digest is its summary's; per-episode, the chunk file's CRCs hold. A damaged one
    is said (a warning) and run again: only the job's own temporary files are concerned."""
    backend = get_backend(storage)
    out, columns = job_dir / JOB_OUTPUT_DIR, {}
    intact = []
    for i in done:
        try:
            meta, _ = read_npz(summary_path(job_dir, i))
            if mode == "direct":
                for key, (a, b, recorded) in (meta.get("regions") or {}).items():
                    if key not in columns:
                        columns[key] = backend.open_column(out, key)
                    column = columns[key]
                    if rows_digest(np.asarray(column[a:b])) != recorded:
                        raise ValueError(f"rows {a}-{b - 1} of {key!r} differ from what the chunk wrote")
            elif meta.get("data_file"):
                with zipfile.ZipFile(data_path(job_dir, i)) as chunk_file:
                    bad = chunk_file.testzip()
                if bad is not None:
                    raise ValueError(f"{data_path(job_dir, i).name}: {bad} fails its CRC-32")
        except (*UNREADABLE_NPZ, CorruptDatasetError) as exc:
            logger.warning("job %s: chunk %d of the interrupted run is damaged (%s): running it again",
                           job_dir.name, i, exc)  # fmt: skip
            summary_path(job_dir, i).unlink(missing_ok=True)
            continue
        intact.append(i)
    return intact
