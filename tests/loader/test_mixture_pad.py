"""Mixtures across robots: keys of different widths padded with exact masks, each source
normalized with its own statistics, renaming, absent keys, dtypes, refusals, resuming."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch
from rlds_cli.errors import MixtureError
from rlds_cli.loader import Loader, MixtureLoader, MixtureSampler, MixtureSource, Normalize
from tests.mixture_fixtures import write_robot

KEYS = ["observation", "action"]


def own_rows(ds: Dataset, index: np.ndarray, keys: list[str], norm: Normalize | None = None) -> TedBatch:
    """What a Loader over ``ds`` alone gives at ``index``: its rows, normalized with its own
    ``Normalize`` when given."""
    batch = TedBatch(ds.gather(index, keys))
    return norm(batch) if norm is not None else batch


def test_widths_padded_and_masks_exact(robots: dict[str, Dataset]) -> None:
    mix = MixtureLoader(robots, [1, 1, 1], batch_size=300, seed=0, keys=KEYS, pad=True)
    batch = mix.sample()
    assert batch["action"].shape == (300, 14) and batch["observation"].shape == (300, 9)
    assert batch["action_pad_mask"].dtype == torch.bool
    src, idx = batch["source"].numpy(), batch["index"].numpy()
    assert set(np.unique(src)) == {0, 1, 2}
    for i, ds in enumerate(robots.values()):
        rows = src == i
        want = own_rows(ds, idx[rows], KEYS)
        for key in KEYS:
            width = want[key].shape[1]
            got = batch[key].numpy()[rows]
            np.testing.assert_array_equal(got[:, :width], want[key])
            assert (got[:, width:] == 0).all()
            mask = batch[f"{key}_pad_mask"].numpy()[rows]
            assert mask[:, :width].all() and not mask[:, width:].any()
    assert mix.source.fields["action"] == ((14,), "float32")


def test_keys_equal_everywhere_get_no_mask(robots: dict[str, Dataset]) -> None:
    mix = MixtureLoader(robots, [1, 1, 1], batch_size=8, seed=0, keys=["next/reward", "action"], pad=True)
    batch = mix.sample()
    assert "next/reward_pad_mask" not in batch and "action_pad_mask" in batch


def identity(batch: TedBatch) -> TedBatch:
    return batch


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-source"])
def test_each_source_normalized_with_its_own_statistics(robots: dict[str, Dataset], fused: bool) -> None:
    """Normalize alone is applied once over the padded batch (per-row tables); with another
    transform in a chain each source's chain runs on its rows: both equal each source's own."""
    norms = {name: Normalize(keys=KEYS) for name in robots}
    chains = {n: t if fused else [t, identity] for n, t in norms.items()}
    mix = MixtureLoader(robots, "size", batch_size=256, seed=1, keys=KEYS, pad=True, transforms=chains)
    assert (mix.source.fused_normalize is not None) == fused
    for _ in range(5):
        batch = mix.sample()
        src, idx = batch["source"].numpy(), batch["index"].numpy()
        for i, ds in enumerate(robots.values()):
            alone = Normalize(keys=KEYS)  # that source's own Normalize, as a Loader over it binds it
            alone.bind(ds)
            rows = src == i
            want = own_rows(ds, idx[rows], KEYS, alone)
            for key in KEYS:
                width = want[key].shape[1]
                np.testing.assert_array_equal(batch[key].numpy()[rows][:, :width], want[key])
                assert (batch[key].numpy()[rows][:, width:] == 0).all()  # padding stays 0
    # the statistics differ per robot: one Normalize for all would not give these rows
    means = [norms[n].statistics.mean["observation"][0] for n in robots]  # type: ignore[union-attr]
    assert len({round(float(m), 3) for m in means}) == 3


def test_single_source_loader_agrees(robots: dict[str, Dataset]) -> None:
    """A mixture of one robot with its Normalize gives a Loader's own normalized rows."""
    ds = robots["widowx"]
    mix = MixtureLoader({"w": ds}, "size", batch_size=32, seed=3, keys=KEYS, pad=True,
                        transforms={"w": Normalize(keys=KEYS)})  # fmt: skip
    loader = Loader(ds, 32, keys=KEYS, transform=Normalize(keys=KEYS), seed=3)
    batch = mix.sample()
    want = loader.source.gather(batch["index"].numpy())
    want = loader.transforms[0](TedBatch(want))
    np.testing.assert_array_equal(batch["action"].numpy(), want["action"])


