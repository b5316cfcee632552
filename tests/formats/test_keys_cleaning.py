"""One key cleaner for every reader (``rlds_cli/formats/base.py``): source names that clean to the
same TED key (``"pos x"`` and ``"pos_x"``, ``infos/a b`` and ``infos/a_b``) get distinct keys,
and text columns (h5py variable-length strings, Minari string infos, tensordict
``NonTensorStack``) are dropped with a note instead of being stored as object pointers.

Sources are written with the upstream libraries and their defaults (h5py, numpy's ``savez``,
minari's ``DataCollector``, ``TensorDict.memmap``) and compared with the upstream readers key by
key, dtype by dtype.
"""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rlds_cli.cache import open_dataset
from rlds_cli.cli.app import app
from rlds_cli.formats.base import clean_keys, clean_part, is_valid_key
from rlds_cli.sources.convert import convert
from tests.minari_fixtures import record_random

runner = CliRunner()


def _stored(name: str) -> dict[str, np.ndarray]:
    """Every stored column of a dataset (no object dtype may appear: np.load refuses pickles)."""
    ds = open_dataset(name)
    return {key: np.asarray(ds.column(key)) for key in ds.manifest.fields}


def _notes(name: str) -> str:
    return "\n".join(open_dataset(name).manifest.conversion["notes"])


# ----------------------------------------------------------------------------- the cleaner


def test_clashing_names_get_distinct_keys() -> None:
    wanted = {"pos x": ("pos x",), "pos_x": ("pos_x",), "pos+x": ("pos+x",)}
    # the clean name keeps its key; the others, in code-point order of their source names, get _2, _3
    assert clean_keys(wanted) == {"pos_x": "pos_x", "pos x": "pos_x_2", "pos+x": "pos_x_3"}
    # a suffix never takes a name another source name already has
    wanted = {"a b": ("a b",), "a_b": ("a_b",), "a_b_2": ("a_b_2",)}
    assert clean_keys(wanted) == {"a_b": "a_b", "a_b_2": "a_b_2", "a b": "a_b_3"}


def test_groups_and_leaves_never_share_a_name() -> None:
    # 'obs x' (a leaf) and 'obs_x/y' (a leaf in group obs_x): without care, obs_x would be both
    keys = clean_keys({"leaf": ("obs x",), "nested": ("obs_x", "y"), "other": ("obs_x", "z")})
    assert keys == {"nested": "obs_x/y", "other": "obs_x/z", "leaf": "obs_x_2"}
    # two source names wanting the same key (D4RL: root 'foo' and 'infos/foo' both -> info/foo)
    assert clean_keys({"foo": ("info", "foo"), "infos/foo": ("info", "foo")}) == {
        "foo": "info/foo",
        "infos/foo": "info/foo_2",
    }


@pytest.mark.parametrize(
    ("raw", "cleaned"), [("", "_"), (".", "_"), ("..", "__"), ("é", "_"), ("a.b-c", "a.b-c")]
)
def test_parts_that_are_not_names(raw: str, cleaned: str) -> None:
    assert clean_part(raw) == cleaned
    assert is_valid_key(clean_part(raw))


_parts = st.text(alphabet="ab_ .-/é\t", max_size=4)
_wanted = st.lists(st.lists(_parts, min_size=1, max_size=3).map(tuple), max_size=12)


@settings(max_examples=300, deadline=None)
@given(_wanted, st.randoms(use_true_random=False))
def test_clean_keys_properties(items: list[tuple[str, ...]], rnd: random.Random) -> None:
    """Distinct source names never share a key (even when their wanted keys are identical), every
    key follows the strict grammar, no key is a group of another, and order does not matter."""
    wanted = {f"src{i}": parts for i, parts in enumerate(items)}
    keys = clean_keys(wanted)
    assert set(keys) == set(wanted)
    assert len(set(keys.values())) == len(keys)
    for key in keys.values():
        assert is_valid_key(key), key
        parts = key.split("/")
        assert all(p and p not in (".", "..") and all(c.isascii() for c in p) for p in parts)
    values = sorted(keys.values())
    for a, b in itertools.pairwise(values):
        assert not b.startswith(a + "/"), (a, b)
    shuffled = list(wanted.items())
    rnd.shuffle(shuffled)
    assert clean_keys(dict(shuffled)) == keys
    # names that are already valid and distinct, none a group of another, are kept as they are
    valid = {label: p for label, p in wanted.items() if all(clean_part(x) == x for x in p)}
    tuples = set(valid.values())
    if len(tuples) == len(valid) and not any(a[: len(b)] == b for a in tuples for b in tuples if a != b):
        assert clean_keys(valid) == {label: "/".join(p) for label, p in valid.items()}


# ----------------------------------------------------------------------------- D4RL (h5py)


