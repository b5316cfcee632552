"""Writing a job's output: preallocated columns (per-step mode, memmap), chunk files appended
in order (per-episode mode, zarr), and the episode index."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.backends import ARRAYS_DIR, ColumnWriter, get_backend, npy_header
from rlds_cli.cache.builder import EPISODE_DTYPE
from rlds_cli.preprocess import schema
from rlds_cli.preprocess.plan import Plan
from rlds_cli.preprocess.worker import data_path, read_npz, summary_path


def column_rows(plan: Plan, storage: str) -> int:
    """Rows of an output column in per-step mode: steps, plus one final row per episode if flat."""
    return plan.limit + (plan.num_episodes if storage == "flat" else 0)


def preallocate(out: Path, inferred: schema.Schema, plan: Plan) -> None:
    """Full-size ``.npy`` files (sparse until written) that workers fill region by region."""
    for key, spec in inferred.items():
        rows = column_rows(plan, spec.storage)
        path = out / ARRAYS_DIR / f"{key}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = npy_header(np.dtype(spec.dtype), (rows, *spec.shape))
        row_bytes = np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64))
        with open(path, "wb") as fh:
            fh.write(header)
            fh.truncate(len(header) + rows * row_bytes)


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
