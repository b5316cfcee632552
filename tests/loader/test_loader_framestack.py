"""FrameStack against a plain reference: per sample, a Python loop over the ``k`` frames, each
read with ``Dataset.gather`` (its own code path) at the step clamped to the episode's start.

Datasets mix one-step, short and long episodes, with two flat keys (uint8 images and float32
vectors) on the memmap and zarr backends; every step is covered (epoch sampler), so episode
starts and last steps (whose next stack ends with the stored final observation) are checked.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.opening import open_dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.formats.base import StepBlock
from rlds_cli.loader import Loader
from rlds_cli.loader.transforms import FrameStack, Normalize, NStepReturn
from tests.loader_fixtures import TedFactory

LENGTHS = [12, 1, 7, 30, 2, 9, 25, 4, 1, 3]
IMAGE = (2, 3, 3)


def build(root: Path, name: str, lengths: list[int], backend: str = "memmap", seed: int = 0) -> Dataset:
    """A dataset with episodes of ``lengths``: ``observation`` random uint8 images, ``state`` the
    float32 ``[flat row, episode, -1 if final observation]``; odd episodes terminate."""
    rng = np.random.default_rng(seed)
    with DatasetBuilder(name, root=root, backend=backend) as builder:
        row = 0
        for e, n in enumerate(lengths):
            rows = np.arange(row, row + n + 1, dtype=np.float32)
            state = np.stack([rows, np.full(n + 1, e, np.float32), np.zeros(n + 1, np.float32)], 1)
            state[-1, 2] = -1
            end = np.zeros((n, 1), bool)
            end[-1] = True
            builder.append(
                StepBlock(
                    steps={
                        "action": rng.standard_normal((n, 2)).astype(np.float32),
                        "next/reward": np.arange(n, dtype=np.float32)[:, None],
                        "next/terminated": end & bool(e % 2),
                        "next/truncated": end & (not e % 2),
                    },
                    observations={
                        "observation": rng.integers(0, 256, (n + 1, *IMAGE), np.uint8),
                        "state": state,
                    },
                    ends=np.array([n - 1]),
                )
            )
            row += n + 1
        builder.commit()
    return open_dataset(name, root)


def reference(ds: Dataset, index: np.ndarray, k: int, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The stacks at ``index`` (any shape) the plain way: a loop over samples and frames."""
    starts = np.cumsum(ds.episodes["length"]) - ds.episodes["length"]
    obs, nxt = [], []
    for t in index.reshape(-1).tolist():
        first = int(starts[np.searchsorted(starts, t, side="right") - 1])
        frames = [ds.gather([max(t - j, first)], [key])[key][0] for j in range(k - 1, -1, -1)]
        final = ds.gather([t], [f"next/{key}"])[f"next/{key}"][0]
        obs.append(np.stack(frames))
        nxt.append(np.stack([*frames[1:], final]))
    shape = (*index.shape, k, *ds.fields[key][0])
    return np.stack(obs).reshape(shape), np.stack(nxt).reshape(shape)


def check(ds: Dataset, batch: Any, k: int, keys: tuple[str, ...] = ("observation",)) -> None:
    """Stacked keys equal the reference; every other key equals ``Dataset.gather``."""
    index = np.asarray(batch["index"])
    for key in keys:
        want_obs, want_next = reference(ds, index, k, key)
        for name, want in ((key, want_obs), (f"next/{key}", want_next)):
            if name in batch:
                got = np.asarray(batch[name])
                assert got.dtype == want.dtype, name
                np.testing.assert_array_equal(got, want, err_msg=name)
    plain = [k for k in batch if k not in ("index", "mask", "weight") and k.split("/")[-1] not in keys]
    gathered = ds.gather(index.reshape(-1), plain)
    for key in plain:
        np.testing.assert_array_equal(
            np.asarray(batch[key]),
            np.asarray(gathered[key]).reshape(np.asarray(batch[key]).shape),
            err_msg=key,
        )


