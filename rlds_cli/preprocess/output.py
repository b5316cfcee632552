"""Writing a job's output: preallocated columns (per-step mode, memmap), chunk files appended
in order (per-episode mode, zarr), and the episode index."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.backends import ARRAYS_DIR, NPY_HEADER_BYTES, ColumnWriter, get_backend, npy_header
from rlds_cli.cache.builder import EPISODE_DTYPE
from rlds_cli.errors import DiskFullError, PreprocessError
from rlds_cli.preprocess import schema
from rlds_cli.preprocess.plan import Plan
from rlds_cli.preprocess.worker import data_path, read_npz, summary_path


def column_rows(plan: Plan, storage: str) -> int:
    """Rows of an output column in per-step mode: steps, plus one final row per episode if flat."""
    return plan.limit + (plan.num_episodes if storage == "flat" else 0)


def column_bytes(dtype: np.dtype, shape: tuple[int, ...], rows: int) -> int:
    """Size of a preallocated ``.npy`` column file: header plus ``rows`` rows."""
    return NPY_HEADER_BYTES + rows * np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))


def preallocate(out: Path, inferred: schema.Schema, plan: Plan) -> None:
    """Full-size ``.npy`` files that workers fill region by region through memory maps.

    The space is reserved on disk first (``posix_fallocate``): a full disk met while writing
    through a memory map kills the process with SIGBUS and no message, so it must be an error
    here, before any work, naming the bytes needed.
    """
    sizes = {
        key: column_bytes(np.dtype(spec.dtype), spec.shape, column_rows(plan, spec.storage))
        for key, spec in inferred.items()
    }
    (out / ARRAYS_DIR).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free
    needed = sum(sizes.values())
    if needed > free:
        raise DiskFullError(
            f"the output needs {needed:,} bytes and {out} has {free:,} free",
            hint="free some space (e.g. 'rlds gc', 'rlds rm'), or set RLDS_HOME to a larger disk",
        )
    for key, spec in inferred.items():
        path = out / ARRAYS_DIR / f"{key}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = npy_header(np.dtype(spec.dtype), (column_rows(plan, spec.storage), *spec.shape))
        with open(path, "wb") as fh:
            fh.write(header)
            fh.truncate(sizes[key])
            fh.flush()
            reserve(fh.fileno(), sizes[key], path, needed)


def reserve(fd: int, size: int, path: Path, needed: int) -> None:
    """Allocate ``size`` bytes of the open file ``fd`` on disk, or raise :class:`DiskFullError`."""
    if size <= NPY_HEADER_BYTES or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise DiskFullError(
                f"not enough disk space for the output {path} ({needed:,} bytes needed in all)",
                hint="free some space (e.g. 'rlds gc', 'rlds rm'), or set RLDS_HOME to a larger disk",
            ) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


class Assembler:
    """Appends finished chunk files to the output columns strictly in chunk order (a chunk
    that finishes early waits on disk), so the output is the same whatever the scheduling."""

    def __init__(self, job_dir: Path, inferred: schema.Schema, storage: str, num_chunks: int) -> None:
        self.job_dir = job_dir
        self.inferred = inferred
        self.num_chunks = num_chunks
        self.next = 0
        out = job_dir / "out"
        if out.exists():  # a resumed job rebuilds its output from the chunk files
            shutil.rmtree(out)
        out.mkdir(parents=True)
        backend = get_backend(storage)
        self.columns: dict[str, ColumnWriter] = {
            k: backend.create_column(out, k, np.dtype(s.dtype), s.shape) for k, s in inferred.items()
        }
        self.ends: list[np.ndarray] = []
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
                self.ids.append(arrays["ids"])
                self.known.append(arrays["known"])
                self.steps += int(meta["rows"])
            self.next += 1

    def close(self, fsync: bool) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        for column in self.columns.values():
            column.close(fsync=fsync)
        return self.steps, cat(self.ends, np.int64), cat(self.ids, np.int64), cat(self.known, bool)


def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def write_episodes(path: Path, ends: np.ndarray, ids: np.ndarray, known: np.ndarray, fsync: bool) -> None:
    index = np.zeros(len(ends), EPISODE_DTYPE)
    index["start"][1:] = ends[:-1] + 1
    index["length"] = ends + 1 - index["start"]
    index["source_id"] = ids
    index["final_known"] = known
    with open(path, "wb") as fh:
        np.save(fh, index, allow_pickle=False)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
