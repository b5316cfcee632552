"""Mixture weights relative to size (Octo's balance_weights), the achieved mix over 10k batches,
and report()'s shares and epochs."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import MixtureError
from rlds_cli.loader import MixtureLoader, Normalize, by_size
from rlds_cli.loader.mixture_sampler import mixture_weights

KEYS = ["observation", "action"]


def octo_weights(weights: list[float], sizes: list[int]) -> np.ndarray:
    """Octo's make_interleaved_dataset with balance_weights=True: weights times sizes, normalized."""
    w = np.array(weights) * np.array(sizes)
    return w / w.sum()


def test_size_weights_as_octo_balances(robots: dict[str, Dataset]) -> None:
    sizes = [ds.num_steps for ds in robots.values()]
    cases = {
        "size": [1.0, 1.0, 1.0],
        "mapping": ({"franka": ("size", 2.0), "widowx": "size", "aloha": ("size", 0.5)}, [2.0, 1.0, 0.5]),
        "by_size pairs": (by_size([("franka", 0.54), ("aloha", 1.0)]), [0.54, 0.0, 1.0]),
        "by_size mapping": (by_size({"widowx": 3.0, "aloha": 1.0}), [0.0, 3.0, 1.0]),
        "list": ([("size", 1.0), "size", ("size", 2.0)], [1.0, 1.0, 2.0]),
    }
    for name, case in cases.items():
        weights, multipliers = ("size", case) if name == "size" else case
        mix = MixtureLoader(robots, weights, batch_size=8, seed=0, keys=KEYS, pad=True)
        np.testing.assert_allclose(mix.weights(), octo_weights(multipliers, sizes), err_msg=name)
    assert by_size() == "size"


def test_achieved_mix_within_one_percent_after_10k_batches(robots: dict[str, Dataset]) -> None:
    weights = {"franka": ("size", 2.0), "widowx": "size", "aloha": ("size", 0.5)}
    norms = {n: Normalize(keys=["action"]) for n in robots}
    mix = MixtureLoader(robots, weights, batch_size=64, seed=5, keys=KEYS, pad=True, transforms=norms,
                        num_batches=10_000)  # fmt: skip
    counts = np.zeros(3, np.int64)
    for batch in mix:
        counts += np.bincount(batch["source"].numpy(), minlength=3)
    target = octo_weights([2.0, 1.0, 0.5], [ds.num_steps for ds in robots.values()])
    achieved = counts / counts.sum()
    assert (np.abs(achieved - target) <= 0.01 * target).all(), (achieved, target)
    report = mix.report()
    for i, (name, ds) in enumerate(robots.items()):
        assert report[name]["rows"] == counts[i]
        assert report[name]["achieved"] == pytest.approx(achieved[i])
        assert report[name]["target"] == pytest.approx(target[i])
        assert report[name]["size"] == ds.num_steps
        assert report[name]["epochs"] == pytest.approx(counts[i] / ds.num_steps)


def test_size_weights_refused_in_one_line(robots: dict[str, Dataset]) -> None:
    names = list(robots)
    bad = [
        ({"franka": ("size", 2.0), "widowx": 1.0}, "relative to size and ['widowx'] as plain numbers"),
        ("sizes", "must be 'size'"),
        ({"franka": ("size", -1.0)}, "must be finite and >= 0"),
        ({"franka": ("size", "x")}, "is not a number"),
        ({"franka": ("count", 2.0)}, "is ('size', multiplier)"),
        ({"ghost": "size"}, "unknown source"),
        (["size", "size"], "must be 3 entries"),
    ]
    for weights, match in bad:
        with pytest.raises(MixtureError) as info:
            mixture_weights(weights, names, lambda: [1, 1, 1], follow=False)
        assert match in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(MixtureError, match="pairs or a mapping"):
        by_size(["franka"])  # type: ignore[list-item]
    assert mixture_weights([0.5, 0.5, 0.0], names, lambda: [1, 1, 1], follow=False) == [0.5, 0.5, 0.0]
    schedule = lambda step: [1, 1, 1]  # noqa: E731
    assert mixture_weights(schedule, names, lambda: [1, 1, 1], follow=False) is schedule
    assert mixture_weights({"franka": 2.0}, names, lambda: [1, 1, 1], follow=False) == [2.0, 0.0, 0.0]
    assert mixture_weights("size", names, lambda: [10, 20, 30], follow=False) == [10.0, 20.0, 30.0]
    sizes = [10, 20, 30]
    following = mixture_weights("size", names, lambda: sizes, follow=True)
    sizes[2] = 60  # a source that grew: the schedule reads the sizes in force
    assert callable(following) and following(0) == [10.0, 20.0, 60.0]
    empty = [0, 0, 0]  # sources that grow, none with a step yet: weighed by multiplier until then
    assert mixture_weights("size", names, lambda: empty, follow=True)(0) == [1.0, 1.0, 1.0]
    for weights, sizes_now, match in (
        ("size", [0, 0, 0], "no source has any"),
        (by_size({"franka": 0.0, "widowx": 0.0}), [1, 1, 1], "a multiplier of 0"),
    ):
        with pytest.raises(MixtureError) as info:
            mixture_weights(weights, names, lambda: sizes_now, follow=False)  # noqa: B023
        assert match in str(info.value)


def test_numbers_at_float64_s_edges_are_weights_or_one_line(robots: dict[str, Dataset]) -> None:
    """Finite weights whose sum overflows are weights (normalized by their largest first); a
    number past float64 is refused like any other bad weight, never a raw OverflowError."""
    from rlds_cli.loader.mixture_sampler import check_weights

    np.testing.assert_allclose(check_weights([1e308, 1e308, 0.0], 3), [0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match="finite non-negative numbers"):
        check_weights([10**400, 1, 1], 3)
    mix = MixtureLoader(robots, [1e308, 1e308, 1e308], batch_size=30, seed=0, keys=["action"], pad=True)
    assert len(mix.sample()["action"]) == 30
    with pytest.raises(ValueError, match="finite non-negative numbers"):  # a raw OverflowError before
        MixtureLoader(robots, [10**400, 1, 1], batch_size=30, seed=0, keys=["action"], pad=True)
