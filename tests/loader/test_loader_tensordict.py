"""TensorDict batches and a TorchRL replay buffer over the cache (skipped when not installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import Loader
from tests.loader_fixtures import TedFactory, make_ted

tensordict = pytest.importorskip("tensordict")

LENGTHS = [6, 9, 3, 12]


@pytest.fixture(scope="module")
def ds(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset(LENGTHS, "tdict")


def test_loader_returns_tensordicts(ds: Dataset) -> None:
    td = Loader(ds, 8, as_tensordict=True, seed=0).sample()
    assert isinstance(td, tensordict.TensorDict)
    assert tuple(td.batch_size) == (8,)
    index = td["index"].numpy()
    want = ds.gather(index, ["next/observation", "next/done"])
    np.testing.assert_array_equal(td["next", "observation"].numpy(), want["next/observation"])
    np.testing.assert_array_equal(td["next", "done"].numpy(), want["next/done"])
    slices = Loader(ds, 6, sampler="slice", slice_len=3, as_tensordict=True).sample()
    # the slice padding mask under the key TorchRL's losses read
    assert tuple(slices.batch_size) == (2, 3) and slices["collector", "mask"].dtype == torch.bool


def test_torchrl_replay_buffer_over_the_cache(ds: Dataset) -> None:
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    rb = make_replay_buffer(ds, batch_size=16)
    assert len(rb) == ds.num_steps
    td = rb.sample()
    assert td.batch_size == (16,)
    want = ds.gather(td["index"].numpy(), ["observation", "next/reward"])
    np.testing.assert_array_equal(td["observation"].numpy(), want["observation"])
    rb = make_replay_buffer(ds, batch_size=12, sampler=SliceSampler(num_slices=4, traj_key="episode"))
    td = rb.sample()
    episode = td["episode"].reshape(4, 3)
    assert (episode == episode[:, :1]).all()  # TorchRL's slices stay inside rlds episodes
    with pytest.raises(TypeError, match="read-only"):
        rb.extend(td)


def _slices_within_episodes(td: Any, num_slices: int) -> None:
    episode = td["episode"].reshape(num_slices, -1)
    index = td["index"].reshape(num_slices, -1)
    assert (episode == episode[:, :1]).all()  # every slice inside one rlds episode
    assert (index.diff(dim=1) == 1).all()  # consecutive steps


@pytest.mark.parametrize(
    "options", [{"traj_key": "episode"}, {"end_key": ("next", "done")}, {}], ids=["traj", "end", "auto"]
)
def test_torchrl_slice_sampler_boundaries_are_cached(ds: Dataset, options: dict[str, Any]) -> None:
    """The read-only storage gives TorchRL's SliceSampler static boundaries, equal to those it
    computes itself from ``storage[:]``, and its slices stay inside episodes."""
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer, rlds_storage

    sampler = SliceSampler(num_slices=4, **options)
    rb = make_replay_buffer(ds, batch_size=12, sampler=sampler)
    assert sampler.cache_values and "static-stop-and-length" in sampler._cache
    own = SliceSampler(num_slices=4, **options)  # TorchRL's own path, reading storage[:]
    for mine, theirs in zip(
        sampler._cache["static-stop-and-length"], own._get_stop_and_length(rlds_storage(ds)), strict=True
    ):
        assert torch.equal(mine, theirs)
    for _ in range(20):
        _slices_within_episodes(rb.sample(), 4)


def test_torchrl_cached_slice_sampler_reads_no_full_storage(
    ds: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After set-up, sampling reads only the sampled rows, never the whole dataset."""
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    rb = make_replay_buffer(ds, batch_size=12, sampler=SliceSampler(num_slices=4, traj_key="episode"))
    source = rb.storage._source
    sizes: list[int] = []
    gather = source.gather
    monkeypatch.setattr(source, "gather", lambda idx: sizes.append(idx.size) or gather(idx))
    for _ in range(5):
        rb.sample()
    assert sizes and set(sizes) == {12}  # batches (TorchRL may read one twice), never storage[:]


