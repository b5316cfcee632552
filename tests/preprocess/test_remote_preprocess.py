"""``rlds preprocess URL --fn F --name URL``: a job that reads a pushed zarr dataset where it lies
and pushes its output, its workers writing their chunks to the store (no shared disk).

Local executors here (the in-process one on ``memory://``, spawned workers on ``file://``); the
Ray cluster test, with a node lost mid-job on the local S3 server, is in
``tests/preprocess/test_preprocess_ray.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli import preprocess
from rlds_cli.cache.manifest import SELF_DIGEST, canonical_sha256
from rlds_cli.cli.app import app
from rlds_cli.errors import PreprocessError, RemoteExistsError, UserFunctionError
from rlds_cli.loader.opening import open_dataset
from tests.dataset_fixtures import make_dataset

fsspec = pytest.importorskip("fsspec")

from rlds_cli.remote.push import push  # noqa: E402
from rlds_cli.remote.reader import RemoteNotReadableError  # noqa: E402

FNS = "tests.preprocess_fns"
runner = CliRunner()

FAILS_ONCE = """
import os
import numpy as np

FLAG = {flag!r}

def scale(batch):
    # the first run fails in its third chunk (steps from 20 on); a run after the flag is gone works
    if os.path.exists(FLAG) and batch["index"][0] >= 20:
        raise RuntimeError("stopped on purpose")
    out = dict(batch)
    for key in ("observation", "next/observation"):
        out[key] = (batch[key] * 0.5 - 1).astype(np.float32)
    return out
"""


@pytest.fixture(autouse=True)
def _fresh_memory_store() -> Iterator[None]:
    from fsspec.implementations.memory import MemoryFileSystem

    yield
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


def remote_files(url: str) -> dict[str, bytes]:
    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {p[len(path.rstrip("/")) + 1 :]: fs.cat_file(p) for p in fs.find(path)}


def local_files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def same_as_local(url: str, local: Any) -> None:
    """The pushed output holds the local job's files byte for byte (the manifest but for its
    name, time and lineage, which name the URLs), plus the push's files index."""
    remote = remote_files(url)
    mine = local_files(local.path)
    assert set(remote) == set(mine) | {"rlds-files.json"}
    for rel, data in mine.items():
        if rel != "manifest.json":
            assert remote[rel] == data, rel
    a, b = json.loads(remote["manifest.json"]), local.manifest.to_dict()
    assert a.pop(SELF_DIGEST) == canonical_sha256(a)  # the pushed manifest checks itself
    for m in (a, b):
        for key in ("created_at", "name", "lineage", "source"):
            m.pop(key)
    assert a == b


@pytest.mark.parametrize("by", ["step", "episode"])
def test_memory_in_memory_out_matches_a_local_job(by: str) -> None:
    make_dataset("src", [30, 1, 45, 12, 60, 2, 50], backend="zarr")
    push("src", "memory://b/src")
    fn = f"{FNS}:returns_to_go" if by == "episode" else f"{FNS}:normalize"
    local = preprocess.run("src", fn, "local", by=by, chunk_steps=16, workers=1, stats=True)
    result = preprocess.run(
        "memory://b/src", fn, "memory://b/out", by=by, chunk_steps=16, workers=1, stats=True
    )
    assert result.url == "memory://b/out" and not result.reused and result.num_chunks > 5
    same_as_local("memory://b/out", local)
    assert not fsspec.filesystem("memory").exists(f"/b/out.rlds-job-{result.manifest.lineage[0]['job']}")
    lineage = result.manifest.lineage[0]
    assert lineage["url"] == "memory://b/src" and lineage["to"] == "memory://b/out"
    assert result.manifest.source["path"] == "memory://b/src"
    out = open_dataset("memory://b/out")  # read where it lies, like any pushed dataset
    np.testing.assert_array_equal(out[:]["observation"], open_dataset("local")[:]["observation"])
    again = preprocess.run(
        "memory://b/src", fn, "memory://b/out", by=by, chunk_steps=16, workers=1, stats=True
    )
    assert again.reused
    assert not preprocess.run("src", fn, "local", by=by, chunk_steps=16, workers=1, stats=True).num_chunks


@pytest.mark.slow
def test_spawned_workers_write_their_chunks_to_the_store(tmp_path: Path) -> None:
    make_dataset("src", [30, 1, 45, 12, 60, 2, 50], backend="zarr")
    src, out = f"file://{tmp_path}/store/src", f"file://{tmp_path}/store/out"
    push("src", src)
    local = preprocess.run("src", f"{FNS}:add_features", "local", chunk_steps=16, workers=1, stats=True)
    result = preprocess.run(src, f"{FNS}:add_features", out, chunk_steps=16, workers=2, stats=True)
    same_as_local(out, local)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["out", "src"]  # the job area is gone
    assert result.manifest.name == "out"


