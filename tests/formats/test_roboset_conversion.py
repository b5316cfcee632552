"""Roboset (RoboHive schema) conversion: golden values, the last-row rule, multi-file sets,
parallel workers, bad files."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from rlds_cli.cache import open_dataset
from rlds_cli.errors import SourceFormatError
from rlds_cli.sources.convert import convert
from tests.formats_fixtures import golden_roboset, roboset_trial, write_roboset


def test_golden_values(tmp_path: Path) -> None:
    result = convert(golden_roboset(tmp_path / "set"), "rob")
    ds = open_dataset("rob")
    m = result.manifest
    assert m.source["format"] == "roboset"
    assert (ds.num_steps, ds.num_episodes) == (7, 3)
    assert ds.episodes["source_id"].tolist() == [0, 2, 60]
    assert ds.episodes["length"].tolist() == [3, 2, 2]
    assert ds.episodes["final_known"].all()
    b = ds[:]
    # file A Trial0 rows 0..3 (done), Trial2 rows 0..2 (horizon); file B Trial60 rows 0..2 (done)
    assert b["observation"][:, 0].tolist() == [0, 1, 2, 20, 21, 700, 701]
    assert b["next/observation"][:, 0].tolist() == [1, 2, 3, 21, 22, 701, 702]
    # the last row's NaN action is never stored, and the reward is the one for reaching s(t+1)
    assert b["action"].tolist() == [[0, 0], [1, 2], [2, 4], [0, 0], [1, 2], [0, 0], [1, 2]]
    assert not np.isnan(b["action"]).any()
    assert b["next/reward"][:, 0].tolist() == [1, 2, 3, 201, 202, 7001, 7002]
    assert b["next/terminated"][:, 0].tolist() == [0, 0, 1, 0, 0, 0, 1]
    assert b["next/truncated"][:, 0].tolist() == [0, 0, 0, 0, 1, 0, 0]
    # env_infos are row-aligned like observations
    assert b["info/obs_dict/qp"][:, 1].tolist() == [0, -1, -2, 20, 19, 700, 699]
    assert b["next/info/solved"].tolist() == [0, 0, 1, 0, 0, 0, 1]
    assert b["next/time"].tolist() == pytest.approx([0.04, 0.08, 0.12, 0.04, 0.08, 0.04, 0.08])
    assert ds.fields["observation"] == ((3,), "float64")
    assert m.conversion["dropped_rows"] == 3
    assert ds.source_arrays["roboset/episode_file"].tolist() == [0, 0, 1]
    assert [f["path"] for f in m.source["files"]] == ["a_trace.h5", "b_trace.h5"]
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in m.source["files"])
    assert m.source["checks"]["nan_counts"]["action"] == 0


def test_list_of_files_keeps_given_order_and_never_merges(tmp_path: Path) -> None:
    d = golden_roboset(tmp_path / "set")
    convert([d / "b_trace.h5", d / "a_trace.h5"], "rev")
    ds = open_dataset("rev")
    assert ds.episodes["source_id"].tolist() == [60, 0, 2]  # Trial0 of two files stay apart
    assert ds.source_arrays["roboset/episode_file"].tolist() == [0, 1, 1]


def test_workers_give_byte_identical_arrays(tmp_path: Path) -> None:
    d = tmp_path / "many"
    d.mkdir()
    for i in range(5):
        write_roboset(d / f"f{i}.h5", {j: roboset_trial(i, j, 3 + j, done_last=j % 2 == 0) for j in range(3)})
    one = convert(d, "w1", options={"workers": 1})
    two = convert(d, "w2", options={"workers": 2})
    again = convert(d, "w1b", options={"workers": 1})
    for other in (two, again):
        for p in sorted(one.path.rglob("*.npy")):
            rel = p.relative_to(one.path)
            assert p.read_bytes() == (other.path / rel).read_bytes(), rel
    assert one.manifest.source["options"] == {} == two.manifest.source["options"]
    # workers is not part of the identity of a conversion: converting again reuses
    assert convert(d, "w1", options={"workers": 2}).reused


def test_one_row_trial_has_no_transition(tmp_path: Path) -> None:
    write_roboset(
        tmp_path / "x.h5",
        {0: roboset_trial(0, 0, 1, done_last=True), 1: roboset_trial(0, 1, 3, done_last=False)},
    )
    m = convert(tmp_path / "x.h5", "one").manifest
    assert (m.num_episodes, m.num_steps, m.conversion["dropped_episodes"]) == (1, 2, 1)


def _bad(path: Path, match: str) -> None:
    with pytest.raises(SourceFormatError, match=match):
        convert(path, "bad")


def test_bad_files(tmp_path: Path) -> None:
    good = roboset_trial(0, 0, 4, done_last=True)
    # no Trial groups
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f.create_dataset("observations", data=np.zeros((3, 2)))
        f.create_group("other")
    with pytest.raises(SourceFormatError):  # detected as nothing known, or refused by the reader
        convert(tmp_path / "empty.h5", "bad", format="roboset")
    # missing dataset
    write_roboset(tmp_path / "missing.h5", {0: {k: v for k, v in good.items() if k != "done"}})
    _bad(tmp_path / "missing.h5", r"missing.h5:Trial0 has no 'done'")
    # ragged rows
    write_roboset(tmp_path / "ragged.h5", {0: {**good, "rewards": good["rewards"][:-1]}})
    _bad(tmp_path / "ragged.h5", r"ragged.h5:Trial0: 'rewards' has 3 rows, 'actions' has 4")
    # done before the last row
    early = {**good, "done": np.array([0, 1, 0, 1], bool)}
    write_roboset(tmp_path / "early.h5", {0: early})
    _bad(tmp_path / "early.h5", r"'done' is set on row 1")
    # mixed shapes across files
    d = tmp_path / "mixed"
    d.mkdir()
    write_roboset(d / "a.h5", {0: good})
    wide = {**good, "observations": np.zeros((4, 5))}
    write_roboset(d / "b.h5", {0: wide})
    _bad(d, r"b.h5:Trial0: 'observation' has shape \(5,\).*mixed shapes")
    # unknown keys appearing in one trial only
    write_roboset(d / "b.h5", {0: {**good, "extra": np.zeros(4)}})
    _bad(d, r"b.h5:Trial0: unknown datasets \['extra'\]")


def test_truncated_file(tmp_path: Path) -> None:
    p = write_roboset(tmp_path / "t.h5", {0: roboset_trial(0, 0, 50, done_last=True)})
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceFormatError, match=r"t.h5"):
        convert(p, "bad", format="roboset")
