"""The torch Loader and the uniform sampler, on the golden file and on the bundled demo."""

from __future__ import annotations

import itertools
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.errors import DatasetNotFoundError, LoaderStateError
from rlds_cli.loader import Loader, UniformSampler
from rlds_cli.sources.download import download
from tests.d4rl_fixtures import GOLDEN_NO_NEXT, GoldenFactory, golden_column

TED_KEYS = {
    "action",
    "episode",
    "info/qpos",
    "observation",
    "next/done",
    "next/observation",
    "next/reward",
    "next/terminated",
    "next/truncated",
}

# The golden file without next_observations, step by step: the one hand-written table
# (tests/d4rl_fixtures.py, docs/formats.md)
GOLDEN = {key: golden_column(False, key) for key in GOLDEN_NO_NEXT["columns"]}
DTYPES = {
    "observation": torch.float32,
    "next/observation": torch.float32,
    "action": torch.float32,
    "next/reward": torch.float32,
    "next/terminated": torch.bool,
    "next/truncated": torch.bool,
    "next/done": torch.bool,
    "episode": torch.int64,
    "info/qpos": torch.float32,
    "index": torch.int64,
}


@pytest.fixture(params=["memmap", "zarr"])
def golden(request: pytest.FixtureRequest, golden_dataset: GoldenFactory) -> Dataset:
    return golden_dataset(backend=request.param)


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo converted once per module (and per xdist worker), in its own root."""
    root = tmp_path_factory.mktemp("demo-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        mp.delenv("RLDS_REGISTRY", raising=False)
        download("demo", root=root)
    yield root


@pytest.fixture
def demo(demo_root: Path) -> Dataset:
    return open_dataset("pointmass-demo-v0", demo_root)


class FixedSampler:
    """A sampler object of the duck-typed kind the Loader accepts."""

    def __init__(self, indices: list[int]) -> None:
        self.indices = np.asarray(indices, np.int64)

    def sample(self) -> np.ndarray:
        return self.indices


def assert_matches_gather(ds: Dataset, batch: dict[str, torch.Tensor]) -> None:
    index = batch["index"].numpy()
    expected = ds.gather(index, [k for k in batch if k != "index"])
    assert set(expected) | {"index"} == set(batch)
    for key, value in expected.items():
        np.testing.assert_array_equal(batch[key].numpy(), np.asarray(value), err_msg=key)


# --------------------------------------------------------------------------- golden


def test_golden_every_step_exact(golden: Dataset) -> None:
    loader = Loader(golden, batch_size=6, sampler=FixedSampler([0, 1, 2, 3, 4, 5]))
    batch = loader.sample()
    assert set(batch) == TED_KEYS | {"index"}
    for key, expected in GOLDEN.items():
        assert isinstance(batch[key], torch.Tensor), key
        assert batch[key].dtype == DTYPES[key], key
        np.testing.assert_array_equal(batch[key].numpy(), expected, err_msg=key)
    assert batch["index"].tolist() == [0, 1, 2, 3, 4, 5]


def test_golden_batch_shapes_and_dtypes(golden: Dataset) -> None:
    batch = Loader(golden, batch_size=5, seed=1).sample()
    assert set(batch) == TED_KEYS | {"index"}
    shapes = {
        "observation": (5, 2),
        "next/observation": (5, 2),
        "action": (5, 1),
        "next/reward": (5, 1),
        "next/terminated": (5, 1),
        "next/truncated": (5, 1),
        "next/done": (5, 1),
        "episode": (5,),
        "info/qpos": (5,),
        "index": (5,),
    }
    for key, shape in shapes.items():
        assert tuple(batch[key].shape) == shape, key
        assert batch[key].dtype == DTYPES[key], key
        assert batch[key].device.type == "cpu"
    assert batch.batch_size == 5


def test_golden_sampled_values(golden: Dataset) -> None:
    loader = Loader(golden, batch_size=16, seed=7, num_batches=5)
    for batch in loader:
        index = batch["index"].numpy()
        assert ((index >= 0) & (index < 6)).all()
        for key, table in GOLDEN.items():
            np.testing.assert_array_equal(batch[key].numpy(), table[index], err_msg=key)
        assert_matches_gather(golden, batch)


def test_nested_access(golden: Dataset) -> None:
    batch = Loader(golden, batch_size=4, sampler=FixedSampler([2, 4, 5, 0])).sample()
    assert batch["next", "reward"] is batch["next/reward"]
    assert ("next", "done") in batch
    assert ("next", "nothing") not in batch
    assert batch.get(("next", "observation")) is batch["next/observation"]
    assert batch["next", "reward"].flatten().tolist() == [3.0, 5.0, 7.0, 1.0]
    assert batch["next", "done"].flatten().tolist() == [True, True, True, False]
    nested = batch.nested()
    assert nested["next"]["reward"] is batch["next/reward"]
    assert nested["info"]["qpos"] is batch["info/qpos"]
    assert set(nested["next"]) == {"done", "observation", "reward", "terminated", "truncated"}


def test_keys_selection(golden: Dataset) -> None:
    loader = Loader(golden, batch_size=3, keys=["observation", ("next", "reward"), "next/done"], seed=0)
    batch = loader.sample()
    assert set(batch) == {"observation", "next/reward", "next/done", "index"}
    index = batch["index"].numpy()
    np.testing.assert_array_equal(batch["observation"].numpy(), GOLDEN["observation"][index])
    np.testing.assert_array_equal(batch["next", "reward"].numpy(), GOLDEN["next/reward"][index])
    assert set(Loader(golden, batch_size=2, keys=[]).sample()) == {"index"}


def test_unknown_key_is_a_key_error(golden: Dataset) -> None:
    with pytest.raises(KeyError, match="no_such_key"):
        Loader(golden, batch_size=2, keys=["observation", "no_such_key"]).sample()


def test_open_by_name(golden: Dataset, isolated_cache: Path) -> None:
    loader = Loader("golden", batch_size=4, seed=0)
    assert loader.dataset.num_steps == 6
    assert loader.dataset.manifest.backend == golden.manifest.backend
    assert Loader("golden", batch_size=4, root=isolated_cache).dataset.directory == golden.directory
    with pytest.raises(DatasetNotFoundError, match="'nope'"):
        Loader("nope", batch_size=4)


def test_device_cpu(golden: Dataset) -> None:
    for device in ("cpu", torch.device("cpu")):
        loader = Loader(golden, batch_size=4, device=device, seed=3)
        assert loader.device == torch.device("cpu")
        batch = loader.sample()
        assert all(v.device.type == "cpu" for v in batch.values())
        assert_matches_gather(golden, batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cuda(golden: Dataset) -> None:
    batch = Loader(golden, batch_size=4, device="cuda", seed=3).sample()
    assert all(v.device.type == "cuda" for v in batch.values())
    cpu = {k: v.cpu() for k, v in batch.items()}
    assert_matches_gather(golden, cpu)


# --------------------------------------------------------------------------- demo


def test_demo_batches_match_gather(demo: Dataset) -> None:
    loader = Loader(demo, batch_size=64, seed=0, num_batches=3)
    batches = list(loader)
    assert len(batches) == 3
    for batch in batches:
        assert set(batch) == set(demo.fields) | {"index"}
        assert batch["observation"].shape == (64, 6)
        assert batch["action"].shape == (64, 2)
        assert batch["next", "reward"].shape == (64, 1)
        assert batch["next", "done"].shape == (64, 1)
        assert batch["next", "done"].dtype == torch.bool
        assert batch["index"].dtype == torch.int64
        assert_matches_gather(demo, batch)
        # TED: inside an episode, the next observation is the following step's observation
        index = batch["index"].numpy()
        inside = ~batch["next", "done"].numpy().reshape(-1)
        following = demo.gather(index[inside] + 1, ["observation"])["observation"]
        np.testing.assert_array_equal(batch["next", "observation"].numpy()[inside], following)


def test_seed_determinism(demo: Dataset) -> None:
    def indices(seed: int, n: int = 3) -> list[list[int]]:
        loader = Loader(demo, batch_size=32, seed=seed, keys=[])
        return [loader.sample()["index"].tolist() for _ in range(n)]

    assert indices(11) == indices(11)
    assert indices(11) != indices(12)
    first = indices(11)
    assert first[0] != first[1]  # a stream, not one batch repeated
    # the default seed is a fresh one per run, exposed as loader.seed: passing it repeats the run
    fresh = Loader(demo, batch_size=32, keys=[])
    default = fresh.sample()["index"].tolist()
    assert isinstance(fresh.seed, int) and default == indices(fresh.seed, 1)[0]


def test_state_dict_resumes_the_same_stream(demo: Dataset) -> None:
    loader = Loader(demo, batch_size=16, seed=5)
    for _ in range(2):
        loader.sample()
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # checkpointable
    expected = [loader.sample() for _ in range(3)]

    resumed = Loader(demo, batch_size=16, seed=999)
    resumed.load_state_dict(state)
    got = [resumed.sample() for _ in range(3)]
    for want, have in zip(expected, got, strict=True):
        assert have["index"].tolist() == want["index"].tolist()
        for key in want:
            assert torch.equal(have[key], want[key]), key
    # the original can be rewound too
    loader.load_state_dict(state)
    assert loader.sample()["index"].tolist() == expected[0]["index"].tolist()


def test_state_dict_from_another_dataset_is_refused(demo: Dataset, golden: Dataset) -> None:
    state = Loader(golden, batch_size=4).state_dict()
    with pytest.raises(ValueError, match="saved on another dataset than"):
        Loader(demo, batch_size=4).load_state_dict(state)


@pytest.mark.parametrize(
    "options",
    [{"sampler": "epoch", "epochs": 3}, {"sampler": "uniform", "epochs": 2}, {"num_batches": 25}],
    ids=["epoch-3", "uniform-2", "batches-25"],
)
@pytest.mark.parametrize("saved_after", [1, 39, 40, 41, -1])
def test_a_state_saved_inside_a_pass_resumes_the_rest_of_that_pass(
    demo: Dataset, options: dict[str, Any], saved_after: int
) -> None:
    """A resumed ``for`` started a whole new pass: ``epochs=3`` saved after 107 of 108 batches gave
    73 more, ``num_batches=25`` saved after 24 gave 25. It finishes the saved pass, batch for batch
    (also saved at an epoch's end, and after the pass's last batch: the pass it was saved in has
    nothing left, then the next is whole)."""
    kwargs = {"batch_size": 128, "seed": 7, "keys": ["action"], **options}
    whole = Loader(demo, **kwargs)
    passes = [[b["index"].tolist() for b in whole] for _ in range(2)]
    cut = saved_after % len(passes[0]) if saved_after >= 0 else len(passes[0])
    first = Loader(demo, **kwargs)
    batches = iter(first)
    seen = [next(batches)["index"].tolist() for _ in range(cut)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    again = Loader(demo, **kwargs)
    again.load_state_dict(state)
    rest = [b["index"].tolist() for b in again]
    if cut < len(passes[0]):
        assert seen + rest == passes[0]
        assert [b["index"].tolist() for b in again] == passes[1]  # then a whole pass, as uninterrupted
    else:  # saved in the loop after the pass's last batch: that pass is over
        assert seen == passes[0] and rest == []
        assert [b["index"].tolist() for b in again] == passes[1]


@pytest.mark.parametrize(
    ("saved", "restored", "refused"),
    [
        (
            {"sampler": "blocks", "block_rows": 128},
            {"sampler": "epoch"},
            "sampler 'blocks'; this loader has sampler 'epoch'",
        ),
        (
            {"sampler": "epoch"},
            {"sampler": "epoch", "shuffle": False},
            "sampler option shuffle not given; this loader has sampler option shuffle False",
        ),
        (
            {"sampler": "slice", "slice_len": 8},
            {"sampler": "slice", "slice_len": 16},
            "slice_len 8; this loader has sampler option slice_len 16",
        ),
        (
            {"sampler": "prioritized"},
            {"sampler": "uniform"},
            "sampler 'prioritized'; this loader has sampler 'uniform'",
        ),
        (
            {"sampler": "epoch"},
            {"sampler": "epoch", "batch_size": 32},
            "batch_size 64; this loader has batch_size 32",
        ),
    ],
    ids=["blocks-epoch", "shuffle", "slice_len", "prioritized-uniform", "batch_size"],
)
def test_a_state_of_other_settings_is_refused(
    demo: Dataset, saved: dict[str, Any], restored: dict[str, Any], refused: str
) -> None:
    """Each was restored without a word, and the stream went on wrong (an epoch repeating 467 steps
    and missing as many)."""
    first = Loader(demo, **{"batch_size": 64, "seed": 7, **saved})
    first.sample()
    with pytest.raises(LoaderStateError, match=re.escape(refused)):
        Loader(demo, **{"batch_size": 64, "seed": 7, **restored}).load_state_dict(first.state_dict())


@pytest.mark.parametrize(
    "options",
    [
        {"sampler": "prioritized", "alpha": 0.6},
        {"sampler": "slice", "slice_len": 8, "padded": "none", "short": "pad"},
        {"sampler": "epoch", "shuffle": True},
    ],
    ids=["alpha", "padded-short", "shuffle"],
)
def test_an_option_given_at_its_default_is_the_same_stream(demo: Dataset, options: dict[str, Any]) -> None:
    """Refused with 'saved with sampler option alpha not given; ... would continue another
    stream': a resume script (or a config system) that spells out a default could not restore."""
    plain = {k: v for k, v in options.items() if k in ("sampler", "slice_len")}
    for saved, restored in ((plain, options), (options, plain)):
        first = Loader(demo, **{"batch_size": 64, "seed": 7, **saved})
        first.sample()
        state = first.state_dict()
        want = first.sample()["index"].tolist()
        other = Loader(demo, **{"batch_size": 64, "seed": 1, **restored})
        other.load_state_dict(state)
        assert other.sample()["index"].tolist() == want


