"""Saved loader and sampler states checked before they are taken: every bad field gives one
:class:`LoaderStateError` naming it, a refused state leaves the loader as it was, and no state
makes a loader loop (a negative epoch position once drew empty batches forever)."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlds_cli import Loader, MixtureLoader
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.epoch import EpochSampler
from rlds_cli.loader.prioritized import PrioritizedSampler
from rlds_cli.loader.samplers import SliceSampler, UniformSampler
from rlds_cli.loader.torch_data import EpochBatchSampler
from tests.dataset_fixtures import make_dataset

LENGTHS = [3, 4, 5]  # 12 steps
STEPS = sum(LENGTHS)

KINDS: dict[str, dict[str, Any]] = {
    "uniform": {},
    "epoch": {"sampler": "epoch"},
    "slice": {"sampler": "slice", "slice_len": 2},
    "prioritized": {"sampler": "prioritized"},
}


def _make(kind: str) -> Loader | MixtureLoader:
    make_dataset("d", LENGTHS, replace=True)
    if kind == "mixture":
        return MixtureLoader({"a": "d", "b": "d"}, [0.5, 0.5], batch_size=4, seed=0)
    return Loader("d", batch_size=4, seed=0, **KINDS[kind])


def _warm(loader: Loader | MixtureLoader) -> dict[str, Any]:
    for _ in range(2):
        loader.sample()
    return loader.state_dict()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _sampler_part(kind: str, state: dict[str, Any]) -> dict[str, Any]:
    """Where the sampler's own fields are: under ``sampler`` for a Loader."""
    return state if kind == "mixture" else state["sampler"]


def _batch_ok(kind: str, loader: Loader | MixtureLoader) -> None:
    """The next batches (a bounded few, iterated and sampled) are full and index the dataset."""
    stream = loader.stream() if kind == "mixture" else iter(loader)  # a mixture has no epochs
    batches = [loader.sample(), *itertools.islice(stream, 8)]
    for batch in batches:
        index = batch["index"].numpy()
        assert index.size and index.min() >= 0 and index.max() < STEPS, index


#: (kind, field of the sampler's part (None: the Loader's own), bad value, message)
BAD_FIELDS: list[tuple[str, str | None, Any, str]] = [
    ("epoch", "position", -3, "field 'position' must be an integer in [0, 12], got -3"),
    ("epoch", "position", 10**12, "'position' must be an integer in [0, 12]"),
    ("epoch", "position", 2.0, "'position' must be an integer"),
    ("epoch", "epoch", -5, "'epoch' must be an integer >= 0, got -5"),
    ("epoch", "epoch", "1", "'epoch' must be an integer"),
    ("epoch", "seed", None, "'seed' must be an integer"),
    ("epoch", "num_steps", True, "'num_steps' must be an integer >= 1, got True"),
    ("uniform", "bit_generator", {"bit_generator": "PCG64"}, "'bit_generator' is no PCG64 generator state"),
    ("uniform", "bit_generator", 7, "'bit_generator' is no PCG64"),
    ("uniform", "rank", -1, "'rank' must be an integer >= 0"),
    ("uniform", "world_size", 0, "'world_size' must be an integer >= 1"),
    ("slice", "seed", -2, "'seed' must be an integer >= 0"),
    ("slice", "bit_generator", {"bit_generator": "MT19937", "state": {}}, "no PCG64 generator state"),
    ("prioritized", "priorities", np.ones(11), "'priorities' must be 12 finite numbers >= 0, got shape"),
    ("prioritized", "priorities", np.full(12, np.nan), "not finite"),
    ("prioritized", "priorities", np.array(["x"] * 12), "got dtype <U1"),
    ("prioritized", "priorities", np.zeros(12), "'priorities' must hold at least one above 0"),
    ("prioritized", "alpha", float("inf"), "'alpha' must be a finite number >= 0"),
    ("prioritized", "alpha", 10**400, "'alpha' must be a finite number >= 0"),
    ("prioritized", "beta", -0.5, "'beta' must be a finite number >= 0"),
    ("prioritized", "max_priority", "1", "'max_priority' must be a finite number"),
    ("uniform", None, "not a dict", "Loader state must be a dict"),
    ("mixture", "batches_drawn", -1, "'batches_drawn' must be an integer >= 0, got -1"),
    ("mixture", "counts", [1, 2, 3], "'counts' must be 2 finite integers >= 0, got shape (3,)"),
    ("mixture", "counts", [-1, 2], "below 0"),
    ("mixture", "target", [0.5, None], "'target' must be 2 finite numbers"),
    ("mixture", "ready_at", [-3, 0], "'ready_at' must be 2 finite integers >= -2"),
    ("mixture", "refresh_batches", -1, "'refresh_batches' must be an integer >= 0"),
    ("mixture", "bit_generator", None, "'bit_generator' is no PCG64"),
]

