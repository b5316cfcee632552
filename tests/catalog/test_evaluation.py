"""Evaluation helpers (issue 24, part 3): ``Dataset.env_spec``, ``Dataset.recover_environment()``,
``rlds_cli.normalized_score`` and ``rlds score``, and the public ``NormalizationStats``.

The Minari dataset is written the way users make one: with minari's own ``DataCollector`` around
a real gymnasium environment, then converted by rlds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import rlds_cli
from rlds_cli.cache.derive import create_view
from rlds_cli.cache.env_spec import env_entry, env_spec_to_json
from rlds_cli.cache.manifest import read_manifest, write_manifest
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import (
    GYMNASIUM_INSTALL,
    DatasetNotFoundError,
    EnvironmentUnavailableError,
    MissingExtraError,
    NoEnvSpecError,
    NoReferenceScoresError,
)
from rlds_cli.sources.convert import convert
from tests.d4rl_fixtures import GoldenFactory
from tests.dataset_fixtures import rewrite_manifest
from tests.minari_fixtures import minari_path, record_random

gym = pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari")
pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")

runner = CliRunner()
DATASET_ID = "rlds/pendulum/eval-v0"
# D4RL's hopper reference scores (d4rl/infos.py: REF_MIN_SCORE/REF_MAX_SCORE['hopper-random-v0'],
# which its loop gives every hopper-*-v2 id)
HOPPER_MIN, HOPPER_MAX = -20.272305, 3234.3


def _recording_env() -> Any:
    return gym.make("Pendulum-v1", g=9.0, max_episode_steps=20)


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Pendulum dataset recorded by minari's DataCollector, with an evaluation env and
    reference scores in its metadata."""
    root = tmp_path_factory.mktemp("minari")
    with minari_path(root):
        record_random(
            _recording_env(), DATASET_ID, 3,
            eval_env=gym.make("Pendulum-v1", g=10.0, max_episode_steps=30),
            code_permalink="tests/catalog/test_evaluation.py", description="rlds evaluation test",
            ref_min_score=-1500.0, ref_max_score=-100.0,
        )  # fmt: skip
    return root


@pytest.fixture
def pendulum(minari_root: Path) -> rlds_cli.Dataset:
    convert(minari_root / "rlds" / "pendulum" / "eval-v0", "pendulum")
    return open_dataset("pendulum")


@pytest.fixture
def golden(golden_dataset: GoldenFactory) -> rlds_cli.Dataset:
    """A D4RL file converted from a path: no environment, no reference scores."""
    return golden_dataset(with_next=True)


def _edit_manifest(ds: rlds_cli.Dataset, **changes: Any) -> rlds_cli.Dataset:
    """Rewrite a dataset's manifest with ``changes`` (as a writer of that manifest would) and
    open it again."""
    manifest = read_manifest(ds.directory)
    for key, value in changes.items():
        setattr(manifest, key, value)
    write_manifest(ds.directory, manifest, fsync=False)
    return open_dataset(ds.name)


# ----------------------------------------------------------------------------- env_spec


def test_recover_environment_makes_the_recording_env(
    pendulum: rlds_cli.Dataset, minari_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = _recording_env().spec
    spec = pendulum.env_spec
    assert spec is not None
    assert (spec.id, spec.kwargs, spec.max_episode_steps) == ("Pendulum-v1", {"g": 9.0}, 20)
    assert spec.source == "minari" and "Minari metadata.json" in spec.origin
    env = pendulum.recover_environment()
    assert (env.spec.id, env.spec.kwargs, env.spec.max_episode_steps) == (
        recorded.id, recorded.kwargs, recorded.max_episode_steps,
    )  # fmt: skip
    assert env.unwrapped.g == 9.0
    # the same environment as minari's own recover_environment
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(minari_root))
    theirs = minari.load_dataset(DATASET_ID).recover_environment()
    assert env.spec == theirs.spec
    # a working environment: an episode ends at the recorded time limit
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    steps = 0
    while True:
        steps += 1
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            break
    assert (steps, trunc) == (20, True)


