"""``rlds push`` / ``rlds pull``: datasets to and from object storage.

Units run on fsspec's ``memory://`` and ``file://`` stores; integration runs against a local
S3-compatible server (moto, started here on 127.0.0.1 with dummy credentials). Kills are real:
a forked child ends with ``os._exit`` (what SIGKILL does) before its k-th write, for every k.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetExistsError,
    DatasetReplacedError,
    MissingExtraError,
    NotPushableError,
    RemoteAccessError,
    RemoteCorruptError,
    RemoteDatasetNotFoundError,
    RemoteExistsError,
)
from tests import faults

fsspec = pytest.importorskip("fsspec")

from rlds_cli.remote import pull as pull_module  # noqa: E402
from rlds_cli.remote import push as push_module  # noqa: E402
from rlds_cli.remote.pull import pull  # noqa: E402
from rlds_cli.remote.push import push  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def make_demo(name: str, storage: str, root: Path | None = None) -> str:
    args = ["download", "demo", "--storage", storage, "--name", name, "-q"]
    if root is not None:
        args += ["--root", str(root)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return name


def tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.fixture(autouse=True)
def _fresh_memory_store() -> Iterator[None]:
    from fsspec.implementations.memory import MemoryFileSystem

    yield
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_round_trip_gives_the_same_files_and_manifest(storage: str, tmp_path: Path) -> None:
    name = make_demo("d", storage)
    pushed = push(name, "memory://bucket/ds/d")
    assert (pushed.uploaded, pushed.skipped, pushed.up_to_date) == (pushed.files, 0, False)
    other = CacheRoot(tmp_path / "other")
    pulled = pull("memory://bucket/ds/d", root=other)
    assert pulled.name == "d" and pulled.digests_checked and pulled.downloaded == pushed.files
    # byte for byte: every array file, the episode index and the manifest
    assert tree(other.dataset_dir("d")) == tree(CacheRoot().dataset_dir("d"))
    assert not list(other.tmp_dir.iterdir())  # the build directory became the dataset
    # nothing left to do either way
    assert push(name, "memory://bucket/ds/d").up_to_date
    assert pull("memory://bucket/ds/d", root=other).up_to_date


def test_pull_under_another_name_renames_only_the_manifest_name(tmp_path: Path) -> None:
    from rlds_cli import open_dataset

    make_demo("d", "memmap")
    push("d", f"file://{tmp_path}/bucket/d")
    result = runner.invoke(app, ["pull", f"file://{tmp_path}/bucket/d", "--name", "copy", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "copy"
    a, b = open_dataset("d"), open_dataset("copy")
    assert b.manifest.name == "copy" and b.manifest.content_digest == a.manifest.content_digest
    for key in a.manifest.fields:
        np.testing.assert_array_equal(np.asarray(a.column(key)), np.asarray(b.column(key)))
    again = runner.invoke(app, ["pull", f"file://{tmp_path}/bucket/d", "--name", "d"])
    assert again.exit_code == 0 and "already holds this version" in again.stdout


@pytest.mark.parametrize("damage", ["cut short", "removed"])
def test_a_pull_over_a_damaged_copy_of_the_same_version_says_so(tmp_path: Path, damage: str) -> None:
    """The cache's copy of the pushed version lost a file or its end: the pull said "the cache
    already holds this version" (exit 0), so the hints' "restore it with rlds pull" did nothing.
    It names the file and says --force pulls it again, which mends the copy."""
    from rlds_cli import open_dataset
    from rlds_cli.cache.backends.base import key_path

    make_demo("d", "memmap")
    url = f"file://{tmp_path}/bucket/d"
    push("d", url)
    column = key_path(CacheRoot().dataset_dir("d"), "action", ".npy")
    if damage == "cut short":
        column.write_bytes(column.read_bytes()[:-8])
    else:
        column.unlink()
    result = runner.invoke(app, ["pull", url])
    assert result.exit_code == 1, result.output
    found = "is missing" if damage == "removed" else "holds"
    assert f"is the version at {url}, but its file arrays/action.npy {found}" in result.output
    assert "pass --force to pull it again" in result.output
    result = runner.invoke(app, ["pull", url, "--force"])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["verify", "d"]).exit_code == 0
    assert np.asarray(open_dataset("d").column("action")).shape[0] > 0
    again = runner.invoke(app, ["pull", url])
    assert again.exit_code == 0 and "'rlds verify d' checks their content" in again.stdout


@pytest.mark.parametrize("command", ["push", "pull"])
def test_a_local_url_below_a_file_is_one_line(tmp_path: Path, command: str) -> None:
    """The store's NotADirectoryError was shown as it was, with a hint about endpoints and
    credentials, for a local path."""
    make_demo("d", "memmap")
    (tmp_path / "afile").write_bytes(b"x")
    url = f"file://{tmp_path}/afile/d"
    result = runner.invoke(app, ["push", "d", url] if command == "push" else ["pull", url])
    assert result.exit_code == 1, result.output
    assert f"error: {url}: a part of the path is a file, not a folder" in result.stderr
    assert "credentials" not in result.output and (tmp_path / "afile").read_bytes() == b"x"


def test_a_push_over_another_dataset_or_version_says_which(tmp_path: Path) -> None:
    """The refusal says whether the URL holds another version of the dataset pushed, or
    another dataset (it called both 'another version')."""
    make_demo("a", "memmap")
    push("a", "memory://bucket/same")
    CacheRoot().remove("a")
    make_demo("a", "zarr")
    with pytest.raises(RemoteExistsError, match="holds another version of dataset 'a'"):
        push("a", "memory://bucket/same")
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/bucket/same/manifest.json", b"[1]")  # damaged: not a JSON object
    with pytest.raises(RemoteExistsError, match=r"holds a dataset \(its manifest is unreadable\)"):
        push("a", "memory://bucket/same")


def test_push_over_another_version_needs_force_and_removes_the_manifest_first(tmp_path: Path) -> None:
    make_demo("a", "memmap")
    make_demo("b", "zarr")
    url = "memory://bucket/x"
    push("a", url)
    with pytest.raises(RemoteExistsError, match="another dataset, 'a'"):
        push("b", url)
    fs = fsspec.filesystem("memory")
    events: list[str] = []
    real_upload, real_put, real_rm = push_module._upload_file, push_module._put_bytes, fs.rm_file

    def upload(fs_: Any, source: Path, target: str, *args: Any) -> None:
        events.append(f"upload {target.rsplit('/x/', 1)[1]} manifest={fs.exists('/bucket/x/manifest.json')}")
        real_upload(fs_, source, target, *args)

    def put(fs_: Any, target: str, data: bytes) -> None:
        events.append(f"put {target.rsplit('/x/', 1)[1]}")
        real_put(fs_, target, data)

    def rm(path: str) -> None:
        events.append(f"rm {path.rsplit('/x/', 1)[1]}")
        real_rm(path)

    mp = pytest.MonkeyPatch()
    with mp.context() as m:
        m.setattr(push_module, "_upload_file", upload)
        m.setattr(push_module, "_put_bytes", put)
        m.setattr(type(fs), "rm_file", lambda self, path: rm(path))
        result = push("b", url, force=True)
    assert result.replaced
    assert events[:2] == ["rm manifest.json", "rm rlds-files.json"]
    uploads = [e for e in events if e.startswith("upload")]
    assert uploads and all(e.endswith("manifest=False") for e in uploads)
    # the old version's files that the new one lacks are gone, before the commit
    removed = [i for i, e in enumerate(events) if e.startswith("rm arrays")]
    puts = [i for i, e in enumerate(events) if e.startswith("put")]
    assert removed and [events[i] for i in puts] == ["put rlds-files.json", "put manifest.json"]
    assert max(removed) < puts[0] and events.index(uploads[-1]) < puts[0]
    pulled = pull(url, root=tmp_path / "other")
    assert pulled.name == "b" and pulled.backend == "zarr"
    assert not [p for p in fs.find("/bucket/x") if p.endswith(".npy") and "/arrays/" in p]


def test_a_dataset_rebuilt_during_its_push_is_not_committed() -> None:
    from rlds_cli.errors import DatasetReplacedError

    make_demo("d", "memmap")
    real = push_module._upload_file
    calls = [0]

    def upload(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:  # rebuilt as zarr between two files: the .npy files are gone
            result = runner.invoke(app, ["download", "demo", "--storage", "zarr", "-n", "d", "-f", "-q"])
            assert result.exit_code == 0, result.output
        real(*args)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(push_module, "_upload_file", upload)
        with pytest.raises(DatasetReplacedError, match="disappeared during the push"):
            push("d", "memory://bucket/d")
    assert not fsspec.filesystem("memory").exists("/bucket/d/manifest.json")
    assert push("d", "memory://bucket/d").backend == "zarr"  # the new version, whole


def test_a_view_is_refused_with_what_to_do() -> None:
    make_demo("d", "memmap")
    assert runner.invoke(app, ["view", "d", "-e", "0:3", "-n", "v", "-q"]).exit_code == 0
    with pytest.raises(NotPushableError, match="is a view of 'd'") as info:
        push("v", "memory://bucket/v")
    assert "rlds push d URL" in info.value.hint
    assert not fsspec.filesystem("memory").exists("/bucket/v")


# --------------------------------------------------------------------------- kills


def _write_counter(kill_at: int) -> tuple[Any, Any]:
    """``_upload_file`` and ``_put_bytes`` that end the process before the ``kill_at``-th write."""
    count = [0]
    real_upload, real_put = push_module._upload_file, push_module._put_bytes

    def tick() -> None:
        count[0] += 1
        if count[0] == kill_at:
            os._exit(faults.KILLED)

    def upload(*args: Any) -> None:
        tick()
        real_upload(*args)

    def put(*args: Any) -> None:
        tick()
        real_put(*args)

    return upload, put


def test_a_push_killed_before_any_write_leaves_no_manifest_and_resumes(tmp_path: Path) -> None:
    name = make_demo("d", "memmap")
    files = len([p for p in CacheRoot().dataset_dir(name).rglob("*") if p.is_file()]) - 1
    writes = files + 2  # every file, the index, the manifest
    for k in range(1, writes + 1):
        remote = tmp_path / f"remote{k}"
        url = f"file://{remote}"

        def killed(k: int = k, url: str = url) -> None:
            upload, put = _write_counter(k)
            push_module._upload_file, push_module._put_bytes = upload, put
            push(name, url)

        code, report = faults._fork(killed, None)
        assert code == faults.KILLED, report
        assert not (remote / "manifest.json").exists(), f"a manifest after a kill before write {k}"
        resumed = push(name, url)
        assert resumed.skipped == min(k - 1, files) and resumed.uploaded == files - resumed.skipped, k
        assert (remote / "manifest.json").is_file()
    pulled = pull(url, root=tmp_path / "other")
    assert tree(Path(pulled.path)) == tree(CacheRoot().dataset_dir(name))


def grow(name: str, episodes: int, seed: int, storage: str = "zarr") -> None:
    import rlds_cli

    rng = np.random.default_rng(seed)
    with rlds_cli.DatasetWriter(name, mode="append", storage=storage) as writer:
        for _ in range(episodes):
            obs = rng.standard_normal((21, 4)).astype(np.float32)
            writer.add_episode({
                "observation": obs[:-1], "next/observation": obs[1:],
                "action": rng.standard_normal((20, 2)).astype(np.float32),
                "next/reward": rng.standard_normal(20).astype(np.float32),
                "next/terminated": np.eye(20, dtype=bool)[-1], "next/truncated": np.zeros(20, bool),
            })  # fmt: skip


def test_a_grown_dataset_pushed_again_is_never_seen_half_written_and_pulls_again(tmp_path: Path) -> None:
    """A growing dataset keeps its manifest as it grows: its second push writes its log again over
    the pushed one. The pushed manifest goes first, so a push killed at any write leaves the URL
    without one (a push under way), never a manifest over a log of another push; and a pull of the
    grown dataset is no 'already holds this version'."""
    grow("g", 3, 0)
    url = f"file://{tmp_path / 'store' / 'g'}"
    push("g", url)
    other = CacheRoot(tmp_path / "o")
    assert pull(url, root=other).downloaded
    assert open_dataset("g", other).num_steps == 60  # a reader may leave files of its own there
    assert pull(url, root=other).up_to_date
    grow("g", 2, 1)
    writes = 0
    for k in range(1, 40):

        def killed(k: int = k) -> None:
            upload, put = _write_counter(k)
            push_module._upload_file, push_module._put_bytes = upload, put
            push("g", url)

        code, _ = faults._fork(killed, None)
        if code != faults.KILLED:  # the push finished before its k-th write
            writes = k - 1
            break
        manifest = tmp_path / "store" / "g" / "manifest.json"
        if manifest.exists():  # still the first push, whole
            assert pull(url, root=tmp_path / f"p{k}").downloaded
        else:
            with pytest.raises(RemoteDatasetNotFoundError):
                pull(url, root=tmp_path / f"p{k}")
    assert writes > 2
    with pytest.raises(DatasetExistsError, match="'g' already exists") as info:
        pull(url, root=other)  # another version of 'g': not 'up to date'
    assert "--force" in info.value.hint
    assert pull(url, root=other, force=True).replaced
    assert open_dataset("g", other).num_steps == 100 == open_dataset("g").num_steps


def test_a_pull_killed_at_every_step_shows_nothing_and_resumes(tmp_path: Path) -> None:
    name = make_demo("d", "memmap")
    url = f"file://{tmp_path}/remote/d"
    push(name, url)
    other = CacheRoot(tmp_path / "other")

    def operation() -> None:
        pull(url, root=other)

    steps = faults.count_steps(operation)
    assert steps > 20
    CacheRoot(other.path).remove("d")
    resumed_with_files = 0
    for k in range(1, steps + 1):
        if faults.kill_at(operation, k) is None:
            break
        assert not other.exists("d") and not list(other.iter_manifests()), k
        listed = runner.invoke(app, ["list", "--root", str(other.path), "-q"])
        assert listed.stdout == "", k
        result = pull(url, root=other)
        resumed_with_files += result.skipped > 0
        assert result.downloaded + result.skipped == result.files and other.exists("d")
        other.remove("d")
    assert resumed_with_files > 10  # most kills left verified files that were kept
    final = pull(url, root=other)
    assert tree(Path(final.path)) == tree(CacheRoot().dataset_dir(name))
    # a kept file damaged on this disk was blamed on the store ("push the dataset again")
    other.remove("d")
    for k in range(1, steps + 1):  # the first kill that kept a file
        assert faults.kill_at(operation, k) is not None, k
        if list(other.tmp_dir.rglob("*.npy")):
            break
    kept = sorted(other.tmp_dir.rglob("*.npy"))[0]
    data = bytearray(kept.read_bytes())
    data[-1] ^= 0x01
    kept.write_bytes(bytes(data))
    again = pull(url, root=other)
    assert again.downloaded >= 1 and tree(Path(again.path)) == tree(CacheRoot().dataset_dir(name))


# --------------------------------------------------------------------------- corruption


def test_a_changed_remote_byte_is_refused_naming_the_key(tmp_path: Path) -> None:
    make_demo("d", "memmap")
    store = tmp_path / "bucket" / "d"  # a file:// store: the CLI refuses memory:// (one process)
    url = f"file://{store}"
    push("d", url)
    fs = fsspec.filesystem("file")
    path = f"{store}/arrays/info/qpos.npy"
    data = bytearray(fs.cat_file(path))
    data[-3] ^= 0x01
    fs.pipe_file(path, bytes(data))
    other = CacheRoot(tmp_path / "other")
    result = runner.invoke(app, ["pull", url, "--root", str(other.path)])
    assert result.exit_code == 1
    line = " ".join(result.stderr.split())
    assert f"{url}/arrays/info/qpos.npy (key info/qpos) differs from the file pushed" in line
    assert "Traceback" not in result.output and not other.exists("d")

    # an index edited to match is still caught: the content digests are recomputed
    index = json.loads(fs.cat_file(f"{store}/rlds-files.json"))
    index["files"]["arrays/info/qpos.npy"]["sha256"] = pull_module.store.hashlib.sha256(data).hexdigest()
    fs.pipe_file(f"{store}/rlds-files.json", pull_module.store.index_bytes(index))
    with pytest.raises(RemoteCorruptError, match="content digest of info/qpos: content changed"):
        pull(url, root=other)
    assert not other.exists("d")


def test_index_and_manifest_of_different_pushes_are_refused(tmp_path: Path) -> None:
    make_demo("d", "memmap")
    push("d", "memory://bucket/d")
    fs = fsspec.filesystem("memory")
    index = json.loads(fs.cat_file("/bucket/d/rlds-files.json"))
    index["manifest_sha256"] = "0" * 64
    fs.pipe_file("/bucket/d/rlds-files.json", pull_module.store.index_bytes(index))
    with pytest.raises(RemoteCorruptError, match="belong to different pushes"):
        pull("memory://bucket/d", root=tmp_path / "o")
    index["manifest_sha256"] = "x"
    index["files"]["../../evil"] = {"size": 1, "sha256": "0"}
    fs.pipe_file("/bucket/d/rlds-files.json", pull_module.store.index_bytes(index))
    with pytest.raises(RemoteCorruptError, match="no safe path"):
        pull("memory://bucket/d", root=tmp_path / "o")
    fs.pipe_file("/bucket/d/manifest.json", b"{not json")
    with pytest.raises(RemoteCorruptError, match=r"cannot read manifest memory://bucket/d/manifest") as i:
        pull("memory://bucket/d", root=tmp_path / "o")
    assert "rlds push" in i.value.hint
    assert not CacheRoot(tmp_path / "o").exists("d")


def test_pull_refuses_to_replace_another_dataset_without_force(tmp_path: Path) -> None:
    make_demo("d", "memmap")
    make_demo("e", "zarr")
    push("d", "memory://bucket/d")
    with pytest.raises(DatasetExistsError, match="'e' already exists"):
        pull("memory://bucket/d", name="e")
    assert pull("memory://bucket/d", name="e", force=True).replaced


def _flip(path: Path, offset: int = -3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_push_force_mends_a_file_damaged_on_the_store(tmp_path: Path) -> None:
    """The hint of a damaged store ('push again from a good copy: rlds push NAME URL --force')
    works: --force uploads every file of the same version again."""
    make_demo("d", "memmap")
    url = f"file://{tmp_path / 'bucket' / 'd'}"
    push("d", url)
    _flip(tmp_path / "bucket" / "d" / "arrays" / "action.npy")
    with pytest.raises(RemoteCorruptError) as info:
        pull(url, root=tmp_path / "o")
    assert "rlds push NAME URL --force" in info.value.hint
    assert push("d", url).up_to_date  # without --force the same version is left as it is
    mended = push("d", url, force=True)
    assert mended.uploaded == mended.files and not mended.replaced
    assert pull(url, root=tmp_path / "o").digests_checked


@pytest.mark.parametrize("kind", ["memmap", "zarr", "growing"])
def test_a_damaged_dataset_is_never_pushed(kind: str, tmp_path: Path) -> None:
    """Damaged local bytes are refused before anything is uploaded: pushed with fresh sha256s they
    verified on the store, and a re-push of the same version replaced the good copy there."""
    if kind == "growing":
        # memmap: a byte in the middle of a file is data (a zarr chunk of 1,024 rows holding 63
        # encodes fill past the array's end, where a flipped byte changes no value read)
        grow("d", 3, 0, storage="memmap")
        damaged = sorted(CacheRoot().dataset_dir("d").glob("segments/*/arrays/observation*"))[0]
    else:
        make_demo("d", kind)
        damaged = sorted(p for p in (CacheRoot().dataset_dir("d") / "arrays").rglob("*") if p.is_file()
                         and "observation" in p.as_posix() and not p.name.endswith(".json"))[0]  # fmt: skip
    good = tmp_path / "store" / "good"
    push("d", f"file://{good}")
    before = tree(good)
    if damaged.is_dir():
        damaged = sorted(q for q in damaged.rglob("*") if q.is_file() and not q.name.endswith(".json"))[0]
    _flip(damaged, len(damaged.read_bytes()) // 2)
    for target in (good, tmp_path / "store" / "new"):
        with pytest.raises(CorruptDatasetError, match="dataset 'd' is damaged: 'observation'") as info:
            push("d", f"file://{target}", force=True)
        # a growing dataset is checked through a snapshot, gone once the push ends: never named
        assert (
            "snapshot" not in info.value.message and str(CacheRoot().dataset_dir("d")) in info.value.message
        )
    assert tree(good) == before  # the good copy is whole
    assert not (tmp_path / "store" / "new").exists()  # nothing was written
    assert pull(f"file://{good}", root=tmp_path / "o").digests_checked
    result = runner.invoke(app, ["push", "d", f"file://{tmp_path / 'store' / 'cli'}"])
    assert result.exit_code == 1 and "dataset 'd' is damaged" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "store" / "cli").exists()


def test_a_replacing_push_taken_up_after_a_kill_removes_the_replaced_versions_files(tmp_path: Path) -> None:
    """A push that replaces a version removes the old manifest first; killed after that, the push
    run again did not know the old version's files (no committed index), left them on the store
    beside the new version for good, and a later push of a growing dataset refused the URL for
    them ("files no push wrote"). The journal holds them: the run taken up removes them."""
    make_demo("d", "zarr")
    url = f"file://{tmp_path}/bucket/d"
    push("d", url)
    assert runner.invoke(app, ["rm", "d", "--yes"]).exit_code == 0
    make_demo("d", "memmap")  # another version: other files

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # after the old manifest's removal, at the first upload

    push_module._upload_file, saved = killed, push_module._upload_file
    try:
        with pytest.raises(KeyboardInterrupt):
            push("d", url, force=True)
    finally:
        push_module._upload_file = saved
    assert not (tmp_path / "bucket" / "d" / "manifest.json").exists()
    push("d", url, force=True)
    stored = set(tree(tmp_path / "bucket" / "d"))
    assert stored == set(tree(CacheRoot().dataset_dir("d"))) | {"rlds-files.json"}
    other = CacheRoot(tmp_path / "other")
    assert pull(url, root=other).name == "d"


def test_a_folder_holding_files_no_push_wrote_is_not_pushed_over(tmp_path: Path) -> None:
    """A URL without a manifest whose files no push wrote is someone else's folder: the push wrote
    over its ``arrays/action.npy``, exit 0."""
    make_demo("d", "memmap")
    folder = tmp_path / "project"
    (folder / "arrays").mkdir(parents=True)
    (folder / "arrays" / "action.npy").write_bytes(b"precious")
    (folder / "main.py").write_text("print()\n")
    with pytest.raises(RemoteExistsError, match=r"holds 2 file\(s\) where the push goes that no push wrote"):
        push("d", f"file://{folder}")
    assert (folder / "arrays" / "action.npy").read_bytes() == b"precious"
    assert not (folder / "manifest.json").exists()
    # a push killed before its manifest is taken up again: its files are in the journal
    upload, _ = _write_counter(3)
    push_module._upload_file, saved = upload, push_module._upload_file
    code, _ = faults._fork(lambda: push("d", f"file://{tmp_path / 'mine'}"), None)
    push_module._upload_file = saved
    assert code == faults.KILLED and not (tmp_path / "mine" / "manifest.json").exists()
    assert push("d", f"file://{tmp_path / 'mine'}").skipped >= 2

    # killed in the middle of a file (half of it at its final name): its own, taken up again
    def half_then_die(fs: Any, source: Path, target: str, entry: Any, progress: Any) -> None:
        with fs.open(target, "wb") as f:
            f.write(source.read_bytes()[: entry.size // 2])
        os._exit(faults.KILLED)

    push_module._upload_file, saved = half_then_die, push_module._upload_file
    code, _ = faults._fork(lambda: push("d", f"file://{tmp_path / 'half'}"), None)
    push_module._upload_file = saved
    assert code == faults.KILLED
    assert push("d", f"file://{tmp_path / 'half'}").uploaded  # not "files no push wrote"
    assert pull(f"file://{tmp_path / 'half'}", root=tmp_path / "h").digests_checked
    assert push("d", f"file://{folder}", force=True).uploaded
    assert (folder / "main.py").exists() and pull(f"file://{folder}", root=tmp_path / "o").digests_checked


def test_a_file_written_since_by_another_push_is_uploaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push taken up again skipped a file the store had at the size its journal recorded,
    though another push (from another cache) had written the path since: it committed the other
    push's bytes under its own index, and said it had pushed."""
    make_demo("d", "memmap")
    url = f"file://{tmp_path / 's'}"

    def killed(fs: Any, target: str, data: bytes) -> None:  # before the index: every file is up
        raise KeyboardInterrupt

    saved = push_module._put_bytes
    monkeypatch.setattr(push_module, "_put_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        push("d", url)
    monkeypatch.setattr(push_module, "_put_bytes", saved)
    theirs = tmp_path / "s" / "arrays" / "action.npy"
    _flip(theirs)  # another push's bytes: the same size
    result = push("d", url)
    assert result.uploaded == 1 and result.skipped >= 3
    assert pull(url, root=tmp_path / "o").digests_checked


def _another_push_lands_first(monkeypatch: pytest.MonkeyPatch, name: str, url: str, root: Path) -> None:
    """The next push's first upload waits for a whole push of ``name`` from ``root`` to ``url``
    (another machine's, committed while this one runs); later uploads run as they are."""
    real = push_module._upload_file
    done: list[bool] = []

    def other_push_lands(*args: Any, **kwargs: Any) -> None:
        if not done:
            done.append(True)
            monkeypatch.setattr(push_module, "_upload_file", real)
            push(name, url, root=root)
        real(*args, **kwargs)

    monkeypatch.setattr(push_module, "_upload_file", other_push_lands)


def test_a_version_committed_by_another_push_meanwhile_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object stores have no lock: a push from another machine that commits while this one uploads
    is found before this one commits (both said 'pushed'; the last won, without --force)."""
    make_demo("a", "memmap")
    make_demo("b", "zarr", root=tmp_path / "elsewhere")
    url = f"file://{tmp_path / 'store' / 'd'}"
    _another_push_lands_first(monkeypatch, "b", url, tmp_path / "elsewhere")
    with pytest.raises(RemoteExistsError, match="another push committed a version"):
        push("a", url)
    assert pull(url, root=tmp_path / "o").name == "b"  # the other push's version, whole


def test_a_push_that_wrote_over_a_version_committed_meanwhile_leaves_no_mix_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two versions of one layout and file sizes: the other push committed after this one's check
    and before its uploads, which then wrote over the committed files. The URL served the other
    version's manifest over this push's bytes (a gather read them, exit 0), and this push said
    'nothing was committed'."""
    from tests.loader_fixtures import make_ted

    mine, theirs, same = tmp_path / "mine", tmp_path / "theirs", tmp_path / "same"
    for folder in (mine, theirs, same):
        folder.mkdir()
    make_ted(mine, "d", [3, 4, 5])
    make_ted(theirs, "d", [5, 4, 3])  # the same files and sizes, other values
    url = f"file://{tmp_path / 'store' / 'd'}"
    _another_push_lands_first(monkeypatch, "d", url, theirs)
    with pytest.raises(RemoteExistsError, match=r"which had written over \d+ of its files") as info:
        push("d", url, root=mine)
    assert "the URL holds no version now" in info.value.message
    with pytest.raises(RemoteDatasetNotFoundError):
        rlds_cli.open_dataset(url)
    assert push("d", url, root=theirs, force=True).uploaded
    assert pull(url, root=tmp_path / "o").digests_checked
    np.testing.assert_array_equal(
        open_dataset("d", tmp_path / "o")[:]["observation"], open_dataset("d", theirs)[:]["observation"]
    )

    # the same bytes pushed meanwhile: nothing of the other version was changed, it stays
    make_ted(same, "d", [3, 4, 5])
    url2 = f"file://{tmp_path / 'store2' / 'd'}"
    _another_push_lands_first(monkeypatch, "d", url2, same)
    with pytest.raises(RemoteExistsError, match="nothing was committed"):
        push("d", url2, root=mine)
    assert pull(url2, root=tmp_path / "o2").digests_checked


def test_a_pull_during_a_push_force_says_replaced_not_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version replaced under a pull was reported as damage, with the hint to push again."""
    make_demo("a", "memmap")
    make_demo("b", "zarr", root=tmp_path / "elsewhere")
    url = f"file://{tmp_path / 'store' / 'd'}"
    push("a", url)
    real = pull_module._download_file
    done = []

    def replaced_meanwhile(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        if not done:
            done.append(True)
            push("b", url, root=tmp_path / "elsewhere", force=True)

    monkeypatch.setattr(pull_module, "_download_file", replaced_meanwhile)
    with pytest.raises(DatasetReplacedError, match=r"replaced .* during the pull") as info:
        pull(url, root=tmp_path / "o")
    assert info.value.hint == "run the pull again"
    monkeypatch.setattr(pull_module, "_download_file", real)
    assert pull(url, root=tmp_path / "o").name == "b"


def test_pull_force_mends_a_damaged_local_copy(tmp_path: Path) -> None:
    make_demo("d", "zarr")
    url = f"file://{tmp_path / 'bucket' / 'd'}"
    push("d", url)
    other = CacheRoot(tmp_path / "o")
    pull(url, root=other)
    _flip(other.dataset_dir("d") / "arrays" / "action" / "c" / "0" / "0")
    verified = runner.invoke(app, ["verify", "d", "--root", str(other.path)])
    assert verified.exit_code == 1, verified.output
    assert pull(url, root=other).up_to_date  # without --force a pulled version is taken as it is
    assert pull(url, root=other, force=True).replaced
    verified = runner.invoke(app, ["verify", "d", "--root", str(other.path)])
    assert verified.exit_code == 0, verified.output


def test_a_push_into_the_cache_is_refused_and_leaves_the_dataset_whole(tmp_path: Path) -> None:
    make_demo("d", "memmap")
    cache = CacheRoot()
    before = tree(cache.dataset_dir("d"))
    for target in (
        cache.dataset_dir("d"),
        cache.path,
        cache.datasets_dir / "store",
        cache.layout.raw_dir / "d",
    ):
        for url in (f"file://{target}", str(target)):
            result = runner.invoke(app, ["push", "d", url])
            assert result.exit_code == 1, result.output
            line = result.stderr.splitlines()[0]
            assert line.startswith(f"error: {url} ") and "would write over its files" in line, line
            assert "outside the cache" in result.stderr
    assert tree(cache.dataset_dir("d")) == before
    assert runner.invoke(app, ["verify", "d"]).exit_code == 0


def test_an_export_into_the_cache_or_to_a_url_is_refused(tmp_path: Path) -> None:
    make_demo("d", "memmap")
    cache = CacheRoot()
    before = tree(cache.dataset_dir("d"))
    inside = cache.dataset_dir("d")
    for out, to in (
        (cache.path, "torchrl"),  # --force would have removed every dataset
        (inside, "torchrl"),
        (inside / "arrays" / "action.npy", "npz"),
        (cache.path.parent, "torchrl"),  # holds the cache
        (cache.datasets_dir / "e", "torchrl"),
        (cache.tmp_dir, "torchrl"),
    ):
        result = runner.invoke(app, ["export", "d", str(out), "--to", to, "--force"])
        assert result.exit_code == 1, result.output
        assert "the export would write over or remove its files" in result.stderr.splitlines()[0]
    assert tree(inside) == before and runner.invoke(app, ["verify", "d"]).exit_code == 0
    mine = cache.path / "exports" / "d"  # a folder of the user's beside the cache's own
    assert runner.invoke(app, ["export", "d", str(mine), "--to", "npz"]).exit_code == 0
    assert runner.invoke(app, ["verify", "d"]).exit_code == 0
    for url in ("s3://bucket/exp", "file:///tmp/exp"):
        result = runner.invoke(app, ["export", "d", url, "--to", "npz"])
        assert result.exit_code == 1 and f"error: {url} is a URL" in result.stderr, result.output
    assert not Path("s3:").exists() and not Path("file:").exists()


# --------------------------------------------------------------------------- errors


def test_errors_are_one_line_with_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_demo("d", "memmap")
    store = f"file://{tmp_path}/b/d"
    gone = "a memory:// store lives inside one process and is gone when this command exits"
    cases = [
        (["pull", f"file://{tmp_path}/nothing"], "holds no manifest.json: it is not an rlds dataset"),
        # a filesystem that connects when it is made (nothing listens on port 1)
        (["push", "d", "ftp://127.0.0.1:1/d"], "cannot reach ftp://127.0.0.1:1/d: "),
        (["preprocess", "d", "--fn", "tests.preprocess_fns:identity", "-n", "memory://b/o"], gone),
        (["push", "d", "nope://bucket/d"], "cannot open nope://bucket/d: Protocol not known"),
        (["push", "d", store, "--storage-option", "novalue"], "is not KEY=VALUE"),
        (["push", "nosuch", store], "no dataset named 'nosuch'"),
        # the CLI's process ends with the command: a push there would report success into nothing
        (["push", "d", "memory://b/d"], f"memory://b/d: {gone}"),
        (["pull", "memory://b/d"], f"memory://b/d: {gone}"),
    ]
    push("d", f"{store}2")
    cases[:0] = [
        (["pull", ""], "the URL is empty"),  # was "error:  holds no manifest.json"
        (["push", "d", " "], "the URL is empty"),
        (["pull", f"{store}2", "--name", ""], "invalid dataset name ''"),  # took the pushed name
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert message in " ".join(result.stderr.split()), (args, result.stderr)
        assert "Traceback" not in result.output and "unexpected" not in result.stderr
    assert "file:///DIR/NAME, s3://bucket/prefix/NAME" in " ".join(result.stderr.split())  # what works
    # an object store keeps '..' as a folder's name: 'a/../d' was pushed as such
    with pytest.raises(RemoteAccessError, match=r"memory://b/a/\.\./d: the path has a '\.' or '\.\.' part"):
        push("d", "memory://b/a/../d")
    monkeypatch.setitem(sys.modules, "fsspec", None)  # the extra is not installed
    result = runner.invoke(app, ["push", "d", store])
    assert result.exit_code == 1
    assert "needs fsspec, which is not installed" in result.stderr and "rlds-cli[remote]" in result.stderr


def test_a_missing_protocol_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    make_demo("d", "memmap")
    monkeypatch.setitem(sys.modules, "s3fs", None)
    # fsspec keeps each protocol's class once imported (an earlier test in this process may have
    # used s3://): forget it, so the import is tried again and fails
    import fsspec.registry  # noqa: F401 (the module; fsspec.registry is also a mapping's name)

    for protocol in ("s3", "s3a"):
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, protocol, raising=False)
    with pytest.raises(MissingExtraError, match="s3fs") as info:
        push("d", "s3://bucket/d")
    assert "rlds-cli[remote]" in info.value.hint


# --------------------------------------------------------------------------- a local S3 server


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    pytest.importorskip("s3fs")
    server_module = pytest.importorskip("moto.server")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_env(endpoint: str, **extra: str) -> dict[str, str]:
    """Dummy credentials, the local endpoint, and no lookup of the EC2 metadata service (it
    is not on loopback) or of the user's own AWS files."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
        **extra,
    }


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    """An S3 filesystem on the local server, with a fresh bucket for this test."""
    import s3fs

    for key, value in s3_env(moto_endpoint).items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    bucket = "b" + str(abs(hash(request.node.name)) % 10**9)
    fs.mkdir(bucket)
    fs.bucket = bucket  # type: ignore[attr-defined]
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full.update(env, PYTHONPATH=str(REPO), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "rlds_cli.cli.app", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_s3_round_trip_through_the_cli(s3: Any, moto_endpoint: str, isolated_cache: Path) -> None:
    make_demo("d", "memmap")
    url = f"s3://{s3.bucket}/rlds/d"
    env = s3_env(moto_endpoint, RLDS_HOME=str(isolated_cache), RLDS_FSYNC="0")
    pushed = run_cli(["push", "d", url, "--json"], env)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["uploaded"] == 9
    env["RLDS_HOME"] = str(isolated_cache.parent / "other")
    pulled = run_cli(["pull", url, "-q"], env)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout == "d\n"
    assert tree(CacheRoot(env["RLDS_HOME"]).dataset_dir("d")) == tree(CacheRoot().dataset_dir("d"))


def test_s3_zarr_round_trip_and_a_killed_push(s3: Any, moto_endpoint: str, isolated_cache: Path) -> None:
    name = make_demo("z", "zarr")
    url = f"s3://{s3.bucket}/rlds/z"
    env = s3_env(moto_endpoint, RLDS_HOME=str(isolated_cache), RLDS_FSYNC="0")
    # a push process SIGKILLed before its 12th write (the 12th of the 20 files)
    script = textwrap.dedent(
        f"""
        import os, signal
        import rlds_cli.remote.push as p
        count = [0]
        real = p._upload_file
        def upload(*args):
            count[0] += 1
            if count[0] == 12:
                os.kill(os.getpid(), signal.SIGKILL)
            real(*args)
        p._upload_file = upload
        p.push({name!r}, {url!r})
        """
    )
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full.update(env, PYTHONPATH=str(REPO))
    killed = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    s3.invalidate_cache()
    assert not s3.exists(f"{s3.bucket}/rlds/z/manifest.json")
    assert len(s3.find(f"{s3.bucket}/rlds/z")) == 11
    with pytest.raises(RemoteDatasetNotFoundError, match="push to it is still in progress"):
        pull(url, root=isolated_cache.parent / "other")
    resumed = push(name, url)
    assert (resumed.skipped, resumed.uploaded) == (11, 9)
    pulled = pull(url, root=isolated_cache.parent / "other")
    assert pulled.digests_checked
    assert tree(Path(pulled.path)) == tree(CacheRoot().dataset_dir(name))


def test_s3_errors(s3: Any, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    make_demo("d", "memmap")
    result = runner.invoke(app, ["push", "d", "s3://no-such-bucket/d"])
    assert result.exit_code == 1
    assert "s3://no-such-bucket/d: not found (The specified bucket does not exist)" in result.stderr
    result = runner.invoke(app, ["pull", f"s3://{s3.bucket}/none"])
    assert result.exit_code == 1 and "holds no manifest.json" in result.stderr
    # --endpoint-url wins over AWS_ENDPOINT_URL; nothing listens on port 9 of loopback
    s3fs.S3FileSystem.clear_instance_cache()
    result = runner.invoke(
        app,
        [
            "pull",
            "s3://b/x",
            "--endpoint-url",
            "http://127.0.0.1:9",
            "--storage-option",
            'config_kwargs={"retries": {"max_attempts": 1}}',
        ],
    )
    assert result.exit_code == 1 and "cannot reach the store" in " ".join(result.stderr.split())
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    s3fs.S3FileSystem.clear_instance_cache()
    result = runner.invoke(app, ["push", "d", f"s3://{s3.bucket}/d"])
    assert result.exit_code == 1, result.output
    assert "no credentials found" in result.stderr and "AWS_ACCESS_KEY_ID" in result.stderr


def test_offline_mode_refuses_every_store_that_needs_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RLDS_OFFLINE=1: a pull or push of hf://, s3:// (or a chained URL over one) is one line
    before anything is sent (``rlds pull hf://...`` went to the Hub); file:// still works."""
    from rlds_cli.errors import OfflineError

    make_demo("d", "memmap")
    monkeypatch.setenv("RLDS_OFFLINE", "1")
    cases = [
        ["pull", "hf://datasets/org/repo/d"],
        ["push", "d", "hf://datasets/org/repo/d"],
        ["push", "d", "s3://bucket/d"],
        ["pull", "simplecache::s3://bucket/d"],
        ["export", "d", "hf://datasets/org/repo/lr", "--to", "lerobot"],
    ]
    for args in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith("error: ") and first.endswith(
            "needs the network, and offline mode is on (RLDS_OFFLINE)"
        )
        assert "unset RLDS_OFFLINE" in result.stderr and "Traceback" not in result.output
    with pytest.raises(OfflineError, match="hf://datasets/org/repo/d needs the network"):
        pull("hf://datasets/org/repo/d")
    assert push("d", f"file://{tmp_path}/bucket/d").uploaded > 0  # local stores need no network
    assert pull(f"file://{tmp_path}/bucket/d", name="d2").downloaded > 0


class _BucketStore:
    """An fsspec-like store with no files, whose buckets are ``buckets``."""

    def __init__(self, protocol: Any, buckets: set[str]) -> None:
        self.protocol, self.buckets = protocol, buckets

    def cat_file(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    def exists(self, path: str) -> bool:
        return path in self.buckets


@pytest.mark.parametrize("protocol", ["s3", ("s3", "s3a"), "gs", ("gs", "gcs"), ("gcs", "gs")])
def test_a_missing_bucket_is_told_from_a_missing_file(protocol: Any) -> None:
    """A file missing from a bucket that exists reads as absent; a missing bucket is an error, for
    every spelling of the protocol the fsspec implementations use (gcsfs says ``("gs", "gcs")``)."""
    from rlds_cli.remote.store import read_bytes

    assert read_bytes(_BucketStore(protocol, {"there"}), "there/ds/manifest.json", "u://there/ds") is None
    with pytest.raises(RemoteAccessError, match="u://gone/ds: not found"):
        read_bytes(_BucketStore(protocol, {"there"}), "gone/ds/manifest.json", "u://gone/ds")


def test_a_store_without_buckets_reads_a_missing_file_as_absent() -> None:
    from rlds_cli.remote.store import read_bytes

    assert read_bytes(_BucketStore(("file", "local"), set()), "a/b/manifest.json", "file://a/b") is None
