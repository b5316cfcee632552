"""``rlds push NAME hf://...``, ``rlds pull hf://...`` and ``open_dataset("hf://...")`` (issue 28,
part 3), offline against the local Hub stand-in (tests/hub_standin.py) that serves the calls
huggingface_hub makes for ``create_commit`` (preupload, the basic LFS batch API, commit) and for
``HfFileSystem`` (revision, tree, paths-info, ranged resolve).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import RemoteAccessError, RemoteDatasetNotFoundError, RemoteExistsError
from tests.hub_standin import TOKEN, HubStandin, hub_env
from tests.remote.test_remote import make_demo, runner, tree

pytest.importorskip("huggingface_hub")

from rlds_cli.remote.pull import pull
from rlds_cli.remote.push import push

REPO_URL = "hf://datasets/rlds-test/shared"
URL = f"{REPO_URL}/demo"
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from rlds_cli.cli.app import main; main()"]


def cli_env(hub: HubStandin, tmp_path: Path, token: str | None) -> dict[str, str]:
    """The environment of a CLI child: this test's cache, the stand-in, ``token`` or none."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**base, **hub_env(hub.endpoint, tmp_path / "child-hf-home", token), "PYTHONPATH": str(ROOT)}


@pytest.fixture
def hub(hub: HubStandin, monkeypatch: pytest.MonkeyPatch) -> HubStandin:
    """The stand-in (tests/conftest.py) with an empty repo ``rlds-test/shared`` (a README and
    ``.gitattributes``, as the Hub makes them) and the write token in ``HF_TOKEN``."""
    hub.add_repo("rlds-test/shared", {".gitattributes": b"*.npy filter=lfs\n", "README.md": b"# shared\n"})
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return hub


def main_files(hub: HubStandin, repo: str = "rlds-test/shared") -> dict[str, bytes]:
    r = hub.repos[repo]
    return r.commits[r.refs["main"]]


@pytest.mark.parametrize("storage", ["memmap", "zarr"])
def test_push_then_pull_gives_the_same_dataset(hub: HubStandin, storage: str, tmp_path: Path) -> None:
    from rlds_cli import open_dataset

    make_demo("demo", storage)
    pushed = push("demo", URL)
    assert (pushed.uploaded, pushed.skipped, pushed.up_to_date) == (pushed.files, 0, False)
    assert len(hub.commits()) == 1  # one commit holds every file, the index and the manifest
    files = main_files(hub)
    assert {"README.md", ".gitattributes", "demo/manifest.json", "demo/rlds-files.json"} <= set(files)
    other = CacheRoot(tmp_path / "other")
    pulled = pull(URL, root=other)
    assert pulled.name == "demo" and pulled.digests_checked and pulled.downloaded == pushed.files
    assert tree(other.dataset_dir("demo")) == tree(CacheRoot().dataset_dir("demo"))
    a, b = open_dataset("demo"), open_dataset("demo", root=other.path)
    for key in a.manifest.fields:
        np.testing.assert_array_equal(np.asarray(b.column(key)), np.asarray(a.column(key)), err_msg=key)


def test_a_repush_of_an_unchanged_dataset_uploads_nothing(hub: HubStandin) -> None:
    make_demo("demo", "zarr")
    push("demo", URL)
    uploads, commits = len(hub.uploads()), len(hub.commits())
    again = push("demo", URL)
    assert again.up_to_date and (again.uploaded, again.bytes_uploaded) == (0, 0)
    assert (len(hub.uploads()), len(hub.commits())) == (uploads, commits)
    assert not [e for e in hub.log if e["path"].endswith(("/preupload/main", "/objects/batch"))][2:]


def test_a_second_push_of_the_same_dataset_sends_no_file_bytes(hub: HubStandin) -> None:
    make_demo("demo", "memmap")
    push("demo", URL)
    start, commits = len(hub.log), len(hub.commits())
    again = push("demo", URL)
    assert again.up_to_date and again.bytes_uploaded == 0
    assert hub.file_bytes(start) == 0 and len(hub.commits()) == commits  # no upload, no preupload sample


def test_a_folder_push_sends_only_the_changed_file(hub: HubStandin, tmp_path: Path) -> None:
    import hashlib

    from rlds_cli.remote.hub_push import push_hub_folder

    folder = tmp_path / "export"
    (folder / "meta").mkdir(parents=True)
    (folder / "meta" / "info.json").write_text('{"version": 1}')
    (folder / "meta" / "stats.json").write_text('{"steps": 3}')
    (folder / "data.bin").write_bytes(bytes(range(256)) * 40)

    def push_folder() -> dict[str, object]:
        return push_hub_folder(
            folder, URL, message="export", marker="meta/info.json", owned=lambda rel: True, force=False
        )

    assert push_folder()["uploaded"] == 3
    start, uploads = len(hub.log), len(hub.uploads())
    assert push_folder()["up_to_date"] and hub.file_bytes(start) == 0
    changed = bytes(range(255, -1, -1)) * 40
    (folder / "data.bin").write_bytes(changed)
    counts = push_folder()
    assert (counts["uploaded"], counts["skipped"], counts["bytes_uploaded"]) == (1, 2, len(changed))
    assert hub.uploads()[uploads:] == [hashlib.sha256(changed).hexdigest()]
    assert hub.commits()[-1] == {"demo/data.bin": "add"}  # the unchanged JSON files are not in it