def test_eval_env_and_kwargs(pendulum: rlds_cli.Dataset) -> None:
    evaluation = pendulum.recover_environment(eval_env=True)
    assert (evaluation.spec.kwargs, evaluation.spec.max_episode_steps) == ({"g": 10.0}, 30)
    rendered = pendulum.recover_environment(render_mode="rgb_array")
    assert rendered.render_mode == "rgb_array"


def test_a_view_has_its_parents_environment(pendulum: rlds_cli.Dataset) -> None:
    create_view("pendulum", "pendulum-first", (0, 1))
    view = open_dataset("pendulum-first")
    assert view.env_spec == pendulum.env_spec
    assert view.recover_environment().spec.id == "Pendulum-v1"
    assert rlds_cli.normalized_score("pendulum-first", -100.0) == 100.0  # the parent's numbers too


@pytest.mark.usefixtures("pendulum")
def test_a_trim_or_merge_has_its_parents_scores_where_they_agree() -> None:
    """A trim of a scored dataset, or a merge of it with its own view, said 'no reference scores'."""
    from rlds_cli.cache.compose import merge_datasets, trim_dataset

    create_view("pendulum", "pendulum-first", (0, 1))
    trim_dataset("pendulum", "pendulum-cut", start=1)
    merge_datasets(["pendulum", "pendulum-first"], "pendulum-twice")
    for name in ("pendulum-cut", "pendulum-twice"):
        assert rlds_cli.normalized_score(name, -100.0) == 100.0


def test_no_environment_is_a_clear_error(golden: rlds_cli.Dataset) -> None:
    assert golden.env_spec is None
    with pytest.raises(NoEnvSpecError, match="dataset 'golden' records no environment to recover"):
        golden.recover_environment()


def test_the_writer_side_stores_a_gymnasium_spec_in_the_manifest(golden: rlds_cli.Dataset) -> None:
    spec = gym.spec("CartPole-v1")
    entry = env_entry(spec, origin="recorded by a test")
    assert entry["spec"] == json.loads(spec.to_json())
    ds = _edit_manifest(golden, env=entry)
    assert json.loads((ds.directory / "manifest.json").read_text())["env"]["spec"]["id"] == "CartPole-v1"
    found = ds.env_spec
    assert found is not None and found.source == "manifest" and found.max_episode_steps == 500
    assert found.origin == "manifest env (recorded by a test)"
    assert ds.recover_environment().spec.id == "CartPole-v1"


def test_a_spec_with_a_python_object_cannot_be_stored() -> None:
    class Env(gym.Env):  # type: ignore[misc]
        pass

    spec = gym.envs.registration.EnvSpec("RldsCallable-v0", entry_point=Env)
    with pytest.raises(EnvironmentUnavailableError, match="'RldsCallable-v0' cannot be stored as JSON"):
        env_spec_to_json(spec)


@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("mujoco") is not None, reason="mujoco is installed"
)
def test_a_missing_env_package_is_named(golden: rlds_cli.Dataset) -> None:
    ds = _edit_manifest(golden, env=env_entry(gym.spec("Hopper-v5")))
    assert ds.env_spec is not None and ds.env_spec.id == "Hopper-v5"
    with pytest.raises(MissingExtraError, match="'Hopper-v5' of dataset 'golden' cannot be made") as err:
        ds.recover_environment()
    assert "mujoco" in str(err.value).lower()


def test_a_missing_module_names_it_and_the_requirements(golden: rlds_cli.Dataset) -> None:
    nowhere = {"id": "RldsNowhere-v0", "entry_point": "rlds_no_such_pkg.envs:Env"}
    raw = json.loads(gym.spec("CartPole-v1").to_json()) | nowhere
    ds = _edit_manifest(golden, env={"spec": raw, "requirements": ["rlds-no-such-pkg>=1.0"]})
    with pytest.raises(MissingExtraError, match="needs the module 'rlds_no_such_pkg'") as err:
        ds.recover_environment()
    assert err.value.hint == "install what the dataset lists: pip install 'rlds-no-such-pkg>=1.0'"