LOADER_FIELDS: list[tuple[str, Any, str]] = [
    ("batches_drawn", -4, "Loader state field 'batches_drawn' must be an integer >= 0, got -4"),
    ("epoch_end_pending", "yes", "'epoch_end_pending' must be True or False"),
    ("seed", 1.5, "Loader state field 'seed' must be an integer"),
]


@pytest.mark.parametrize(("kind", "field", "value", "says"), BAD_FIELDS)
def test_each_bad_sampler_field_is_named_and_nothing_changes(
    kind: str, field: str | None, value: Any, says: str
) -> None:
    loader = _make(kind)
    good = _warm(loader)
    bad: Any = copy.deepcopy(good)
    if field is None:
        bad = value
    else:
        _sampler_part(kind, bad)[field] = value
    with pytest.raises(LoaderStateError, match=re.escape(says)):
        loader.load_state_dict(bad)
    assert _same(loader.state_dict(), good)  # the refused state left it as it was
    _batch_ok(kind, loader)


#: The fields a state cannot do without, by kind (seed, rank and world size may be absent in
#: states saved by older versions, and ready_at in mixtures saved before growing ones).
REQUIRED = {
    "uniform": ["bit_generator", "num_steps"],
    "slice": ["bit_generator", "num_steps"],
    "prioritized": ["bit_generator", "num_steps", "priorities", "max_priority", "alpha", "beta"],
    "epoch": ["seed", "epoch", "position", "num_steps"],
    "mixture": ["bit_generator", "batches_drawn", "counts", "target"],
}


@pytest.mark.parametrize("kind", [*KINDS, "mixture"])
def test_a_missing_field_is_named(kind: str) -> None:
    loader = _make(kind)
    good = _warm(loader)
    for key in REQUIRED[kind]:
        bad = copy.deepcopy(good)
        del _sampler_part(kind, bad)[key]
        with pytest.raises(LoaderStateError, match=f"has no field '{key}'"):
            loader.load_state_dict(bad)
    if kind != "mixture":
        bad = copy.deepcopy(good)
        del bad["sampler"]
        with pytest.raises(LoaderStateError, match="Loader state has no field 'sampler'"):
            loader.load_state_dict(bad)
    assert _same(loader.state_dict(), good)


@pytest.mark.parametrize(("field", "value", "says"), LOADER_FIELDS)
def test_each_bad_loader_field_is_named(field: str, value: Any, says: str) -> None:
    loader = _make("epoch")
    good = _warm(loader)
    with pytest.raises(LoaderStateError, match=re.escape(says)):
        loader.load_state_dict({**good, field: value})
    assert _same(loader.state_dict(), good)


def test_the_negative_position_that_looped_forever_is_refused() -> None:
    loader = _make("epoch")
    state = _warm(loader)
    state["sampler"]["position"] = -1
    with pytest.raises(LoaderStateError, match=r"'position' must be an integer in \[0, 12\], got -1"):
        loader.load_state_dict(state)
    state["sampler"]["position"] = 12  # the end of the epoch is a real place to resume from
    loader.load_state_dict(state)
    _batch_ok("epoch", loader)


