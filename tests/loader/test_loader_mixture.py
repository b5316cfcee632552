"""Mixtures of datasets: weights (fixed and scheduled), renaming, the achieved mix, state."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader import Loader, Normalize
from rlds_cli.loader.mixture import MixtureLoader, MixtureSampler, MixtureSource
from tests.loader_fixtures import TedFactory


@pytest.fixture(scope="module")
def pair(ted_dataset: TedFactory) -> tuple[Dataset, Dataset]:
    return ted_dataset([10, 20], "a"), ted_dataset([5, 5, 5], "b")


def test_fixed_weights_and_report(pair: tuple[Dataset, Dataset]) -> None:
    a, b = pair
    mix = MixtureLoader({"a": a, "b": b}, [0.8, 0.2], batch_size=100, seed=0)
    for _ in range(50):
        batch = mix.sample()
        src = batch["source"].numpy()
        idx = batch["index"].numpy()
        for i, ds in enumerate(pair):  # every row is its source's own step
            rows = src == i
            want = ds.gather(idx[rows], ["observation", "next/reward"])
            np.testing.assert_array_equal(batch["observation"].numpy()[rows], want["observation"])
    report = mix.report()
    assert report["a"]["rows"] + report["b"]["rows"] == 5000
    assert abs(report["a"]["achieved"] - 0.8) < 0.02
    assert report["a"]["target"] == pytest.approx(0.8)


def test_scheduled_weights(pair: tuple[Dataset, Dataset]) -> None:
    mix = MixtureLoader(list(pair), lambda step: [1.0, 0.0] if step < 10 else [0.0, 1.0], batch_size=20)
    assert mix.names == ["a", "b"]
    for _ in range(10):
        assert (mix.sample()["source"] == 0).all()
    assert (mix.sample()["source"] == 1).all()
    report = mix.report()
    assert report["a"]["target"] == pytest.approx(10 / 11)
    assert report["a"]["achieved"] == pytest.approx(10 / 11)


def test_renaming_to_a_common_schema(tmp_path: Path, pair: tuple[Dataset, Dataset]) -> None:
    a, _ = pair
    mix = MixtureLoader(
        {"a": a, "a2": a},
        [0.5, 0.5],
        batch_size=16,
        keys=["state", "next/state", "action"],
        rename={
            "a": {"observation": "state", "next/observation": "next/state"},
            "a2": {"observation": "state", "next/observation": "next/state"},
        },
    )
    batch = mix.sample()
    assert set(batch) == {"state", "next/state", "action", "index", "source"}
    with pytest.raises(KeyError, match="source 'a2' has no keys"):
        MixtureLoader({"a": a, "a2": a}, [1, 1], keys=["state"], rename={"a": {"observation": "state"}})


def test_state_dict_continues(pair: tuple[Dataset, Dataset]) -> None:
    mix = MixtureLoader(list(pair), [0.5, 0.5], batch_size=8, seed=2)
    mix.sample()
    state = pickle.loads(pickle.dumps(mix.state_dict()))
    want = [mix.sample()["index"].tolist() for _ in range(3)]
    other = MixtureLoader(list(pair), [0.5, 0.5], batch_size=8, seed=9)
    other.load_state_dict(state)
    assert [other.sample()["index"].tolist() for _ in range(3)] == want
    assert other.report() == mix.report()


def test_a_state_saved_inside_a_pass_finishes_that_pass(pair: tuple[Dataset, Dataset]) -> None:
    """The state held no pass: restored 2 batches into a pass of 4, the next ``for`` gave 4 more
    (a resumed run did more steps than planned)."""
    whole = [b["index"].tolist() for b in MixtureLoader(list(pair), [0.5, 0.5], batch_size=4, seed=2,
                                                         num_batches=4)]  # fmt: skip
    mix = MixtureLoader(list(pair), [0.5, 0.5], batch_size=4, seed=2, num_batches=4)
    taken = []
    for batch in mix:
        taken.append(batch["index"].tolist())
        if len(taken) == 2:
            state = pickle.loads(pickle.dumps(mix.state_dict()))
            break
    other = MixtureLoader(list(pair), [0.5, 0.5], batch_size=4, seed=9, num_batches=4)
    other.load_state_dict(state)
    assert taken + [b["index"].tolist() for b in other] == whole
    assert len(list(other)) == 4  # the pass after it is whole
    with pytest.raises(LoaderStateError, match="pass_left"):
        other.load_state_dict({**state, "pass_left": -1})


@pytest.mark.parametrize("weights", [[1.0], [-1.0, 2.0], [0.0, 0.0], [float("nan"), 1.0]])
def test_bad_weights(pair: tuple[Dataset, Dataset], weights: list[float]) -> None:
    with pytest.raises(ValueError, match="weights must be 2"):
        MixtureLoader(list(pair), weights)


def test_errors(pair: tuple[Dataset, Dataset]) -> None:
    a, b = pair
    with pytest.raises(ValueError, match="unknown source"):
        MixtureLoader({"a": a, "b": b}, [1, 1], rename={"c": {}})
    with pytest.raises(ValueError, match="at least one"):
        MixtureLoader({}, [])
    with pytest.raises(ValueError, match="equal shapes"):
        MixtureLoader(
            {"a": a, "b": b}, [1, 1], keys=["x"], rename={"a": {"observation": "x"}, "b": {"action": "x"}}
        )


def test_mixture_composes_into_a_loader(pair: tuple[Dataset, Dataset]) -> None:
    """A MixtureSource and MixtureSampler in a Loader: prefetch and transforms, the same stream
    as the MixtureLoader of the same seed, and a state that continues it."""
    source = MixtureSource(list(pair), keys=["observation"])
    mix = MixtureLoader(list(pair), [0.3, 0.7], batch_size=16, seed=4, keys=["observation"])
    want = [mix.sample() for _ in range(4)]

    def double(batch: TedBatch) -> TedBatch:
        batch["observation"] = batch["observation"] * 2
        return batch

    sampler = MixtureSampler(source.sizes, [0.3, 0.7], 16, seed=4)
    loader = Loader(source, 16, sampler=sampler, prefetch=2, transform=double, num_batches=4)
    got = list(loader)
    for a, b in zip(want, got, strict=True):
        assert a["index"].tolist() == b["index"].tolist() and a["source"].tolist() == b["source"].tolist()
        np.testing.assert_array_equal(a["observation"].numpy() * 2, b["observation"].numpy())
    loader.close()  # the prefetch thread drew ahead: closing rewinds the sampler to the loop's
    assert sampler.report(source.names) == mix.report()
    with pytest.raises(ValueError, match="keys apply to a dataset"):
        Loader(source, 16, keys=["observation"])
    with pytest.raises(ValueError, match="binds to a dataset"):
        Loader(source, 16, transform=Normalize(keys=["observation"]))


def test_any_sampler_over_a_mixture(pair: tuple[Dataset, Dataset]) -> None:
    a, b = pair
    source = MixtureSource({"a": a, "b": b}, keys=["observation"])
    assert source.num_steps == a.num_steps + b.num_steps
    # an epoch over the mixture: every step of every source once, in any order of sources
    loader = Loader(source, 7, sampler="epoch", seed=1)
    rows = [
        (s, i)
        for batch in loader
        for s, i in zip(batch["source"].tolist(), batch["index"].tolist(), strict=True)
    ]
    assert sorted(rows) == [(0, i) for i in range(a.num_steps)] + [(1, i) for i in range(b.num_steps)]
    for batch in Loader(source, 7, sampler="epoch", seed=1, num_batches=3):
        for s, ds in enumerate(pair):  # rows in their places, whatever the order of sources
            here = batch["source"].numpy() == s
            got = ds.gather(batch["index"].numpy()[here], ["observation"])["observation"]
            np.testing.assert_array_equal(batch["observation"].numpy()[here], got)
    # slices never cross an episode, hence never a source
    batch = Loader(source, 12, sampler="slice", slice_len=4, seed=2).sample()
    assert batch["index"].shape == (3, 4) and batch["observation"].shape[:2] == (3, 4)
    assert (batch["source"] == batch["source"][:, :1]).all()
    with pytest.raises(IndexError, match="out of range"):
        source.gather(np.array([source.num_steps]))
