"""TorchRL interop: a collector's rollout TensorDict -> whole episodes for ``add_episode``.

A TorchRL collector yields batches in the TED layout rlds stores: ``observation`` and ``action`` at
the root, ``("next", "observation")``, ``("next", "reward")`` ``(T, 1)`` and the flags ``("next",
"done" | "terminated" | "truncated")`` ``(T, 1)``. :class:`RolloutEpisodes` handles what differs
from what ``DatasetWriter.add_episode`` takes:

* the batch is ``[T]`` (one environment) or ``[n_envs, T]`` and holds pieces of several episodes,
  split at ``("collector", "traj_ids")`` (without it, after every ``("next", "done")``);
* an episode that spans batches is kept (by its trajectory id) and joined to its continuation in the
  next batch, so each episode is committed once, whole;
* a batch of ``split_trajs=True`` (``[n_trajectories, longest]``) holds only the steps its
  ``("collector", "mask")`` marks; the padding after them is dropped;
* an unfinished episode's steps are copied when kept (a collector may refill its batch in place,
  ``return_same_td=True``);
* bookkeeping keys are dropped: ``collector/*`` and the root ``done``/``terminated``/``truncated``
  (the flags of the state at t, which TED derives from the previous step);
* a rollout of an environment that gives ``("next", "done")`` without ``terminated`` or
  ``truncated`` (an older env): the missing flag is what ``done`` leaves of the other (``done``
  alone: terminated), as TorchRL's ``done = terminated | truncated`` reads.

Every other key keeps its name (``("next", "pixels")`` -> ``next/pixels``): a key at the root and
under ``next`` is observation-like, as in the rest of rlds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np

from rlds_cli.errors import RecordingError

#: Root keys a rollout carries that are not data of the transition.
DROPPED_ROOT = ("done", "terminated", "truncated")
DROPPED_GROUPS = ("collector",)


def _columns(td: Any) -> dict[str, np.ndarray]:
    """The rollout's leaves as numpy arrays under ``/``-joined keys, bookkeeping dropped."""
    out: dict[str, np.ndarray] = {}
    for key, value in td.items(include_nested=True, leaves_only=True):
        parts = (key,) if isinstance(key, str) else tuple(key)
        if parts[0] in DROPPED_GROUPS or (len(parts) == 1 and parts[0] in DROPPED_ROOT):
            continue
        out["/".join(parts)] = value.detach().cpu().numpy()
    for need in ("next/reward", "next/done"):
        if need not in out:
            raise RecordingError(
                f"the rollout has no {tuple(need.split('/'))!r} key; a TorchRL collector's rollout has it",
                hint="pass the TensorDict a collector yields (or env.rollout(...)) as it is",
            )
    done = out["next/done"].astype(bool)
    if "next/terminated" not in out:  # done = terminated | truncated
        truncated = out.get("next/truncated")
        out["next/terminated"] = done if truncated is None else done & ~truncated.astype(bool)
    if "next/truncated" not in out:
        out["next/truncated"] = done & ~out["next/terminated"].astype(bool)
    return out


def _collector_key(td: Any, name: str) -> np.ndarray | None:
    """``("collector", name)`` of the rollout as numpy, or ``None``."""
    key = ("collector", name)
    if key in td.keys(include_nested=True):
        return np.asarray(td.get(key).detach().cpu().numpy())
    return None


