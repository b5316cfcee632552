"""Content digests and what ``rlds verify`` / ``rlds inspect --check`` check, per kind of dataset:
a value changed by hand in a ``.npy`` file or a zarr chunk is caught and named; views,
preprocessed outputs and local conversions list the checks that ran; datasets written before
digests existed still pass; ``rlds inspect`` shows real provenance, never a ``?``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from typer.testing import CliRunner

from rlds_cli import preprocess
from rlds_cli.cache import digest
from rlds_cli.cache.derive import create_view, split_dataset
from rlds_cli.cache.manifest import MANIFEST_FILE
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError
from rlds_cli.inspection.validate import check_dataset
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import golden_three_episodes
from tests.dataset_fixtures import make_dataset, rewrite_manifest
from tests.formats_fixtures import minari_episode, write_minari_by_hand

FNS = "tests.preprocess_fns"
LENGTHS = [3, 5, 2, 6, 4]


pytestmark = [pytest.mark.usefixtures("consoles"), pytest.mark.console_widths(400, 400)]


def rlds(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def verify_json(name: str) -> dict[str, Any]:
    result = rlds("verify", name, "--json")
    return dict(json.loads(result.stdout), exit_code=result.exit_code)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report["checks"]}


def edit_npy(path: Path, row: int) -> None:
    """Change one value of a .npy file in place, as a hand edit would."""
    array = np.load(path, mmap_mode="r+")
    array[row] = array[row] + 1
    array.flush()
    del array


def edit_zarr(dataset_dir: Path, key: str, row: int) -> None:
    """Change one value of a zarr array: zarr rewrites the chunk that holds it."""
    import zarr

    array = zarr.open_group(str(dataset_dir / "arrays"), mode="r+")[key]
    array[row] = np.asarray(array[row]) + 1


def drop_digests(name: str) -> None:
    """Make the manifest look written by an rlds before content digests (and before views
    recorded their parent's creation time)."""
    path = open_dataset(name).directory / MANIFEST_FILE
    data = json.loads(path.read_text())
    del data["content_digest"]
    data["source"].pop("parent_created_at", None)
    for parent in data["lineage"]:
        parent.pop("created_at", None)
    path.write_text(json.dumps(data))
    rewrite_manifest(path, signed=False)


# ----------------------------------------------------------------------------- the digest itself


def logical_bytes(array: Any) -> bytes:
    """The bytes a content digest covers, defined apart from the code under test: the values in
    C order, little-endian."""
    array = np.asarray(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def test_digest_is_the_xxh3_128_of_the_logical_values_whatever_the_backend() -> None:
    make_dataset("m", LENGTHS, backend="memmap")
    make_dataset("z", LENGTHS, backend="zarr")
    m, z = open_dataset("m"), open_dataset("z")
    assert m.manifest.content_digest["algorithm"] == "xxh3_128"
    assert m.manifest.content_digest["columns"] == z.manifest.content_digest["columns"]
    assert set(m.manifest.content_digest["columns"]) == set(m.stored_fields)
    want = xxhash.xxh3_128(logical_bytes(m.column("observation"))).hexdigest()
    assert m.manifest.content_digest["columns"]["observation"] == want
    episodes = xxhash.xxh3_128(np.ascontiguousarray(m.episode_index).tobytes()).hexdigest()
    assert m.manifest.content_digest["episodes"] == episodes


def as_written_by_sha256_rlds(name: str) -> Path:
    """Rewrite a dataset's digests as an rlds of sha256 digests recorded them (computed here,
    apart from the code under test); returns its manifest's path."""
    ds = open_dataset(name)
    path = ds.directory / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["content_digest"] = {
        "algorithm": "sha256",
        "columns": {
            key: hashlib.sha256(logical_bytes(ds.column(key))).hexdigest() for key in ds.stored_fields
        },
        "episodes": hashlib.sha256(np.ascontiguousarray(ds.episode_index).tobytes()).hexdigest(),
    }
    path.write_text(json.dumps(data))
    rewrite_manifest(path, signed=False)
    return path


def test_an_unknown_algorithm_of_a_view_of_a_parent_without_digests_fails_too() -> None:
    """The view records its own episode index's digest; its parent (an rlds before digests) none:
    the view's unknown algorithm is still damage, never "skipped"."""
    make_dataset("old", [3, 5, 2])
    drop_digests("old")
    create_view("old", "v", (0, 2))
    path = open_dataset("v").directory / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["content_digest"]["algorithm"] = "md5"
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    assert not check_dataset(open_dataset("v")).ok
    assert rlds("verify", "v").exit_code == 1
    assert rlds("inspect", "v", "--check", "--no-stats").exit_code == 1


def test_a_dataset_an_older_rlds_wrote_with_sha256_is_checked_by_sha256() -> None:
    make_dataset("d", LENGTHS)
    as_written_by_sha256_rlds("d")
    report = verify_json("d")
    assert report["exit_code"] == 0 and statuses(report)["content digests"] == "pass", report
    edit_npy(open_dataset("d").directory / "arrays" / "info" / "qpos.npy", 2)
    check = rlds("inspect", "d", "--check", "--no-stats")
    assert check.exit_code == 1
    (line,) = [line for line in check.stdout.splitlines() if line.startswith("violation")]
    assert "info/qpos" in line and "sha256" in line, check.stdout


@pytest.mark.parametrize("algorithm", ["md5", "xxh3_64", "", 7])
def test_digests_of_an_algorithm_rlds_does_not_know_fail_the_check(algorithm: Any) -> None:
    make_dataset("d", LENGTHS)
    path = open_dataset("d").directory / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["content_digest"]["algorithm"] = algorithm
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    report = check_dataset(open_dataset("d"))
    assert [(v.check, v.key) for v in report.violations] == [("digest", "content_digest")]
    assert "does not know" in report.violations[0].message
    check = rlds("inspect", "d", "--check", "--no-stats")
    assert check.exit_code == 1 and "Traceback" not in check.stderr
    verify = rlds("verify", "d")
    assert verify.exit_code == 1 and "Traceback" not in verify.stderr
    (failed,) = [line for line in verify.stdout.splitlines() if line.startswith("fail")]
    assert str(path) in failed and "does not know" in failed, verify.stdout


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_digest_does_not_depend_on_the_block_size(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_dataset("d", LENGTHS, backend=backend)
    ds = open_dataset("d")
    whole = digest.column_digest(ds.column("observation"), "float32")
    monkeypatch.setattr(digest, "BLOCK_BYTES", 24)  # 3 rows of 8 bytes a block: many reads
    assert digest.column_digest(ds.column("observation"), "float32") == whole
    assert whole == ds.manifest.content_digest["columns"]["observation"]


def test_preprocess_outputs_record_digests_of_what_they_wrote() -> None:
    make_dataset("src", LENGTHS)
    preprocess.run("src", f"{FNS}:normalize", "out", workers=1, chunk_steps=4)
    out = open_dataset("out")
    columns = out.manifest.content_digest["columns"]
    assert set(columns) == set(out.stored_fields)
    for key in columns:
        assert columns[key] == digest.column_digest(out.column(key), out.stored_fields[key].dtype), key


# ----------------------------------------------------------------------------- damage is caught


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_value_changed_by_hand_is_caught_and_named(backend: str) -> None:
    make_dataset("d", LENGTHS, backend=backend)
    assert rlds("verify", "d").exit_code == 0
    directory = open_dataset("d").directory
    if backend == "memmap":
        edit_npy(directory / "arrays" / "info" / "qpos.npy", 4)
        where = directory / "arrays" / "info" / "qpos.npy"
    else:
        edit_zarr(directory, "info/qpos", 4)
        where = directory / "arrays" / "info" / "qpos"
    # no TED invariant breaks (info/qpos is a plain step key): only the digest sees it
    report = check_dataset(open_dataset("d"))
    assert [(v.check, v.key) for v in report.violations] == [("digest", "info/qpos")]

    check = rlds("inspect", "d", "--check", "--no-stats")
    assert check.exit_code == 1
    lines = [line for line in check.stdout.splitlines() if line.startswith("violation")]
    assert len(lines) == 1 and "info/qpos" in lines[0] and str(where) in lines[0], check.stdout

    verify = rlds("verify", "d")
    assert verify.exit_code == 1
    failed = [line for line in verify.stdout.splitlines() if line.startswith("fail")]
    assert len(failed) == 1, verify.stdout
    assert failed[0].startswith(f"fail    content digest of info/qpos: {where}: content changed since")
    (error,) = [line for line in verify.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: d: verification failed: 1 of ")
    assert error.endswith("(content digest of info/qpos)")
    assert "Traceback" not in verify.stderr
    report = verify_json("d")
    assert report["exit_code"] == 1 and not report["ok"]
    (bad,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert bad["check"] == "content digest of info/qpos" and bad["hint"]


def test_an_edited_episode_index_is_caught() -> None:
    make_dataset("d", LENGTHS)
    path = open_dataset("d").directory / "episodes.npy"
    index = np.load(path)
    index["source_id"][1] = 99  # no count or boundary changes: only the digest can tell
    np.save(path, index)
    report = verify_json("d")  # refused by every open, before the digests are compared
    assert statuses(report)["dataset opens"] == "fail"
    detail = next(c["detail"] for c in report["checks"] if c["status"] == "fail")
    assert str(path) in detail and "changed since it was written" in detail
    with pytest.raises(CorruptDatasetError, match="changed since it was written"):
        open_dataset("d").episodes.columns()


def test_a_view_fails_its_checks_when_its_parents_episode_index_is_damaged() -> None:
    """The view's episode table reads its parent's index (source ids, seeds): its verify and
    check passed while that index's header was damaged, and ``view.episodes`` then failed."""
    make_dataset("d", LENGTHS)
    create_view("d", "v", [0, 2])
    path = open_dataset("d").directory / "episodes.npy"
    path.write_bytes(path.read_bytes().replace(b"fortran_order", b"fortr`n_order"))
    with pytest.raises(CorruptDatasetError, match="header is damaged"):
        open_dataset("v").episodes.columns()
    report = verify_json("v")
    assert statuses(report)["content digest of episodes"] == "fail"
    assert str(path) in next(c["detail"] for c in report["checks"] if c["status"] == "fail")
    assert not check_dataset(open_dataset("v")).ok


def test_a_tampered_digest_field_is_one_clear_error() -> None:
    make_dataset("d", LENGTHS)
    path = open_dataset("d").directory / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["content_digest"] = ["not", "a", "dict"]
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    with pytest.raises(CorruptDatasetError, match=r"malformed.*content_digest"):
        open_dataset("d")
    result = rlds("verify", "d")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == "error: d: verification failed: 1 of 2 checks (manifest readable)"
    (failed,) = [line for line in result.stdout.splitlines() if line.startswith("fail")]
    assert "content_digest" in failed and str(path) in failed


def test_a_manifest_edited_by_hand_fails_its_check_in_verifys_report() -> None:
    """verify stopped at the manifest with one error line whose hint said to run verify, printed
    no check, and --json wrote nothing."""
    make_dataset("d", LENGTHS)
    path = open_dataset("d").directory / MANIFEST_FILE
    path.write_text(path.read_text().replace('"num_episodes": 5', '"num_episodes": 4'))
    report = verify_json("d")
    assert report["exit_code"] == 1 and not report["ok"]
    assert statuses(report) == {"manifest readable": "fail", "dataset files": "skipped"}
    assert "does not match its own digest" in report["checks"][0]["detail"]
    result = rlds("verify", "d")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].startswith("fail    manifest readable: manifest ")
    hint = result.stderr.splitlines()[-1]
    assert hint.startswith("hint: remove it ('rlds rm d')") and "rlds verify" not in hint


# ----------------------------------------------------------------------------- checks by kind


def test_a_local_file_conversion_checks_its_source_while_it_is_there(tmp_path: Path) -> None:
    source = golden_three_episodes(tmp_path / "d.hdf5", with_next=False)
    convert(source, "local")
    report = verify_json("local")
    assert report["kind"] == "converted" and report["exit_code"] == 0
    assert statuses(report) == {
        f"source file {source.resolve()}": "pass",
        "files complete": "pass",
        "content digests": "pass",
    }
    source.write_bytes(source.read_bytes() + b"\0")
    changed = verify_json("local")
    assert changed["exit_code"] == 1 and statuses(changed)[f"source file {source.resolve()}"] == "fail"
    source.unlink()
    gone = verify_json("local")
    assert gone["exit_code"] == 0
    (src,) = [c for c in gone["checks"] if c["check"].startswith("source")]
    assert src["status"] == "skipped" and "gone" in src["detail"]


def test_a_local_folder_conversion_checks_every_recorded_file(tmp_path: Path) -> None:
    folder = write_minari_by_hand(tmp_path / "m", [minari_episode(3), minari_episode(4, terminated=False)])
    convert(folder, "folder")
    report = verify_json("folder")
    (src,) = [c for c in report["checks"] if c["check"].startswith("source")]
    assert src["status"] == "pass" and "have the sha256 recorded at conversion" in src["detail"]
    data_file = next(p for p in folder.rglob("*.hdf5"))
    data_file.write_bytes(data_file.read_bytes() + b"\0")
    changed = verify_json("folder")
    (src,) = [c for c in changed["checks"] if c["check"].startswith("source")]
    assert changed["exit_code"] == 1 and src["status"] == "fail" and str(data_file) in src["detail"]


@pytest.mark.parametrize("backend", ["memmap", "zarr"])
def test_a_view_checks_its_parent_version_and_the_parents_data(backend: str) -> None:
    make_dataset("p", LENGTHS, backend=backend)
    create_view("p", "v", (1, 4))
    report = verify_json("v")
    assert report["kind"] == "view" and report["exit_code"] == 0
    assert statuses(report) == {
        "parent p": "pass",
        "parent p version": "pass",
        "files complete": "pass",
        "content digests": "pass",
    }
    version = next(c for c in report["checks"] if c["check"] == "parent p version")
    assert open_dataset("p").manifest.created_at in version["detail"]
    # the parent's data changed under the view: caught, named in the parent's files
    directory = open_dataset("p").directory
    if backend == "memmap":
        edit_npy(directory / "arrays" / "action.npy", 5)
    else:
        edit_zarr(directory, "action", 5)
    damaged = verify_json("v")
    (bad,) = [c for c in damaged["checks"] if c["status"] == "fail"]
    assert bad["check"] == "content digest of action" and str(directory) in bad["detail"]
    assert "rlds verify p" in bad["hint"]
    # the parent rebuilt: the view is of a version that is gone
    _replace("p", backend)
    replaced = verify_json("v")
    assert replaced["exit_code"] == 1 and statuses(replaced)["parent p version"] == "fail"


def _replace(name: str, backend: str) -> None:
    from rlds_cli.cache.builder import DatasetBuilder
    from rlds_cli.formats.base import StepBlock

    n = 4
    term = np.zeros(n, bool)
    term[-1] = True
    block = StepBlock(
        steps={
            "action": np.zeros((n, 1), np.float32),
            "next/reward": np.ones(n, np.float32),
            "next/terminated": term,
            "next/truncated": np.zeros(n, bool),
            "info/qpos": np.zeros(n, np.float32),
        },
        observations={"observation": np.ones((n + 1, 2), np.float32)},
        ends=np.array([n - 1]),
    )
    with DatasetBuilder(name, backend=backend, replace=True) as builder:
        builder.append(block)
        builder.commit()


def test_split_parts_verify_as_views() -> None:
    make_dataset("p", LENGTHS)
    split_dataset("p", 0.4)
    for part in ("p-train", "p-val"):
        report = verify_json(part)
        assert report["kind"] == "view" and report["exit_code"] == 0
        assert set(statuses(report).values()) == {"pass"}


def test_a_preprocessed_output_checks_the_parent_in_its_lineage() -> None:
    make_dataset("src", LENGTHS)
    preprocess.run("src", f"{FNS}:identity", "out", workers=1)
    report = verify_json("out")
    assert report["kind"] == "preprocessed" and report["exit_code"] == 0
    assert statuses(report) == {
        "parent src": "pass",
        "parent src version": "pass",
        "files complete": "pass",
        "content digests": "pass",
    }
    edit_npy(open_dataset("out").directory / "arrays" / "observation.npy", 2)
    damaged = verify_json("out")
    assert damaged["exit_code"] == 1 and statuses(damaged)["content digest of observation"] == "fail"


def test_a_preprocessed_output_whose_parent_is_gone_still_verifies_its_own_data() -> None:
    make_dataset("src", LENGTHS)
    preprocess.run("src", f"{FNS}:identity", "out", workers=1)
    assert rlds("rm", "src", "--yes", "--force").exit_code == 0
    report = verify_json("out")
    assert report["exit_code"] == 0
    assert statuses(report) == {"parent src": "skipped", "files complete": "pass", "content digests": "pass"}
    (parent,) = [c for c in report["checks"] if c["check"] == "parent src"]
    assert "no longer in the cache" in parent["detail"]


def test_a_preprocessed_output_of_a_replaced_parent_is_stale() -> None:
    make_dataset("src", LENGTHS)
    preprocess.run("src", f"{FNS}:identity", "out", workers=1)
    _replace("src", "memmap")
    report = verify_json("out")
    assert report["exit_code"] == 1 and statuses(report)["parent src version"] == "fail"
    (bad,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert "rlds preprocess src" in bad["hint"]


# ----------------------------------------------------------------------------- older datasets


def test_datasets_without_digests_pass_and_say_so() -> None:
    make_dataset("old", LENGTHS)
    drop_digests("old")
    create_view("old", "old-view", (0, 2))
    drop_digests("old-view")
    create_view("old", "new-view", (0, 2))  # made today, of a parent written before digests
    for name in ("old", "old-view", "new-view"):
        report = verify_json(name)
        assert report["exit_code"] == 0, report
        skipped = {c["check"]: c["detail"] for c in report["checks"] if c["status"] == "skipped"}
        assert digest.NOT_RECORDED in skipped.values(), (name, report["checks"])
        assert "fail" not in statuses(report).values()
        text = rlds("verify", name)
        assert text.exit_code == 0 and digest.NOT_RECORDED in text.stdout
        assert "checks passed" in text.stdout.splitlines()[-1]
    check = rlds("inspect", "old", "--check", "--no-stats")
    assert check.exit_code == 0 and f"skipped digest: {digest.NOT_RECORDED}" in check.stdout
    assert "check passed: files, index, done, continuity, counts, nan" in check.stdout
    # the other checks still run: a broken invariant still fails an older dataset
    directory = open_dataset("old").directory
    term = np.load(directory / "arrays" / "next" / "terminated.npy", mmap_mode="r+")
    term[0, 0] = True
    term.flush()
    del term
    assert rlds("inspect", "old", "--check", "--no-stats").exit_code == 1


def test_verify_never_says_verified_without_saying_what_was_checked() -> None:
    make_dataset("d", LENGTHS)
    create_view("d", "v", (0, 2))
    for name in ("d", "v"):
        out = rlds("verify", name).stdout.splitlines()
        assert out[-1].startswith(f"{name} (") and "checks passed" in out[-1], out
        assert all(line.split()[0] in ("pass", "skipped") for line in out[:-1]), out


# ----------------------------------------------------------------------------- provenance shown


def test_refusing_to_overwrite_a_derived_dataset_names_what_it_is(tmp_path: Path) -> None:
    from rlds_cli.errors import DatasetExistsError

    source = golden_three_episodes(tmp_path / "d.hdf5", with_next=False)
    make_dataset("p", LENGTHS)
    create_view("p", "v", (0, 2))
    preprocess.run("p", f"{FNS}:identity", "out", workers=1)
    with pytest.raises(DatasetExistsError, match=r"(?m)already exists in .* \(a view of 'p'\)$"):
        convert(source, "v")
    with pytest.raises(DatasetExistsError, match=r"(?m)already exists in .* \(preprocessed from 'p'\)$"):
        convert(source, "out")


def test_inspect_shows_provenance_without_placeholders(tmp_path: Path) -> None:
    source = golden_three_episodes(tmp_path / "d.hdf5", with_next=False)
    convert(source, "file")
    convert(write_minari_by_hand(tmp_path / "m", [minari_episode(3), minari_episode(4)]), "folder")
    make_dataset("p", LENGTHS)
    create_view("p", "v", (1, 3))
    split_dataset("p", 0.4)
    preprocess.run("v", f"{FNS}:identity", "out", workers=1)
    parent = open_dataset("p").manifest
    texts = {}
    for name in ("file", "folder", "p", "v", "p-train", "p-val", "out"):
        result = rlds("inspect", name, "--no-stats")
        assert result.exit_code == 0, result.output
        assert "?" not in result.stdout, (name, result.stdout)
        texts[name] = result.stdout
    assert f"source  d4rl: {source.resolve()}  sha256 " in texts["file"]
    assert "source  minari: " in texts["folder"]
    view_line = f"view of p (manifest {parent.digest()[:12]}, written at {parent.created_at}) episodes 1:3"
    assert view_line in texts["v"] and "source  " not in texts["v"]
    assert "view of p (manifest" in texts["p-val"] and "episodes 3:5" in texts["p-val"]
    out = texts["out"]
    assert f"derived from v (manifest {open_dataset('v').manifest.digest()[:12]}" in out
    assert f"by {FNS}:identity (sha256 " in out
    assert f"  which is a {view_line}" in out
    assert "content digest  xxh3_128 of 6 arrays and the episode index" in out
    assert "content digest  xxh3_128 of the episode index (the arrays: p's)" in texts["v"]


def test_every_flipped_byte_of_a_zarr_groups_metadata_fails_the_checks() -> None:
    """rlds reads its arrays without the groups' zarr.json; other zarr readers open the dataset
    through them, so a damaged one fails verify and inspect --check all the same."""
    make_dataset("z", LENGTHS, backend="zarr")
    ds = open_dataset("z")
    arrays = ds.directory / "arrays"
    for group in (arrays / "zarr.json", arrays / "next" / "zarr.json"):
        good = group.read_bytes()
        for offset in range(len(good)):
            flipped = bytearray(good)
            flipped[offset] ^= 0x01
            group.write_bytes(bytes(flipped))
            # unreadable JSON fails zarr's own open; readable but wrong fails the group check
            assert ds.check_files(), (group, offset)
        group.write_bytes(good)
    assert ds.check_files() == []
    (arrays / "zarr.json").write_bytes(b'{"attributes": {}, "zarr_forlat": 3, "node_type": "group"}')
    for args in (("verify", "z"), ("inspect", "z", "--check", "--no-stats")):
        result = rlds(*args)
        assert result.exit_code == 1 and f"zarr group metadata {arrays / 'zarr.json'} is damaged" in " ".join(
            (result.stdout + result.stderr).split()
        ), result.output


@pytest.mark.parametrize("damage", ["deleted", "changed"])
def test_a_views_checks_cover_its_parents_source_metadata(damage: str) -> None:
    """A view reads its parent's source_metadata.npz (per-episode facts, instructions): verify and
    inspect --check passed on the view with the parent's file damaged or gone, and a read of the
    deleted file's facts gave none."""
    from tests.robomimic_fixtures import ROBOCASA

    convert(ROBOCASA, "rc")
    create_view("rc", "rc-view", (1, 2))
    assert open_dataset("rc-view").episode_metadata(0)
    path = open_dataset("rc").directory / "source_metadata.npz"
    if damage == "deleted":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
    report = verify_json("rc-view")
    assert report["exit_code"] == 1, report
    assert rlds("inspect", "rc-view", "--check", "-q").exit_code == 1
    if damage == "deleted":
        with pytest.raises(CorruptDatasetError, match=r"source_metadata\.npz is missing"):
            open_dataset("rc-view").episode_metadata(0)


def test_a_selection_of_a_trim_whose_manifest_is_damaged_reads_and_verifies_without_it() -> None:
    """A view of a trim reads the trim's parent (composed.py): verify stopped at the trim's damaged
    manifest with one error (no report, no JSON) where inspect --check passed; now both pass, and
    verify names the trim's damage in a skipped lineage check."""
    make_dataset("d", LENGTHS)
    assert rlds("trim", "d", "--start", "1", "--name", "t").exit_code == 0
    create_view("t", "v", (0, 2))
    path = open_dataset("t").directory / MANIFEST_FILE
    text = path.read_text()
    at = text.index('"num_steps": ') + len('"num_steps": ')
    path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :])
    report = verify_json("v")
    assert report["exit_code"] == 0 and statuses(report)["parent t"] == "skipped"
    (lineage,) = [c for c in report["checks"] if c["check"] == "parent t"]
    assert "does not match its own digest" in lineage["detail"]
    assert rlds("inspect", "v", "--check", "--no-stats").exit_code == 0


def test_a_view_whose_parents_manifest_is_damaged_fails_inspect_check() -> None:
    make_dataset("d", LENGTHS)
    create_view("d", "v", (0, 2))
    path = open_dataset("d").directory / MANIFEST_FILE
    text = path.read_text()
    at = text.index('"num_steps": ') + len('"num_steps": ')
    path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :])
    assert verify_json("v")["exit_code"] == 1
    checked = rlds("inspect", "v", "--check", "--no-stats")
    assert checked.exit_code == 1, checked.stdout