def test_rename_into_the_common_schema(tmp_path: Path, robots: dict[str, Dataset]) -> None:
    other = write_robot(tmp_path, "ur5", 6, 5, [12, 9], 4, extra={"proprio": 11})
    sources = {"franka": robots["franka"], "ur5": other}
    rename = {"ur5": {"observation": "camera_free", "proprio": "observation"}}
    norms = {"franka": Normalize(keys=["observation"]), "ur5": Normalize(keys=["observation"])}
    mix = MixtureLoader(sources, [1, 1], batch_size=64, seed=0, keys=["observation"], rename=rename,
                        pad=True, transforms=norms)  # fmt: skip
    batch = mix.sample()
    assert batch["observation"].shape == (64, 11)
    rows = batch["source"].numpy() == 1
    alone = Normalize(keys=["proprio"])
    alone.bind(other)
    want = own_rows(other, batch["index"].numpy()[rows], ["proprio"], alone)["proprio"]
    np.testing.assert_array_equal(batch["observation"].numpy()[rows], want)
    assert batch["observation_pad_mask"].numpy()[rows].all()
    assert norms["ur5"].stored_keys == {"observation": "proprio"}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "per-source"])
def test_a_key_renamed_away_is_absent_under_its_old_name(robots: dict[str, Dataset], packed: bool) -> None:
    """franka's action renamed to arm_action: its rows' action is zeros with a mask of False (it
    was franka's action again, masked True, beside the same values under arm_action)."""
    sources = {"franka": robots["franka"], "aloha": robots["aloha"]}
    mix = MixtureLoader(sources, [1, 1], batch_size=128, seed=0, keys=["action", "arm_action"],
                        rename={"franka": {"action": "arm_action"}}, pad=True,
                        transforms=None if packed else {"franka": identity})  # fmt: skip
    batch = mix.sample()
    franka = batch["source"].numpy() == 0
    assert franka.any() and (~franka).any()
    assert not batch["action_pad_mask"].numpy()[franka].any()
    assert (batch["action"].numpy()[franka] == 0).all()
    want = own_rows(robots["franka"], batch["index"].numpy()[franka], ["action"])["action"]
    np.testing.assert_array_equal(batch["arm_action"].numpy()[franka], want)
    assert not batch["arm_action_pad_mask"].numpy()[~franka].any()


def test_key_only_some_sources_have_is_zero_with_mask_false(
    tmp_path: Path, robots: dict[str, Dataset]
) -> None:
    wrist = write_robot(tmp_path, "with-wrist", 7, 8, [15], 5, extra={"wrist": 4})
    mix = MixtureLoader({"a": robots["franka"], "b": wrist}, [1, 1], batch_size=64, seed=0,
                        keys=["action", "wrist"], pad=True)  # fmt: skip
    batch = mix.sample()
    src = batch["source"].numpy()
    assert (batch["wrist"].numpy()[src == 0] == 0).all()
    assert not batch["wrist_pad_mask"].numpy()[src == 0].any()
    assert batch["wrist_pad_mask"].numpy()[src == 1].all()
    assert "action_pad_mask" not in batch  # 7 wide in both
    with pytest.raises(KeyError, match="pass pad=True"):
        MixtureLoader({"a": robots["franka"], "b": wrist}, [1, 1], keys=["action", "wrist"])


def test_dtypes_promote(tmp_path: Path, robots: dict[str, Dataset]) -> None:
    wide = write_robot(tmp_path, "f64", 3, 8, [10], 6, dtype=np.float64)
    mix = MixtureLoader(
        {"a": robots["franka"], "b": wide}, [1, 1], batch_size=32, seed=0, keys=KEYS, pad=True
    )
    batch = mix.sample()
    assert batch["action"].dtype == torch.float64 and batch["action"].shape == (32, 7)
    rows = batch["source"].numpy() == 0
    want = own_rows(robots["franka"], batch["index"].numpy()[rows], ["action"])["action"]
    np.testing.assert_array_equal(batch["action"].numpy()[rows], want.astype(np.float64))
    cast = MixtureLoader({"a": robots["franka"], "b": wide}, [1, 1], batch_size=8, seed=0, keys=KEYS,
                         pad=True, float_dtype=torch.float32)  # fmt: skip
    assert cast.sample()["action"].dtype == torch.float32


