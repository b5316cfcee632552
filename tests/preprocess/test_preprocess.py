"""``rlds_cli.preprocess``: the library API (function references, modes, schema checks, stats,
lineage, reuse). The CLI, resume after SIGKILL and Ray live in test_preprocess_cli.py."""

from __future__ import annotations

import hashlib
import importlib
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rlds_cli import preprocess
from rlds_cli.cache import stats as pstats
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetExistsError,
    FunctionImportError,
    OutputSchemaError,
    PreprocessError,
    UserFunctionError,
)
from rlds_cli.preprocess.plan import make_plan
from tests.dataset_fixtures import assert_same, everything, make_dataset

FNS = "tests.preprocess_fns"
FNS_FILE = str(Path(__file__).parents[1] / "preprocess_fns.py")


@pytest.fixture
def golden() -> str:
    # not conftest's golden_dataset (the D4RL golden file): a small make_dataset cache named "golden"
    make_dataset("golden", [3, 3, 2])
    return "golden"


@pytest.fixture
def medium() -> str:
    make_dataset("medium", [7, 13, 1, 20, 9, 30, 4])  # 84 steps
    return "medium"


# --------------------------------------------------------------------------- function references


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("tests.no_such_module:f", "no module named 'tests.no_such_module'"),
        (f"{FNS}:no_such_function", "has no attribute 'no_such_function'"),
        (f"{FNS}:NOT_CALLABLE", "'NOT_CALLABLE' is not callable"),
        ("no-colon-here", "is not of the form"),
        ("missing/file.py:f", "does not exist"),
        ("tests/:f", "tests is a folder, not a Python file"),  # said "file tests does not exist"
    ],
    ids=["bad-module", "bad-name", "not-callable", "malformed", "missing-file", "a-folder"],
)
def test_function_reference_errors(golden: str, ref: str, message: str) -> None:
    with pytest.raises(FunctionImportError, match=message) as info:
        preprocess.run(golden, ref, "out")
    assert isinstance(info.value, ImportError)
    assert not open_dataset(golden).directory.parent.joinpath("out").exists()