def test_torchrl_slice_sampler_reads_only_its_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchRL's SliceSampler over the rlds replay buffer reads only the rows of each batch
    (issue 16): uncached, it read ``storage[:]["episode"]``, the whole dataset, at every sample
    (~100x the cost of rlds's own slice sampler). Counted in rows, not timed: the cost ratio
    against rlds's sampler is measured in ``make bench``, where timings belong."""
    pytest.importorskip("torchrl")
    from torchrl.data import SliceSampler

    from rlds_cli.loader.torchrl_compat import make_replay_buffer

    monkeypatch.setenv("RLDS_FSYNC", "0")
    big = make_ted(tmp_path, "slices", [250] * 200)  # 50,000 steps
    rb = make_replay_buffer(big, batch_size=256, sampler=SliceSampler(num_slices=8, traj_key="episode"))
    source = rb._storage._source
    gather = source.gather
    rows: list[int] = []

    def counting(idx: Any) -> Any:
        rows.append(int(np.asarray(idx).size))
        return gather(idx)

    monkeypatch.setattr(source, "gather", counting)
    for _ in range(5):
        rb.sample()
    assert rows and max(rows) <= 256, rows  # the batch's rows; uncached: 50,000 a sample
    _slices_within_episodes(rb.sample(), 8)


# ----------------------------------------------------------------------------- how batches are built


@pytest.fixture(scope="module")
def ds2(ted_dataset: TedFactory) -> Dataset:
    return ted_dataset([5, 7], "tdict2")


def _own_weight(batch: Any) -> Any:
    """A transform giving the batch a ``weight`` of its own (not the sampler's)."""
    batch["weight"] = np.ones(batch["index"].shape, np.float32)
    return batch


def _constructed(batch: Any, device: str | None = None) -> Any:
    """What ``TensorDict(...)`` makes of a plain batch: the extras under TorchRL's keys, nested."""
    from rlds_cli.cache.ted import TedBatch
    from rlds_cli.loader.tensors import torchrl_paths

    extras = [k for k in ("weight", "mask") if k in batch]
    renamed = TedBatch(zip(torchrl_paths(batch, extras), batch.values(), strict=True))
    return tensordict.TensorDict(renamed.nested(), batch_size=tuple(batch["index"].shape), device=device)


LOADERS = {
    "uniform": {},
    "slice": {"sampler": "slice", "slice_len": 3},
    "prioritized": {"sampler": "prioritized"},
    "ram": {"in_memory": True},
    "device": {"in_memory": "device"},
    "prefetch": {"prefetch": 2},
    "windows": {"windows": {"observation": [-1, 0]}},
    "float64": {"float_dtype": torch.float64},
}


def _assert_same_tensordict(td: Any, want: Any) -> None:
    assert type(td) is tensordict.TensorDict
    assert list(td.keys(True, True)) == list(want.keys(True, True))  # same keys, nesting and order
    assert td.batch_size == want.batch_size and td.device == want.device
    for key in want.keys(True):
        mine, theirs = td[key], want[key]
        if isinstance(theirs, tensordict.TensorDict):
            assert type(mine) is tensordict.TensorDict and mine.batch_size == theirs.batch_size
            assert mine.device == theirs.device
        else:
            assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), key


@pytest.mark.parametrize("options", list(LOADERS.values()), ids=list(LOADERS))
def test_tensordict_batches_are_the_constructors(ds: Dataset, options: dict[str, Any]) -> None:
    """The TensorDict batch is what the ``TensorDict`` constructor makes of the plain batch of the
    same draw: keys and their order, nesting, dtypes, batch sizes at every level, device."""
    tds = Loader(ds, 6, seed=4, as_tensordict=True, **options)
    plain = Loader(ds, 6, seed=4, **options)
    for _ in range(3):
        _assert_same_tensordict(tds.sample(), _constructed(plain.sample()))
    tds.close()
    plain.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("options", [{}, {"sampler": "slice", "slice_len": 3}, {"in_memory": "device"}])
def test_cuda_tensordict_batches_are_the_constructors(ds: Dataset, options: dict[str, Any]) -> None:
    """On a device given without an index the batch's device is indexed, as the constructor does."""
    tds = Loader(ds, 6, seed=4, device="cuda", as_tensordict=True, **options)
    plain = Loader(ds, 6, seed=4, device="cuda", **options)
    for _ in range(3):
        td = tds.sample()
        _assert_same_tensordict(td, _constructed(plain.sample(), "cuda"))
        assert td.device == torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("options", [{}, {"sampler": "slice", "slice_len": 3}], ids=["uniform", "slice"])