def test_a_batch_s_keys_and_dtypes_never_depend_on_the_sources_it_holds(
    tmp_path: Path, robots: dict[str, Dataset]
) -> None:
    """A batch drawn from one source only still carries every key of the schema (zeros, mask
    False, where that source lacks it) at the mixture's promoted dtype: it had the one source's
    dtype and lacked its keys, on the per-source path (transforms in a chain, a refresh)."""
    wide = write_robot(tmp_path, "f64", 7, 8, [10], 6, dtype=np.float64, extra={"wrist": 4})
    chains = {"a": [identity], "b": [identity]}  # the per-source path
    mix = MixtureLoader({"a": robots["franka"], "b": wide}, [1, 0], batch_size=16, seed=0,
                        keys=["action", "wrist"], pad=True, transforms=chains)  # fmt: skip
    assert mix.source.fused_normalize is None and mix.source._per_part
    for _ in range(3):
        batch = mix.sample()
        assert (batch["source"].numpy() == 0).all()
        assert batch["action"].dtype == torch.float64
        assert batch["wrist"].shape == (16, 4) and (batch["wrist"].numpy() == 0).all()
        assert not batch["wrist_pad_mask"].numpy().any()


def test_renames_that_would_hide_or_lose_values_are_refused(
    tmp_path: Path, robots: dict[str, Dataset]
) -> None:
    wrist = write_robot(tmp_path, "with-wrist", 7, 8, [15], 5, extra={"wrist": 4})
    sources = {"a": robots["franka"], "b": wrist}

    def mix(rename: object) -> MixtureLoader:
        return MixtureLoader(sources, [1, 1], keys=["action"], pad=True, rename=rename)  # type: ignore[arg-type]

    cases = [
        ({"b": {"observation": "x", "wrist": "x"}}, "two of its keys onto ['x']"),
        ({"b": {"wrist": "observation"}}, "a key onto one it keeps: ['observation']"),
        ({"b": {"wrist": "wrist_pad_mask"}}, "a name the mixture writes itself"),
        ({"b": {"next/reward": "source"}}, "a name the mixture writes itself"),
        ({"b": {"wrist": "action_is_pad"}}, "a name the mixture writes itself"),
        ({"b": {"obsevation": "state"}}, "names ['obsevation'], which source 'b' does not store"),
        ({"b": ["wrist"]}, "rename['b'] is list"),
        ({"b": {"wrist": 3}}, "maps 'wrist' to 3"),
    ]
    for rename, match in cases:
        with pytest.raises(MixtureError) as info:
            mix(rename)
        assert match in str(info.value) and "\n" not in str(info.value), rename
    for own in ("source", "index", "action_pad_mask"):  # no source stores it: was an IndexError
        with pytest.raises(MixtureError, match=f"keys= names '{own}', which a mixture's batch writes"):
            MixtureLoader(sources, [1, 1], keys=["action", own], pad=True)
    swapped = mix({"b": {"wrist": "observation", "observation": "wrist"}})  # a swap hides nothing
    assert swapped.source.renames() == {"b": {"wrist": "observation", "observation": "wrist"}}
    # a Normalize naming a key as the source stores it, not as its batches carry it: was a no-op
    with pytest.raises(MixtureError, match="names \\['wrist'\\] as 'with-wrist' stores them"):
        MixtureLoader(sources, [1, 1], keys=["action", "state"], pad=True, rename={"b": {"wrist": "state"}},
                      transforms={"b": Normalize(keys=["wrist"])})  # fmt: skip
    swap = {"b": {"wrist": "observation", "observation": "wrist"}}
    MixtureLoader(sources, [1, 1], keys=["action", "wrist"], pad=True, rename=swap,
                  transforms={"b": Normalize(keys=["wrist"])})  # fmt: skip
    for sources_given, match in (
        (["franka", "franka"], "sources name ['franka'] more than once"),
        ({"a": 5}, "sources holds 5"),
        ("franka", "sources is one dataset"),
    ):
        with pytest.raises(MixtureError) as info:
            MixtureLoader(sources_given, [1, 1], root=robots["franka"].directory.parent.parent)  # type: ignore[arg-type]
        assert match in str(info.value)
    with pytest.raises(ValueError, match=r"MixtureLoader\(keys=...\) takes a list of keys, not the string"):
        MixtureLoader(sources, [1, 1], keys="action", pad=True)  # type: ignore[arg-type]