def test_a_module_edited_since_its_import_is_refused_not_mixed(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook ran ``mymod:fn``, edited mymod.py, ran again: this process ran the old function,
    the spawned workers the new one, and the lineage named the new file (one dataset held both)."""
    mod = tmp_path / "edited_in_a_notebook.py"
    # a cache the module fills as it runs (not an edit); a constant it keeps
    body = (
        "calls = []\nFACTOR = 2\n\n"
        "def fn(b):\n    calls.append(1)\n    return {**b, 'action': b['action'] * FACTOR}\n"
    )
    mod.write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = "edited_in_a_notebook:fn"
    preprocess.run(golden, ref, "a", workers=1)
    mod.write_text("# the factor, again\n\n" + body)
    preprocess.run(golden, ref, "b", workers=1)  # lines moved, same code, the cache filled: runs
    mod.write_text("def fn(b):\n    return {**b, 'action': b['action'] * 10}\n")
    with pytest.raises(FunctionImportError, match="function 'fn' differs"):
        preprocess.run(golden, ref, "c", workers=2)
    assert not open_dataset(golden).directory.parent.joinpath("c").exists()
    importlib.reload(sys.modules["edited_in_a_notebook"])
    preprocess.run(golden, ref, "c", workers=2)
    np.testing.assert_array_equal(open_dataset("c")[:]["action"], open_dataset(golden)[:]["action"] * 10)


def test_file_path_reference_works_and_records_file_hash(golden: str) -> None:
    result = preprocess.run(golden, f"{FNS_FILE}:normalize", "out", workers=1)
    lineage = result.manifest.lineage[0]
    assert lineage["fn"] == f"{FNS_FILE}:normalize"
    assert lineage["fn_sha256"] == hashlib.sha256(Path(FNS_FILE).read_bytes()).hexdigest()
    out = open_dataset("out")[:]
    src = open_dataset(golden)[:]
    assert np.array_equal(out["observation"], ((src["observation"] - 1.5) / 2).astype(np.float32))


def test_callable_from_python(golden: str) -> None:
    from tests import preprocess_fns

    result = preprocess.run(golden, preprocess_fns.normalize, "out", workers=1)
    assert result.manifest.lineage[0]["fn"] == f"{FNS}:normalize"


# --------------------------------------------------------------------------- per-step mode


def test_per_step_identity_and_transform(medium: str) -> None:
    src = everything(medium)
    preprocess.run(medium, f"{FNS}:identity", "same", workers=1, chunk_steps=10)
    assert_same(everything("same"), src)
    preprocess.run(medium, f"{FNS}:add_features", "feat", workers=1, chunk_steps=10)
    out = open_dataset("feat")
    assert "info/qpos" not in out.fields
    assert out.fields["obs_norm"] == ((1,), "float32")
    assert out.fields["next/reward"] == ((1,), "float64")
    data = out[:]
    assert np.allclose(data["obs_norm"][:, 0], np.linalg.norm(src["observation"], axis=1), rtol=1e-6)
    assert np.array_equal(data["next/reward"], src["next/reward"].astype(np.float64) * 2)
    assert np.array_equal(data["next/observation"], src["next/observation"])


def test_memmap_and_zarr_outputs_agree(medium: str) -> None:
    preprocess.run(medium, f"{FNS}:normalize", "mm", workers=1, chunk_steps=16)
    preprocess.run(medium, f"{FNS}:normalize", "zz", workers=1, chunk_steps=16, storage="zarr")
    assert open_dataset("zz").manifest.backend == "zarr"
    assert_same(everything("mm"), everything("zz"))
    fn = f"{FNS}:drop_short_episodes"
    preprocess.run(medium, fn, "ep-mm", by="episode", workers=1, chunk_steps=16, num_frames=60)
    preprocess.run(medium, fn, "ep-zz", by="episode", chunk_steps=16, num_frames=60, storage="zarr")
    assert_same(everything("ep-mm"), everything("ep-zz"))


@pytest.mark.parametrize("shards", ["one-row-shards", "default-shards"])
def test_zarr_direct_mode_equals_files_mode_byte_for_byte(
    medium: str, shards: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-step chunks written in place, each into its own regions of the preallocated zarr
    columns (Backend.open_region): with shards of one row every chunk's region is aligned, so
    the job runs in direct mode; with the default shards the chunks of a multi-chunk plan share
    a shard, so it falls back to chunk files. Either way the output is the files mode's, file
    for file."""
    from rlds_cli.cache.backends.zarr import write as backends
    from rlds_cli.preprocess import output

    if shards == "one-row-shards":
        monkeypatch.setattr(backends, "ZARR_CHUNK_BYTES", 1)
        monkeypatch.setattr(backends, "ZARR_SHARD_BYTES", 1)
    preallocated: list[Path] = []
    real_preallocate = output.preallocate

    def spy(out: Path, *args: object) -> None:
        preallocated.append(out)
        real_preallocate(out, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(output, "preallocate", spy)
    fn = f"{FNS}:add_features"
    preprocess.run(medium, fn, "direct", workers=2, chunk_steps=16, storage="zarr")
    assert len(preallocated) == (1 if shards == "one-row-shards" else 0)
    monkeypatch.setattr(output, "direct_possible", lambda *args: False)
    preprocess.run(medium, fn, "files", workers=2, chunk_steps=16, storage="zarr")
    assert len(preallocated) <= 1
    direct, files = open_dataset("direct"), open_dataset("files")
    assert direct.manifest.content_digest == files.manifest.content_digest
    written = {p.relative_to(files.directory) for p in files.directory.rglob("*") if p.is_file()}
    assert written == {p.relative_to(direct.directory) for p in direct.directory.rglob("*") if p.is_file()}
    for rel in sorted(written - {Path("manifest.json")}):
        assert (direct.directory / rel).read_bytes() == (files.directory / rel).read_bytes(), rel
    assert_same(everything("direct"), everything("files"))


def test_source_is_never_modified(medium: str) -> None:
    directory = open_dataset(medium).directory
    before = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    preprocess.run(medium, f"{FNS}:normalize", "out", workers=1, chunk_steps=16)
    after = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    assert before == after


def test_inputs_are_read_only(golden: str) -> None:
    with pytest.raises(UserFunctionError, match="read-only"):
        preprocess.run(golden, f"{FNS}:in_place", "out", workers=1)


# --------------------------------------------------------------------------- per-episode mode


def test_per_episode_returns_to_go_golden(golden: str) -> None:
    preprocess.run(golden, f"{FNS}:returns_to_go", "rtg", by="episode", workers=1, chunk_steps=4)
    out = open_dataset("rtg")
    # rewards are 1..8 in episodes of 3, 3 and 2 steps; returns-to-go written out by hand
    assert out[:]["return_to_go"][:, 0].tolist() == [6, 5, 3, 15, 11, 6, 15, 8]
    assert out.episodes["length"].tolist() == [3, 3, 2]
    assert_same({k: v for k, v in out[:].items() if k != "return_to_go"}, dict(open_dataset(golden)[:]))


def test_per_episode_filtering_whole_episodes(medium: str) -> None:
    src = open_dataset(medium)
    result = preprocess.run(
        medium, f"{FNS}:drop_short_episodes", "long", by="episode", workers=1, chunk_steps=25
    )
    out = open_dataset("long")
    kept = [e for e, n in enumerate(src.episodes["length"]) if n >= 3]
    assert out.episodes["length"].tolist() == [int(src.episodes["length"][e]) for e in kept]
    assert out.episodes["source_id"].tolist() == kept
    assert result.manifest.num_steps == sum(int(src.episodes["length"][e]) for e in kept)
    for j, e in enumerate(kept):
        a, b = out.episode(j), src.episode(e)
        for key in ("observation", "next/observation", "action", "next/reward", "next/terminated"):
            assert np.array_equal(a[key], b[key]), (e, key)


def test_per_episode_chunks_hold_whole_episodes(medium: str) -> None:
    ds = open_dataset(medium)
    plan = make_plan(ds.episode_index, "episode", 25, None)
    starts = set(ds.episodes["start"].tolist()) | {ds.num_steps}
    assert set(plan.bounds.tolist()) <= starts
    assert plan.bounds[0] == 0 and plan.bounds[-1] == ds.num_steps


def test_dropping_everything_is_an_error(golden: str) -> None:
    with pytest.raises(OutputSchemaError, match="dropped every step"):
        preprocess.run(golden, f"{FNS}:drop_everything", "none", by="episode", workers=1)


# --------------------------------------------------------------------------- schema errors


@pytest.mark.parametrize(
    ("fn", "by", "message"),
    [
        ("returns_list", "step", "returned list, expected a mapping"),
        ("no_action", "step", "returned no action"),
        ("drops_a_step", "step", "per-step mode keeps every step"),
        ("noisy", "step", "next/observation at step 0 differs from observation at step 1"),
        ("cut_episode", "episode", "does not end an episode"),
        # named as the cache's ("under .../out cannot be a file name", "the dataset was tampered with")
        ("bad_key", "step", r"output key 'a//b' cannot be stored: it has an empty part"),
        ("text_key", "step", r"output key 'label': values of type ndarray are fixed-width unicode"),
        # "unexpected ValueError" / "unexpected TypeError" / "unexpected ValueError" (the shape)
        ("ragged_key", "step", r"output key 'info/ragged': values of type list are not an array of numbers"),
        (
            "bfloat16_key",
            "step",
            r"output key 'info/half': values of type Tensor are not an array of numbers",
        ),
        ("wide_done", "step", r"returned next/done of shape \(\d+, 2\): it is one flag per step"),
        # zarr: "unexpected ValueError"; memmap: stored, and the torchrl export lost 'feat'
        ("leaf_and_group", "step", r"output key 'feat' is both an array and a group \('feat/x'\)"),
        # stored, then audit and the npz and torchrl exports failed ('unexpected IndexError')
        ("empty_key", "step", r"output key 'info/empty' has per-step shape \(0,\): no value per step"),
        # stored before, then read as 3x the return (vector) or returns of 1.0 (bool)
        ("vector_reward", "step", r"output key 'next/reward' has shape \(\d+, 3\): it is one value per step"),
        ("bool_reward", "step", r"output key 'next/reward' has dtype bool; a reward is a number"),
        ("wide_flags", "step", r"'next/terminated' has shape \(\d+, 2\)"),  # was "unexpected ValueError"
        ("float_flags", "step", r"'next/truncated' is float32 holding values other than 0 and 1"),
    ],
)
def test_output_schema_errors(medium: str, fn: str, by: str, message: str) -> None:
    """Each names the function; a job whose function fails on its first chunk (schema inference)
    leaves no folder (an empty one was left per failed attempt, never resumable)."""
    with pytest.raises(OutputSchemaError, match=message) as info:
        preprocess.run(medium, f"{FNS}:{fn}", "out", by=by, workers=1, chunk_steps=16)
    assert f"{FNS}:{fn}" in info.value.message
    cache = open_dataset(medium).directory.parent.parent
    assert not (cache / "datasets" / "out").exists()
    if "schema inference" in info.value.message:
        assert not list((cache / "tmp").glob("out.job-*"))


def test_inconsistent_chunks_are_named(medium: str) -> None:
    with pytest.raises(OutputSchemaError) as info:
        preprocess.run(medium, f"{FNS}:bad_dtype_later", "out", workers=1, chunk_steps=16)
    msg = info.value.message
    # per-step chunks end on episode ends (7, 21) where one falls in the 16-step window
    assert "chunk 2 (steps 21-36" in msg and "float64" in msg and "float32" in msg


def test_flat_mismatch_across_chunk_boundary(medium: str) -> None:
    # consistent inside every chunk, but observation jumps at chunk boundaries inside episodes
    # chunk 1 is steps 7-16: episode 1 (steps 7-19) is longer than a 10-step chunk, so it is cut
    with pytest.raises(OutputSchemaError, match=r"chunks 1 and 2: next/observation at step 16 differs"):
        preprocess.run(medium, f"{FNS}:per_chunk_offset", "out", workers=1, chunk_steps=10)


def test_user_exception_names_function_chunk_and_range(medium: str) -> None:
    with pytest.raises(UserFunctionError) as info:
        preprocess.run(medium, f"{FNS}:raises", "out", workers=1, chunk_steps=16)
    msg = info.value.message
    assert f"function {FNS}:raises, chunk 2 (steps 21-36, episodes 3-3)" in msg
    assert "ValueError: boom in user code" in msg
    tb = info.value.user_traceback
    assert "preprocess_fns.py" in tb and 'raise ValueError("boom in user code")' in tb
    assert "rlds_cli" not in tb  # only the user's frames


def test_a_pair_of_another_dtype_in_a_later_chunk_names_the_function_and_chunk(medium: str) -> None:
    with pytest.raises(
        OutputSchemaError, match=rf"function {FNS}:pair_mismatch_later, chunk \d+ .*they must match"
    ):
        preprocess.run(medium, f"{FNS}:pair_mismatch_later", "out", workers=1, chunk_steps=10)


def test_an_exception_that_cannot_be_printed_is_still_the_users(medium: str) -> None:
    """Its ``__str__`` raising made the error rlds' own 'unexpected RuntimeError', traceback lost."""
    with pytest.raises(UserFunctionError, match=r"raised _Unprintable: <exception str\(\) failed>") as info:
        preprocess.run(medium, f"{FNS}:raises_unprintable", "out", workers=1)
    assert "raise _Unprintable()" in info.value.user_traceback


@pytest.mark.parametrize("resume", [False, True])
def test_error_in_schema_inference(golden: str, isolated_cache: Path, resume: bool) -> None:
    """With --resume, a run that failed before any chunk kept an empty job folder in tmp/ and did
    not say so: nothing a resume could continue."""
    with pytest.raises(UserFunctionError, match="schema inference on steps 0-2"):
        preprocess.run(golden, f"{FNS}:always_raises", "out", by="episode", resume=resume)
    assert not list((isolated_cache / "tmp").iterdir())


def test_bad_arguments(golden: str) -> None:
    for kwargs, message in (
        ({"by": "row"}, "--by must be"),
        ({"backend": "spark"}, "--executor must be"),
        ({"keys": ["nope"]}, "has no keys"),
        ({"chunk_steps": 0}, "--chunk-steps"),
    ):
        with pytest.raises(PreprocessError, match=message) as info:
            preprocess.run(golden, f"{FNS}:identity", "out", **kwargs)
        assert info.value.hint, message  # every refusal says what to do
    with pytest.raises(PreprocessError, match="must differ"):
        preprocess.run(golden, f"{FNS}:identity", golden)


# --------------------------------------------------------------------------- dry run, num_frames, keys


def test_dry_run_shows_schema_and_writes_nothing(golden: str, isolated_cache: Path) -> None:
    info = preprocess.dry_run(golden, f"{FNS}:add_features")
    assert info.output["obs_norm"] == {"shape": [1], "dtype": "float32", "storage": "step"}
    assert info.output["observation"]["storage"] == "flat"
    assert "info/qpos" not in info.output
    assert info.input["next/observation"] == {"shape": [2], "dtype": "float32"}
    assert (info.steps, info.sample_steps_in, info.sample_steps_out) == (8, 8, 8)
    assert sorted(p.name for p in (isolated_cache / "datasets").iterdir()) == [golden]
    assert not (isolated_cache / "tmp").exists() or not any((isolated_cache / "tmp").iterdir())


def test_num_frames_cuts_the_last_episode(golden: str) -> None:
    preprocess.run(golden, f"{FNS}:identity", "first5", num_frames=5, workers=1, chunk_steps=2)
    out, src = open_dataset("first5"), open_dataset(golden)
    assert (out.num_steps, out.num_episodes) == (5, 2)
    a, b = out[:], src[:5]
    assert np.array_equal(a["next/observation"], b["next/observation"])  # real next observation at the cut
    assert a["next/truncated"][:, 0].tolist() == [False, False, False, False, True]
    assert a["next/terminated"][:, 0].tolist() == [False, False, True, False, False]
    preprocess.run(golden, f"{FNS}:identity", "first-eps", num_frames=5, by="episode", workers=1)
    assert open_dataset("first-eps").num_steps == 3  # whole episodes only


def test_keys_restrict_the_input(golden: str) -> None:
    info = preprocess.dry_run(
        golden, f"{FNS}:identity", keys=["observation", "next/observation", "action", "next/reward"]
    )
    assert "info/qpos" not in info.output


# --------------------------------------------------------------------------- statistics


def test_stats_equal_numpy_on_the_full_data(medium: str) -> None:
    preprocess.run(medium, f"{FNS}:add_features", "s", workers=1, chunk_steps=10, stats=True)
    ds = open_dataset("s")
    data = ds[:]
    got = preprocess.load_stats(ds)
    assert set(got) == {"action", "next/reward", "obs_norm", "observation"}  # numeric, not bool
    for key, s in got.items():
        x = data[key].astype(np.float64)
        assert s.count == len(x)
        np.testing.assert_allclose(s.mean, x.mean(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s.std, x.std(axis=0), rtol=1e-10, atol=1e-12)
        assert np.array_equal(s.min, x.min(axis=0)) and np.array_equal(s.max, x.max(axis=0))
        for q, value in s.quantiles.items():
            # approximate: within the spread of one 1/256 rank step of the data, with margin
            lo = np.quantile(x, max(q - 0.05, 0), axis=0)
            hi = np.quantile(x, min(q + 0.05, 1), axis=0)
            assert np.all((value >= lo - 1e-9) & (value <= hi + 1e-9)), (key, q)


def test_stats_of_many_chunks_are_merged_one_chunk_at_a_time(medium: str) -> None:
    """The coordinator loaded every chunk's summary at once (a 257 x 256 float64 sketch per chunk
    for this key): 355 MB at 1,000 chunks. It now holds one (4.5 MB here, 16 MB before)."""
    import tracemalloc

    tracemalloc.start()
    try:
        preprocess.run(medium, f"{FNS}:wide_feature", "wide", workers=1, chunk_steps=4, stats=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert preprocess.load_stats(open_dataset("wide"))["feat"].count == 84
    assert peak < 9 << 20, f"{peak:,} bytes"  # 21 chunks' sketches held at once: 16 MB


def test_stats_merge_is_chan_exact() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(i, 1 + i, size=(n, 3)) for i, n in enumerate([5, 1, 100, 37])]
    merged = None
    for part in parts:
        merged = pstats.merge(merged, pstats.partial(part))
    full = np.concatenate(parts)
    assert merged is not None
    out = pstats.finalize(merged, (3,))
    np.testing.assert_allclose(out["mean"], full.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(out["std"], full.std(axis=0), rtol=1e-12)
    median = np.asarray(out["quantiles"]["0.5"])
    ranks = (full < median).mean(axis=0)
    assert np.all(np.abs(ranks - 0.5) < 0.03)


def _merged_quantiles(x: np.ndarray, rows: int) -> dict[str, list[float]]:
    merged = None
    for start in range(0, len(x), rows):
        merged = pstats.merge(merged, pstats.partial(x[start : start + rows]))
    assert merged is not None
    return pstats.finalize(merged, x.shape[1:])["quantiles"]


def test_stats_quantiles_of_discrete_data_do_not_depend_on_the_chunks() -> None:
    """A count of 0..6 had a median of 2.63 in 8 chunks (3 in one): the merge spread each value's
    mass linearly to the next. Values held over several grid points are atoms now."""
    x = np.stack([np.arange(5600) % 7, np.arange(5600) % 2], axis=1).astype(np.int16)
    one = _merged_quantiles(x, len(x))
    assert one["0.25"] == [1.0, 0.0] and one["0.5"] == [3.0, 0.0] and one["0.99"] == [6.0, 1.0]
    for rows in (700, 70):  # chunks alike: exact
        assert _merged_quantiles(x, rows) == one, rows
    # chunks of 33 steps differ: each quantile's rank within 2 grid steps of the data's
    for q, values in _merged_quantiles(x, 33).items():
        for column, value in zip(x.T, values, strict=True):
            below, upto = (column < value).mean(), (column <= value).mean()
            assert below - 2 / 256 <= float(q) <= upto + 2 / 256, (q, value)


def test_stats_quantiles_of_small_chunks_keep_their_ranks() -> None:
    """Chunks of 20 steps each interpolated between their 20 values, which spread their mass: a
    rank error of 0.019 (5 grid steps) on shuffled uniform data, now under one grid step."""
    x = np.random.default_rng(1).permutation(np.arange(5000.0))[:, None]
    for q, (value,) in _merged_quantiles(x, 20).items():
        assert abs((x < value).mean() - float(q)) < 1 / 256, q


def test_stats_quantiles_with_infinities_and_nan_do_not_depend_on_the_chunks() -> None:
    """One inf made q0.99 NaN once merged, a NaN vanished (median 2499 instead of NaN), and a key
    mostly inf had a median of 0.0 (its minimum)."""
    x = np.repeat(np.arange(5000.0)[:, None], 3, axis=1)
    x[4321, 0] = np.inf
    x[123, 1] = np.nan
    x[350:, 2] = np.inf
    for rows in (len(x), 625, 50):
        got = _merged_quantiles(x, rows)
        assert all(np.isnan(v[1]) for v in got.values()), rows
        assert np.isfinite(got["0.99"][0]) and abs(got["0.99"][0] - np.quantile(x[:, 0], 0.99)) < 20, rows
        assert got["0.5"][2] == np.inf and abs(got["0.05"][2] - np.quantile(x[:, 2], 0.05)) < 20, rows


def test_stats_merge_keeps_infinite_means_as_numpy_does() -> None:
    """inf - inf in Chan's update made a mean of +inf nan (and numpy warned, on the CLI's stderr)."""
    cols = [
        [[1.0], [np.inf]],
        [[2.0], [3.0]],
        [[-np.inf], [0.0]],  # +inf, then -inf joins it: nan
    ]
    parts = [np.array(c) for c in cols]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = pstats.merge(pstats.partial(parts[0]), pstats.partial(parts[1]))
        assert first is not None and first.mean.tolist() == [np.inf]
        both = pstats.merge(first, pstats.partial(parts[2]))
        assert both is not None and np.isnan(both.mean).all()
        rest = pstats.merge(pstats.partial(parts[1]), pstats.partial(parts[0]))
        assert rest is not None and rest.mean.tolist() == [np.inf]


def test_stats_large_shapes_are_reduced() -> None:
    p = pstats.partial(np.arange(2 * 5000, dtype=np.float32).reshape(2, 5000))
    assert p is not None and p.reduced and p.sketch is None
    out = pstats.finalize(p, (5000,))
    assert out["shape"] == [] and out["mean"] == pytest.approx(4999.5)


def test_no_stats_without_flag(golden: str) -> None:
    preprocess.run(golden, f"{FNS}:identity", "plain", workers=1)
    assert preprocess.load_stats(open_dataset("plain")) == {}
    assert "stats" not in open_dataset("plain").manifest.to_dict()


# --------------------------------------------------------------------------- lineage and reuse


def test_lineage_contents(golden: str) -> None:
    src = open_dataset(golden)
    result = preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1, chunk_steps=4)
    (parent,) = result.manifest.lineage
    assert parent["name"] == golden
    assert parent["digest"] == src.manifest.digest()
    assert parent["fn"] == f"{FNS}:normalize"
    assert parent["fn_sha256"] == hashlib.sha256(Path(FNS_FILE).read_bytes()).hexdigest()
    assert parent["args"] == {
        "by": "step",
        "chunk_steps": 4,
        "keys": None,
        "num_frames": None,
        "stats": False,
        "storage": "memmap",
    }
    assert parent["rlds_version"]
    assert parent["parent_lineage"] == []
    preprocess.run("norm", f"{FNS}:identity", "norm2", workers=1)
    chain = open_dataset("norm2").manifest.lineage[0]
    assert chain["name"] == "norm" and chain["parent_lineage"][0]["name"] == golden


def test_rerun_is_a_noop_unless_force(golden: str) -> None:
    first = preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1)
    again = preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1)
    assert again.reused and again.manifest.created_at == first.manifest.created_at
    assert again.manifest.lineage == first.manifest.lineage
    with pytest.raises(DatasetExistsError):
        preprocess.run(golden, f"{FNS}:identity", "norm", workers=1)
    before = everything("norm")
    forced = preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1, force=True)
    assert not forced.reused
    # the rebuilt dataset holds the data again (not the zeros of fresh, never-written files)
    assert_same(everything("norm"), before)
    assert np.any(before["observation"] != 0)


