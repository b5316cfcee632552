"""Language instructions through exports: an RLDS source's ``language_instruction``, LIBERO's
``problem_info`` and RoboCasa's ``ep_meta["lang"]`` reach LeRobot's tasks, RLDS's
``language_instruction`` and robomimic's places (:attr:`Dataset.instructions`), step for step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError, ExportError
from rlds_cli.export import export_dataset
from rlds_cli.sources.convert import convert
from tests.rlds_tfrecord_fixtures import write_rlds_dataset
from tests.robomimic_fixtures import LIBERO, ROBOCASA

pytestmark = pytest.mark.usefixtures("consoles")
runner = CliRunner()


def step_texts(ds: Dataset) -> list[str]:
    """The instruction of every step of ``ds``, in order."""
    found = ds.instructions
    assert found is not None, ds.name
    out: list[str] = []
    for e in range(ds.num_episodes):
        start, length = int(ds.episode_index["start"][e]), int(ds.episode_index["length"][e])
        out += [found.texts[i] for i in found.of_steps(ds, e, slice(start, start + length))]
    return out


@pytest.fixture
def oxe(isolated_cache: Path, tmp_path: Path) -> Dataset:
    """An RLDS source whose episodes carry one of three instructions each."""
    pytest.importorskip("crc32c")
    write_rlds_dataset(tmp_path / "src", (5, 7, 4, 3), last_step="mixed", shards=2)
    convert(tmp_path / "src", "oxe")
    return open_dataset("oxe")


def test_rlds_source_instructions_and_a_views(oxe: Dataset) -> None:
    texts = ["pick up the red block", "open the drawer", "wipe the table"]
    lengths = oxe.episode_index["length"].tolist()
    want = [t for e, n in enumerate(lengths) for t in [texts[e % 3]] * n]
    assert oxe.instructions is not None and oxe.instructions.step_key == "info/language_instruction_index"
    assert step_texts(oxe) == want
    assert runner.invoke(app, ["view", "oxe", "--episodes", "1:3", "--name", "part"]).exit_code == 0
    assert step_texts(open_dataset("part")) == want[lengths[0] : sum(lengths[:3])]


def test_each_batch_row_gets_its_instruction(oxe: Dataset) -> None:
    """``Instructions.of_batch``: the text of each sampled row, from the step column (RLDS) or the
    episode (RoboCasa), for plain, TensorDict and slice batches; one clear line without the column."""
    import rlds_cli

    convert(ROBOCASA, "robocasa")
    for name in ("oxe", "robocasa"):
        ds = open_dataset(name)
        found, every = ds.instructions, np.array(step_texts(ds), dtype=object)
        assert found is not None
        for options in ({}, {"as_tensordict": True}, {"sampler": "slice", "slice_len": 2}):
            if options.get("as_tensordict"):
                pytest.importorskip("tensordict")
            loader = rlds_cli.Loader(name, batch_size=6, num_batches=2, seed=1, **options)  # type: ignore[arg-type]
            for batch in loader:
                rows = np.asarray(batch["index"])
                assert found.of_batch(batch).tolist() == every[rows].tolist(), (name, options)
        batch = next(iter(rlds_cli.Loader(name, batch_size=4, num_batches=1, keys=["action"])))
        with pytest.raises(KeyError, match="gives each row's instruction: add it to keys="):
            found.of_batch(batch)


def test_preprocessed_and_downsampled_copies_keep_the_instructions(oxe: Dataset) -> None:
    """A preprocessed or downsampled copy kept no source facts: its exports lost the instructions."""
    fn = "tests.preprocess_fns:identity"
    assert (
        runner.invoke(app, ["preprocess", "oxe", "--fn", fn, "--name", "same", "--workers", "1"]).exit_code
        == 0
    )
    assert step_texts(open_dataset("same")) == step_texts(oxe)
    assert runner.invoke(app, ["downsample", "oxe", "--every", "2", "--name", "half"]).exit_code == 0
    half = open_dataset("half")
    texts = sorted(set(step_texts(oxe)), key=step_texts(oxe).index)
    per_episode = [texts[e % 3] for e in range(oxe.num_episodes)]
    lengths = half.episode_index["length"].tolist()
    assert step_texts(half) == [t for t, n in zip(per_episode, lengths, strict=True) for _ in range(n)]


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_rlds_instructions_become_lerobot_tasks(oxe: Dataset, tmp_path: Path, version: str) -> None:
    """RLDS -> LeRobot (what GR00T and openpi train on): each row's task is its step's
    instruction (the dataset's name before); no index column is written besides ``task_index``."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("av")
    out = export_dataset(oxe, tmp_path / "out", "lerobot", options={"version": version})
    data = sorted((out / "data").rglob("*.parquet"))
    assert "language_instruction_index" not in pq.read_table(data[0]).column_names
    if version == "2.1":
        tasks = [json.loads(line)["task"] for line in (out / "meta/tasks.jsonl").read_text().splitlines()]
        assert tasks == oxe.text_tables["info/language_instruction_index"]
    assert runner.invoke(app, ["download", str(out), "--name", "back"]).exit_code == 0
    assert step_texts(open_dataset("back")) == step_texts(oxe)


def test_libero_and_robocasa_instructions_reach_rlds_and_lerobot(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """LIBERO's one ``problem_info`` instruction (OpenVLA's LIBERO fine-tuning sets are this
    conversion) and RoboCasa's per-demo ``lang`` were dropped by both exports."""
    pytest.importorskip("crc32c")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("av")
    for path, name in ((LIBERO, "libero"), (ROBOCASA, "robocasa")):
        convert(path, name)
        ds = open_dataset(name)
        rlds = export_dataset(ds, tmp_path / f"{name}-rlds", "rlds")
        convert(rlds, f"{name}-back")
        assert step_texts(open_dataset(f"{name}-back")) == step_texts(ds), name
        lerobot = export_dataset(ds, tmp_path / f"{name}-lerobot", "lerobot")
        tasks = pq.read_table(lerobot / "meta" / "tasks.parquet").to_pydict()["__index_level_0__"]
        assert sorted(tasks) == sorted(set(step_texts(ds))), name
    with h5py.File(LIBERO) as f:
        want = json.loads(f["data"].attrs["problem_info"])["language_instruction"]
    assert set(step_texts(open_dataset("libero-back"))) == {want}


def test_rlds_instructions_reach_robomimics_places(oxe: Dataset, tmp_path: Path) -> None:
    """RoboCasa's ``ep_meta`` ``lang`` per demo (one instruction each), read back step for step;
    a file of one instruction also gets LIBERO's ``problem_info``."""
    out = export_dataset(oxe, tmp_path / "out.hdf5", "robomimic")
    with h5py.File(out) as f:
        langs = [json.loads(f[f"data/{d}"].attrs["ep_meta"])["lang"] for d in sorted(f["data"])]
        assert "problem_info" not in f["data"].attrs  # three instructions
    assert len(langs) == oxe.num_episodes
    convert(out, "back")
    assert step_texts(open_dataset("back")) == step_texts(oxe)
    assert runner.invoke(app, ["view", "oxe", "--episodes", "0:1", "--name", "one"]).exit_code == 0
    single = export_dataset(open_dataset("one"), tmp_path / "one.hdf5", "robomimic")
    with h5py.File(single) as f:
        info = json.loads(f["data"].attrs["problem_info"])
    assert info == {"language_instruction": step_texts(oxe)[0]}


def test_a_text_index_outside_its_table_is_damage(oxe: Dataset, tmp_path: Path) -> None:
    """A table shorter than the indices (its manifest damaged past the checks): one line naming
    the dataset and the key, nothing written; the LeRobot export wrote an empty task before."""
    pytest.importorskip("av")
    table = oxe.manifest.source["metadata"]["rlds"]["text"]["info/language_instruction_index"]
    del table[1:]
    with pytest.raises(
        CorruptDatasetError, match=r"'oxe'.*language_instruction_index.*outside its table of 1"
    ):
        export_dataset(oxe, tmp_path / "out", "lerobot")
    assert list(tmp_path.glob("out*")) == []


def test_only_texts_named_for_an_instruction_are_instructions(
    oxe: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any RLDS text feature was taken for the instruction (a file path became every row's task)."""
    tables = {"episode_metadata/file_path_index": ["/data/a.npz"]}
    monkeypatch.setattr(Dataset, "text_tables", property(lambda self: tables))
    assert oxe.instructions is None
    tables["observation/natural_language_instruction_index"] = ["stack the cups"]
    found = oxe.instructions
    assert found is not None and found.step_key == "observation/natural_language_instruction_index"


def test_lerobot_task_ids_with_gaps_export_only_the_tasks_rows_have(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """A LeRobot source's task ids 0 and 3 became tasks 0..3 with two empty ones: LeRobot v3's
    tasks are indexed by their text, which then held "" twice."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("av")
    from tests.lerobot_fixtures import FIXTURE, v21_tree

    src = v21_tree(FIXTURE, tmp_path / "v21")
    (src / "meta/tasks.jsonl").write_text(
        json.dumps({"task_index": 0, "task": "push the T"})
        + "\n"
        + json.dumps({"task_index": 3, "task": "unused"})
    )
    convert(src, "gaps")
    ds = open_dataset("gaps")
    assert ds.instructions is not None and ds.instructions.texts == ["push the T", "", "", "unused"]
    out = export_dataset(ds, tmp_path / "out", "lerobot")
    tasks = pq.read_table(out / "meta/tasks.parquet").to_pydict()
    assert (tasks["task_index"], tasks["__index_level_0__"]) == ([0], ["push the T"])
    assert runner.invoke(app, ["download", str(out), "--name", "back"]).exit_code == 0
    assert set(step_texts(open_dataset("back"))) == {"push the T"}


def test_lerobot_tasks_are_numbered_as_lerobot_reads_them(oxe: Dataset, tmp_path: Path) -> None:
    """lerobot reads a row's task at position ``task_index`` of tasks.parquet: a view leaving a
    task out kept the source's numbers (0 and 2 of two tasks), so rows read the wrong text or
    none. The export numbers the tasks some row has from 0."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("av")
    assert runner.invoke(app, ["view", "oxe", "--episodes", "2:4", "--name", "tail"]).exit_code == 0
    tail = open_dataset("tail")
    for version in ("3.0", "2.1"):
        out = export_dataset(tail, tmp_path / version, "lerobot", options={"version": version})
        if version == "3.0":
            tasks = pq.read_table(out / "meta/tasks.parquet").to_pydict()["__index_level_0__"]
        else:
            lines = (out / "meta/tasks.jsonl").read_text().splitlines()
            tasks = [json.loads(line)["task"] for line in lines]
            assert [json.loads(line)["task_index"] for line in lines] == list(range(len(tasks)))
        rows = [
            i
            for path in sorted((out / "data").rglob("*.parquet"))
            for i in pq.read_table(path)["task_index"].to_pylist()
        ]
        assert [tasks[i] for i in rows] == step_texts(tail), version
        assert len(tasks) == 2


def test_a_damaged_text_in_the_source_arrays_is_damage(isolated_cache: Path, tmp_path: Path) -> None:
    """A byte flipped in a RoboCasa instruction inside source_metadata.npz (its mtime kept):
    ``inspect --check`` said "unexpected BadZipFile" and the library raised zipfile's own error."""
    import os

    convert(ROBOCASA, "rc")
    ds = open_dataset("rc")
    path = ds.directory / "source_metadata.npz"
    data = bytearray(path.read_bytes())
    text = ds.instructions.texts[0].encode()  # type: ignore[union-attr]
    data[data.find(text[:12])] ^= 0x20
    stat = path.stat()
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(CorruptDatasetError, match=r"source_metadata\.npz is unreadable"):
        _ = open_dataset("rc").instructions
    result = runner.invoke(app, ["inspect", "rc", "--check"])
    assert result.exit_code == 1 and "source_metadata.npz is unreadable" in result.output, result.output
    assert "unexpected" not in result.output


def test_a_merge_of_other_instruction_tables_keeps_each_steps_text(oxe: Dataset, tmp_path: Path) -> None:
    """Merging two RLDS datasets whose instruction tables differ dropped every instruction: the
    LeRobot export wrote the merge's name as every row's task (with the parts' index column), the
    RLDS export plain index numbers."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("av")

    def other(i: int, features: dict) -> None:
        steps = len(features["steps/language_instruction"][0])
        features["steps/language_instruction"] = (
            [["stack the cups", "wipe the table"][i % 2].encode()] * steps,
            "byte",
        )

    write_rlds_dataset(tmp_path / "src2", (4, 6, 3), mutate=other)
    convert(tmp_path / "src2", "oxe2")
    for args in (["merge", "oxe", "oxe2", "--name", "both"], ["merge", "both", "oxe", "--name", "again"]):
        assert runner.invoke(app, args).exit_code == 0
    both = open_dataset("both")
    want = step_texts(oxe) + step_texts(open_dataset("oxe2"))
    assert step_texts(both) == want
    assert step_texts(open_dataset("again")) == want + step_texts(oxe)  # a merge of a merge
    # a downsample kept each parent's raw index and no table: every instruction was lost
    assert runner.invoke(app, ["downsample", "both", "--every", "2", "--name", "half"]).exit_code == 0
    ends = both.episode_index
    kept = [want[s + t] for s, n in zip(ends["start"], ends["length"], strict=True) for t in range(0, n, 2)]
    assert step_texts(open_dataset("half")) == kept
    # so did a preprocess of it (the function saw each parent's own indices)
    fn = "tests.preprocess_fns:identity"
    assert (
        runner.invoke(app, ["preprocess", "both", "--fn", fn, "--name", "copy", "--workers", "1"]).exit_code
        == 0
    )
    assert step_texts(open_dataset("copy")) == want
    out = export_dataset(both, tmp_path / "le", "lerobot")
    tasks = pq.read_table(out / "meta/tasks.parquet").to_pydict()["__index_level_0__"]
    rows = [
        i
        for p in sorted((out / "data").rglob("*.parquet"))
        for i in pq.read_table(p)["task_index"].to_pylist()
    ]
    assert [tasks[i] for i in rows] == want and sorted(tasks) == sorted(set(want))
    assert (
        "language_instruction_index"
        not in pq.read_table(sorted((out / "data").rglob("*.parquet"))[0]).column_names
    )
    out = export_dataset(both, tmp_path / "rlds", "rlds")
    assert runner.invoke(app, ["download", str(out), "--name", "back"]).exit_code == 0
    assert step_texts(open_dataset("back")) == want
    import rlds_cli

    found = both.instructions
    assert found is not None and found.maps
    for to in ("torchrl", "d4rl", "minari", "amago"):  # numbers only: one would stand for two texts
        with pytest.raises(
            ExportError, match=r"number their language instructions .* each in their own table"
        ):
            export_dataset(both, tmp_path / f"numbers-{to}", to)
        assert not (tmp_path / f"numbers-{to}").exists()
    every = np.array(want, dtype=object)
    for batch in rlds_cli.Loader("both", batch_size=16, num_batches=3, seed=0):
        assert found.of_batch(batch).tolist() == every[np.asarray(batch["index"])].tolist()


def test_robocasa_instructions_survive_trim_downsample_and_merge(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """RoboCasa's per-demo ``lang``, ``ep_meta`` and ``model_file`` live in source_metadata.npz, which
    a trim, merge, downsample or preprocess did not carry: their exports lost the instructions and the
    robomimic export the scene files RoboCasa rebuilds its scenes from."""
    convert(ROBOCASA, "rc")
    rc = open_dataset("rc")
    texts = rc.episode_texts("robomimic/lang")
    assert runner.invoke(app, ["trim", "rc", "--start", "1", "--name", "rc_t"]).exit_code == 0
    assert runner.invoke(app, ["downsample", "rc", "--every", "2", "--name", "rc_d"]).exit_code == 0
    fn, workers = "tests.preprocess_fns:identity", "1"
    assert (
        runner.invoke(app, ["preprocess", "rc", "--fn", fn, "--name", "rc_p", "--workers", workers]).exit_code
        == 0
    )
    assert runner.invoke(app, ["split", "rc", "--val-episodes", "1"]).exit_code == 0
    assert runner.invoke(app, ["merge", "rc-val", "rc-train", "rc", "--name", "rc_m"]).exit_code == 0
    val, train = open_dataset("rc-val"), open_dataset("rc-train")
    merged = val.episode_texts("robomimic/lang") + train.episode_texts("robomimic/lang") + texts
    for name, want in (("rc_t", texts), ("rc_d", texts), ("rc_p", texts), ("rc_m", merged)):
        ds = open_dataset(name)
        assert ds.episode_texts("robomimic/lang") == want, name
        found = ds.instructions
        assert found is not None and [found.texts[i] for i in found.episode_task] == want, name  # type: ignore[union-attr]
    out = export_dataset(open_dataset("rc_t"), tmp_path / "t.hdf5", "robomimic")
    with h5py.File(out, "r") as f, h5py.File(ROBOCASA, "r") as g:
        for demo in f["data"]:
            for attr in ("ep_meta", "model_file"):
                assert f["data"][demo].attrs[attr] == g["data"][demo].attrs[attr], (demo, attr)
    for name in ("rc_m", "rc_p", "rc_d"):
        assert runner.invoke(app, ["inspect", name, "--check"]).exit_code == 0, name
    assert runner.invoke(app, ["verify", "rc_p"]).exit_code == 0


def test_instructions_that_are_not_utf8_stay_distinct(isolated_cache: Path, tmp_path: Path) -> None:
    """b"caf\\xe9" and b"caf\\xe8" both became "caf\\ufffd": one instruction, one exported task."""
    pytest.importorskip("crc32c")

    def latin1(i: int, features: dict) -> None:
        steps = len(features["steps/language_instruction"][0])
        features["steps/language_instruction"] = ([[b"caf\xe9", b"caf\xe8"][i % 2]] * steps, "byte")

    write_rlds_dataset(tmp_path / "src", (3, 4), mutate=latin1)
    convert(tmp_path / "src", "latin")
    ds = open_dataset("latin")
    a, b = ds.episode_index["length"].tolist()
    assert step_texts(ds) == ["caf\\xe9"] * a + ["caf\\xe8"] * b


def test_preprocess_by_episode_keeps_each_episodes_own_texts(isolated_cache: Path) -> None:
    """A function run per episode that dropped an episode (docs' filtering pattern), or any run of
    a merge whose parts share source ids (two recordings numbered demo_1..), lost every per-episode
    text and fact: they were kept only where the output's source ids were the input's first ones.
    Each output episode now takes its own parent's, through the returned ``episode`` column."""
    convert(ROBOCASA, "rc")
    rc = open_dataset("rc")
    texts = rc.episode_texts("robomimic/lang")
    convert(ROBOCASA, "rc2")  # a second recording, its demos numbered as the first's
    assert runner.invoke(app, ["merge", "rc", "rc2", "--name", "twice"]).exit_code == 0

    def run(source: str, fn: str, name: str) -> Dataset:
        args = ["preprocess", source, "--fn", f"tests.preprocess_fns:{fn}", "--by", "episode"]
        result = runner.invoke(app, [*args, "--workers", "1", "--name", name])
        assert result.exit_code == 0, result.output
        return open_dataset(name)

    assert run("rc", "identity", "rc_e").episode_texts("robomimic/lang") == texts
    dropped = run("rc", "drop_first_episode", "rc_drop")
    assert dropped.num_episodes == rc.num_episodes - 1
    assert dropped.episode_texts("robomimic/lang") == texts[1:]
    assert dropped.episode_metadata(0) == rc.episode_metadata(1)
    both = run("twice", "identity", "twice_e")
    assert both.episode_texts("robomimic/lang") == texts + texts
    assert both.episode_metadata(len(texts)) == rc.episode_metadata(0)
    # an episode column naming no input episode: no parent, so no facts (not another episode's)
    assert run("rc", "renumbers_episodes", "rc_r").episode_source_arrays() == {}


def test_copies_of_a_merge_of_libero_files_keep_each_episodes_instruction(
    isolated_cache: Path, tmp_path: Path
) -> None:
    """LIBERO keeps one instruction per file, in its metadata, which a merge of two files has none
    of: a preprocess or downsample of the merge lost every instruction (the merge had them)."""
    other = tmp_path / "libero_other.hdf5"
    shutil.copy(LIBERO, other)
    with h5py.File(other, "r+") as f:
        info = json.loads(f["data"].attrs["problem_info"])
        info["language_instruction"] = "close the top drawer"
        f["data"].attrs["problem_info"] = json.dumps(info)
    convert(LIBERO, "lib1")
    convert(other, "lib2")
    assert runner.invoke(app, ["merge", "lib1", "lib2", "--name", "m"]).exit_code == 0
    found = open_dataset("m").instructions
    assert found is not None and found.episode_task is not None
    want = [found.texts[t] for t in found.episode_task]
    assert set(want) == {"close the top drawer", open_dataset("lib1").instructions.texts[0]}  # type: ignore[union-attr]
    fn = ["--fn", "tests.preprocess_fns:identity", "--workers", "1"]
    for args in (
        ["preprocess", "m", *fn, "--name", "m-pp"],
        ["preprocess", "m", *fn, "--by", "episode", "--name", "m-pp-ep"],
        ["downsample", "m", "--every", "2", "--name", "m-ds"],
    ):
        assert runner.invoke(app, args).exit_code == 0, args
        copy = open_dataset(args[-1])
        got = copy.instructions
        assert got is not None and got.episode_task is not None, args
        assert [got.texts[t] for t in got.episode_task] == want, args
        assert runner.invoke(app, ["inspect", args[-1], "--check"]).exit_code == 0, args
    for name in ("m", "m-ds"):  # robomimic exports wrote no instruction (each demo's in ep_meta now)
        out = tmp_path / f"{name}.hdf5"
        assert runner.invoke(app, ["export", name, str(out), "--to", "robomimic"]).exit_code == 0
        convert(out, f"{name}-back")
        back = open_dataset(f"{name}-back").instructions
        assert back is not None and back.episode_task is not None, name
        assert [back.texts[t] for t in back.episode_task] == want, name


def test_a_copy_of_a_merge_of_lerobot_sources_exports_to_lerobot(oxe: Dataset, tmp_path: Path) -> None:
    """The parents' task tables differ, so the merge kept no LeRobot metadata: a downsample of it
    took LeRobot's bookkeeping columns for the user's own ('taken twice') and was refused."""
    for name, episodes in (("v1", "0:2"), ("v2", "2:4")):  # other instructions: other tables
        assert runner.invoke(app, ["view", "oxe", "-e", episodes, "--name", name]).exit_code == 0
        export_dataset(open_dataset(name), tmp_path / f"{name}.lerobot", "lerobot")
        convert(tmp_path / f"{name}.lerobot", f"{name}-L")
    assert runner.invoke(app, ["merge", "v1-L", "v2-L", "--name", "mL"]).exit_code == 0
    assert open_dataset("v1-L").source_metadata != open_dataset("v2-L").source_metadata
    assert runner.invoke(app, ["downsample", "mL", "--every", "2", "--name", "mL1"]).exit_code == 0
    result = runner.invoke(app, ["export", "mL1", str(tmp_path / "mL1.out"), "--to", "lerobot"])
    assert result.exit_code == 0, result.output
    convert(tmp_path / "mL1.out", "mL1-back")
    assert step_texts(open_dataset("mL1-back")) == step_texts(open_dataset("mL1"))
    assert set(step_texts(open_dataset("mL1"))) == set(step_texts(open_dataset("mL")))
