"""Per-key temporal windows (``Loader(..., windows={key: offsets})``) against LeRobot's rule,
written out one row at a time.

LeRobot (``LeRobotDataset._get_query_indices``) reads, for frame ``idx`` of an episode spanning
``[ep_start, ep_end)``, each key at ``max(ep_start, min(ep_end - 1, idx + delta))`` for every
delta, and sets ``{key}_is_pad[j] = idx + delta < ep_start or idx + delta >= ep_end``.
:func:`statement` is that rule per sample and offset, over the fixture's telling values (step
``i`` has ``observation = [i, episode, 0.5 i]``, ``action = [0.1 i, -i]``, ``reward = i``; each
episode's final observation is ``[-(last + 1), episode, 0]``), never through the loader's code.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import Loader, MixtureLoader, TedIterableDataset, Windows
from tests.loader_fixtures import TedFactory, make_ted

LENGTHS = [1, 3, 7, 12, 2, 5]


@pytest.fixture(scope="module")
def ds(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "win")


def value_at(key: str, step: int, lengths: list[int]) -> list[float]:
    """The fixture's value of ``key`` at global step ``step`` (see the module docstring)."""
    ends = np.cumsum(lengths)
    e = int(np.searchsorted(ends, step, side="right"))
    if key == "observation":
        return [step, e, 0.5 * step]
    if key == "action":
        return [np.float32(0.1) * np.float32(step), -step]
    if key == "next/reward":
        return [step]
    if key == "next/observation":
        if step == ends[e] - 1:
            return [-float(ends[e]), e, 0]
        return [step + 1, e, 0.5 * (step + 1)]
    raise KeyError(key)


def statement(key: str, index: int, offsets: list[int], lengths: list[int]) -> tuple[list[Any], list[bool]]:
    """LeRobot's rule for one sample: the values at the clamped steps, and the pad flags."""
    ends = np.cumsum(lengths)
    e = int(np.searchsorted(ends, index, side="right"))
    ep_start, ep_end = int(ends[e] - lengths[e]), int(ends[e])
    rows, pads = [], []
    for delta in offsets:
        q = max(ep_start, min(ep_end - 1, index + delta))
        rows.append(value_at(key, q, lengths))
        pads.append(index + delta < ep_start or index + delta >= ep_end)
    return rows, pads


def check(batch: Any, windows: dict[str, list[int]], lengths: list[int], index: np.ndarray) -> None:
    for key, offsets in windows.items():
        value = np.asarray(batch[key])
        pad = np.asarray(batch[key + "_is_pad"])
        assert pad.dtype == np.bool_ and pad.shape == (*index.shape, len(offsets))
        assert value.shape[: index.ndim + 1] == (*index.shape, len(offsets))
        for pos in np.ndindex(index.shape):
            rows, pads = statement(key, int(index[pos]), offsets, lengths)
            np.testing.assert_allclose(value[pos], np.asarray(rows, np.float32), rtol=1e-6, err_msg=key)
            assert pad[pos].tolist() == pads, key