@pytest.fixture(scope="module", params=["memmap", "zarr"])
def ds(request: pytest.FixtureRequest, ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "fs", backend=request.param, build=build)


MODES = [{"in_memory": False}, {"in_memory": True}, {"in_memory": True, "pack": False}]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_every_step_matches_the_reference(ds: Dataset, mode: dict, k: int) -> None:
    keys = ("observation", "state")
    loader = Loader(ds, 16, sampler="epoch", seed=1, transform=FrameStack(k, keys=keys), **mode)
    seen = []
    for batch in loader:
        assert batch["observation"].shape == (len(batch["index"]), k, *IMAGE)
        assert batch["next", "state"].shape == (len(batch["index"]), k, 3)
        check(ds, batch, k, keys)
        seen.append(batch["index"].numpy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(ds.num_steps))  # starts, last steps too


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize(
    "sampler",
    [
        {"sampler": "uniform"},
        {"sampler": "slice", "slice_len": 4},
        {"sampler": "prioritized", "slice_len": 2},
    ],
    ids=lambda s: "-".join(map(str, s.values())),
)
def test_samplers_and_prefetch(ds: Dataset, mode: dict, sampler: dict) -> None:
    loader = Loader(ds, 32, seed=2, transform=FrameStack(4), prefetch=2, **mode, **sampler)
    for batch in itertools.islice(loader, 3):
        assert batch["observation"].shape == (*batch["index"].shape, 4, *IMAGE)
        check(ds, batch, 4)
    loader.close()


def test_the_loader_does_not_read_the_stacked_keys(ds: Dataset) -> None:
    fs = FrameStack(2)
    loader = Loader(ds, 8, seed=3, in_memory=True, transform=fs)
    assert "observation" not in loader._host.keys and "next/observation" not in loader._host.keys
    assert "next/state" in loader._host.keys
    assert fs._source is not None and fs._source.in_memory  # what the loader no longer holds, in RAM
    later = Loader(ds, 8, seed=3, transform=[Normalize(keys=["state"]), FrameStack(2)])
    assert "observation" in later._host.keys  # not first in the chain: the loader reads them


@pytest.mark.parametrize(
    "keys",
    [["observation"], ["next/observation"], ["observation", "next/reward"], ["action", "next/done"]],
)
def test_subsets_of_keys(ds: Dataset, keys: list[str]) -> None:
    batch = Loader(ds, 16, sampler="epoch", seed=4, keys=keys, transform=FrameStack(3)).sample()
    assert set(batch) == {*keys, "index"}
    check(ds, batch, 3)


def test_further_down_a_chain_the_batch_next_observation_is_the_newest_frame(ds: Dataset) -> None:
    # after NStepReturn, next/observation is the observation n steps on: the next stack ends with it
    loader = Loader(ds, 64, seed=5, transform=[NStepReturn(3, 0.9), FrameStack(3)])
    batch = loader.sample()
    plain = Loader(ds, 64, seed=5, transform=NStepReturn(3, 0.9)).sample()
    assert torch.equal(batch["index"], plain["index"])
    want_obs, want_next = reference(ds, batch["index"].numpy(), 3, "observation")
    np.testing.assert_array_equal(batch["observation"].numpy(), want_obs)
    np.testing.assert_array_equal(batch["next", "observation"][:, :-1].numpy(), want_next[:, :-1])
    np.testing.assert_array_equal(
        batch["next", "observation"][:, -1].numpy(), plain["next", "observation"].numpy()
    )

    def halve(batch: TedBatch) -> TedBatch:  # a newest frame of another dtype: concatenated as before
        batch["next/observation"] = batch["next/observation"] / 2
        return batch

    out = Loader(ds, 16, seed=6, transform=[halve, FrameStack(2)]).sample()
    want_obs, want_next = reference(ds, out["index"].numpy(), 2, "observation")
    np.testing.assert_array_equal(out["observation"].numpy(), want_obs)
    np.testing.assert_array_equal(
        out["next", "observation"][:, 0].numpy(), want_next[:, 0].astype(np.float64)
    )
    np.testing.assert_array_equal(out["next", "observation"][:, 1].numpy(), want_next[:, 1] / 2)