def test_a_state_of_another_dataset_of_the_same_size_is_refused(demo: Dataset, demo_root: Path) -> None:
    from rlds_cli.preprocess import run
    from rlds_cli.testing.sources import normalize

    run(demo.name, normalize, "other", root=demo_root, workers=1)
    state = Loader(demo, batch_size=64, seed=7).state_dict()
    assert open_dataset("other", demo_root).num_steps == demo.num_steps
    with pytest.raises(LoaderStateError, match="saved on another dataset than 'other'"):
        Loader(open_dataset("other", demo_root), batch_size=64, seed=7).load_state_dict(state)


def test_num_batches_and_len(demo: Dataset) -> None:
    loader = Loader(demo, batch_size=8, num_batches=4, keys=["action"])
    assert len(loader) == 4
    first = [b["index"].tolist() for b in loader]
    second = [b["index"].tolist() for b in loader]
    assert len(first) == len(second) == 4
    assert first != second  # each pass continues the stream
    assert len(list(Loader(demo, batch_size=8, num_batches=0))) == 0


def test_endless_loader(demo: Dataset) -> None:
    loader = Loader(demo, batch_size=8, keys=["action"], epochs=None)  # endless only when asked
    with pytest.raises(TypeError, match="num_batches"):
        len(loader)
    assert len(list(itertools.islice(loader, 7))) == 7


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_samplers_bad_indices_are_refused_naming_it(demo: Dataset, in_memory: bool) -> None:
    """A -1 read a row whose keys came from different steps (differently in memory), a float was
    cut to another step, a bool mask read as steps 0 and 1."""
    n = demo.num_steps
    for given in ([-1], [n]):
        message = (
            f"sampler FixedSampler returned step indices from {given[0]} to {given[0]}; the loader reads"
        )
        with pytest.raises(IndexError, match=f"{message} steps 0 to {n - 1}"):
            Loader(demo, 1, sampler=FixedSampler(given), in_memory=in_memory).sample()
    for bad in (np.array([1.5]), np.array([True, False])):
        sampler = FixedSampler([0])
        sampler.indices = bad
        with pytest.raises(ValueError, match="step indices are integers"):
            Loader(demo, 1, sampler=sampler, in_memory=in_memory).sample()