def test_a_spec_this_gymnasium_cannot_read(golden: rlds_cli.Dataset) -> None:
    raw = json.loads(gym.spec("CartPole-v1").to_json()) | {"from_the_future": 1}
    ds = _edit_manifest(golden, env={"spec": raw})
    with pytest.raises(EnvironmentUnavailableError, match="env spec of dataset 'golden' cannot be read"):
        ds.recover_environment()


def test_retired_spec_keys_are_dropped_as_minari_does(golden: rlds_cli.Dataset) -> None:
    retired = {"apply_api_compatibility": False, "autoreset": False}
    raw = json.loads(gym.spec("CartPole-v1").to_json()) | retired
    ds = _edit_manifest(golden, env={"spec": raw})
    assert ds.recover_environment().spec.id == "CartPole-v1"


def test_a_d4rl_download_names_its_d4rl_environment(golden: rlds_cli.Dataset) -> None:
    """What ``rlds download hopper-medium-v2`` writes (the registry entry's ``env_entry``)."""
    from rlds_cli.catalog import registry

    env = registry.resolve("hopper-medium-v2").env_entry()
    source = {**golden.manifest.source, "id": "hopper-medium-v2"}
    ds = _edit_manifest(golden, source=source, env=env)
    spec = ds.env_spec
    assert spec is not None
    assert (spec.id, spec.max_episode_steps, spec.source) == ("hopper-medium-v2", 1000, "registry")
    assert "registry entry 'hopper-medium-v2'" in spec.origin
    unregistered = "'hopper-medium-v2' of dataset 'golden' is not registered"
    with pytest.raises(EnvironmentUnavailableError, match=unregistered) as err:
        ds.recover_environment()
    assert "d4rl package" in err.value.hint
    # the registry's reference scores follow the dataset too
    assert rlds_cli.normalized_score("golden", HOPPER_MAX) == pytest.approx(100.0)