def test_other_sampler_order_and_windows(robots: dict[str, Dataset]) -> None:
    """Rows in any order (an epoch over the mixture) and windows over a padded mixture."""
    norms = {name: Normalize(keys=["action"]) for name in robots}
    source = MixtureSource(robots, keys=KEYS, pad=True, transforms=norms)
    batch = Loader(source, 64, sampler="epoch", seed=0).sample()
    src, idx = batch["source"].numpy(), batch["index"].numpy()
    assert len(np.unique(src)) > 1 and (np.diff(src) != 0).sum() > 2  # interleaved sources
    for i, ds in enumerate(robots.values()):
        rows = src == i
        want = own_rows(ds, idx[rows], ["action"], norms[list(robots)[i]])["action"]
        np.testing.assert_array_equal(batch["action"].numpy()[rows][:, : want.shape[1]], want)
    mix = MixtureLoader(
        robots,
        [1, 1, 1],
        batch_size=16,
        seed=0,
        keys=KEYS,
        pad=True,
        transforms={n: Normalize(keys=["action"]) for n in robots},
        windows={"action": [0, 1]},
    )
    b = mix.sample()  # fmt: skip
    assert b["action"].shape == (16, 2, 14) and b["action_is_pad"].shape == (16, 2)


def test_state_dict_resumes_with_pad(robots: dict[str, Dataset]) -> None:
    def make(seed: int) -> MixtureLoader:
        return MixtureLoader(robots, "size", batch_size=32, seed=seed, keys=KEYS, pad=True,
                             transforms={n: Normalize(keys=KEYS) for n in robots})  # fmt: skip

    mix = make(2)
    mix.sample()
    state = pickle.loads(pickle.dumps(mix.state_dict()))
    want = [mix.sample() for _ in range(3)]
    other = make(9)
    other.load_state_dict(state)
    for w in want:
        got = other.sample()
        assert set(got) == set(w)
        for key in w:
            torch.testing.assert_close(got[key], w[key], rtol=0, atol=0)
    assert other.report() == mix.report()


def test_sampler_composition_pads_too(robots: dict[str, Dataset]) -> None:
    source = MixtureSource(robots, keys=KEYS, pad=True)
    sampler = MixtureSampler(source.sizes, [1, 1, 1], batch_size=16, seed=0)
    loader = Loader(source, 16, sampler=sampler, prefetch=2, num_batches=3)
    shapes = [tuple(b["action_pad_mask"].shape) for b in loader]
    loader.close()
    assert shapes == [(16, 14)] * 3


def test_refusals_are_one_line(robots: dict[str, Dataset]) -> None:
    norm = Normalize(keys=["action"])

    def mix(**options: object) -> MixtureLoader:
        options.setdefault("keys", KEYS)
        return MixtureLoader(robots, [1, 1, 1], pad=True, **options)  # type: ignore[arg-type]

    cases = [
        (lambda: mix(keys=["nope"]), "no source of the mixture has key 'nope'"),
        (lambda: mix(transforms={"franka": norm, "aloha": norm}), "one Normalize is given to sources"),
        (lambda: mix(transforms={"ghost": Normalize()}), "transforms name unknown source"),
        (lambda: mix(transforms=[Normalize()]), "transforms= maps source names"),
        (lambda: mix(transforms={"franka": 3}), "is not callable"),
    ]  # fmt: skip
    for make, match in cases:
        with pytest.raises(MixtureError) as info:
            make()
        assert match in str(info.value) and "\n" not in str(info.value)


def test_keys_of_different_widths_pad_across_names(tmp_path: Path, robots: dict[str, Dataset]) -> None:
    """A key of (4,) in one source and (8,) in another (after renaming) pads to (8,)."""
    grid = write_robot(tmp_path, "grid", 7, 8, [6], 7, extra={"grid": 4})
    mix = MixtureLoader({"a": robots["franka"], "g": grid}, [1, 1], keys=["action", "x"], pad=True,
                        rename={"g": {"grid": "x"}, "a": {"observation": "x"}})  # fmt: skip
    batch = mix.sample()
    assert batch["x"].shape == (256, 8)
    assert batch["x_pad_mask"].numpy()[batch["source"].numpy() == 1].sum(axis=1).tolist() == [4] * int(
        (batch["source"].numpy() == 1).sum()
    )


def test_axes_must_match(tmp_path: Path) -> None:
    import rlds_cli

    with rlds_cli.DatasetWriter("flat", root=tmp_path, mode="create") as w:
        w.add_episode(_episode(np.zeros((3, 8), np.float32)))
    with rlds_cli.DatasetWriter("square", root=tmp_path, mode="create") as w:
        w.add_episode(_episode(np.zeros((3, 2, 4), np.float32)))
    flat, square = (rlds_cli.open_dataset(n, root=tmp_path) for n in ("flat", "square"))
    with pytest.raises(MixtureError, match=r"key 'action' is \(8,\) in source 'flat' but \(2, 4\)"):
        MixtureSource({"flat": flat, "square": square}, keys=["action"], pad=True)