class RolloutEpisodes:
    """Cuts TorchRL rollouts into whole episodes, keeping unfinished ones across batches.

    Example::

        episodes = RolloutEpisodes()
        with rlds_cli.DatasetWriter("pendulum-torchrl") as writer:
            for rollout in collector:
                for episode in episodes.add(rollout):
                    writer.add_episode(episode)
            for episode in episodes.flush():  # unfinished ones, last step truncated
                writer.add_episode(episode)
    """

    def __init__(self) -> None:
        # trajectory id (or env index without ids) -> pieces of an episode not yet ended
        self._pending: dict[int, list[dict[str, np.ndarray]]] = {}

    @property
    def pending(self) -> int:
        """Episodes started but not ended yet."""
        return len(self._pending)

    def add(self, rollout: Any) -> list[dict[str, np.ndarray]]:
        """The episodes that end in ``rollout`` (``[T]`` or ``[n_envs, T]``), whole."""
        dims = len(rollout.batch_size)
        if dims not in (1, 2):
            raise RecordingError(
                f"a rollout of batch size {tuple(rollout.batch_size)}: expected [T] or [n_envs, T]",
                hint="pass the TensorDict a collector yields, without reshaping it",
            )
        columns = _columns(rollout)
        ids = _collector_key(rollout, "traj_ids")
        # split_trajs=True: [n_trajectories, longest] rows padded after their steps (mask False)
        mask = _collector_key(rollout, "mask")
        done = columns["next/done"].reshape(*rollout.batch_size)
        if dims == 1:
            columns = {k: v[None] for k, v in columns.items()}
            done = done[None]
            ids = None if ids is None else ids[None]
            mask = None if mask is None else mask[None]
        finished: list[dict[str, np.ndarray]] = []
        for env in range(done.shape[0]):
            steps = slice(None) if mask is None else mask[env].reshape(-1).astype(bool)
            row = {k: v[env][steps] for k, v in columns.items()}
            if len(row["next/done"]):
                row_ids = None if ids is None else ids[env].reshape(-1)[steps]
                finished.extend(self._split(row, done[env][steps], row_ids, env))
        return finished

    def _split(
        self, row: dict[str, np.ndarray], done: np.ndarray, ids: np.ndarray | None, env: int
    ) -> Iterable[dict[str, np.ndarray]]:
        t = len(done)
        # a new trajectory id starts an episode; without ids, the step after a done does
        cuts = np.flatnonzero(ids[1:] != ids[:-1] if ids is not None else done[:-1]) + 1
        bounds = [0, *cuts.tolist(), t]
        for start, stop in itertools.pairwise(bounds):
            piece = {k: v[start:stop] for k, v in row.items()}
            tag = int(ids[start]) if ids is not None else -1 - env
            parts = self._pending.pop(tag, [])
            if done[stop - 1]:
                yield _join([*parts, piece])
            else:  # copied: a collector may refill its batch in place (return_same_td=True)
                self._pending[tag] = [*parts, {k: np.array(v) for k, v in piece.items()}]

    def flush(self) -> list[dict[str, np.ndarray]]:
        """The unfinished episodes, each with its last step marked truncated, and forget them."""
        out = []
        for parts in self._pending.values():
            ep = _join(parts)
            for key in ("next/truncated", "next/done"):
                if key in ep:
                    ep[key][-1] = True
            out.append(ep)
        self._pending.clear()
        return out


def _join(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return {k: np.array(v) for k, v in parts[0].items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def from_rollout(rollout: Any, *, unfinished: str = "truncate") -> list[dict[str, np.ndarray]]:
    """The episodes of one rollout TensorDict.

    Args:
        rollout: A TorchRL collector's batch or ``env.rollout(...)`` (``[T]`` or ``[n_envs, T]``).
        unfinished: What to do with episodes the rollout cuts: ``"truncate"`` keeps them with
            the last step marked truncated, ``"drop"`` leaves them out. To join an episode to
            its continuation in the next batch, use :class:`RolloutEpisodes` instead.
    """
    if unfinished not in ("truncate", "drop"):
        raise RecordingError(f"unfinished={unfinished!r}: expected 'truncate' or 'drop'")
    splitter = RolloutEpisodes()
    episodes = splitter.add(rollout)
    if unfinished == "truncate":
        episodes.extend(splitter.flush())
    return episodes


def extend_from_rollout(writer: Any, rollout: Any, episodes: RolloutEpisodes | None = None) -> int:
    """Commit the episodes of ``rollout`` to ``writer`` in one call; returns how many.

    With ``episodes`` (a :class:`RolloutEpisodes` kept across batches), an unfinished episode
    waits for its continuation; without it, it is committed truncated.
    """
    found = episodes.add(rollout) if episodes is not None else from_rollout(rollout)
    for episode in found:
        writer.add_episode(episode)
    return len(found)