def test_the_standin_skips_unchanged_files_and_empty_commits_as_the_hub_does(hub: HubStandin) -> None:
    """What hub_push's docstring weighs: the preupload answers each file's ``oid``, so
    ``create_commit`` drops unchanged files and makes no commit when none is left."""
    from huggingface_hub import CommitOperationAdd

    from rlds_cli.net.hub import hf_api

    def commit(data: bytes) -> str:
        ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=data) for p in ("x/a.json", "x/b.bin")]
        return hf_api().create_commit(REPO_URL[len("hf://datasets/") :], operations=ops, commit_message="m",
                                     repo_type="dataset").oid  # fmt: skip

    first = commit(b"12345")
    start, uploads = len(hub.log), len(hub.uploads())
    assert commit(b"12345") == first and len(hub.commits()) == 1
    assert len(hub.uploads()) == uploads and hub.file_bytes(start) == 2 * 5  # the preupload's samples
    commit(b"67890")
    assert hub.commits()[-1] == {"x/a.json": "add", "x/b.bin": "add"}


def test_a_push_that_dies_before_its_commit_leaves_main_as_it_was(hub: HubStandin) -> None:
    make_demo("demo", "zarr")
    before = dict(main_files(hub))
    hub.fail_commits = 1
    with pytest.raises(RemoteAccessError, match="HTTP 500"):
        push("demo", URL)
    assert main_files(hub) == before and hub.uploads()  # uploaded, never committed
    with pytest.raises(RemoteDatasetNotFoundError):
        pull(URL)
    uploaded = len(hub.uploads())
    done = push("demo", URL)  # the same command: the LFS objects are on the Hub already
    assert not done.up_to_date and len(hub.uploads()) == uploaded and len(hub.commits()) == 1
    assert pull(URL, "copy").digests_checked


