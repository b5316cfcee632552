"""The per-source normalization table: what each source's Normalize uses, saved as JSON, read
back, and used to un-normalize a padded action per robot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.cache import stats as accumulator
from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import MixtureError
from rlds_cli.loader import MixtureLoader, NormalizationTable, Normalize

KEYS = ["observation", "action"]


@pytest.fixture(scope="module")
def mix(robots: dict[str, Dataset]) -> MixtureLoader:
    norms = {name: Normalize(keys=KEYS) for name in robots}
    return MixtureLoader(robots, "size", batch_size=64, seed=0, keys=KEYS, pad=True, transforms=norms)


def test_table_holds_each_sources_normalize(mix: MixtureLoader, robots: dict[str, Dataset]) -> None:
    table = mix.normalization_table()
    json.dumps(table)  # JSON-able as it is
    assert list(table["sources"]) == list(robots)
    for i, (name, ds) in enumerate(robots.items()):
        entry = table["sources"][name]
        assert entry["index"] == i and entry["dataset"] == ds.name
        norm = mix.source.transforms[i][0]
        assert isinstance(norm, Normalize) and norm.statistics is not None
        for key in KEYS:
            s = entry["keys"][key]
            assert s["shape"] == [ds.fields[key][0][0]]
            for stat in ("mean", "std", "min", "max"):
                np.testing.assert_array_equal(s[stat], getattr(norm.statistics, stat)[key].tolist())
            q = accumulator.key_stats(accumulator.scan(ds, key, quantiles=True), ds.fields[key][0])  # type: ignore[arg-type]
            np.testing.assert_allclose(s["q01"], q.quantiles[0.01])
            np.testing.assert_allclose(s["q99"], q.quantiles[0.99])
            assert s["eps"] == norm.eps


def test_saved_table_unnormalizes_padded_actions(mix: MixtureLoader, tmp_path: Path) -> None:
    path = tmp_path / "norm.json"
    data = mix.normalization_table(path)
    table = NormalizationTable.load(path)
    assert table.to_dict() == data
    batch = mix.sample()
    src, idx = batch["source"].numpy(), batch["index"].numpy()
    for i, ds in enumerate(mix.datasets):
        rows = src == i
        padded = batch["action"].numpy()[rows]  # normalized, 14 wide
        back = table.unnormalize(i, "action", padded)
        want = ds.gather(idx[rows], ["action"])["action"]
        assert back.shape == want.shape
        np.testing.assert_allclose(back, want, rtol=1e-5, atol=1e-5)
        name = mix.names[i]
        np.testing.assert_allclose(table.unnormalize(name, "action", padded), back)
        np.testing.assert_allclose(
            table.normalize(name, "action", want), padded[:, : want.shape[1]], atol=1e-5
        )
    stats = table.statistics("aloha")
    assert stats.keys == KEYS
    q = table.to_dict()["sources"]["aloha"]["keys"]["action"]
    lo = table.unnormalize("aloha", "action", -np.ones(14), mode="q01_q99")
    np.testing.assert_allclose(lo, q["q01"])


def test_sources_without_normalize_and_given_statistics(robots: dict[str, Dataset]) -> None:
    franka = robots["franka"]
    given = Normalize(stats={"action": {"mean": np.zeros(7), "std": np.ones(7)}}, keys=["action"])
    mix = MixtureLoader({"a": franka, "b": robots["widowx"]}, [1, 1], batch_size=8, keys=KEYS, pad=True,
                        transforms={"a": given})  # fmt: skip
    table = NormalizationTable(mix.normalization_table())
    assert table.keys("b") == []
    entry = table.to_dict()["sources"]["a"]["keys"]["action"]
    assert entry["q01"] is None and entry["mean"] == [0.0] * 7
    with pytest.raises(MixtureError, match="no q01/q99 of key 'action' for source 'a'"):
        table.unnormalize("a", "action", np.zeros(7), mode="q01_q99")


def _with_null(table: NormalizationTable) -> NormalizationTable:
    """``table`` saved with a null (a statistic that was not finite) in aloha's action std: the
    arithmetic gave NaN for that dimension without a word."""
    import json

    data = json.loads(json.dumps(table.to_dict()))
    data["sources"]["aloha"]["keys"]["action"]["std"][1] = None
    return NormalizationTable(data)


def test_table_refusals_name_what(mix: MixtureLoader, tmp_path: Path) -> None:
    table = NormalizationTable(mix.normalization_table())
    cases = [
        (lambda: table.unnormalize("ghost", "action", np.zeros(14)), "no source 'ghost'"),
        (lambda: table.unnormalize(7, "action", np.zeros(14)), "no source of index 7"),
        (lambda: table.unnormalize("aloha", "gripper", np.zeros(14)), "no statistics of key 'gripper'"),
        (lambda: table.unnormalize("aloha", "action", np.zeros(7)), "of source 'aloha'"),
        (lambda: table.unnormalize("aloha", "action", np.zeros(14), mode="minmax"), "mode must be one of"),
        (lambda: NormalizationTable({"format": "x"}), "not a normalization table"),
        (
            lambda: _with_null(table).unnormalize("aloha", "action", np.zeros(14)),
            "is not finite at dimensions [1]",
        ),
        (lambda: _with_null(table).normalize("aloha", "action", np.zeros(14)), "(null in the table)"),
    ]
    for make, match in cases:
        with pytest.raises(MixtureError) as info:
            make()
        assert match in str(info.value) and "\n" not in str(info.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MixtureError, match=r"bad\.json is not a normalization table"):
        NormalizationTable.load(bad)
    broken = mix.normalization_table()
    broken["sources"]["franka"]["keys"]["action"]["mean"] = [0.0]
    bad.write_text(json.dumps(broken))
    with pytest.raises(MixtureError, match="source 'franka' of the normalization table is malformed"):
        NormalizationTable.load(bad)
    with pytest.raises(FileNotFoundError):
        NormalizationTable.load(tmp_path / "missing.json")


def test_hand_edited_tables_that_would_give_inf_or_reversed_bounds_are_refused(
    mix: MixtureLoader, tmp_path: Path
) -> None:
    """Each loaded before, then un-normalized to inf, NaN or from reversed bounds."""
    saved = json.loads(NormalizationTable(mix.normalization_table()).save(tmp_path / "t.json").read_text())
    action = saved["sources"]["franka"]["keys"]["action"]
    width = len(action["mean"])
    edits = [
        (("mean", [1e400] * width), "holds inf, not a finite number"),
        (("std", ["1"] * width), "holds '1', not a finite number"),
        (("mean", [True] * width), "holds True, not a finite number"),
        (("q01", [x + 1e6 for x in action["q99"]]), "the q01 of key 'action' is above its q99"),
        (("min", [x + 1 for x in action["max"]]), "the min of key 'action' is above its max"),
    ]
    bad = tmp_path / "bad.json"
    for (stat, value), match in edits:
        edited = json.loads(json.dumps(saved))
        edited["sources"]["franka"]["keys"]["action"][stat] = value
        bad.write_text(json.dumps(edited).replace("Infinity", "1e400"))
        with pytest.raises(MixtureError, match=match):
            NormalizationTable.load(bad)
    for version in (2, "x"):
        bad.write_text(json.dumps({**saved, "version": version}))
        with pytest.raises(MixtureError, match=f"of version {version!r}; this rlds reads version 1"):
            NormalizationTable.load(bad)
    bad.write_text("[" * 100_000 + "]" * 100_000)  # was a bare RecursionError
    with pytest.raises(MixtureError, match="JSON nested too deep"):
        NormalizationTable.load(bad)


def test_from_datasets_matches_the_mixture(mix: MixtureLoader, robots: dict[str, Dataset]) -> None:
    table = NormalizationTable.from_datasets(list(robots.values()), KEYS)
    assert table.to_dict()["sources"] == mix.normalization_table()["sources"]
    with pytest.raises(MixtureError, match="dataset 'franka' stores no key 'gripper'"):
        NormalizationTable.from_datasets([robots["franka"]], ["gripper"])


def test_statistics_given_as_numbers_get_the_source_s_width(
    robots: dict[str, Dataset], tmp_path: Path
) -> None:
    """Plain-number statistics are recorded at the source's own width (they were recorded as
    shape [], so an un-normalized action kept the padded width), and a value that is not
    finite is written as null: the file is JSON every reader takes."""
    scalar = Normalize(stats={"action": {"mean": 1.0, "std": 2.0}}, keys=["action"])
    mix = MixtureLoader({"a": robots["franka"], "b": robots["aloha"]}, [1, 1], batch_size=8, keys=KEYS,
                        pad=True, transforms={"a": scalar})  # fmt: skip
    table = NormalizationTable(mix.normalization_table())
    entry = table.to_dict()["sources"]["a"]["keys"]["action"]
    assert entry["shape"] == [7] and entry["mean"] == [1.0] * 7
    assert entry["min"] == [None] * 7  # given statistics have no min: NaN, written as null
    np.testing.assert_allclose(table.unnormalize("a", "action", np.zeros(14)), np.full(7, 1.0))
    path = table.save(tmp_path / "t.json")
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert np.isnan(NormalizationTable.load(path).statistics("a").min["action"]).all()


def test_table_readers_take_tensors_and_refuse_what_would_mislead(mix: MixtureLoader, tmp_path: Path) -> None:
    import torch

    table = NormalizationTable(mix.normalization_table())
    batch = mix.sample()
    first = batch["source"][0]  # a 0-d tensor, as a batch gives it
    name = table.names[int(first)]
    assert (
        table.unnormalize(first, "action", np.zeros(14)).shape
        == table.unnormalize(name, "action", np.zeros(14)).shape
    )
    with pytest.raises(MixtureError, match="not numbers"):
        table.unnormalize(name, "action", ["a"] * 14)
    with pytest.raises(MixtureError, match="no source of index True"):
        table.unnormalize(True, "action", np.zeros(14))  # type: ignore[arg-type]
    assert torch.is_tensor(first)

    def damaged(change: object) -> dict:
        data = mix.normalization_table()
        change(data["sources"])  # type: ignore[operator]
        return data

    cases = [
        (lambda s: s["widowx"].update(index=s["franka"]["index"]), "have one index"),
        (lambda s: s["franka"].update(index=float("inf")), "no source number"),
        (lambda s: s["franka"].update(index=1.0), "no source number"),
        (lambda s: s["franka"]["keys"]["action"].update(shape="7"), "not a list of sizes"),
        (lambda s: s["franka"]["keys"]["action"].update(eps=-5), "not a finite number >= 0"),
        (lambda s: s["franka"]["keys"]["action"].update(std=[-1.0] * 7), "negative values"),
    ]
    for change, match in cases:
        with pytest.raises(MixtureError) as info:
            NormalizationTable(damaged(change))
        assert match in str(info.value), match
    with pytest.raises(MixtureError, match="is not a normalization table"):
        NormalizationTable.load(tmp_path)  # a folder
    with pytest.raises(MixtureError, match="it is a folder"):
        table.save(tmp_path)


def test_two_normalize_of_one_key_or_none_to_compute_are_refused(
    robots: dict[str, Dataset], tmp_path: Path
) -> None:
    import rlds_cli

    twice = [Normalize(keys=["action"]), Normalize(keys=["action"])]
    mix = MixtureLoader({"a": robots["franka"], "b": robots["aloha"]}, [1, 1], batch_size=8, keys=KEYS,
                        pad=True, transforms={"a": twice})  # fmt: skip
    with pytest.raises(MixtureError, match="normalizes key 'action' twice"):
        mix.normalization_table()
    rlds_cli.DatasetWriter("online", root=tmp_path, schema=robots["franka"].fields).close()  # no step yet
    online = rlds_cli.open_dataset("online", tmp_path)
    with pytest.raises(MixtureError, match=r"source 'b' .* has no steps yet to compute its Normalize"):
        MixtureLoader({"a": robots["franka"], "b": online}, [1, 1], batch_size=8, keys=["action"], refresh=1,
                      transforms={"b": Normalize(keys=["action"])})  # fmt: skip


def test_a_source_grown_since_its_statistics_has_no_quantiles_of_another_time(
    robots: dict[str, Dataset], tmp_path: Path
) -> None:
    """A growing source's mean is that of when its Normalize was bound; its q01/q99 were scanned
    when the table was made, after the source grew (a table mixing two moments): they are null
    once it has grown, and ``q01_q99`` says the table has none."""
    import rlds_cli

    def add(mean: float, episodes: int) -> None:
        rng = np.random.default_rng(int(mean) + 1)
        with rlds_cli.DatasetWriter("grow", root=tmp_path, mode="append") as writer:
            for _ in range(episodes):
                obs = rng.normal(size=(21, 3)).astype(np.float32)
                writer.add_episode({"observation": obs[:-1], "next/observation": obs[1:],
                                    "action": rng.normal(mean, 0.1, size=(20, 2)).astype(np.float32),
                                    "next/reward": np.zeros(20, np.float32),
                                    "next/terminated": np.arange(20) == 19,
                                    "next/truncated": np.zeros(20, bool)})  # fmt: skip

    add(0.0, 3)
    grow = rlds_cli.open_dataset("grow", tmp_path)
    norm = {"grow": Normalize(keys=["action"])}
    mix = MixtureLoader({"grow": grow, "franka": robots["franka"]}, [1, 1], batch_size=16, keys=["action"],
                        pad=True, seed=0, refresh=1, transforms=norm)  # fmt: skip
    assert mix.normalization_table()["sources"]["grow"]["keys"]["action"]["q01"] is not None
    add(100.0, 4)
    mix.sample()  # the refresh follows the commit
    entry = mix.normalization_table()["sources"]["grow"]["keys"]["action"]
    assert entry["q01"] is None and entry["q99"] is None
    assert abs(entry["mean"][0]) < 1  # the mean the rows were normalized with, of the first moment
    with pytest.raises(MixtureError, match="no q01/q99"):
        NormalizationTable(mix.normalization_table()).unnormalize(
            "grow", "action", np.zeros(7), mode="q01_q99"
        )


def test_a_bounded_source_refilled_to_its_size_has_no_quantiles_of_another_time(
    robots: dict[str, Dataset], tmp_path: Path
) -> None:
    """Every episode evicted and replaced by as many steps: the step count was the same, so the
    table paired the first moment's mean (0.5) with the new rows' q01/q99 (1000, 1001)."""
    import rlds_cli

    def add(base: float, **settings: int) -> None:
        with rlds_cli.DatasetWriter("ring", root=tmp_path, mode="append", **settings) as writer:
            action = (base + np.linspace(0, 1, 10)[:, None] * np.ones(2)).astype(np.float32)
            obs = np.zeros((11, 3), np.float32)
            writer.add_episode({
                "observation": obs[:-1], "next/observation": obs[1:], "action": action,
                "next/reward": np.zeros(10, np.float32), "next/terminated": np.arange(10) == 9,
                "next/truncated": np.zeros(10, bool),
            })  # fmt: skip

    add(0.0, capacity=10)
    ring = rlds_cli.open_dataset("ring", tmp_path)
    norm = {"ring": Normalize(keys=["action"])}
    mix = MixtureLoader({"ring": ring, "franka": robots["franka"]}, [1, 1], batch_size=8, keys=["action"],
                        pad=True, seed=0, refresh=1, transforms=norm)  # fmt: skip
    assert mix.normalization_table()["sources"]["ring"]["keys"]["action"]["q01"] is not None
    add(1000.0)
    mix.sample()
    assert ring.num_steps == 10 and ring.episode_ids.tolist() == [1]
    entry = mix.normalization_table()["sources"]["ring"]["keys"]["action"]
    assert entry["q01"] is None and entry["q99"] is None and abs(entry["mean"][0] - 0.5) < 1e-6


def test_a_scalar_key_without_a_finite_value_loads_back(tmp_path: Path) -> None:
    """Its mean and std are written as null: the table's own file was refused ('no mean or std')."""
    nothing = {"mean": None, "std": None, "min": None, "max": None, "q01": None, "q99": None}
    key = {"reward": {"shape": [], "eps": 0.0, **nothing}}
    table = NormalizationTable.from_sources({"a": {"index": 0, "dataset": "a", "keys": key}})
    loaded = NormalizationTable.load(table.save(tmp_path / "t.json")).statistics("a")
    assert np.isnan(loaded.mean["reward"]) and np.isnan(loaded.std["reward"])