def test_mixture_tensordict_batches_are_the_constructors(
    ds: Dataset, ds2: Dataset, options: dict[str, Any]
) -> None:
    from rlds_cli.loader import MixtureLoader, MixtureSource

    sources = {"a": ds, "b": ds2}
    tds: Any
    plain: Any
    if options:
        tds = Loader(MixtureSource(sources), 6, seed=1, as_tensordict=True, **options)
        plain = Loader(MixtureSource(sources), 6, seed=1, **options)
    else:
        tds = MixtureLoader(sources, [0.5, 0.5], 6, seed=1, as_tensordict=True)
        plain = MixtureLoader(sources, [0.5, 0.5], 6, seed=1)
    for _ in range(3):
        td = tds.sample()
        _assert_same_tensordict(td, _constructed(plain.sample()))
        assert td["source"].dtype == torch.int64


def test_a_datasets_own_weight_stays_where_it_is(ds: Dataset) -> None:
    """Only the sampler's extras move to TorchRL's keys; a ``weight`` a transform makes does not."""
    td = Loader(ds, 6, seed=0, transform=_own_weight, as_tensordict=True).sample()
    assert {"weight"} <= set(td.keys()) and "priority_weight" not in set(td.keys())
    td = Loader(ds, 6, seed=0, sampler="prioritized", as_tensordict=True).sample()
    assert {"priority_weight"} <= set(td.keys()) and "weight" not in set(td.keys())


def test_a_transform_key_without_the_batch_rows_is_refused_by_name(ds: Dataset) -> None:
    def bad(batch: Any) -> Any:
        batch["bad"] = np.zeros(3, np.float32)
        return batch

    loader = Loader(ds, 6, seed=0, transform=bad, as_tensordict=True)
    with pytest.raises(ValueError, match=r"batch key 'bad' has shape \(3,\), not the batch's leading"):
        loader.sample()


def test_a_key_that_is_also_a_parent_is_refused_by_name(ds: Dataset) -> None:
    from rlds_cli.loader.tensors import nesting

    def clash(batch: Any) -> Any:
        batch["observation/extra"] = np.zeros(batch["index"].shape, np.float32)
        return batch

    loader = Loader(ds, 6, seed=0, transform=clash, as_tensordict=True)
    with pytest.raises(
        ValueError, match="batch key 'observation' is a tensor and the parent of 'observation/extra'"
    ):
        loader.sample()
    with pytest.raises(ValueError, match="batch key 'a' is a tensor and the parent of 'a/b'"):
        nesting(["a/b", "a"])
    assert nesting(["x", "n/a", "y", "n/m/b"]) == [("x", 0), ("n", [("a", 1), ("m", [("b", 3)])]), ("y", 2)]


def test_to_tensordict_converts_moves_and_checks() -> None:
    from rlds_cli.cache.ted import TedBatch
    from rlds_cli.loader.tensors import to_tensordict

    arrays = TedBatch({"observation": np.ones((4, 2), np.float32), "next/reward": np.zeros((4, 1))})
    td = to_tensordict(arrays)  # numpy values: the constructor converts them
    assert td.batch_size == (4,) and td["next", "reward"].dtype == torch.float64
    tensors = TedBatch({k: torch.from_numpy(v) for k, v in arrays.items()})
    tensors["index"] = torch.arange(4)
    _assert_same_tensordict(to_tensordict(tensors), tensordict.TensorDict(tensors.nested(), batch_size=(4,)))
    assert to_tensordict(tensors, "cpu").device == torch.device("cpu")
    tensors["index"] = torch.arange(4).reshape(2, 2)  # a batch of slices: the index's shape
    assert to_tensordict(TedBatch(index=tensors["index"])).batch_size == (2, 2)
    with pytest.raises(ValueError, match=r"batch key 'observation' has shape \(4, 2\)"):
        to_tensordict(tensors)


def test_a_builder_keeps_every_layout_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of other keys (and extras) each get their own nesting, also past the kept maximum."""
    from rlds_cli.cache.ted import TedBatch
    from rlds_cli.loader.tensors import TensorDictBatches

    build = TensorDictBatches(checked=False)
    monkeypatch.setattr(build, "MAX_LAYOUTS", 2)
    index = torch.arange(3)
    batches = [
        (TedBatch(index=index, a=torch.ones(3)), None),
        (TedBatch(index=index, mask=torch.ones(3, dtype=torch.bool)), ["mask"]),
        (TedBatch(index=index, mask=torch.ones(3, dtype=torch.bool)), None),
        (TedBatch({"index": index, "n/b": torch.ones(3, 2)}), None),
    ]
    for _ in range(2):
        for batch, extras in batches:
            td = build(batch, extras)
            keys = [".".join(k) if isinstance(k, tuple) else k for k in td.keys(True, True)]
            want = [("collector.mask" if extras and k == "mask" else k.replace("/", ".")) for k in batch]
            assert keys == want and td.batch_size == (3,)