def test_a_push_killed_during_its_uploads_leaves_nothing_visible(hub: HubStandin, tmp_path: Path) -> None:
    make_demo("demo", "zarr")
    before = dict(main_files(hub))
    child: list[subprocess.Popen[str]] = []

    def kill_at_the_second_upload(oid: str) -> None:
        if len([e for e in hub.log if e.get("oid")]) == 2:
            child[0].kill()  # SIGKILL: no handler, no cleanup
            child[0].wait()

    hub.on_upload = kill_at_the_second_upload
    child.append(subprocess.Popen([*CLI, "push", "demo", URL], env=cli_env(hub, tmp_path, TOKEN), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    child[0].communicate(timeout=120)
    assert child[0].returncode == -9
    assert main_files(hub) == before and not hub.commits()
    with pytest.raises(RemoteDatasetNotFoundError):
        pull(URL)
    hub.on_upload = None
    assert not push("demo", URL).up_to_date and len(hub.commits()) == 1
    assert pull(URL, "copy").digests_checked


def test_another_version_needs_force_and_is_replaced_whole(hub: HubStandin) -> None:
    make_demo("demo", "zarr")
    push("demo", URL)
    result = runner.invoke(
        app, ["download", "demo", "--storage", "memmap", "--name", "demo", "--force", "-q"]
    )
    assert result.exit_code == 0, result.output
    with pytest.raises(RemoteExistsError):
        push("demo", URL)
    replaced = push("demo", URL, force=True)
    assert replaced.replaced and len(hub.commits()) == 2
    files = main_files(hub)
    # the zarr version's arrays are gone with the commit that brought the memmap one; the README stays
    assert not [p for p in files if p.startswith("demo/arrays/") and "zarr" in p]
    assert "README.md" in files
    assert pull(URL, "copy").backend == "memmap"


def test_remote_read_in_place(hub: HubStandin) -> None:
    from rlds_cli import open_dataset

    make_demo("demo", "zarr")
    push("demo", URL)
    local, remote = open_dataset("demo"), open_dataset(URL)
    assert remote.num_steps == local.num_steps and remote.num_episodes == local.num_episodes
    for key in local.manifest.fields:
        np.testing.assert_array_equal(
            np.asarray(remote.column(key)), np.asarray(local.column(key)), err_msg=key
        )
    rows = np.array([0, 5, 17, local.num_steps - 1])
    got, want = remote.gather(rows), local.gather(rows)
    for key in want:
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)
    ranged = [e for e in hub.log if e.get("range") and e.get("file", "").startswith("demo/arrays/")]
    assert ranged  # chunks came as byte ranges, not whole files


def test_no_token_is_one_line_and_the_token_is_never_printed(
    hub: HubStandin, isolated_cache: Path, tmp_path: Path
) -> None:
    make_demo("demo", "zarr")
    hub.repos["rlds-test/shared"].gated = True
    env = cli_env(hub, tmp_path, None)
    for args in (["push", "demo", URL], ["pull", URL, "--name", "copy"]):
        run = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 1
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert "HTTP 401" in lines[0] and "rlds-test/shared" in lines[0], run.stderr
        assert "Traceback" not in run.stderr
    env["HF_TOKEN"] = TOKEN
    for args in (["push", "demo", URL], ["pull", URL, "--name", "copy"], ["push", "demo", URL, "--json"]):
        run = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert TOKEN not in run.stdout + run.stderr
    manifest = (CacheRoot().dataset_dir("copy") / "manifest.json").read_text()
    assert TOKEN not in manifest and "hf_" not in manifest


def test_a_commit_landing_during_the_push_stops_it_whole(hub: HubStandin) -> None:
    make_demo("demo", "zarr")
    repo = hub.repos["rlds-test/shared"]

    def someone_else_commits(oid: str) -> None:
        if repo.refs["main"] == first:
            repo.add_commit({**main_files(hub), "notes.md": b"another writer\n"})

    first = repo.refs["main"]
    hub.on_upload = someone_else_commits
    with pytest.raises(RemoteAccessError, match="changed during the push") as caught:
        push("demo", URL)
    assert "run the push again" in (caught.value.hint or "")
    assert set(main_files(hub)) == {".gitattributes", "README.md", "notes.md"}  # nothing of the push
    hub.on_upload = None
    push("demo", URL)
    assert "notes.md" in main_files(hub) and "demo/manifest.json" in main_files(hub)


def test_pull_at_a_revision_reads_that_commit(hub: HubStandin, tmp_path: Path) -> None:
    make_demo("demo", "zarr")
    push("demo", URL)
    first = hub.repos["rlds-test/shared"].refs["main"]
    first_tree = tree(CacheRoot().dataset_dir("demo"))
    args = ["download", "demo", "--storage", "memmap", "--name", "demo", "--force", "-q"]
    assert runner.invoke(app, args).exit_code == 0
    push("demo", URL, force=True)
    other = CacheRoot(tmp_path / "other")
    old = pull(f"{URL}@{first}", root=other)
    assert old.backend == "zarr" and tree(other.dataset_dir("demo")) == first_tree
    assert pull(URL, "now", root=other).backend == "memmap"


def test_a_remote_read_stays_on_its_commit_while_main_moves(hub: HubStandin) -> None:
    from rlds_cli import open_dataset

    make_demo("demo", "zarr")
    push("demo", URL)
    remote = open_dataset(URL)
    rows = np.array([1, 30, 200])
    want = {k: np.asarray(v) for k, v in open_dataset("demo").gather(rows).items()}
    args = ["download", "demo", "--storage", "zarr", "--name", "demo", "--force", "-q"]
    assert runner.invoke(app, args).exit_code == 0  # a new version (another manifest) ...
    push("demo", URL, force=True)  # ... on main now
    got = remote.gather(rows)  # the commit opened: whole, never a mix
    for key in want:
        np.testing.assert_array_equal(np.asarray(got[key]), want[key], err_msg=key)


def test_frame_columns_on_the_hub(hub: HubStandin, isolated_cache: Path, tmp_path: Path) -> None:
    """A frame column's two files (``@`` in their names) go to the Hub and come back: pushed,
    pulled, and read where they lie."""
    from rlds_cli import open_dataset
    from tests.frames_fixtures import build_frames

    pixels = build_frames(isolated_cache, "cam", [3, 4], "png", backend="zarr")
    push("cam", f"{REPO_URL}/cam")
    assert "cam/arrays/pixels@frames" in main_files(hub)
    other = CacheRoot(tmp_path / "other")
    assert pull(f"{REPO_URL}/cam", root=other).digests_checked
    np.testing.assert_array_equal(open_dataset("cam", root=other.path).column("pixels")[:], pixels)
    remote = open_dataset(f"{REPO_URL}/cam")
    np.testing.assert_array_equal(np.asarray(remote.column("pixels")[[0, 5, 8]]), pixels[[0, 5, 8]])


@pytest.mark.parametrize(
    ("steps", "category"),
    [
        (0, "n<1K"),
        (999, "n<1K"),
        (1_000, "1K<n<10K"),
        (5_000_000, "1M<n<10M"),
        (99_999_999, "10M<n<100M"),
        (200_000_000, "100M<n<1B"),
        (3_000_000_000, "1B<n<10B"),
        (50_000_000_000, "10B<n<100B"),
        (999_999_999_999, "100B<n<1T"),
        (10**12, "n>1T"),
    ],
)
def test_the_card_names_the_hubs_size_category(steps: int, category: str) -> None:
    """Every bucket of the Hub's ``size_categories`` (a 200M-step dataset is not "n>1T")."""
    from rlds_cli.cache.manifest import Manifest
    from rlds_cli.remote.hub_push import front_matter

    meta = front_matter(Manifest("ds", "memmap", steps, 1, {}), {})
    assert meta["size_categories"] == [category]


def test_a_folder_holding_files_no_push_wrote_is_not_pushed_over(hub: HubStandin) -> None:
    """A repo folder without a manifest whose files look like a dataset's is someone else's: the
    push overwrote ``episodes.npy`` and deleted ``arrays/mine.bin`` in its commit, exit 0."""
    theirs = {"x/arrays/mine.bin": b"precious", "x/episodes.npy": b"mine too", "x/notes.txt": b"notes"}
    hub.add_repo("rlds-test/other", {".gitattributes": b"", **theirs})
    make_demo("demo", "memmap")
    url = "hf://datasets/rlds-test/other/x"
    with pytest.raises(RemoteExistsError, match=r"holds 2 file\(s\) where the push goes that no push wrote"):
        push("demo", url)
    assert len(hub.repos["rlds-test/other"].commits) == 1  # no commit
    push("demo", url, force=True)
    files = main_files(hub, "rlds-test/other")
    assert "x/arrays/mine.bin" not in files and files["x/notes.txt"] == b"notes"
    assert pull(url, "copy").name == "copy"


def test_a_growing_dataset_pushed_after_compaction_leaves_no_old_segment(hub: HubStandin) -> None:
    """A re-push deletes the segments the pushed version no longer has (compacted or evicted): they
    were kept in the repo for ever, beside an index that no longer named them."""
    import json

    from tests.remote.test_remote import grow

    grow("g", 4, 0)
    push("g", f"{REPO_URL}/g")
    result = runner.invoke(app, ["compact", "g"])
    assert result.exit_code == 0, result.output
    push("g", f"{REPO_URL}/g", force=True)
    files = main_files(hub)
    index = json.loads(files["g/rlds-files.json"])
    segments = {p for p in files if p.startswith("g/segments/")}
    assert segments == {f"g/{rel}" for rel in index["files"] if rel.startswith("segments/")}
    assert pull(f"{REPO_URL}/g", "g2").name == "g2"
    # the card counts the log's episodes (a growing dataset's manifest counts none), and its
    # pull command is one that runs
    card = files["g/README.md"].decode()
    assert "num_steps: 80" in card and "num_episodes: 4" in card and "of 4 episodes (80 steps)" in card
    command = f"rlds pull {REPO_URL}/g"
    assert f"`{command}`" in card
    result = runner.invoke(app, [*command.split()[1:], "--name", "g3"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("cut", ["10 bytes short", "cut to 10 bytes"])
def test_a_hub_file_of_another_size_is_damage_by_name(hub: HubStandin, cut: str, tmp_path: Path) -> None:
    """The Hub client checks a download's size itself: a file served shorter than pushed was "the
    store failed ... check the URL, the endpoint and the credentials" (pull, a file-cached read)
    or "HTTP 416, run the same command again later" (a read past the file's end)."""
    from rlds_cli import open_dataset
    from rlds_cli.errors import CorruptDatasetError, RemoteCorruptError

    make_demo("demo", "zarr")
    push("demo", URL)
    files = main_files(hub)
    path = max((p for p in files if p.startswith("demo/arrays/")), key=lambda p: len(files[p]))
    good = files[path]
    hub.corrupt[path] = good[:-10] if cut == "10 bytes short" else good[:10]
    size = len(hub.corrupt[path])
    where = f"{URL}/{path.removeprefix('demo/')}"
    with pytest.raises(RemoteCorruptError, match=f"differs from the file pushed: {size} bytes") as info:
        pull(URL, root=CacheRoot(tmp_path / "other"))
    assert str(info.value).startswith(where) and "rlds push" in info.value.hint
    for kwargs in ({"cache": tmp_path / "files"}, {}):
        remote = open_dataset(URL, **kwargs)
        with pytest.raises(CorruptDatasetError) as info:
            for key in remote.manifest.fields:
                np.asarray(remote.column(key))
        assert str(info.value).startswith(where), str(info.value)
        assert "differs from the file pushed" in str(info.value) or "is shorter than the file pushed" in str(
            info.value
        )
        assert "rlds push" in info.value.hint