def _write_d4rl_with_infos(path: Path) -> Path:
    """A D4RL file as h5py writes it, with clashing info names and a variable-length string info."""
    n = 10
    rng = np.random.default_rng(0)
    timeouts = np.zeros(n, bool)
    timeouts[[4, 9]] = True
    with h5py.File(path, "w") as f:
        f["observations"] = rng.normal(size=(n, 3)).astype(np.float32)
        f["actions"] = rng.normal(size=(n, 2)).astype(np.float32)
        f["rewards"] = rng.normal(size=n).astype(np.float32)
        f["terminals"] = np.zeros(n, bool)
        f["timeouts"] = timeouts
        f["infos/a b"] = np.arange(n, dtype=np.float32)
        f["infos/a_b"] = np.arange(n, dtype=np.float32) * 10
        f.create_dataset("infos/goal", data=[f"goal {i}" for i in range(n)], dtype=h5py.string_dtype())
        f.create_dataset("infos/raw", data=[b"x" * i for i in range(n)], dtype=h5py.string_dtype("ascii"))
    return path


def test_d4rl_clashing_infos_and_strings_from_the_cli(tmp_path: Path) -> None:
    src = _write_d4rl_with_infos(tmp_path / "d.hdf5")
    result = runner.invoke(app, ["download", str(src), "--name", "d"])
    assert result.exit_code == 0, result.output
    cols = _stored("d")
    assert not any(v.dtype.kind in "OSU" for v in cols.values())
    assert "info/goal" not in cols and "info/raw" not in cols
    # timeouts drop the rows 4 and 9 (next state unknown): steps are rows 0-3 and 5-8
    rows = [0, 1, 2, 3, 5, 6, 7, 8]
    with h5py.File(src) as f:
        for key, h5 in (("info/a_b", "infos/a_b"), ("info/a_b_2", "infos/a b")):
            np.testing.assert_array_equal(cols[key], f[h5][rows], err_msg=key)
            assert cols[key].dtype == f[h5].dtype
    notes = _notes("d")
    assert "'infos/a b' -> 'info/a_b_2'" in notes
    assert "infos/goal: variable-length strings are not stored" in notes
    assert "infos/raw: variable-length strings are not stored" in notes
    check = runner.invoke(app, ["inspect", "d", "--check"])
    assert check.exit_code == 0, check.output


# ----------------------------------------------------------------------------- Roboset, OGBench, AMAGO


