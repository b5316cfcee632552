"""Batch sizes are checked when a loader is made, before anything is allocated (issue 37):
``slice_len=10**9`` over episodes of 5 steps made an 8 GB index array when the sampler was made,
``windows`` of 10**6 offsets and ``batch_size=10**12`` were numpy's MemoryError at the first
batch. Each is now one ValueError naming the argument and the limit: a quarter of the machine's
memory (patched to 16 GiB here, so that the limit is the same on every machine)."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import rlds_cli
from rlds_cli.loader import Loader, MixtureLoader, sizes
from rlds_cli.loader.samplers import SliceSampler
from tests.dataset_fixtures import uid_episode

EPISODE_STEPS = 5


@pytest.fixture
def dataset(isolated_cache: Path) -> str:
    with rlds_cli.DatasetWriter("d") as w:
        for uid in range(3):
            w.add_episode(uid_episode(uid, EPISODE_STEPS))
    return "d"


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine of 16 GiB: a batch may take 4 GiB."""
    monkeypatch.setattr(sizes, "physical_memory", lambda: 16 << 30)


def _address_space() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@pytest.fixture
def no_large_allocation() -> Iterator[None]:
    """This process may map at most 2 GiB more while the test runs: an allocation of gigabytes
    (what these arguments made before they were checked) fails at once as a MemoryError,
    instead of swapping the machine."""
    used = _address_space()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if used is None:
        yield
        return
    cap = used + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


pytestmark = pytest.mark.usefixtures("no_large_allocation")


def _batch_bytes(batch: dict[str, object]) -> int:
    return sum(v.numel() * v.element_size() for v in batch.values())  # type: ignore[attr-defined]


@pytest.mark.usefixtures("machine")
@pytest.mark.parametrize("size", [{"num_slices": 1}, {"batch_size": 10**9}])
def test_a_slice_len_past_every_episode_is_refused_naming_it(dataset: str, size: dict[str, int]) -> None:
    with pytest.raises(ValueError) as caught:
        Loader(dataset, sampler="slice", slice_len=10**9, seed=0, **size)
    message = str(caught.value)
    assert message.startswith("slice_len=1000000000: one batch of 1 slice(s) of 1000000000 steps"), message
    assert "over the 4.0 GiB a batch may take (a quarter of this machine's 16.0 GiB" in message, message
    assert f"the longest episode has {EPISODE_STEPS} steps; lower slice_len" in message, message


@pytest.mark.usefixtures("machine")
def test_a_prioritized_slice_len_past_every_episode_is_refused_naming_it(dataset: str) -> None:
    with pytest.raises(ValueError, match=r"(?m)^slice_len=1000000000: .*; lower slice_len$"):
        Loader(dataset, sampler="prioritized", slice_len=10**9, num_slices=1, seed=0)


@pytest.mark.usefixtures("machine")
def test_a_slice_len_no_episode_holds_without_padding_keeps_its_own_error(dataset: str) -> None:
    with pytest.raises(ValueError, match="no episode has slice_len=1000000000 steps"):
        Loader(dataset, sampler="slice", slice_len=10**9, num_slices=1, short="skip", seed=0)


@pytest.mark.usefixtures("machine")
def test_a_slice_sampler_made_alone_checks_its_index_arrays() -> None:
    with pytest.raises(ValueError, match=r"^slice_len=1000000000: .*longest episode has 5 steps"):
        SliceSampler(np.array([5, 5]), 1, 10**9, seed=0)
    with pytest.raises(ValueError, match=r"^num_slices=1000000000: "):
        SliceSampler(np.array([5, 5]), 10**9, 4, seed=0)


@pytest.mark.usefixtures("machine")
def test_windows_of_a_million_offsets_are_refused_naming_windows(dataset: str) -> None:
    with pytest.raises(ValueError) as caught:
        Loader(dataset, seed=0, windows={"observation": range(10**6)})
    message = str(caught.value)
    assert message.startswith("windows: one batch of 256 rows needs"), message
    assert "{'observation': 1000000}" in message and message.endswith("give windows fewer offsets"), message


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_a_batch_size_no_machine_holds_is_refused_naming_it(dataset: str, sampler: str) -> None:
    """The machine's real memory: 10**12 rows of 51 bytes is past a quarter of any machine's."""
    with pytest.raises(ValueError, match=r"(?m)^batch_size=1000000000000: .*; lower batch_size$"):
        Loader(dataset, batch_size=10**12, sampler=sampler, seed=0)


def test_a_mixture_batch_size_no_machine_holds_is_refused_naming_it(dataset: str) -> None:
    with pytest.raises(ValueError, match=r"^batch_size=1000000000000: "):
        MixtureLoader({"a": dataset, "b": dataset}, [0.5, 0.5], batch_size=10**12, seed=0)


def test_an_epoch_batch_larger_than_the_dataset_is_the_whole_dataset(dataset: str) -> None:
    """An epoch's batch never holds more than the dataset's steps: asking for more is no error."""
    loader = Loader(dataset, batch_size=10**12, sampler="epoch", seed=0)
    assert loader.sample()["index"].shape == (3 * EPISODE_STEPS,)


@pytest.mark.parametrize(
    ("options", "arg"),
    [({}, "batch_size"), ({"sampler": "slice", "slice_len": 1}, "num_slices")],
)
def test_the_limit_is_the_bytes_a_batch_really_takes(
    dataset: str, monkeypatch: pytest.MonkeyPatch, options: dict[str, object], arg: str
) -> None:
    """The bytes counted per row are those of a real batch (every key, the index, the mask): on a
    machine whose quarter is 100 rows, 100 rows are made and 101 refused."""
    row = _batch_bytes(Loader(dataset, seed=0, **{arg: 1}, **options).sample())  # type: ignore[arg-type]
    monkeypatch.setattr(sizes, "physical_memory", lambda: 4 * 100 * row)
    batch = Loader(dataset, seed=0, **{arg: 100}, **options).sample()  # type: ignore[arg-type]
    assert _batch_bytes(batch) == 100 * row
    with pytest.raises(ValueError, match=rf"^{arg}=101: .*\({row} bytes a row\)"):
        Loader(dataset, seed=0, **{arg: 101}, **options)  # type: ignore[arg-type]