def _episode(action: np.ndarray) -> dict[str, np.ndarray]:
    n = len(action)
    o = np.zeros((n + 1, 2), np.float32)
    return {"observation": o[:-1], "next/observation": o[1:], "action": action,
            "next/reward": np.zeros(n, np.float32), "next/terminated": np.arange(n) == n - 1,
            "next/truncated": np.zeros(n, bool)}  # fmt: skip


def test_large_keys_read_straight_into_the_batch(tmp_path: Path) -> None:
    """A key of >= 1 KB a step, equal in every source (frames), skips the second copy: the same
    values, grouped by source or in any order."""
    a = write_robot(tmp_path, "cam-a", 7, 8, [20, 15], 8, extra={"frame": 300})
    b = write_robot(tmp_path, "cam-b", 14, 8, [25], 9, extra={"frame": 300})
    keys = ["frame", "action", "observation", "next/observation"]
    source = MixtureSource({"a": a, "b": b}, keys=keys, pad=True)
    assert source._direct is not None and list(source._direct.plans) == ["frame"]
    for sampler in (MixtureSampler(source.sizes, [1, 1], batch_size=64, seed=0), "epoch"):
        batch = Loader(source, 64, sampler=sampler, seed=0).sample()
        src, idx = batch["source"].numpy(), batch["index"].numpy()
        for i, ds in enumerate((a, b)):
            rows = src == i
            want = own_rows(ds, idx[rows], keys)
            np.testing.assert_array_equal(batch["frame"].numpy()[rows], want["frame"])
            np.testing.assert_array_equal(batch["next/observation"].numpy()[rows], want["next/observation"])


@pytest.mark.parametrize("per_source", ["float_dtype", "windows", "refresh"])
def test_large_keys_are_read_straight_in_where_the_rest_is_read_per_source(
    tmp_path: Path, per_source: str
) -> None:
    """Frames are read straight into the batch; the other keys were expected to hold them wherever
    the mixture read source by source (a float_dtype cast, windows, a refresh that grew a source):
    'key 'frame' ... is missing from what the transforms of [...] give'."""
    import rlds_cli

    a = write_robot(tmp_path, "cam-a", 7, 8, [20, 15], 8, extra={"frame": 300})
    write_robot(tmp_path, "cam-b", 14, 8, [25], 9, extra={"frame": 300})
    keys = ["frame", "action"]
    options: dict[str, object] = {
        "float_dtype": {"float_dtype": torch.float64},
        "windows": {"windows": {"frame": [-1, 0]}},
    }.get(per_source, {})
    mix = MixtureLoader({"a": "cam-a", "b": "cam-b"}, [1, 1], batch_size=32, keys=keys, pad=True, seed=0,
                        root=tmp_path, refresh=1 if per_source == "refresh" else None, **options)  # fmt: skip
    if per_source == "refresh":
        mix.sample()
        with rlds_cli.DatasetWriter("cam-a", root=tmp_path, mode="append") as w:
            cut = {k: v[:5] for k, v in a.episode(0).items()}
            cut["next/terminated"] = cut["next/done"] = np.arange(5) == 4
            w.add_episode(cut)
    elif per_source == "float_dtype":
        assert mix.source._packed is None
    for _ in range(2):
        batch = mix.sample()
        src, idx = batch["source"].numpy(), batch["index"].numpy()
        for i, name in enumerate(("cam-a", "cam-b")):
            ds = rlds_cli.open_dataset(name, root=tmp_path)
            rows = src == i
            frames = batch["frame"].numpy()[rows]
            want = ds.gather(idx[rows], ["frame"])["frame"]
            np.testing.assert_array_equal(frames[:, -1] if per_source == "windows" else frames, want)
    if per_source == "refresh":
        assert mix.source._packed is None