def test_the_environment_is_read_without_the_registry(golden: rlds_cli.Dataset) -> None:
    """``Dataset.env_spec`` reads the manifest alone: in a fresh process it imports nothing of
    the catalog (the registry is asked at download)."""
    from rlds_cli.catalog import registry

    ds = _edit_manifest(golden, env=registry.resolve("hopper-medium-v2").env_entry())
    code = (
        "import sys; from rlds_cli.cache.dataset import Dataset; "
        f"spec = Dataset({str(ds.directory)!r}).env_spec; "
        "print(spec.id, spec.source, sorted(m for m in sys.modules if m.startswith('rlds_cli.catalog')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["hopper-medium-v2", "registry", "[]"]


def test_a_d4rl_dataset_downloaded_before_records_no_environment(golden: rlds_cli.Dataset) -> None:
    """The registry is asked at download, not at read: a D4RL cache from before that records
    none, and the error says how to get it (download again)."""
    source = {**golden.manifest.source, "id": "hopper-medium-v2"}
    ds = _edit_manifest(golden, source=source, env={})
    assert ds.env_spec is None and ds.episodes.env_spec is None
    with pytest.raises(NoEnvSpecError, match="'golden' records no environment") as err:
        ds.recover_environment()
    assert "'rlds download hopper-medium-v2 --force'" in err.value.hint


def test_without_gymnasium_the_error_says_what_to_install(
    pendulum: rlds_cli.Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    assert pendulum.env_spec is not None  # reading the spec needs no gymnasium
    with pytest.raises(MissingExtraError, match="needs gymnasium, which is not installed") as err:
        pendulum.recover_environment()
    assert err.value.hint == GYMNASIUM_INSTALL
    assert "pip install 'rlds-cli[record]'" in str(err.value)  # a traceback shows the message only


def test_a_malformed_env_entry_is_a_corrupt_manifest(golden: rlds_cli.Dataset) -> None:
    path = golden.directory / "manifest.json"
    data = json.loads(path.read_text())
    data["env"] = {"spec": "not an object"}
    path.write_text(json.dumps(data))
    rewrite_manifest(path)
    with pytest.raises(rlds_cli.errors.CorruptDatasetError, match="missing or bad 'env'"):
        open_dataset("golden")


# ----------------------------------------------------------------------------- normalized scores


def test_normalized_score_of_d4rl_ids_by_hand() -> None:
    # 100 * (return - min) / (max - min), computed by hand
    assert rlds_cli.normalized_score("hopper-medium-v2", 1000.0) == pytest.approx(31.348890, abs=1e-6)
    assert rlds_cli.normalized_score("d4rl/hopper-medium-v2", HOPPER_MIN) == 0.0
    out = rlds_cli.normalized_score("hopper-medium-v2", np.array([HOPPER_MIN, HOPPER_MAX, 1617.01]))
    assert isinstance(out, np.ndarray) and out.shape == (3,)
    np.testing.assert_allclose(out, [0.0, 100.0, 50.307], atol=1e-3)
    # antmaze: 0 and 1 (success rate)
    assert rlds_cli.normalized_score("antmaze-umaze-v2", 0.75) == pytest.approx(75.0)
    # Adroit v1 takes the *-human-v0 numbers: door -56.512833 .. 2880.5693087298737
    assert rlds_cli.normalized_score("door-expert-v1", 2880.5693087298737) == pytest.approx(100.0)
    ref = rlds_cli.reference_scores("walker2d-medium-replay-v2")
    assert (ref.min, ref.max) == (1.629008, 4592.3)
    # divided before it is scaled, as D4RL does: 100 * 1e307 overflowed to inf
    huge = rlds_cli.normalized_score("hopper-medium-v2", 1e307)
    assert np.isfinite(huge) and huge == pytest.approx(1e307 / (HOPPER_MAX - HOPPER_MIN) * 100)


def test_every_d4rl_registry_score_is_d4rls() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        from d4rl_ref_scores import reference_scores as table
    finally:
        sys.path.pop(0)
    from rlds_cli.catalog import registry

    scored = {e.id: (e.extra["ref_min_score"], e.extra["ref_max_score"])
              for e in registry.entries() if "ref_min_score" in e.extra}  # fmt: skip
    assert scored == table() and len(scored) == 147
    assert table()["halfcheetah-medium-expert-v2"] == (-280.178953, 12135.0)


def test_normalized_score_of_a_minari_dataset_from_its_metadata(pendulum: rlds_cli.Dataset) -> None:
    assert rlds_cli.normalized_score("pendulum", -300.0) == pytest.approx(100 * 1200 / 1400)
    ref = rlds_cli.reference_scores("pendulum")
    assert (ref.min, ref.max) == (-1500.0, -100.0) and "Minari metadata" in ref.origin


def test_a_minari_export_keeps_the_reference_scores(
    pendulum: rlds_cli.Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # they were dropped: minari's get_normalized_score of the export failed, rlds score too
    out = tmp_path / "exported" / "pendulum-v0"
    assert runner.invoke(app, ["export", "pendulum", str(out), "--to", "minari"]).exit_code == 0
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out.parent))
    loaded = minari.load_dataset("pendulum-v0")
    assert minari.get_normalized_score(loaded, np.array([-300.0])) == pytest.approx([1200 / 1400])
    convert(out, "pendulum-again")
    ref = rlds_cli.reference_scores("pendulum-again")
    assert (ref.min, ref.max) == (-1500.0, -100.0) and "Minari metadata" in ref.origin


def test_unknown_reference_scores_are_a_clear_error(golden: rlds_cli.Dataset) -> None:
    with pytest.raises(NoReferenceScoresError, match="dataset 'golden' has no reference scores"):
        rlds_cli.normalized_score("golden", 1.0)
    with pytest.raises(NoReferenceScoresError, match="D4RL id 'ant-random-expert-v0' has no reference"):
        rlds_cli.normalized_score("ant-random-expert-v0", 1.0)
    with pytest.raises(DatasetNotFoundError, match="'D4RL/door/human-v2', not downloaded yet"):
        rlds_cli.normalized_score("D4RL/door/human-v2", 1.0)  # a Minari id: its metadata has them
    with pytest.raises(DatasetNotFoundError, match="no dataset named 'nowhere'"):
        rlds_cli.normalized_score("nowhere", 1.0)


def test_a_cached_dataset_named_as_a_registry_id_is_scored_by_its_own_data(
    golden: rlds_cli.Dataset,
) -> None:
    """A view of other data named hopper-medium-v2 was scored with hopper's D4RL reference
    scores (the registry was asked first), though every other command reads the cached dataset
    of that name."""
    from rlds_cli.cache.derive import create_selection

    create_selection("golden", "hopper-medium-v2", np.array([0]), how="a test")
    with pytest.raises(NoReferenceScoresError, match="dataset 'hopper-medium-v2' has no reference scores"):
        rlds_cli.normalized_score("hopper-medium-v2", 1000.0)
    result = runner.invoke(app, ["score", "hopper-medium-v2", "1000"])
    assert result.exit_code == 1 and "has no reference scores" in result.stderr, result.output
    assert rlds_cli.normalized_score("hopper-medium-expert-v2", 1000.0) == pytest.approx(31.35, abs=0.01)


# ----------------------------------------------------------------------------- CLI


@pytest.mark.usefixtures("consoles")
def test_rlds_score_and_inspect(pendulum: rlds_cli.Dataset, golden: rlds_cli.Dataset) -> None:
    result = runner.invoke(app, ["score", "hopper-medium-v2", "1000", "2500"])
    assert result.exit_code == 0, result.output
    assert "return 1000  ->  normalized score 31.35" in result.stdout
    assert "return 2500  ->  normalized score 77.44" in result.stdout
    assert runner.invoke(app, ["score", "pendulum", "-q", "--", "-300"]).stdout == "85.7143\n"
    as_json = json.loads(runner.invoke(app, ["score", "pendulum", "--json", "--", "-1500"]).stdout)
    assert as_json["normalized_scores"] == [0.0] and as_json["reference_scores"]["ref_max_score"] == -100.0
    failed = runner.invoke(app, ["score", "golden", "1"])
    assert failed.exit_code == 1
    assert failed.stderr.splitlines()[0] == (
        "error: dataset 'golden' has no reference scores (ref_min_score, ref_max_score)"
    )
    text = runner.invoke(app, ["inspect", "pendulum", "--no-stats"]).stdout
    assert "environment  Pendulum-v1, at most 20 steps, kwargs {'g': 9.0}  (from Minari metadata.json" in text
    assert "reference scores  min -1500, max -100  (from Minari metadata" in text
    info = json.loads(runner.invoke(app, ["inspect", "pendulum", "--no-stats", "--json"]).stdout)
    assert info["env"]["id"] == "Pendulum-v1" and info["env"]["source"] == "minari"
    assert info["env"]["has_eval_spec"] is True
    plain = runner.invoke(app, ["inspect", "golden", "--no-stats"]).stdout
    assert "environment" not in plain and "reference scores" not in plain
    assert json.loads(runner.invoke(app, ["inspect", "golden", "--json", "--no-stats"]).stdout)["env"] is None


def test_an_env_in_the_manifest_is_exported_to_minari(
    golden: rlds_cli.Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlds_cli.export import export_dataset

    ds = _edit_manifest(golden, env=env_entry(gym.spec("CartPole-v1")))
    export_dataset(ds, tmp_path / "out" / "golden-v0", "minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "out"))
    back = minari.load_dataset("golden-v0")
    assert back.spec.env_spec == gym.spec("CartPole-v1")
    assert back.recover_environment().spec.id == "CartPole-v1"