def test_keys_given_as_one_string_are_refused_naming_the_argument(demo: Dataset) -> None:
    # read letter by letter: "dataset has no keys ['o', 'b', 's', ...]"
    with pytest.raises(
        ValueError, match=r"Loader\(keys=...\) takes a list of keys, not the string 'observation'"
    ):
        Loader(demo, 4, keys="observation")
    from rlds_cli.loader import MixtureLoader

    with pytest.raises(ValueError, match=r"MixtureLoader\(keys=...\) takes a list of keys"):
        MixtureLoader({"a": demo, "b": demo}, [1, 1], keys="observation")  # type: ignore[arg-type]


def test_unknown_sampler(demo: Dataset) -> None:
    with pytest.raises(ValueError, match="'bogus'"):
        Loader(demo, batch_size=8, sampler="bogus")


def test_loader_keeps_a_given_sampler(demo: Dataset) -> None:
    sampler = UniformSampler(demo.num_steps, 8, seed=4)
    loader = Loader(demo, batch_size=8, sampler=sampler)
    assert loader.sampler is sampler
    reference = UniformSampler(demo.num_steps, 8, seed=4)
    assert loader.sample()["index"].tolist() == reference.sample().tolist()


# --------------------------------------------------------------------------- UniformSampler


def test_uniform_sampler_range_shape_dtype() -> None:
    sampler = UniformSampler(10, 7, seed=0)
    seen: set[int] = set()
    for _ in range(40):
        idx = sampler.sample()
        assert idx.shape == (7,)
        assert idx.dtype == np.int64
        assert idx.min() >= 0 and idx.max() < 10
        seen.update(idx.tolist())
    assert seen == set(range(10))


def test_uniform_sampler_is_roughly_uniform() -> None:
    sampler = UniformSampler(4, 1000, seed=1)
    counts = np.bincount(np.concatenate([sampler.sample() for _ in range(10)]), minlength=4)
    assert counts.sum() == 10_000
    assert (np.abs(counts - 2500) < 200).all(), counts


def test_uniform_sampler_state() -> None:
    a = UniformSampler(100, 5, seed=2)
    a.sample()
    state = a.state_dict()
    assert state["num_steps"] == 100
    want = [a.sample().tolist() for _ in range(3)]
    b = UniformSampler(100, 5, seed=None)
    b.load_state_dict(state)
    assert [b.sample().tolist() for _ in range(3)] == want
    with pytest.raises(ValueError, match="100 steps"):
        UniformSampler(50, 5).load_state_dict(state)


@pytest.mark.parametrize(("num_steps", "batch_size"), [(0, 4), (-1, 4), (10, 0), (10, -2)])
def test_uniform_sampler_rejects_bad_sizes(num_steps: int, batch_size: int) -> None:
    with pytest.raises(ValueError):
        UniformSampler(num_steps, batch_size)
