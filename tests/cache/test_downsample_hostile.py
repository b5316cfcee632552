"""``rlds downsample`` with a k past the longest episode (or past int64) and of a damaged parent:
one step per episode in the first case, a one-line refusal naming the damage in the second (a
downsampled copy of damaged arrays would verify clean, hiding it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cache import CacheRoot, open_dataset
from rlds_cli.cache.compose import downsample_dataset
from rlds_cli.cli.app import app
from rlds_cli.errors import CorruptDatasetError, SchemaMismatchError
from tests.formats_fixtures import refused
from tests.loader_fixtures import make_ted


@pytest.fixture
def a(isolated_cache: Path) -> Any:
    isolated_cache.mkdir(parents=True, exist_ok=True)
    return make_ted(Path(os.environ["RLDS_HOME"]), "a", [3, 4, 5])


@pytest.mark.parametrize("every", [5, 6, 100, 10**30])
def test_a_k_past_the_longest_episode_keeps_each_episodes_first_step(a: Any, every: int) -> None:
    downsample_dataset("a", "d", every)
    d = open_dataset("d")
    assert d.episodes["length"].tolist() == [1, 1, 1]
    for e in range(3):
        src = a.episode(e)
        np.testing.assert_array_equal(d.episode(e)["action"], np.asarray(src["action"])[:1])
        assert float(d.episode(e)["next/reward"].sum()) == pytest.approx(float(src["next/reward"].sum()))
    assert d.manifest.lineage[0]["every"] == every


def test_downsample_of_a_damaged_parent_is_refused(a: Any) -> None:
    path = CacheRoot().dataset_dir("a") / "arrays" / "action.npy"
    data = np.load(path)
    data[1] += 1
    np.save(path, data)
    with pytest.raises(CorruptDatasetError, match=r"dataset 'a' is damaged: 'action'"):
        downsample_dataset("a", "d", 2)
    assert not CacheRoot().exists("d")


@pytest.mark.usefixtures("consoles")
@pytest.mark.console_widths(250, 250)
def test_from_the_cli(a: Any) -> None:
    result = CliRunner().invoke(app, ["downsample", "a", "-k", str(10**30), "-n", "d", "--json"])
    assert result.exit_code == 0, result.output
    path = CacheRoot().dataset_dir("a") / "arrays" / "action.npy"
    data = np.load(path)
    data[0] -= 1
    np.save(path, data)
    result = CliRunner().invoke(app, ["downsample", "a", "-k", "2", "-n", "e"])
    refused(result, "dataset 'a' is damaged", hint=True, published=("a", "d"))


@pytest.mark.parametrize(
    ("dtype", "value", "every", "fits"),
    [("int8", 30, 4, True), ("int8", 100, 3, False), ("uint8", 200, 4, False), ("int16", 100, 4, True),
     ("bool", False, 4, True), ("bool", True, 2, False), ("float16", 30000.0, 4, False),
     ("float32", 0.1, 4, True), ("int64", 2**62, 2, False), ("int64", 2**60, 4, True),
     ("uint64", 2**63, 2, False), ("uint64", 2**61, 4, True), ("int64", -(2**62), 3, False)],
)  # fmt: skip
def test_reward_sums_are_exact_in_their_dtype_or_refused(
    isolated_cache: Path, tmp_path: Path, dtype: str, value: object, every: int, fits: bool
) -> None:
    """int8, uint8 and int16 sums wrapped (100 x 3 steps read 44), bool sums became "any", and
    int64/uint64 sums wrapped in int64 (2**62 + 2**62 read -2**63), with exit 0 and a digest that
    verified; a sum the stored dtype holds is exact, any other refused."""
    from rlds_cli.sources.convert import convert
    from tests.d4rl_fixtures import write_d4rl

    n = 12
    src = write_d4rl(
        tmp_path / "r.hdf5", observations=np.arange(n * 2, dtype=np.float32).reshape(n, 2),
        actions=np.zeros((n, 1), np.float32), rewards=np.full(n, value, dtype),
        terminals=np.arange(n) == n - 1, timeouts=np.zeros(n, bool),
    )  # fmt: skip
    convert(src, "r")
    if not fits:
        with pytest.raises(SchemaMismatchError, match=rf"'next/reward' over {every} steps reaches .*{dtype}"):
            downsample_dataset("r", "d", every)
        assert not CacheRoot().exists("d")
        return
    downsample_dataset("r", "d", every)
    got = open_dataset("d").column("next/reward")[:]
    assert got.dtype == np.dtype(dtype)
    expected = np.add.reduceat(np.full(n, value, np.float64), np.arange(0, n, every))
    np.testing.assert_allclose(got.reshape(-1).astype(np.float64), expected, rtol=1e-6)