def test_a_failed_job_resumes_from_the_store_on_another_coordinator(tmp_path: Path) -> None:
    make_dataset("src", [10] * 6, backend="zarr")
    push("src", "memory://b/src")
    flag = tmp_path / "fail"
    flag.touch()
    fns = tmp_path / "failfns.py"
    fns.write_text(FAILS_ONCE.format(flag=str(flag)))
    fn = f"{fns}:scale"
    with pytest.raises(UserFunctionError, match="stopped on purpose"):
        preprocess.run("memory://b/src", fn, "memory://b/out", chunk_steps=10, workers=1)
    area = [p for p in fsspec.filesystem("memory").find("/b") if ".rlds-job-" in p]
    assert len([p for p in area if p.endswith(".done.npz")]) == 2  # chunks 0 and 1 finished
    assert not fsspec.filesystem("memory").exists("/b/out/manifest.json")
    flag.unlink()
    other = tmp_path / "other-machine"  # its own cache: the finished chunks come from the store
    resumed = preprocess.run(
        "memory://b/src", fn, "memory://b/out", chunk_steps=10, workers=1, resume=True, root=other
    )
    assert resumed.resumed_chunks == 2
    local = preprocess.run("src", fn, "local", chunk_steps=10, workers=1)
    same_as_local("memory://b/out", local)


def test_errors_of_a_remote_job_are_one_line(tmp_path: Path) -> None:
    make_dataset("src", [10, 10], backend="zarr")
    make_dataset("mm", [10, 10])
    push("src", "memory://b/src")
    push("mm", "memory://b/mm")
    with pytest.raises(PreprocessError, match="its last part 'bad name' cannot be a dataset name"):
        preprocess.run("memory://b/src", f"{FNS}:identity", "memory://b/bad name", workers=1)
    for bucket in ("memory://b", "memory://b/"):  # the bucket was taken for the name ('b')
        with pytest.raises(PreprocessError, match="names a bucket or host, not a dataset in it"):
            preprocess.run("memory://b/src", f"{FNS}:identity", bucket, workers=1)
    with pytest.raises(RemoteNotReadableError, match="is a memmap dataset"):
        preprocess.run("memory://b/mm", f"{FNS}:identity", "memory://b/out", workers=1)
    push("mm", "memory://b/taken")
    with pytest.raises(RemoteExistsError, match="memory://b/taken holds another dataset"):
        preprocess.run("memory://b/src", f"{FNS}:identity", "memory://b/taken", workers=1)
    replaced = preprocess.run("memory://b/src", f"{FNS}:identity", "memory://b/taken", workers=1, force=True)
    assert open_dataset("memory://b/taken").manifest.lineage[0]["job"] == replaced.manifest.lineage[0]["job"]
    src = f"file://{tmp_path}/s/src"  # the CLI refuses memory:// (its store ends with the command)
    push("src", src)
    result = runner.invoke(app, ["preprocess", src, "--fn", f"{FNS}:identity", "--name", src])
    assert result.exit_code == 1 and "the output name must differ from the source" in result.stderr


def test_the_cli_takes_urls(tmp_path: Path) -> None:
    make_dataset("src", [10, 20], backend="zarr")
    src, out = f"file://{tmp_path}/s/src", f"file://{tmp_path}/s/out"
    push("src", src)
    args = ["preprocess", src, "--fn", f"{FNS}:normalize", "--name", out, "--workers", "1", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["path"] == out and info["name"] == "out" and info["num_steps"] == 30
    dry = runner.invoke(app, ["preprocess", src, "--fn", f"{FNS}:normalize", "--dry-run", "--json"])
    assert dry.exit_code == 0 and json.loads(dry.stdout)["steps"] == 30


def test_a_second_job_to_the_same_url_is_refused_while_one_runs(isolated_cache: Path) -> None:
    import hashlib

    from filelock import FileLock

    from rlds_cli.errors import LockTimeoutError

    make_dataset("src", [10, 10], backend="zarr")
    push("src", "memory://b/src")
    ident = hashlib.sha256(b"memory://b/out").hexdigest()[:16]
    (isolated_cache / "locks").mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(isolated_cache / "locks" / f".preprocess-{ident}.lock"))
    with lock, pytest.raises(LockTimeoutError, match="memory://b/out is being written by another process"):
        preprocess.run("memory://b/src", f"{FNS}:identity", "memory://b/out", workers=1)
