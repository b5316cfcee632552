"""A job whose output goes to a URL: where its chunks meet, so that no node needs a shared
filesystem.

Each task writes its chunk's files (the rows, then the summary that is its done-marker) to the job's
area ``<output URL>.rlds-job-<id>/chunks/``, each as one object (one PUT on an object store; a
temporary name then a rename on a filesystem), so a file there is always whole. The coordinator
copies each finished chunk into its local job directory as the task reports back (every finished one
when a job is resumed, from any machine), assembles the output there in chunk order as a local job
does, pushes it to the output URL (manifest last) and removes the job's area. A task Ray runs again
after losing its node rewrites the same bytes.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.backends import save_npz
from rlds_cli.cache.layout import JOB_CHUNKS_DIR
from rlds_cli.remote import store

#: Per process: the store of each job area (opened once per task process, not per chunk).
_OPEN: dict[tuple[str, int], tuple[Any, str]] = {}


def job_url(out_url: str, job_id: str) -> str:
    """The job's area on the store, next to its output."""
    return f"{out_url}.rlds-job-{job_id}"


def _open(url: str) -> tuple[Any, str]:
    key = (url, os.getpid())
    if key not in _OPEN:
        _OPEN[key] = store.open_url(url)
    return _OPEN[key]


def put_npz(url: str, name: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Write one chunk file (an uncompressed ``.npz``) to the job area, whole or not at all."""
    buffer = io.BytesIO()
    save_npz(buffer, arrays)
    fs, base = _open(url)
    target = store.join(base, f"{JOB_CHUNKS_DIR}/{name}")
    with store.translated(url):
        if store.is_local(fs):  # a filesystem: a temporary name, then a rename
            fs.makedirs(store.join(base, JOB_CHUNKS_DIR), exist_ok=True)
            part = f"{target}.{os.getpid()}.part"
            fs.pipe_file(part, buffer.getvalue())
            fs.mv(part, target)
        else:  # an object store: one PUT is atomic
            fs.pipe_file(target, buffer.getvalue())


def fetch(url: str, job_dir: Path, names: list[str]) -> None:
    """Copy chunk files from the job area into ``job_dir/chunks`` (each under a temporary name, then
    renamed: a local file is always whole), data files before summaries."""
    fs, base = _open(url)
    chunks = job_dir / JOB_CHUNKS_DIR
    chunks.mkdir(parents=True, exist_ok=True)
    for name in sorted(names, key=lambda n: n.endswith(".done.npz")):
        part = chunks / f".{name}.{os.getpid()}.fetch"
        with store.translated(url):
            fs.get_file(store.join(base, f"{JOB_CHUNKS_DIR}/{name}"), str(part))
        os.replace(part, chunks / name)


def fetch_finished(url: str, job_dir: Path) -> int:
    """Copy every finished chunk the job area holds and ``job_dir`` lacks (a resumed job); returns
    the number of chunks copied."""
    fs, base = _open(url)
    remote = store.list_files(fs, base, url)
    prefix = f"{JOB_CHUNKS_DIR}/"
    names = {rel.split("/", 1)[1] for rel in remote if rel.startswith(prefix) and rel.endswith(".npz")}
    local = job_dir / JOB_CHUNKS_DIR
    wanted = []
    for name in names:
        if name.endswith(".done.npz") and not (local / name).is_file():
            wanted.append(name)
            data = name.replace(".done.npz", ".data.npz")
            if data in names:
                wanted.append(data)
    fetch(url, job_dir, wanted)
    return sum(n.endswith(".done.npz") for n in wanted)


def remove(url: str) -> None:
    """Remove the job area (once the output is pushed, or the job starts over)."""
    fs, base = _open(url)
    with store.translated(url), contextlib.suppress(FileNotFoundError):
        fs.rm(base, recursive=True)