def test_a_transform_that_changes_a_padded_width_gets_its_own_mask(robots: dict[str, Dataset]) -> None:
    """franka's transform makes its 7-dim action 10 wide (euler -> rot6d, say): the mask kept the
    stored 7 (real values marked padding); a width past the batch's, another rank, or a transform
    returning no batch were numpy's errors naming no source."""

    def widen(batch: TedBatch) -> TedBatch:
        batch["action"] = np.concatenate([batch["action"], np.ones((len(batch["action"]), 3), np.float32)], 1)
        return batch

    def narrow(batch: TedBatch) -> TedBatch:
        batch["action"] = batch["action"][:, :3]
        return batch

    mix = MixtureLoader(robots, [1, 1, 1], batch_size=64, seed=0, keys=KEYS, pad=True,
                        transforms={"franka": widen, "widowx": narrow})  # fmt: skip
    batch = mix.sample()
    src, mask, action = batch["source"].numpy(), batch["action_pad_mask"].numpy(), batch["action"].numpy()
    for i, width in enumerate((10, 3, 14)):
        rows = src == i
        assert rows.any() and mask[rows][:, :width].all() and not mask[rows][:, width:].any(), i
        assert (action[rows][:, width:] == 0).all()
    assert (action[src == 0][:, 7:10] == 1).all()

    def wider(batch: TedBatch) -> TedBatch:
        batch["action"] = np.zeros((len(batch["action"]), 21), np.float32)
        return batch

    wide = (
        r"source 'franka' give key 'action' per-step shape \(21,\); the mixture's batch holds it as \(14,\)"
    )
    for fn, match in (
        (wider, wide),
        (lambda batch: None, "a transform of source 'franka' returned NoneType"),
    ):
        mix = MixtureLoader(
            robots, [1, 0, 0], batch_size=8, seed=0, keys=KEYS, pad=True, transforms={"franka": fn}
        )
        with pytest.raises(MixtureError, match=match):
            mix.sample()


def test_a_transform_that_drops_a_padded_key_masks_its_rows_false(robots: dict[str, Dataset]) -> None:
    """franka's transform drops ``action``: its rows are zeros, and their mask was True (the
    stored width's), so a masked loss trained on the zeros as real actions."""

    def drop(batch: TedBatch) -> TedBatch:
        del batch["action"]
        return batch

    mix = MixtureLoader(robots, [1, 1, 1], batch_size=64, seed=0, keys=KEYS, pad=True,
                        transforms={"franka": drop})  # fmt: skip
    batch = mix.sample()
    src, mask, action = batch["source"].numpy(), batch["action_pad_mask"].numpy(), batch["action"].numpy()
    franka = src == 0
    assert franka.any() and not mask[franka].any() and (action[franka] == 0).all()
    assert mask[src == 2].all()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-source"])
def test_a_listed_next_key_is_normalized_once_with_its_own_statistics(
    robots: dict[str, Dataset], fused: bool
) -> None:
    """``Normalize(keys=["observation", "next/observation"])``: the twin was normalized with
    ``observation``'s statistics, then again with its own, except on the packed path (once):
    the numbers depended on which path the mixture took."""
    keys = ["observation", "next/observation"]
    chains = {n: Normalize(keys=keys) if fused else [Normalize(keys=keys), identity] for n in robots}
    mix = MixtureLoader(robots, [1, 1, 1], batch_size=128, seed=0, keys=keys, pad=True, transforms=chains)
    batch = mix.sample()
    src, idx = batch["source"].numpy(), batch["index"].numpy()
    for i, ds in enumerate(robots.values()):
        rows, width = src == i, ds.fields["observation"][0][0]
        raw = ds.gather(idx[rows], keys)
        for key in keys:
            stats = Normalize(keys=[key])
            stats.bind(ds)
            mean, std = stats.stats[key]  # type: ignore[index]
            np.testing.assert_allclose(
                batch[key].numpy()[rows][:, :width], (raw[key] - mean) / std, rtol=1e-6
            )


def test_sources_listing_a_next_key_differently_agree_on_both_paths(robots: dict[str, Dataset]) -> None:
    """franka lists next/observation, widowx does not: the fused path left widowx's twin
    unnormalized (its table row the identity) where its own Normalize normalizes it."""
    keys = ["observation", "next/observation"]
    two = {n: robots[n] for n in ("franka", "widowx")}
    batches = []
    for fused in (True, False):
        norms = {"franka": Normalize(keys=keys), "widowx": Normalize(keys=["observation"])}
        chains = {n: t if fused else [t, identity] for n, t in norms.items()}
        mix = MixtureLoader(two, [1, 1], batch_size=64, seed=0, keys=keys, pad=True, transforms=chains)
        assert (mix.source.fused_normalize is not None) == fused
        batches.append(mix.sample())
    (a, b), widowx = batches, robots["widowx"]
    np.testing.assert_array_equal(a["index"].numpy(), b["index"].numpy())
    for key in keys:
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)
    rows = b["source"].numpy() == 1
    alone = Normalize(keys=["observation"])
    alone.bind(widowx)
    want = alone(TedBatch(widowx.gather(b["index"].numpy()[rows], keys)))
    np.testing.assert_array_equal(a["next/observation"].numpy()[rows][:, :9], want["next/observation"])