@pytest.mark.parametrize(
    "make",
    [
        lambda: UniformSampler(12, 4, 0),
        lambda: SliceSampler(np.array(LENGTHS), 2, 2, seed=0),
        lambda: EpochSampler(12, 4, 0),
        lambda: PrioritizedSampler(12, 4, seed=0),
    ],
)
def test_the_samplers_check_their_own_states(make: Callable[[], Any]) -> None:
    sampler = make()
    sampler.sample()
    with pytest.raises(LoaderStateError, match="state must be a dict"):
        sampler.load_state_dict([1, 2])
    with pytest.raises(LoaderStateError, match="has no field 'num_steps'"):
        sampler.load_state_dict({k: v for k, v in sampler.state_dict().items() if k != "num_steps"})


def test_the_torch_batch_sampler_checks_its_cursor() -> None:
    sampler = EpochBatchSampler(12, 4, seed=0)
    state = sampler.state_dict()
    with pytest.raises(LoaderStateError, match=r"'position' must be an integer in \[0, 3\], got -1"):
        sampler.load_state_dict({**state, "position": -1})
    with pytest.raises(LoaderStateError, match="'epoch' must be an integer >= 0, got -5"):
        sampler.load_state_dict({**state, "epoch": -5})
    with pytest.raises(LoaderStateError, match="'batch_size' must be an integer >= 1"):
        sampler.load_state_dict({**state, "batch_size": 0})
    assert _same(sampler.state_dict(), state)


def test_the_torch_batch_sampler_refuses_a_state_of_the_other_shuffle_mode() -> None:
    """A shuffled epoch's position means other steps in order: the state names its mode, and a
    sampler of the other mode refuses it (it took it, and repeated and skipped steps)."""
    shuffled = EpochBatchSampler(12, 4, seed=0, shuffle=True)
    next(iter(shuffled))
    state = shuffled.state_dict()
    assert state["shuffle"] is True
    in_order = EpochBatchSampler(12, 4, seed=0, shuffle=False)
    with pytest.raises(LoaderStateError, match="saved with shuffle=True, not False"):
        in_order.load_state_dict(state)
    assert in_order.position == 0
    with pytest.raises(LoaderStateError, match="saved with shuffle=True, not False"):
        in_order.resume([state])
    older = {k: v for k, v in state.items() if k != "shuffle"}  # saved before the field
    again = EpochBatchSampler(12, 4, seed=0, shuffle=True)
    again.load_state_dict(older)
    assert [b for b in again] == [b for b in iter(shuffled)]


VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-3, 20),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(-3, 3), max_size=13),
    st.just({}),
    st.just("DELETE"),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from([*KINDS, "mixture"]), data=st.data())
def test_any_single_field_mutation_loads_cleanly_or_is_refused(kind: str, data: st.DataObject) -> None:
    loader = _make(kind)
    good = _warm(loader)
    bad = copy.deepcopy(good)
    holders = [bad] if kind == "mixture" else [bad, bad["sampler"]]
    holder = data.draw(st.sampled_from(holders))
    key = data.draw(st.sampled_from(sorted(holder)))
    value = data.draw(VALUES)
    if value == "DELETE":
        del holder[key]
    else:
        holder[key] = value
    try:
        loader.load_state_dict(bad)
    except LoaderStateError:
        assert _same(loader.state_dict(), good), (key, value)
    _batch_ok(kind, loader)