def test_unbound_and_standalone(ds: Dataset) -> None:
    fs = FrameStack(3, keys=["state"])
    with pytest.raises(RuntimeError, match="bound"):
        fs(TedBatch(index=np.arange(3)))
    with pytest.raises(RuntimeError, match="bound"):
        fs.claim(["state"])
    with pytest.raises(ValueError, match="observation-like"):
        FrameStack(2, keys=["action"]).bind(ds)
    fs.bind(ds)
    index = np.array([[0, 11, 12], [13, 50, ds.num_steps - 1]])
    batch = ds.gather(index, ["state", "next/state", "action"])
    batch["index"] = index
    out = fs(batch)
    assert out["state"].shape == (2, 3, 3, 3)
    check(ds, out, 3, ("state",))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    k=st.integers(1, 6),
    in_memory=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_any_episodes(lengths: list[int], k: int, in_memory: bool, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = build(Path(tmp), "prop", lengths, seed=seed)
        loader = Loader(data, 8, sampler="epoch", seed=seed, in_memory=in_memory, transform=FrameStack(k))
        for batch in loader:
            check(data, batch, k)


def test_batches_held_are_never_overwritten(ds: Dataset) -> None:
    # the stacks' memory is reused once a batch is dropped: whatever still refers to it (the
    # batch, a tensor view of it, a numpy view of a numpy view) keeps it, with or without prefetch
    for prefetch in (0, 2):
        loader = Loader(ds, 8, seed=7, prefetch=prefetch, transform=FrameStack(3))
        held = [loader.sample() for _ in range(12)]  # more than the pool keeps
        dropped = loader.sample()
        view = dropped["next", "observation"][2:5, 1]  # a tensor view; its batch is dropped
        want = reference(ds, dropped["index"].numpy(), 3, "observation")[1][2:5, 1]
        del dropped
        for _ in range(12):
            loader.sample()
        for batch in held:
            check(ds, batch, 3)
        np.testing.assert_array_equal(view.numpy(), want)
        loader.close()
    fs = FrameStack(2, keys=["state"])
    fs.bind(ds)
    index = np.array([3, 20, 40])
    batch = fs(TedBatch(index=index, state=np.zeros((3, 3), np.float32)))
    last = batch["state"][:, -1]  # a numpy view of a view: its base is the pooled block
    del batch
    for _ in range(10):
        fs(TedBatch(index=np.array([0, 1, 2]), state=np.zeros((3, 3), np.float32)))
    np.testing.assert_array_equal(last, reference(ds, index, 2, "state")[0][:, -1])


def test_a_dropped_batch_memory_is_reused(ds: Dataset) -> None:
    loader = Loader(ds, 8, seed=8, transform=FrameStack(3))
    batch = loader.sample()
    address = batch["observation"].data_ptr()
    del batch
    again = loader.sample()
    assert again["observation"].data_ptr() == address  # gathered into the same block
    check(ds, again, 3)


def test_normalize_before_a_transform_that_writes_raw_values_is_refused(ds: Dataset) -> None:
    """[Normalize(), FrameStack(3)] gave stacks of raw and normalized frames side by side, and
    [Normalize(), NStepReturn(3)] raw next observations beside normalized observations."""
    cases = ((FrameStack(3), "['next/observation', 'observation']"), (NStepReturn(3), "['next/observation']"))
    for later, keys in cases:
        with pytest.raises(
            ValueError, match=re.escape(f"{type(later).__name__} after Normalize writes {keys}")
        ):
            Loader(ds, 4, seed=0, transform=[Normalize(), later])
    Loader(ds, 4, seed=0, transform=[FrameStack(3), Normalize()]).sample()  # the order that works