OFFSETS = st.lists(st.integers(-14, 14), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    obs=OFFSETS,
    act=OFFSETS,
    nxt=OFFSETS,
    sampler=st.sampled_from(["uniform", "slice"]),
    in_memory=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_windows_follow_lerobots_rule(
    ds: Dataset, obs: list[int], act: list[int], nxt: list[int], sampler: str, in_memory: bool, seed: int
) -> None:
    windows = {"observation": obs, "action": act, "next/observation": nxt}
    options = {"slice_len": 3, "padded": "both"} if sampler == "slice" else {}
    loader = Loader(
        ds, batch_size=12, sampler=sampler, seed=seed, in_memory=in_memory, windows=windows, **options
    )
    for _ in range(2):
        batch = loader.sample()
        index = batch["index"].numpy()
        check(batch, windows, LENGTHS, index)
        np.testing.assert_array_equal(batch["next", "reward"].numpy()[..., 0], index)  # others untouched


def test_act_batch_shapes_and_shared_offsets(ds: Dataset) -> None:
    """ACT-style: 2 observations, a 50-action chunk; keys with the same offsets share a gather."""
    windows = {"observation": range(-1, 1), "action": range(50), "next/reward": range(50)}
    loader = Loader(
        ds,
        batch_size=16,
        sampler="uniform",
        seed=0,
        windows=windows,
        keys=["observation", "action", "next/reward"],
    )
    batch = loader.sample()
    assert batch["observation"].shape == (16, 2, 3)
    assert batch["action"].shape == (16, 50, 2)
    assert batch["next", "reward"].shape == (16, 50, 1)
    assert batch["action_is_pad"].shape == (16, 50) and batch["action_is_pad"].dtype == torch.bool
    assert batch["observation_is_pad"].shape == (16, 2)
    assert batch["next/reward_is_pad"].shape == (16, 50)
    check(batch, {k: list(v) for k, v in windows.items()}, LENGTHS, batch["index"].numpy())
    assert sorted(batch.keys()) == sorted(
        [
            "index",
            "observation",
            "action",
            "next/reward",
            "observation_is_pad",
            "action_is_pad",
            "next/reward_is_pad",
        ]
    )


def test_resume_exact_with_prefetch_and_transform(ds: Dataset) -> None:
    windows = {"observation": [-2, 0], "action": range(4)}

    def plus_one(batch: Any) -> Any:  # a later transform sees the windowed keys
        batch["action"] = batch["action"] + 1
        return batch

    def make(prefetch: int) -> Loader:
        return Loader(ds, batch_size=8, sampler="slice", slice_len=4, padded="right", seed=5,
                      prefetch=prefetch, windows=windows, transform=plus_one)  # fmt: skip

    loader = make(2)
    for _ in range(3):
        loader.sample()
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    want = [loader.sample() for _ in range(3)]
    again = make(0)
    again.load_state_dict(state)
    for a, b in zip(want, [again.sample() for _ in range(3)], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    rows, _ = statement("action", int(want[0]["index"][0, 0]), [0, 1, 2, 3], LENGTHS)
    np.testing.assert_allclose(want[0]["action"][0, 0].numpy(), np.asarray(rows, np.float32) + 1, rtol=1e-6)


def test_mixture_windows_never_cross_datasets(tmp_path: Path) -> None:
    a = make_ted(tmp_path, "a", [4, 6])
    b = make_ted(tmp_path, "b", [5, 3])
    windows = {"observation": [-3, 0], "action": range(0, 5)}
    mix = MixtureLoader({"a": a, "b": b}, [0.5, 0.5], batch_size=32, seed=0, windows=windows,
                        keys=["observation", "action"], num_batches=2)  # fmt: skip
    for batch in mix:
        for src, lengths in ((0, [4, 6]), (1, [5, 3])):
            rows = (batch["source"] == src).numpy()
            sub = {k: v[rows] for k, v in batch.items()}
            check(sub, {k: list(v) for k, v in windows.items()}, lengths, sub["index"].numpy())
    state = mix.state_dict()
    want = mix.sample()
    mix.load_state_dict(state)
    assert torch.equal(mix.sample()["action"], want["action"])


def test_torch_adapter_batches(ds: Dataset) -> None:
    """Bound to a dataset, Windows works on the numpy batches of the torch adapters."""
    it = TedIterableDataset(
        ds, batch_size=6, shuffle="slice", slice_len=3, padded="left", seed=0, num_batches=2
    )
    windows = Windows({"observation": [-1, 0], "action": range(3)})
    windows.bind(ds)
    for batch in it:
        out = windows(batch)
        check(out, {"observation": [-1, 0], "action": [0, 1, 2]}, LENGTHS, np.asarray(out["index"]))
        assert out["mask"].shape == (2, 3)


def test_seconds_need_a_frame_rate(ds: Dataset) -> None:
    loader = Loader(ds, batch_size=4, seed=0, windows=Windows({"action": [0.0, 0.5]}, fps=4))
    batch = loader.sample()
    check(batch, {"action": [0, 2]}, LENGTHS, batch["index"].numpy())
    with pytest.raises(
        ValueError, match=r"windows\['action'\] gives times in seconds, and the dataset records no frame rate"
    ):
        Loader(ds, batch_size=4, seed=0, windows={"action": [0.0, 0.1]})
    with pytest.raises(ValueError, match=r"times \[0.1\] are not whole frames at 4 fps"):
        Loader(ds, batch_size=4, seed=0, windows=Windows({"action": [0.0, 0.1]}, fps=4))


@pytest.mark.parametrize(
    ("windows", "error", "match"),
    [
        ({}, ValueError, "windows must be a non-empty mapping"),
        ({"action": []}, ValueError, r"windows\['action'\] is empty"),
        ({"action": "01"}, ValueError, r"windows\['action'\] must be a sequence of offsets"),
        ({"action": [0, "1"]}, ValueError, r"must hold integer steps or float seconds"),
        ({"action": [True]}, ValueError, r"must hold integer steps or float seconds"),
        # 1 was read as one second once a float was in the list
        ({"action": [0, 1, 0.5]}, ValueError, r"mixes whole steps \(ints\) and seconds \(floats\)"),
        # NaN and inf became INT64_MIN; 2**63 - 1 wrapped round to the episode's first step
        (
            Windows({"action": [float("nan")]}, fps=4),
            ValueError,
            r"are not finite times within 2\*\*62 frames",
        ),
        (Windows({"action": [float("inf")]}, fps=4), ValueError, r"are not finite times within 2\*\*62"),
        ({"action": [2**63 - 1]}, ValueError, r"reach past 2\*\*62 steps"),
        ({"action": [2**63]}, ValueError, r"reach past 2\*\*62 steps"),
        ({"pixels": [0]}, KeyError, r"windows name key\(s\) \['pixels'\] that dataset 'win' does not have"),
    ],
)
def test_bad_windows_name_the_key(ds: Dataset, windows: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Loader(ds, batch_size=4, seed=0, windows=windows)


def test_windows_refuse_device_gathers_and_unbound_use(ds: Dataset) -> None:
    with pytest.raises(ValueError, match="reads the cache and cannot run with in_memory='device'"):
        Loader(ds, batch_size=4, seed=0, in_memory="device", windows={"action": [0]})
    with pytest.raises(RuntimeError, match="Windows must be bound"):
        Windows({"action": [0]})({"index": np.zeros(1, np.int64)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fps must be > 0"):
        Windows({"action": [0.0]}, fps=0)


class _Rows:
    """A source of rows of its own (not a dataset, not a mixture)."""

    def __init__(self, ds: Dataset) -> None:
        from rlds_cli.loader.sources import HostSource

        self._host = HostSource(ds, ["action"])
        self.num_steps = ds.num_steps
        self.episodes = self._host.episode_bounds

    def gather(self, indices: Any) -> Any:
        return self._host.gather(indices)


def test_windows_need_a_dataset_or_a_mixture(ds: Dataset) -> None:
    with pytest.raises(ValueError, match="windows need a dataset or a MixtureSource to read from, not _Rows"):
        Loader(_Rows(ds), batch_size=4, seed=0, windows={"action": [0]})


@pytest.mark.parametrize("sampler", ["prioritized", "epoch"])
def test_windows_with_other_samplers_and_tensordicts(ds: Dataset, sampler: str) -> None:
    windows = {"observation": [-2, -1, 0], "action": range(0, 6)}
    loader = Loader(ds, batch_size=10, sampler=sampler, seed=2, windows=windows, as_tensordict=True)
    td = loader.sample()
    assert td.batch_size == (10,)
    assert td["action"].shape == (10, 6, 2) and td["observation_is_pad"].shape == (10, 3)
    check(
        {k: td[k] for k in ("observation", "action", "observation_is_pad", "action_is_pad")},
        {k: list(v) for k, v in windows.items()},
        LENGTHS,
        td["index"].numpy(),
    )


def test_windows_in_dataloader_workers(ds: Dataset) -> None:
    """``collate_fn=windows.collate``: the windows are added in the workers (Windows pickles by
    the dataset's path and reopens its columns there), the same batches as in-process."""
    from rlds_cli.loader import TedDataLoader

    windows = Windows({"observation": [-1, 0], "action": range(4)})
    windows.bind(ds)

    def batches(workers: int) -> list[Any]:
        it = TedIterableDataset(ds, batch_size=8, shuffle="uniform", seed=4, num_batches=4)
        return list(TedDataLoader(it, num_workers=workers, collate_fn=windows.collate))

    here, there = batches(0), batches(2)
    for a, b in zip(here, there, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key
        check(a, {"observation": [-1, 0], "action": [0, 1, 2, 3]}, LENGTHS, a["index"].numpy())
    assert isinstance(here[0]["action_is_pad"], torch.Tensor)
    mixture = Windows({"action": [0]})
    from rlds_cli.loader import MixtureSource

    mixture.bind_source(MixtureSource({"a": ds}))
    with pytest.raises(TypeError, match="Windows bound to a mixture cannot be pickled"):
        pickle.dumps(mixture)


def test_unbound_claim_and_unknown_mixture_keys(ds: Dataset) -> None:
    with pytest.raises(RuntimeError, match=r"Windows must be bound to a dataset before claim\(\)"):
        Windows({"action": [0]}).claim(["action"])
    from rlds_cli.loader import MixtureSource

    with pytest.raises(KeyError, match=r"windows name key\(s\) \['pixels'\] that the mixture does not have"):
        Windows({"pixels": [0]}).bind_source(MixtureSource({"a": ds}))
