"""Sample user functions for the preprocessing tests (imported by reference in workers)."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

NOT_CALLABLE = 42


def identity(batch: Any) -> Any:
    return batch


def normalize(batch: Any) -> Any:
    """Observation normalization with fixed constants (a cheap vectorized function)."""
    out = dict(batch)
    for key in ("observation", "next/observation"):
        out[key] = ((batch[key] - 1.5) / 2.0).astype(np.float32)
    return out


def add_features(batch: Any) -> Any:
    """Adds a per-step key, a float64 reward and drops info keys."""
    out = {k: v for k, v in batch.items() if not k.startswith("info/")}
    out["obs_norm"] = np.linalg.norm(batch["observation"], axis=-1, keepdims=True)
    out["next/reward"] = batch["next/reward"].astype(np.float64) * 2
    return out


def returns_to_go(batch: Any) -> Any:
    """Per-episode: undiscounted returns-to-go as a new per-step key."""
    out = dict(batch)
    reward = batch["next/reward"].reshape(-1)
    rtg = np.zeros_like(reward)
    ends = np.flatnonzero(batch["next/done"].reshape(-1))
    start = 0
    for end in ends:
        rtg[start : end + 1] = np.cumsum(reward[start : end + 1][::-1])[::-1]
        start = end + 1
    out["return_to_go"] = rtg[:, None]
    return out


def drop_short_episodes(batch: Any) -> Any:
    """Per-episode: keep only episodes of at least 3 steps."""
    episode = batch["episode"]
    _, counts = np.unique(episode, return_counts=True)
    keep_eps = np.unique(episode)[counts >= 3]
    keep = np.isin(episode, keep_eps)
    return {k: v[keep] for k, v in batch.items()}


def raises(batch: Any) -> Any:
    if batch["index"][0] >= 16:  # not in schema inference (which starts at step 0)
        raise ValueError("boom in user code")
    return batch


def bad_dtype_later(batch: Any) -> Any:
    out = dict(batch)
    dtype = np.float64 if batch["index"][0] >= 16 else np.float32
    out["observation"] = batch["observation"].astype(dtype)
    out["next/observation"] = batch["next/observation"].astype(dtype)
    return out


def noisy(batch: Any) -> Any:
    """Breaks next/observation[t] == observation[t+1]."""
    out = dict(batch)
    out["next/observation"] = batch["next/observation"] + 1
    return out


def drops_a_step(batch: Any) -> Any:
    return {k: v[:-1] for k, v in batch.items()}


def returns_list(batch: Any) -> Any:
    return [1, 2, 3]


def bad_key(batch: Any) -> Any:
    return {**batch, "a//b": batch["action"]}


def text_key(batch: Any) -> Any:
    return {**batch, "label": np.array(["x"] * len(batch["action"]))}


def empty_key(batch: Any) -> Any:
    """Adds a key of no value per step (shape (steps, 0))."""
    out = dict(batch)
    out["info/empty"] = np.zeros((len(batch["action"]), 0), np.float32)
    return out


def ragged_key(batch: Any) -> Any:
    return {**batch, "info/ragged": [[1.0]] + [[1.0, 2.0]] * (len(batch["action"]) - 1)}


def bfloat16_key(batch: Any) -> Any:
    import torch

    return {**batch, "info/half": torch.zeros(len(batch["action"]), 2, dtype=torch.bfloat16)}


def wide_done(batch: Any) -> Any:
    done = np.asarray(batch["next/terminated"]) | np.asarray(batch["next/truncated"])
    return {**batch, "next/done": np.repeat(done, 2, axis=1)}


def leaf_and_group(batch: Any) -> Any:
    return {**batch, "feat": batch["action"], "feat/x": batch["action"]}


def vector_reward(batch: Any) -> Any:
    return {**batch, "next/reward": np.repeat(batch["next/reward"], 3, axis=1)}


def bool_reward(batch: Any) -> Any:
    return {**batch, "next/reward": batch["next/reward"] > 0}


def wide_flags(batch: Any) -> Any:
    return {**batch, "next/terminated": np.repeat(batch["next/terminated"], 2, axis=1)}


def float_flags(batch: Any) -> Any:
    return {**batch, "next/truncated": batch["next/truncated"].astype(np.float32) + 0.5}


def no_action(batch: Any) -> Any:
    return {k: v for k, v in batch.items() if k != "action"}


def normalize_or_hang(batch: Any) -> Any:
    """normalize(); a chunk starting at or past step ``PREPROCESS_TEST_HANG_FROM`` (when set)
    never returns, so a job is sure to be running when a test kills it midway."""
    hang_from = os.environ.get("PREPROCESS_TEST_HANG_FROM")
    if hang_from is not None and batch["index"][0] >= int(hang_from):
        threading.Event().wait()  # until the process is killed
    return normalize(batch)


def heavy(batch: Any) -> Any:
    """A CPU-heavy per-step function (used by the benchmark too)."""
    out = dict(batch)
    x = batch["observation"].astype(np.float64)
    for _ in range(20):
        x = np.tanh(x) + np.sin(x) * 0.5
    out["feature"] = x.astype(np.float32)
    return out


def in_place(batch: Any) -> Any:
    batch["action"] *= 2  # the input is a read-only view of the cache
    return batch


def drop_everything(batch: Any) -> Any:
    return {k: v[:0] for k, v in batch.items()}


def always_raises(batch: Any) -> Any:
    raise RuntimeError("never works")


def cut_episode(batch: Any) -> Any:
    """Per-episode: drops the last step of the chunk (so it does not end an episode)."""
    return {k: v[:-1] for k, v in batch.items()}


def per_chunk_offset(batch: Any) -> Any:
    """Consistent inside a chunk, not across chunks: adds the chunk's first index."""
    out = dict(batch)
    offset = np.float32(batch["index"][0])
    out["observation"] = batch["observation"] + offset
    out["next/observation"] = batch["next/observation"] + offset
    return out


