"""The Loader in every mode (disk, RAM packed or not, device-resident), every sampler, prefetch,
state, transforms and argument errors: every batch must equal ``Dataset.gather`` at its indices."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import Loader, SliceSampler
from rlds_cli.loader.transforms import FrameStack, Normalize, NStepReturn, compute_stats
from tests.loader_fixtures import TedFactory, make_ted

LENGTHS = [12, 1, 7, 30, 2, 9, 25, 4]


@pytest.fixture(scope="module", params=["memmap", "zarr"])
def ted(request: pytest.FixtureRequest, ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, backend=request.param)


@pytest.fixture(scope="module")
def mm(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "mm")


def assert_batch_is_gather(ds: Dataset, batch: dict[str, torch.Tensor]) -> None:
    index = batch["index"].cpu().numpy()
    keys = [k for k in batch if k not in ("index", "mask", "weight")]
    want = ds.gather(index.ravel(), keys)
    for key in keys:
        got = batch[key].cpu().numpy()
        flat = np.asarray(want[key])
        assert got.shape == index.shape + flat.shape[1:], key  # [batch (, slice_len), *key shape]
        expected = flat.reshape(got.shape)
        np.testing.assert_array_equal(got, expected, err_msg=key)
        assert got.dtype == expected.dtype, key


MODES = [
    {"in_memory": False},
    {"in_memory": True},
    {"in_memory": True, "pack": False},
    {"in_memory": "device"},
]
SAMPLERS = [
    {"sampler": "uniform"},
    {"sampler": "epoch"},
    {"sampler": "slice", "slice_len": 4},
    {"sampler": "prioritized"},
    {"sampler": "prioritized", "slice_len": 4},
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: "-".join(map(str, s.values())))
def test_every_mode_and_sampler_matches_gather(ted: Dataset, mode: dict, sampler: dict) -> None:
    loader = Loader(ted, batch_size=16, seed=3, **mode, **sampler)
    for batch in itertools.islice(loader, 3):
        assert set(batch) >= set(ted.fields) | {"index"}
        assert_batch_is_gather(ted, batch)
        if sampler["sampler"] == "slice" or "slice_len" in sampler:
            assert batch["index"].shape == (4, 4) and batch["observation"].shape == (4, 4, 3)
            assert batch["mask"].dtype == torch.bool
        if sampler["sampler"] == "prioritized":
            assert batch["weight"].dtype == torch.float32 and batch["weight"].shape == batch["index"].shape


@pytest.fixture(scope="module")
def scalars(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    """A dataset with per-step keys of shape () (float32 and bool), made by preprocess."""
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.preprocess import run

    root = tmp_path_factory.mktemp("scalars")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLDS_FSYNC", "0")
        make_ted(root, "base", LENGTHS)
        run("base", "tests.preprocess_fns:scalar_keys", "scalars", workers=1, root=root)
        yield open_dataset("scalars", root)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize("sampler", SAMPLERS[:3], ids=lambda s: "-".join(map(str, s.values())))
def test_keys_of_shape_unit_keep_their_shape(scalars: Dataset, mode: dict, sampler: dict) -> None:
    """A () key is [batch] (or [slices, slice_len]) in every mode: packing must not add a dim."""
    assert scalars.manifest.fields["cost"].shape == () and scalars.manifest.fields["success"].shape == ()
    for keys in (None, ["cost", "success"], ["success", "episode"]):
        batch = Loader(scalars, batch_size=16, seed=1, keys=keys, **mode, **sampler).sample()
        assert batch["success"].shape == batch["index"].shape
        assert batch["success"].dtype == torch.bool
        assert_batch_is_gather(scalars, batch)


@pytest.mark.parametrize("mode", MODES[:3], ids=["disk", "ram", "ram-unpacked"])
def test_key_subsets(mm: Dataset, mode: dict) -> None:
    for keys in (["next/observation"], ["next/done", "episode"], ["action", "next/truncated"], []):
        batch = Loader(mm, 8, keys=keys, **mode).sample()
        assert set(batch) == {*keys, "index"}
        assert_batch_is_gather(mm, batch)


def test_unneeded_arrays_are_never_opened(tmp_path: Path) -> None:
    ds = make_ted(tmp_path, "lazy", [5, 5])
    Loader(ds, 4, keys=["action"]).sample()
    assert set(ds._columns) == {"action"}


def test_same_seed_same_batches_across_modes(mm: Dataset) -> None:
    def run(**kw: object) -> list[list[int]]:
        loader = Loader(mm, 8, seed=11, **kw)  # type: ignore[arg-type]
        return [b["index"].tolist() for b in itertools.islice(loader, 4)]

    for sampler in ("uniform", "epoch", "prioritized"):
        ref = run(sampler=sampler)
        assert run(sampler=sampler, in_memory=True) == ref
        assert run(sampler=sampler, prefetch=2) == ref
    assert run(sampler="slice", slice_len=2) == run(sampler="slice", slice_len=2, prefetch=3)


@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize(
    "sampler", [{"sampler": "uniform"}, {"sampler": "epoch"}, {"sampler": "prioritized"}]
)
def test_state_dict_continues_the_stream(mm: Dataset, prefetch: int, sampler: dict) -> None:
    loader = Loader(mm, 8, seed=5, prefetch=prefetch, **sampler)
    for _ in range(7):
        loader.sample()
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    want = [loader.sample()["index"].tolist() for _ in range(5)]
    resumed = Loader(mm, 8, seed=99, prefetch=prefetch, **sampler)
    resumed.load_state_dict(state)
    assert [resumed.sample()["index"].tolist() for _ in range(5)] == want
    loader.close()
    resumed.close()


def test_prefetch_errors_reach_the_caller(mm: Dataset) -> None:
    class Broken:
        def sample(self) -> np.ndarray:
            raise RuntimeError("sampler broke")

    loader = Loader(mm, 4, sampler=Broken(), prefetch=2)
    with pytest.raises(RuntimeError, match="sampler broke"):
        loader.sample()


def test_prefetch_threads_of_loaders_left_open_stop_at_exit(mm: Dataset) -> None:
    """A daemon thread still making a torch batch while the interpreter finalized aborted the
    process ('terminate called without an active exception', exit 134): an exit hook stops them."""
    import threading

    from rlds_cli.loader.read_ahead import stop_prefetchers

    loaders = [Loader(mm, 4, seed=s, prefetch=2) for s in range(3)]
    for loader in loaders:
        loader.sample()
    assert sum(t.name == "rlds-prefetch" and t.is_alive() for t in threading.enumerate()) >= 3
    stop_prefetchers()
    assert not [t for t in threading.enumerate() if t.name == "rlds-prefetch" and t.is_alive()]
    with pytest.raises(RuntimeError, match="stopped at exit"):  # a later draw says so, never waits
        loaders[0].sample()


def test_epoch_iteration_is_one_epoch(mm: Dataset) -> None:
    for drop_last, prefetch in [(False, 0), (True, 0), (False, 2)]:
        loader = Loader(mm, 16, sampler="epoch", drop_last=drop_last, prefetch=prefetch, keys=[])
        for _ in range(2):
            seen = np.concatenate([b["index"].numpy() for b in loader])
            assert len(seen) == (len(mm) // 16) * 16 if drop_last else len(seen) == len(mm)
            assert len(set(seen.tolist())) == len(seen)
        assert len(loader) == (len(mm) // 16 if drop_last else -(-len(mm) // 16))
        loader.close()


def test_prioritized_loader_update_priority(mm: Dataset) -> None:
    loader = Loader(mm, 64, sampler="prioritized", alpha=1.0, beta=1.0, prefetch=1)
    batch = loader.sample()
    loader.update_priority(torch.arange(len(mm)), torch.where(torch.arange(len(mm)) == 7, 1e6, 1e-3))
    loader.close()  # batches prefetched with the old priorities are dropped
    hot = np.mean([(loader.sample()["index"] == 7).float().mean().item() for _ in range(5)])
    assert hot > 0.9
    assert batch["weight"].max() <= 1.0
    with pytest.raises(ValueError, match="no priorities"):
        Loader(mm, 4).update_priority([0], [1.0])


def test_custom_sampler_object_with_extras(mm: Dataset) -> None:
    loader = Loader(mm, 6, sampler=SliceSampler(mm.episodes["length"], 3, 2, seed=0))
    batch = loader.sample()
    assert batch["index"].shape == (3, 2) and batch["mask"].shape == (3, 2)
    assert_batch_is_gather(mm, batch)


def test_device_resident_uniform_draws_on_the_device(mm: Dataset) -> None:
    loader = Loader(mm, 32, in_memory="device", device="cpu", seed=1)
    assert type(loader.sampler).__name__ == "DeviceUniformSampler"
    a = [loader.sample()["index"].tolist() for _ in range(3)]
    state = loader.state_dict()
    b = loader.sample()["index"].tolist()
    loader.load_state_dict(state)
    assert loader.sample()["index"].tolist() == b
    assert a == [Loader(mm, 32, in_memory="device", seed=1).sample()["index"].tolist(), *a[1:]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", [{"in_memory": False, "prefetch": 2}, {"in_memory": "device"}])
def test_cuda_paths(mm: Dataset, mode: dict) -> None:  # GPU path: pinned memory, device-resident
    loader = Loader(mm, 32, device="cuda", **mode)
    batch = loader.sample()
    assert all(v.device.type == "cuda" for v in batch.values())
    assert_batch_is_gather(mm, {k: v.cpu() for k, v in batch.items()})
    loader.close()


# --------------------------------------------------------------------------- transforms


def test_normalize_with_computed_stats(mm: Dataset) -> None:
    stats = compute_stats(mm, ["observation", "action"])
    obs = mm.gather(np.arange(len(mm)), ["observation"])["observation"]
    np.testing.assert_allclose(stats["observation"]["mean"], obs.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["observation"]["std"], obs.std(0), rtol=1e-4)
    loader = Loader(mm, 16, transform=Normalize(keys=["observation"]), seed=0)
    raw = Loader(mm, 16, seed=0).sample()
    got = loader.sample()
    mean, std = stats["observation"]["mean"], stats["observation"]["std"] + 1e-6
    np.testing.assert_allclose(
        got["observation"].numpy(), (raw["observation"].numpy() - mean) / std, rtol=1e-5
    )
    np.testing.assert_allclose(
        got["next", "observation"].numpy(), (raw["next", "observation"].numpy() - mean) / std, rtol=1e-5
    )
    np.testing.assert_array_equal(got["action"].numpy(), raw["action"].numpy())


def test_n_step_returns(mm: Dataset) -> None:
    n, gamma = 3, 0.5
    batch = Loader(mm, 64, transform=NStepReturn(n, gamma), seed=2).sample()
    ends = np.cumsum(LENGTHS)
    for row, t in enumerate(batch["index"].tolist()):
        end = ends[np.searchsorted(ends, t, side="right")]
        k = min(n, end - t)
        want = sum(gamma**j * float(t + j) for j in range(k))  # reward of step i is i
        assert batch["next", "reward"][row].item() == pytest.approx(want)
        assert batch["next", "discount"][row].item() == pytest.approx(gamma**k)
        last = mm.gather([t + k - 1], ["next/observation", "next/terminated", "next/done"])
        np.testing.assert_array_equal(batch["next", "observation"][row].numpy(), last["next/observation"][0])
        assert batch["next", "terminated"][row].item() == bool(last["next/terminated"][0, 0])
        assert batch["next", "done"][row].item() == bool(last["next/done"][0, 0])


def test_frame_stack_from_flat_storage(mm: Dataset) -> None:
    k = 3
    for sampler in ({"sampler": "uniform"}, {"sampler": "slice", "slice_len": 2}):
        batch = Loader(mm, 32, transform=FrameStack(k), seed=4, **sampler).sample()
        idx = batch["index"].numpy()
        assert batch["observation"].shape == (*idx.shape, k, 3)
        starts = np.cumsum(LENGTHS) - np.asarray(LENGTHS)
        for pos in np.ndindex(idx.shape):
            t = int(idx[pos])
            first = starts[np.searchsorted(starts, t, side="right") - 1]
            frames = [max(t - j, first) for j in range(k - 1, -1, -1)]
            want = mm.gather(frames, ["observation"])["observation"]
            np.testing.assert_array_equal(batch["observation"][pos].numpy(), want)
            nxt = [max(t + 1 - j, first) for j in range(k - 1, 0, -1)]
            want_next = np.concatenate(
                [
                    mm.gather(nxt, ["observation"])["observation"],
                    mm.gather([t], ["next/observation"])["next/observation"],
                ]
            )
            np.testing.assert_array_equal(batch["next", "observation"][pos].numpy(), want_next)


def test_plain_callable_transform_and_chain(mm: Dataset) -> None:
    def double_reward(batch: dict) -> dict:
        batch["next/reward"] = batch["next/reward"] * 2
        return batch

    a = Loader(mm, 8, transform=[double_reward, double_reward], seed=0).sample()
    b = Loader(mm, 8, seed=0).sample()
    assert torch.equal(a["next", "reward"], b["next", "reward"] * 4)
    with pytest.raises(ValueError, match="in_memory='device'"):
        Loader(mm, 8, in_memory="device", transform=NStepReturn(2))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"in_memory": "gpu"}, "in_memory must be"),
        ({"prefetch": -1}, "prefetch must be"),
        ({"num_batches": -2}, "num_batches must be"),
        ({"pin_memory": True}, "pin_memory=True needs a CUDA device"),
        ({"sampler": "bogus"}, "unknown sampler 'bogus'"),
        ({"sampler": "uniform", "slice_len": 3}, "no option.*slice_len"),
        ({"sampler": object()}, "sampler must be a name or an object with sample"),
        ({"sampler": SliceSampler([5], 1, 1), "slice_len": 2}, "only apply to a sampler given by name"),
        ({"sampler": "slice", "slice_len": 5}, "batch_size=8 is not a multiple of slice_len=5"),
        ({"sampler": "slice", "slice_len": 8, "short": "error"}, "slice_len=8 is longer than"),
        ({"transform": 3}, "transform must be callable"),
    ],
)
def test_bad_arguments_are_clear_value_errors(mm: Dataset, kwargs: dict, match: str) -> None:
    kwargs = {"batch_size": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        Loader(mm, **kwargs)


def test_as_tensordict_needs_tensordict(mm: Dataset) -> None:
    pytest.importorskip("tensordict")
    td = Loader(mm, 8, sampler="slice", slice_len=4, as_tensordict=True).sample()
    assert tuple(td.batch_size) == (2, 4)
    assert td["next", "reward"].shape == (2, 4, 1)
