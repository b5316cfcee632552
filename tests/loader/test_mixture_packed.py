"""A mixture's small keys from packed padded tables: the same batches as the per-source path
(keys, shapes, dtypes, values bit for bit, masks, per-source Normalize), and the general path
wherever packing does not apply."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import MixtureLoader, MixtureSource, Normalize, mixture_gather

#: Every stored kind the tables hold: a flat key and its next/ twin, step floats, step flags.
TED = ["observation", "action", "next/observation", "next/reward", "next/terminated", "next/truncated"]


def both(
    robots: dict[str, Dataset], monkeypatch: pytest.MonkeyPatch, **kw: object
) -> tuple[MixtureSource, ...]:
    """The mixture packed, and the same mixture on the per-source path (packing refused by size)."""
    packed = MixtureSource(robots, **kw)  # type: ignore[arg-type]
    with monkeypatch.context() as m:
        m.setattr(mixture_gather, "MAX_PACK_BYTES", 0)
        general = MixtureSource(robots, **kw)  # type: ignore[arg-type]
    return packed, general


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for key in want:
        a, b = np.asarray(got[key]), np.asarray(want[key])
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert a.tobytes() == np.ascontiguousarray(b).tobytes(), key  # bit for bit


@pytest.mark.parametrize(
    ("keys", "normalize"),
    [
        (TED, None),
        (TED, ["observation", "action"]),
        (TED, ["action", "next/reward"]),
        (None, ["observation"]),
    ],
    ids=["plain", "normalized", "step-keys-normalized", "every-key"],
)
def test_packed_batches_equal_the_per_source_path(
    robots: dict[str, Dataset],
    monkeypatch: pytest.MonkeyPatch,
    keys: list[str] | None,
    normalize: list[str] | None,
) -> None:
    """Every key (keys=None adds the derived episode and next/done), in any order of rows."""
    transforms = None if normalize is None else {n: Normalize(keys=normalize) for n in robots}
    packed, general = both(robots, monkeypatch, keys=keys, pad=True, transforms=transforms)
    assert packed._packed is not None and general._packed is None
    if keys is None:
        assert {"episode", "next/done"} <= set(packed.keys)
    rng = np.random.default_rng(0)
    sampler = MixtureLoader(robots, "size", batch_size=200, seed=3, keys=TED, pad=True).sampler
    draws = [
        sampler.sample(),  # grouped by source, as a MixtureSampler draws
        rng.integers(0, packed.num_steps, 150),  # any order
        rng.integers(0, packed.num_steps, (6, 5)),  # 2-D (slices, windows)
        np.array([0, packed.num_steps - 1]),  # the first and last steps
    ]
    for idx in draws:
        assert_same(packed.gather(idx), general.gather(idx))


def test_keys_some_sources_lack_and_renames(
    robots: dict[str, Dataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key only aloha has (its next/reward, renamed): zeros with a mask all False elsewhere."""
    rename = {"aloha": {"next/reward": "reward_aloha"}}
    packed, general = both(robots, monkeypatch, keys=["action", "reward_aloha"], pad=True, rename=rename)
    assert packed._packed is not None
    idx = np.random.default_rng(1).integers(0, packed.num_steps, 300)
    got = packed.gather(idx)
    assert_same(got, general.gather(idx))
    aloha = got["source"] == 2
    assert not got["reward_aloha_pad_mask"][~aloha].any() and got["reward_aloha_pad_mask"][aloha].all()
    assert (got["reward_aloha"][~aloha] == 0).all() and (got["reward_aloha"][aloha] != 0).any()


def test_loader_streams_and_resume_equal(robots: dict[str, Dataset], monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's batches (and a restored loader's) are those of the per-source path."""

    def make(seed: int) -> MixtureLoader:
        norms = {n: Normalize(keys=["observation", "action"]) for n in robots}
        return MixtureLoader(robots, "size", batch_size=64, seed=seed, keys=TED, pad=True, transforms=norms)

    mix = make(4)
    assert mix.source._packed is not None
    mix.sample()
    state = pickle.loads(pickle.dumps(mix.state_dict()))
    want = [mix.sample() for _ in range(3)]
    with monkeypatch.context() as m:
        m.setattr(mixture_gather, "MAX_PACK_BYTES", 0)
        general = make(4)
    assert general.source._packed is None
    general.load_state_dict(state)
    other = make(8)
    other.load_state_dict(state)
    for w in want:
        for got in (general.sample(), other.sample()):
            assert list(got) == list(w)
            for key in w:
                torch.testing.assert_close(got[key], w[key], rtol=0, atol=0)


def test_general_path_where_packing_does_not_apply(robots: dict[str, Dataset]) -> None:
    def ident(batch: object) -> object:
        return batch

    chains = {n: [Normalize(keys=["action"]), ident] for n in robots}
    assert MixtureSource(robots, keys=TED, pad=True, transforms=chains)._packed is None  # per-source chains
    assert MixtureSource(robots, keys=TED, pad=True, float_dtype=torch.float64)._packed is None  # a cast
    assert MixtureSource(robots, keys=TED, pad=True, in_memory=True)._packed is not None


def test_out_of_range_index_refused(robots: dict[str, Dataset]) -> None:
    source = MixtureSource(robots, keys=TED, pad=True)
    assert source._packed is not None
    for bad in (np.array([source.num_steps]), np.array([-1])):
        with pytest.raises(IndexError, match="mixture index out of range"):
            source.gather(bad)


def test_refresh_that_grows_a_source_reads_per_source_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables are a snapshot of the views opened: a refresh that changes one drops them, and
    the new rows are served (every row its episode's own)."""
    import rlds_cli
    from tests.dataset_fixtures import uid_episode

    monkeypatch.setenv("RLDS_FSYNC", "0")

    def write(name: str, uids: list[int]) -> None:
        with rlds_cli.DatasetWriter(name, root=tmp_path, mode="append") as w:
            for uid in uids:
                w.add_episode(uid_episode(uid, 10))

    write("a", [1, 2])
    write("online", [100])
    mix = MixtureLoader(["a", "online"], [0.5, 0.5], batch_size=64, root=tmp_path, seed=0, refresh=1)
    assert mix.source._packed is not None
    first = mix.sample()
    assert set(first["info/episode_uid"].numpy().tolist()) <= {1, 2, 100}
    write("online", [101, 102])
    uids: set[int] = set()
    for _ in range(5):
        batch = mix.sample()
        uid, obs = batch["info/episode_uid"].numpy(), batch["observation"].numpy()
        assert (obs[:, 0] == uid).all()
        uids |= set(uid.tolist())
    assert mix.source._packed is None and {101, 102} <= uids