def test_a_seed_a_state_cannot_hold_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed of 2**63 or more trained, then its own checkpoint was refused at restore time
    ('seed' must be an integer >= 0, got 9223372036854775808); 2**64 on the device failed in torch."""
    import rlds_cli
    from rlds_cli.errors import SeedError

    make_dataset("s", [5, 5])
    for seed in (2**63, 2**64, 2**128):
        with pytest.raises(SeedError, match=r"from 0 to 2\*\*63 - 1"):
            rlds_cli.Loader("s", batch_size=2, seed=seed)
    monkeypatch.setenv("RLDS_SEED", str(2**63))
    with pytest.raises(
        SeedError, match=r"RLDS_SEED='9223372036854775808' is not an integer from 0 to 2\*\*63 - 1"
    ):
        rlds_cli.Loader("s", batch_size=2)
    monkeypatch.delenv("RLDS_SEED")
    loader = rlds_cli.Loader("s", batch_size=2, seed=2**63 - 1)
    again = rlds_cli.Loader("s", batch_size=2, seed=2**63 - 1)
    next(iter(loader.sample()))
    again.load_state_dict(loader.state_dict())  # its own checkpoint restores


def test_a_state_of_another_recorded_dataset_is_refused(isolated_cache: Any) -> None:
    """Two datasets recorded alike (DatasetWriter: no content digest) had the same commit-log
    positions, and a state of one restored into a loader over the other without a word."""
    import rlds_cli

    def record(name: str, lengths: list[int], seed: int) -> None:
        rng = np.random.default_rng(seed)
        with rlds_cli.DatasetWriter(name, mode="create", episodes_per_commit=3, commit_interval=1e9) as w:
            for n in lengths:
                obs = rng.normal(size=(n + 1, 3)).astype(np.float32)
                w.add_episode(
                    {
                        "observation": obs[:-1],
                        "next/observation": obs[1:],
                        "action": rng.normal(size=(n, 2)).astype(np.float32),
                        "next/reward": np.zeros(n, np.float32),
                        "next/terminated": np.arange(n) == n - 1,
                        "next/truncated": np.zeros(n, bool),
                    }
                )

    record("robot-a", [5, 7, 9], seed=10)
    record("robot-b", [9, 7, 5], seed=11)
    assert rlds_cli.open_dataset("robot-a").log_position == rlds_cli.open_dataset("robot-b").log_position
    a = Loader("robot-a", batch_size=4, sampler="slice", slice_len=4, seed=0)
    a.sample()
    with pytest.raises(LoaderStateError, match="saved on another dataset than 'robot-b'"):
        Loader("robot-b", batch_size=4, sampler="slice", slice_len=4, seed=0).load_state_dict(a.state_dict())
    Loader("robot-a", batch_size=4, sampler="slice", slice_len=4, seed=0).load_state_dict(a.state_dict())


def test_a_state_over_another_mixture_source_is_refused() -> None:
    """A Loader over a MixtureSource recorded no dataset: a state over {sim, real} restored into
    one over {real, sim} (rows numbered otherwise) or over another dataset of as many steps."""
    from rlds_cli.loader import MixtureSource

    make_dataset("sim", [3, 4, 5])
    make_dataset("real", [6, 2])
    make_dataset("whole", [5, 5, 5, 5])
    keys = ["observation", "action"]
    saved = Loader(MixtureSource({"sim": "sim", "real": "real"}, keys=keys), 4, sampler="epoch", seed=0)
    saved.sample()
    state = saved.state_dict()
    for sources in ({"real": "real", "sim": "sim"}, {"whole": "whole"}):
        other = Loader(MixtureSource(sources, keys=keys), 4, sampler="epoch", seed=0)
        with pytest.raises(LoaderStateError, match="saved on another dataset"):
            other.load_state_dict(state)
    same = Loader(MixtureSource({"sim": "sim", "real": "real"}, keys=keys), 4, sampler="epoch", seed=0)
    same.load_state_dict(state)
    assert np.array_equal(same.sample()["index"], saved.sample()["index"])


def test_a_uniform_state_drawn_on_the_device_is_named_so_on_the_host(isolated_cache: Any) -> None:
    """Refused right, but as 'UniformSampler state has no field bit_generator': a damaged state."""
    make_dataset("d", LENGTHS, replace=True)
    modes = {"device": {"in_memory": "device", "device": "cpu"}, "host": {"in_memory": True}}
    for saved, restored in (("device", "host"), ("host", "device")):
        state = _warm(Loader("d", batch_size=4, seed=0, **modes[saved]))  # type: ignore[arg-type]
        with pytest.raises(
            LoaderStateError, match=rf"uniform indices drawn on the {saved}.* draws them on the {restored}"
        ):
            Loader("d", batch_size=4, seed=0, **modes[restored]).load_state_dict(state)  # type: ignore[arg-type]