def test_roboset_clashing_env_infos_and_strings(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:  # RoboHive's logger writes '/' keys as nested groups
        g = f.create_group("Trial0")
        g["observations"] = np.arange(8, dtype=np.float64).reshape(4, 2)
        actions = np.ones((4, 1))
        actions[-1] = np.nan
        g["actions"] = actions
        g["rewards"] = np.arange(4, dtype=np.float64)
        g["done"] = np.array([0, 0, 0, 1], bool)
        g["env_infos/a b"] = np.arange(4.0)
        g["env_infos/a_b"] = -np.arange(4.0)
        g.create_dataset("env_infos/msg", data=["m"] * 4, dtype=h5py.string_dtype())
    convert(path, "r")
    cols = _stored("r")
    np.testing.assert_array_equal(cols["info/a_b"], -np.arange(4.0))
    np.testing.assert_array_equal(cols["info/a_b_2"], np.arange(4.0))
    assert "info/msg" not in cols
    notes = _notes("r")
    assert "env_infos/msg: variable-length strings are not stored" in notes
    assert "'env_infos/a b' -> 'info/a_b_2'" in notes


def test_ogbench_clashing_arrays_and_text(tmp_path: Path) -> None:
    n = 5
    terminals = np.zeros(n, bool)
    terminals[-1] = True
    path = tmp_path / "o.npz"
    np.savez(
        path,
        observations=np.arange(2 * n, dtype=np.float32).reshape(n, 2),
        actions=np.zeros((n, 1), np.float32),
        terminals=terminals,
        **{"qpos x": np.arange(n, dtype=np.float32), "qpos_x": -np.arange(n, dtype=np.float32)},
        label=np.array([f"l{i}" for i in range(n)]),
    )
    convert(path, "o", format="ogbench")
    cols = _stored("o")
    np.testing.assert_array_equal(cols["info/qpos_x"], -np.arange(n, dtype=np.float32))
    np.testing.assert_array_equal(cols["info/qpos_x_2"], np.arange(n, dtype=np.float32))
    assert "info/label" not in cols and "label: text values are not stored" in _notes("o")


def test_amago_clashing_observation_keys(tmp_path: Path) -> None:
    fifo = tmp_path / "buffer" / "fifo"
    fifo.mkdir(parents=True)
    length = 4
    np.savez(
        fifo / "env_0001.npz",
        **{"_OBS_KEY_a b": np.full((length, 1), 1.0), "_OBS_KEY_a_b": np.full((length, 1), 2.0)},
        rews=np.zeros((length - 1, 1), np.float32),
        dones=np.zeros((length - 1, 1), bool),
        actions=np.zeros((length - 1, 1), np.float32),
    )
    convert(tmp_path, "a", format="amago")
    cols = _stored("a")
    assert (cols["observation/a_b"] == 2.0).all() and (cols["observation/a_b_2"] == 1.0).all()
    assert "'_OBS_KEY_a b' -> 'observation/a_b_2'" in _notes("a")


# ----------------------------------------------------------------------------- TorchRL (tensordict)


def test_tensordict_clashing_keys_and_non_tensor_data(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    t = 4
    obs = torch.arange(t + 1, dtype=torch.float32)[:, None].expand(t + 1, 2).contiguous()
    done = torch.zeros(t, 1, dtype=torch.bool)
    done[-1] = True
    td = tensordict.TensorDict(
        {
            "observation": obs[:-1],
            "action": torch.zeros(t, 1),
            "pos x": torch.full((t,), 1.0),
            "pos_x": torch.full((t,), 2.0),
            "tag": tensordict.NonTensorStack(*[f"s{i}" for i in range(t)]),
            "next": {"observation": obs[1:], "reward": torch.ones(t, 1), "done": done, "terminated": done},
        },
        batch_size=[t],
    )
    td.memmap(tmp_path / "td")
    convert(tmp_path / "td", "t")
    cols = _stored("t")
    back = tensordict.TensorDict.load_memmap(tmp_path / "td")
    for key, source in (("pos_x", "pos_x"), ("pos_x_2", "pos x"), ("action", "action")):
        np.testing.assert_array_equal(cols[key], back[source].numpy(), err_msg=key)
        assert cols[key].dtype == back[source].numpy().dtype
    assert "tag" not in cols
    notes = _notes("t")
    assert "tag: text/Python values (NonTensorData) are not stored" in notes
    assert "'pos x' -> 'pos_x_2'" in notes


# ----------------------------------------------------------------------------- Minari (DataCollector)

gym: Any = None
try:
    import gymnasium as gym
    from gymnasium import spaces

    class KeyEnv(gym.Env):  # type: ignore[misc]
        """Dict observations ``"pos x"`` and ``"pos_x"``, infos ``"a b"``, ``"a_b"`` and a string."""

        def __init__(self) -> None:
            box = spaces.Box(-10, 10, (2,), np.float32)
            self.observation_space = spaces.Dict({"pos x": box, "pos_x": box})
            self.action_space = spaces.Box(-1, 1, (1,), np.float32)
            self.t = 0

        def _obs(self) -> dict[str, np.ndarray]:
            return {"pos x": np.array([self.t, 1], np.float32), "pos_x": np.array([self.t, 2], np.float32)}

        def _info(self) -> dict[str, Any]:
            return {"tag": f"t{self.t}", "a b": 1.0 + self.t, "a_b": 2.0 + self.t}

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
            super().reset(seed=seed)
            self.t = 0
            return self._obs(), self._info()

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
            self.t += 1
            return self._obs(), float(self.t), self.t >= 3, False, self._info()

except ImportError:  # pragma: no cover - the minari test below skips
    pass


def test_minari_clashing_keys_and_string_infos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    minari = pytest.importorskip("minari")
    pytest.importorskip("jax", reason="minari's DataCollector needs jax: pip install 'minari[create]'")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    gym.register("RldsKeyToy-v0", entry_point=f"{__name__}:KeyEnv", disable_env_checker=True)
    with pytest.warns(UserWarning):  # no eval_env given
        record_random(
            gym.make("RldsKeyToy-v0", max_episode_steps=5),
            "rlds/keys/toy-v0",
            2,
            unseeded=True,  # the default of minari's DataCollector
            record_infos=True,
            code_permalink="tests/formats/test_keys_cleaning.py",
            description="key cleaning",
        )
    source = tmp_path / "minari" / "rlds" / "keys" / "toy-v0"
    result = runner.invoke(app, ["download", str(source), "--name", "m"])
    assert result.exit_code == 0, result.output
    ds = open_dataset("m")
    assert not any(np.dtype(f.dtype).kind in "OSU" for f in ds.manifest.fields.values())
    pairs = {
        "observation/pos_x": ("observations", "pos_x"),
        "observation/pos_x_2": ("observations", "pos x"),
        "info/a_b": ("infos", "a_b"),
        "info/a_b_2": ("infos", "a b"),
    }
    start = 0
    for ep in minari.load_dataset("rlds/keys/toy-v0").iterate_episodes():
        t = len(ep.rewards)
        batch = ds.gather(np.arange(start, start + t), [*pairs, *(f"next/{k}" for k in pairs)])
        for key, (group, name) in pairs.items():
            want = np.asarray(getattr(ep, group)[name])
            np.testing.assert_array_equal(batch[key], want[:-1], err_msg=key)
            np.testing.assert_array_equal(batch[f"next/{key}"], want[1:], err_msg=key)
            assert batch[key].dtype == want.dtype, key
        assert ep.infos["tag"].dtype == object  # minari keeps the strings; rlds drops the column
        start += t
    assert start == ds.num_steps
    notes = _notes("m")
    assert "info/tag: variable-length" in notes and "not stored" in notes
    assert "'observations/pos x' -> 'observation/pos_x_2'" in notes
    assert os.environ["MINARI_DATASETS_PATH"] == str(tmp_path / "minari")