def scalar_keys(batch: Any) -> Any:
    """Adds per-step keys of shape (): a float32 cost and a bool success flag."""
    out = dict(batch)
    reward = batch["next/reward"].reshape(-1)
    out["cost"] = (reward * 0.5).astype(np.float32)
    out["success"] = reward > 10
    return out


def calls_exit(batch: Any) -> Any:
    """Exits with status 0 halfway through a job, as a script's function might."""
    import sys

    if int(batch["index"][0]) > 0:
        sys.exit(0)
    return batch


def chatty(batch: Any) -> Any:
    """Prints from Python and from C (a write to file descriptor 1) on every chunk."""
    print(f"chunk starting at {int(batch['index'][0])}")
    os.write(1, b"raw write to fd 1\n")
    return batch


def adds_a_big_key(batch: Any) -> Any:
    """Adds 2 KB a step of random (incompressible) floats: outputs bigger than their input."""
    out = dict(batch)
    rng = np.random.default_rng(int(batch["index"][0]))
    out["big"] = rng.standard_normal((len(batch["index"]), 512)).astype(np.float32)
    return out


def drop_first_episode(batch: Any) -> Any:
    """Per-episode: drops the input's episode 0 (where the chunk holds it), keeping ``episode``."""
    keep = np.asarray(batch["episode"]) != 0
    return {k: v[keep] for k, v in batch.items()}


def renumbers_episodes(batch: Any) -> Any:
    """Per-episode: an ``episode`` column naming no input episode."""
    return {**batch, "episode": np.full(len(batch["episode"]), 10**6, np.int64)}


def wide_feature(batch: Any) -> Any:
    """Adds ``feat``: 256 floats a step (a quantile sketch of 257 x 256 a chunk)."""
    n = len(batch["index"])
    feat = np.arange(256, dtype=np.float32) + np.asarray(batch["index"], np.float32).reshape(n, 1)
    return {**batch, "feat": feat}


def pair_mismatch_later(batch: Any) -> Any:
    """From step 40 on, ``next/observation`` is float64 while ``observation`` stays float32."""
    out = dict(batch)
    if batch["index"][0] >= 40:
        out["next/observation"] = np.asarray(batch["next/observation"], np.float64)
    return out


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str fails")


def raises_unprintable(batch: Any) -> Any:
    raise _Unprintable()