def test_a_state_restores_only_into_the_mixture_it_was_saved_from(robots: dict[str, Dataset]) -> None:
    """Any mixture of as many sources took another's state: sources swapped, another batch size,
    weights or split (its rows then credited to the wrong source). (A converted source's content
    is compared too; these robots are growing datasets, which record no content digest.)"""
    from rlds_cli.errors import LoaderStateError

    franka, aloha = robots["franka"], robots["aloha"]
    mix = MixtureLoader(
        {"franka": franka, "aloha": aloha}, [0.9, 0.1], batch_size=16, seed=1, keys=["action"], pad=True
    )
    mix.sample()
    state = mix.state_dict()
    same = MixtureLoader(
        {"franka": franka, "aloha": aloha}, (0.9, 0.1), batch_size=16, seed=1, keys=["action"], pad=True
    )
    same.load_state_dict(state)
    np.testing.assert_array_equal(same.sample()["index"].numpy(), mix.sample()["index"].numpy())
    others = {
        "sources": ({"aloha": aloha, "franka": franka}, [0.1, 0.9], {}),
        "batch_size 16": ({"franka": franka, "aloha": aloha}, [0.9, 0.1], {"batch_size": 8}),
        "weights": ({"franka": franka, "aloha": aloha}, [0.5, 0.5], {}),
        "split": ({"franka": franka, "aloha": aloha}, [0.9, 0.1], {"split": "fixed"}),
    }
    for what, (sources, weights, options) in others.items():
        options = {"batch_size": 16, **options}
        other = MixtureLoader(sources, weights, seed=1, keys=["action"], pad=True, **options)  # type: ignore[arg-type]
        with pytest.raises(LoaderStateError, match=what):
            other.load_state_dict(state)


def test_stored_keys_a_mixture_writes_itself_are_refused(tmp_path: Path) -> None:
    """A stored ``source`` was replaced by each row's source index; a stored ``action_pad_mask``
    replaced the real mask."""
    robots = {
        name: write_robot(tmp_path, name, act, 4, [5, 6], seed, extra={extra: act})
        for name, act, seed, extra in (("a", 7, 1, "source"), ("b", 14, 2, "action_pad_mask"))
    }
    with pytest.raises(
        MixtureError, match=r"sources \['a'\] store key 'source', a name a mixture's batch writes"
    ):
        MixtureLoader(robots, [1, 1], batch_size=4, keys=["action", "source"], pad=True)
    with pytest.raises(MixtureError, match=r"sources \['b'\] store key 'action_pad_mask'"):
        MixtureLoader(robots, [1, 1], batch_size=4, keys=["action", "action_pad_mask"], pad=True)
    renamed = MixtureLoader(robots, [1, 0], batch_size=4, seed=0, keys=["action", "origin"], pad=True,
                            rename={"a": {"source": "origin"}})  # fmt: skip
    batch = renamed.sample()
    assert (batch["source"].numpy() == 0).all() and batch["origin"].shape == (4, 7)


def test_windows_name_the_source_whose_transform_reads_an_unwindowed_key(robots: dict[str, Dataset]) -> None:
    def speed(batch: TedBatch) -> TedBatch:
        batch["speed"] = np.abs(batch["observation"]).sum(-1)
        return batch

    mix = MixtureLoader(robots, [1, 1, 1], batch_size=8, seed=0, keys=KEYS, pad=True,
                        transforms={n: speed for n in robots},
                        windows={"action": [0, 1]})  # fmt: skip
    with pytest.raises(
        MixtureError, match="a transform of source 'franka' reads key 'observation', which a window"
    ):
        for _ in range(5):
            mix.sample()


def test_weights_as_bools_and_a_schedules_bad_weights_are_named(robots: dict[str, Dataset]) -> None:
    with pytest.raises(ValueError, match="weights must be 3 finite non-negative numbers"):
        MixtureLoader(robots, [True, False, True], batch_size=8, keys=KEYS, pad=True)
    mix = MixtureLoader(robots, lambda n: [1.0], batch_size=8, keys=KEYS, pad=True)
    with pytest.raises(ValueError, match="the weight schedule at batch 0: weights must be 3"):
        mix.sample()