def test_an_edit_of_a_decorated_function_is_a_new_job(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function wrapped by a decorator of another file (``functools.wraps``) was recorded with
    the decorator file's sha256: once the function was edited, the re-run said "nothing to do" and
    kept the old output."""
    (tmp_path / "deco_for_rlds.py").write_text(
        "import functools\n\ndef logged(f):\n    @functools.wraps(f)\n"
        "    def w(b):\n        return f(b)\n    return w\n"
    )
    user = tmp_path / "decorated_fn_for_rlds.py"
    user.write_text("from deco_for_rlds import logged\n\n@logged\ndef same(b):\n    return dict(b)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = "decorated_fn_for_rlds:same"
    assert not preprocess.run(golden, ref, "deco", workers=1).reused
    assert preprocess.run(golden, ref, "deco", workers=1).reused
    user.write_text(user.read_text() + "\n# edited\n")
    with pytest.raises(DatasetExistsError):  # another job now: not "nothing to do"
        preprocess.run(golden, ref, "deco", workers=1)


def test_an_edit_of_a_helper_module_is_a_new_job(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's identity covered the function's file only: after an edit of a module it imports
    (the user's own, beside it), ``--resume`` kept chunks the old helper computed."""
    helper = tmp_path / "scale_helper_for_rlds.py"
    helper.write_text("FACTOR = 2\n\ndef scale(x):\n    return x * FACTOR\n")
    user = tmp_path / "uses_helper_for_rlds.py"
    user.write_text(
        "import numpy as np\nfrom scale_helper_for_rlds import scale\n\n"
        "def double(b):\n    return {**b, 'action': scale(np.asarray(b['action']))}\n"
        # an object whose attributes run code (a proxy outside its context): no module, no error
        "class _Proxy:\n    def __getattribute__(self, name):\n        raise RuntimeError('no context')\n"
        "PROXY = _Proxy()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = "uses_helper_for_rlds:double"
    first = preprocess.run(golden, ref, "helped", workers=1)
    assert first.manifest.lineage[0]["fn_helpers_sha256"]
    assert preprocess.run(golden, ref, "helped", workers=1).reused
    helper.write_text(helper.read_text().replace("FACTOR = 2", "FACTOR = 3"))
    # this process still holds FACTOR = 2: it would compute with it under the new file's digest
    with pytest.raises(FunctionImportError, match="FACTOR is 2 here, 3 in the file"):
        preprocess.run(golden, ref, "helped", workers=1)
    importlib.reload(sys.modules["scale_helper_for_rlds"])
    with pytest.raises(DatasetExistsError):  # another job now: not "nothing to do"
        preprocess.run(golden, ref, "helped", workers=1)
    # numpy and rlds are not the user's: a function using only them has no helper digest
    assert (
        "fn_helpers_sha256"
        not in preprocess.run(golden, f"{FNS}:identity", "plain", workers=1).manifest.lineage[0]
    )


def test_a_file_reference_imports_modules_beside_the_caller_as_its_workers_do(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'--fn myfn.py:f' run in the folder of myfn.py, whose file imports a module beside it, was
    refused ('No module named ...') though the workers, which put the caller's folder on their
    path, would have found it (the module form 'myfn:f' worked)."""
    (tmp_path / "sibling_helper_for_rlds.py").write_text("SCALE = 2\n")
    (tmp_path / "uses_sibling_for_rlds.py").write_text(
        "import sibling_helper_for_rlds\n\ndef same(b):\n    return dict(b)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert preprocess.run(golden, "uses_sibling_for_rlds.py:same", "sib", workers=1).manifest.num_steps == 8


def test_a_value_imported_by_name_from_a_helper_is_part_of_the_job(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from helper import SCALE`` holds a float, which names no module: an edit of helper.py kept
    the job, so a re-run was 'nothing to do' over the old output and ``--resume`` mixed both."""
    helper = tmp_path / "constant_helper_for_rlds.py"
    helper.write_text("SCALE = 2\n")
    user = tmp_path / "uses_constant_for_rlds.py"
    user.write_text(
        "import numpy as np\nfrom constant_helper_for_rlds import SCALE\n\n"
        "def scaled(b):\n    return {**b, 'action': np.asarray(b['action']) * SCALE}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = "uses_constant_for_rlds:scaled"
    assert preprocess.run(golden, ref, "scaled", workers=1).manifest.lineage[0]["fn_helpers_sha256"]
    helper.write_text("SCALE = 3\n")
    with pytest.raises(FunctionImportError, match="SCALE is 2 here, 3 in the file"):
        preprocess.run(golden, ref, "scaled", workers=1)
    importlib.reload(sys.modules["constant_helper_for_rlds"])
    importlib.reload(sys.modules["uses_constant_for_rlds"])
    with pytest.raises(DatasetExistsError):  # another job now: not "nothing to do"
        preprocess.run(golden, ref, "scaled", workers=1)


def test_a_constant_edited_beside_a_class_or_local_name_of_its_name_is_refused(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class attribute or a function's local of the same name counted as a second binding of the
    module's constant, which then was not compared: the old value ran under the new file's digest."""
    user = tmp_path / "shadowed_constant_for_rlds.py"
    user.write_text(
        "import numpy as np\nSCALE = 2\n\nclass Config:\n    SCALE = 1\n\n"
        "def scaled(b):\n    factor = SCALE\n    return {**b, 'action': np.asarray(b['action']) * factor}\n"
        "\ndef other():\n    SCALE = 5\n    return SCALE\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("shadowed_constant_for_rlds")
    user.write_text(user.read_text().replace("SCALE = 2", "SCALE = 3"))
    with pytest.raises(FunctionImportError, match="SCALE is 2 here, 3 in the file"):
        preprocess.run(golden, "shadowed_constant_for_rlds:scaled", "shadowed", workers=1)


def test_a_constant_set_again_where_the_module_runs_is_no_edit(
    golden: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unedited module was refused as 'changed since this process imported it' when an
    UPPER_CASE constant was set again in an ``if``, by ``+=`` or by a function's ``global``."""
    user = tmp_path / "sets_constants_for_rlds.py"
    user.write_text(
        "DEVICE = 'cpu'\nif True:\n    DEVICE = 'cuda'\nN_STACK = 2\nN_STACK += 1\nCALLS = 0\n\n"
        "def same(b):\n    global CALLS\n    CALLS += 1\n    return dict(b)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not preprocess.run(golden, "sets_constants_for_rlds:same", "same", workers=1).reused
    assert preprocess.run(golden, "sets_constants_for_rlds:same", "same", workers=1).reused


STOPS_ONCE = """
import os

def double(batch):
    if os.path.exists(os.environ["RLDS_TEST_STOP_MARK"]) and batch["index"][0] >= 40:
        raise ValueError("stopped")
    out = dict(batch)
    out["action"] = batch["action"] * 2
    return out
"""


@pytest.mark.parametrize(
    ("by", "damaged"), [("step", "rows"), ("episode", "rows"), ("step", "marker"), ("episode", "marker")]
)
def test_a_damaged_finished_chunk_is_run_again_on_resume(
    medium: str,
    by: str,
    damaged: str,
    tmp_path: Path,
    isolated_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A byte flipped in the rows a finished chunk of an interrupted job had written (the output's
    region, per step) was published by ``--resume`` with fresh digests; in its chunk file (per
    episode), or in its done-marker, it was 'unexpected BadZipFile' at every resume. Each is now
    found and run again."""
    fn = tmp_path / "stops_once.py"
    fn.write_text(STOPS_ONCE)
    mark = tmp_path / "stop"
    monkeypatch.setenv("RLDS_TEST_STOP_MARK", str(mark))
    ref = preprocess.run(medium, f"{fn}:double", "ref", workers=1, chunk_steps=10, by=by)
    mark.touch()
    with pytest.raises(UserFunctionError):
        preprocess.run(medium, f"{fn}:double", "out", workers=1, chunk_steps=10, by=by)
    (job,) = (isolated_cache / "tmp").glob("out.job-*")
    if by == "step" and damaged == "rows":
        target = job / "out" / "arrays" / "action.npy"
        offset = np.load(target, mmap_mode="r").offset + 2  # in the first chunk's rows
    else:  # a byte of the largest member's data (a local header's sizes are not read back)
        target = job / "chunks" / ("00000000.done.npz" if damaged == "marker" else "00000000.data.npz")
        with zipfile.ZipFile(target) as members:
            info = max(members.infolist(), key=lambda i: i.file_size)
        offset = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.file_size // 2
    data = bytearray(target.read_bytes())
    data[offset] ^= 0x10
    target.write_bytes(bytes(data))
    mark.unlink()
    with caplog.at_level("WARNING", logger="rlds_cli.preprocess"):
        result = preprocess.run(medium, f"{fn}:double", "out", workers=1, chunk_steps=10, by=by, resume=True)
    assert result.resumed_chunks >= 1
    assert damaged == "marker" or "chunk 0 of the interrupted run is damaged" in caplog.text
    assert_same(everything("out"), everything(ref.manifest.name))


def test_a_damaged_source_is_refused_before_anything_is_made(golden: str, isolated_cache: Path) -> None:
    """A flipped byte of the source (or of a view's parent) was copied into the output, which got
    fresh digests and passed verify."""
    from rlds_cli.cache.derive import create_view

    create_view(golden, "first", episodes=(0, 2))
    column = isolated_cache / "datasets" / golden / "arrays" / "action.npy"
    data = bytearray(column.read_bytes())
    data[-1] ^= 1
    column.write_bytes(bytes(data))
    for source in (golden, "first"):
        with pytest.raises(CorruptDatasetError, match=rf"dataset '{source}' is damaged: 'action'"):
            preprocess.run(source, f"{FNS}:identity", "out", workers=1)
    assert not (isolated_cache / "datasets" / "out").exists()


def test_a_damaged_output_of_the_same_job_is_named_not_reused(golden: str, isolated_cache: Path) -> None:
    preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1)
    before = everything("norm")
    (isolated_cache / "datasets" / "norm" / "arrays" / "action.npy").unlink()
    with pytest.raises(CorruptDatasetError, match="'norm', made by this job before, is damaged: array file"):
        preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1)
    for resume in (False, True):
        again = preprocess.run(golden, f"{FNS}:normalize", "norm", workers=1, force=True, resume=resume)
        assert not again.reused
        assert_same(everything("norm"), before)
        (isolated_cache / "datasets" / "norm" / "arrays" / "action.npy").unlink()


def test_a_job_refused_for_disk_space_leaves_no_job_folder(
    medium: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before job.json was written, the job left ``tmp/out.job-*/chunks`` that no
    ``--resume`` could continue and that ``rlds gc`` counted as resumable."""
    from collections import namedtuple

    from rlds_cli.errors import DiskFullError
    from rlds_cli.preprocess import output

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(output.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 10))
    with pytest.raises(DiskFullError, match="the output needs"):
        preprocess.run(medium, f"{FNS}:adds_a_big_key", "out", workers=1)
    cache = open_dataset(medium).directory.parent.parent
    assert not list((cache / "tmp").glob("out.job-*"))