def test_a_key_one_source_normalizes_has_one_dtype_in_every_batch(tmp_path: Path) -> None:
    """Only source a normalizes its uint8 key: batches holding a's rows were float32, batches of
    b's rows alone uint8 (and the mixture's fields said uint8)."""
    import rlds_cli

    for name, seed in (("a", 1), ("b", 2)):
        rng = np.random.default_rng(seed)
        with rlds_cli.DatasetWriter(name, root=tmp_path, mode="create") as writer:
            for n in (6, 7):
                frames = rng.integers(0, 255, (n + 1, 4, 4, 3), dtype=np.uint8)
                writer.add_episode({
                    "observation": frames[:-1], "next/observation": frames[1:],
                    "action": rng.normal(size=(n, 2)).astype(np.float32),
                    "next/reward": np.zeros(n, np.float32), "next/terminated": np.arange(n) == n - 1,
                    "next/truncated": np.zeros(n, bool),
                })  # fmt: skip
    sources = {n: rlds_cli.open_dataset(n, root=tmp_path) for n in ("a", "b")}
    mix = MixtureLoader(sources, lambda step: [[1, 0], [0, 1]][step % 2], batch_size=8, seed=0,
                        keys=["observation", "action"], pad=True,
                        transforms={"a": Normalize(keys=["observation"])})  # fmt: skip
    assert mix.source.fields["observation"][1] == "float32"
    dtypes = {str(mix.sample()["observation"].dtype) for _ in range(4)}
    assert dtypes == {"torch.float32"}


def test_a_fixed_split_that_never_draws_a_source_is_refused(robots: dict[str, Dataset]) -> None:
    """weights 0.995/0.005 of 64 rows with split='fixed': aloha got 0 rows in every batch."""
    two = {n: robots[n] for n in ("franka", "aloha")}
    with pytest.raises(
        MixtureError, match=r"split='fixed' gives sources \['aloha'\] no row of a batch of 64"
    ):
        MixtureLoader(two, [0.995, 0.005], batch_size=64, split="fixed", keys=["action"], pad=True)
    with pytest.raises(ValueError, match=r"split='fixed' gives members \[1\]"):
        MixtureSampler([10, 10], [0.995, 0.005], 64, split="fixed")
    MixtureLoader(two, [0.99, 0.01], batch_size=64, split="fixed", keys=["action"], pad=True)  # 0.64: 1 row
    # the same weights from a schedule drew aloha in no batch, without a word
    scheduled = MixtureLoader(two, lambda step: [0.995, 0.005], batch_size=64, split="fixed", keys=["action"],
                              pad=True)  # fmt: skip
    with pytest.raises(
        ValueError, match=r"the weight schedule at batch 0: split='fixed' gives members \[1\]"
    ):
        scheduled.sample()


def test_a_normalize_of_a_key_its_source_lacks_names_the_source(robots: dict[str, Dataset]) -> None:
    with pytest.raises(
        MixtureError, match=r"Normalize of source 'franka': dataset '.*' stores no key 'nope'"
    ):
        MixtureLoader(
            robots,
            [1, 1, 1],
            batch_size=8,
            keys=KEYS,
            pad=True,
            transforms={"franka": Normalize(keys=["nope"])},
        )


def test_priorities_over_a_mixture_land_on_the_rows_drawn(robots: dict[str, Dataset]) -> None:
    """A batch's index is each row's step in its own source: update_priority(batch['index']) put
    every other source's priorities on the first source's same-numbered steps."""
    source = MixtureSource(robots, keys=["action"], pad=True)
    loader = Loader(source, 64, sampler="prioritized", seed=0, alpha=1.0, eps=0.0)
    batch = loader.sample()
    with pytest.raises(ValueError, match="pass source=batch\\['source'\\] too"):
        loader.update_priority(batch["index"], 50.0)
    loader.update_priority(batch["index"], torch.full((64,), 50.0), source=batch["source"])
    drawn = source.offsets[batch["source"].numpy()] + batch["index"].numpy()
    priorities = loader.sampler.priorities  # type: ignore[attr-defined]
    assert (priorities[drawn] == 50.0).all()
    assert (np.delete(priorities, drawn) == 1.0).all()
    with pytest.raises(ValueError, match=r"source holds values outside 0\.\.2"):
        loader.update_priority(batch["index"], 1.0, source=batch["source"] + 3)
    plain = Loader(robots["franka"], 8, sampler="prioritized", seed=0)
    with pytest.raises(ValueError, match="source= is for a loader over a MixtureSource"):
        plain.update_priority([0], 1.0, source=[0])
