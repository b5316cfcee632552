"""``RecordEpisodes``: a gymnasium wrapper that writes every episode it sees into a dataset.

The wrapper is a drop-in for Minari's ``DataCollector`` that writes to an rlds
:class:`~rlds_cli.DatasetWriter` instead of a temporary Minari storage: the same episodes (the
reset observation and every step's action, reward, terminated, truncated and next observation),
the reset seed of every episode, drawn with 64 random bits when ``reset()`` is given none (as
``DataCollector`` draws it), and the selected ``info`` keys. An episode is handed to
``writer.add_episode`` when a step ends it and committed whole on the writer's commit thread
while the next one is recorded; so a process killed mid-episode loses that episode and those
whose commit had not landed, nothing more.

An episode cut short by the user (``reset()`` or ``close()`` before it ended, or
:meth:`RecordEpisodes.finish_episode`) is committed with its last step marked truncated, as
``DataCollector`` keeps it: truncation is exactly "stopped for a reason outside the task". An
episode without a step is dropped. An episode still running when the writer is closed without
``env.close()`` is not committed.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Protocol

from rlds_cli.errors import GYMNASIUM_INSTALL, MissingExtraError, RecordingError
from rlds_cli.recording.episode import EpisodeAssembler
from rlds_cli.write.writer import DatasetWriter

try:
    import gymnasium as gym
except ImportError:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(
        f"recording from an environment needs gymnasium, which is not installed: {GYMNASIUM_INSTALL}",
        hint=GYMNASIUM_INSTALL,
    ) from None

#: Bits of a drawn seed (Minari's ``AUTOSEED_BIT_SIZE``: HDF5 attributes hold up to uint64).
SEED_BITS = 64


class EpisodeSink(Protocol):
    """Where finished episodes go: a :class:`~rlds_cli.DatasetWriter`, or anything with
    ``add_episode``."""

    def add_episode(self, episode: Any) -> Any: ...


class RecordEpisodes(gym.Wrapper):
    """Record every episode of ``env`` into ``writer``.

    Args:
        env: A gymnasium environment (single, not vectorized).
        writer: An open :class:`~rlds_cli.DatasetWriter` (or anything with ``add_episode``).
            The wrapper never closes it.
        info_keys: The ``info`` entries to keep: ``None`` (none, the default, as Minari's
            ``record_infos=False``), ``"all"`` (every numeric entry) or a list of names.
        autoseed: Draw a 64-bit seed for a ``reset()`` given none, so every episode can be
            replayed (``DataCollector``'s default). ``reset(options={"minari_autoseed": False})``
            also turns it off for one reset, as in Minari.

    Example::

        with rlds_cli.DatasetWriter("pendulum-mine") as writer:
            env = rlds_cli.RecordEpisodes(gym.make("Pendulum-v1"), writer)
            obs, _ = env.reset(seed=0)
            ...
            env.close()  # commits an unfinished episode as truncated
    """

    def __init__(
        self,
        env: Any,
        writer: EpisodeSink,
        *,
        info_keys: Sequence[str] | str | None = None,
        autoseed: bool = True,
    ) -> None:
        if isinstance(env, gym.vector.VectorEnv) or not isinstance(env, gym.Env):
            raise RecordingError(
                f"RecordEpisodes wraps one gymnasium environment, not a {type(env).__name__}",
                hint="wrap each environment before vectorizing it, or pass a TorchRL rollout to "
                "rlds_cli.recording.torchrl.RolloutEpisodes",
            )
        super().__init__(env)
        self.writer = writer
        self.autoseed = autoseed
        self.assembler = EpisodeAssembler(env.observation_space, env.action_space, info_keys)
        #: Seed of each committed episode (``None`` where the reset had none), in commit order.
        self.seeds: list[int | None] = []
        #: Steps committed so far.
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset the environment; an episode still running is committed, truncated."""
        self.finish_episode()
        if seed is None and self.autoseed and (options or {}).get("minari_autoseed", True):
            seed = secrets.randbits(SEED_BITS)
        obs, info = self.env.reset(seed=seed, options=options)
        self.assembler.start(obs, info, seed)
        return obs, info

    def step(self, action: Any) -> Any:
        """Step the environment and record the transition; commit the episode when it ends."""
        if not self.assembler.active:
            # checked before stepping, so the environment is not advanced for nothing
            self.assembler.step(action, None, None, None, None, {})
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.assembler.step(action, obs, reward, terminated, truncated, info)
        if terminated or truncated:
            self._commit()
        return obs, reward, terminated, truncated, info

    def finish_episode(self) -> bool:
        """Commit the running episode now, its last step marked truncated (``False``: there
        was none with a step, and nothing was committed)."""
        if not self.assembler.active:
            return False
        return self._commit()

    def _commit(self) -> bool:
        seed = self.assembler.seed
        episode = self.assembler.finish()
        if episode is None:
            return False
        if isinstance(self.writer, DatasetWriter):  # the arrays were built for this call alone
            self.writer.add_episode(episode, copy=False)
        else:
            self.writer.add_episode(episode)
        self.seeds.append(seed)
        self.steps += len(episode["next/reward"])
        return True

    def close(self) -> None:
        """Commit a running episode (truncated), then close the environment."""
        try:
            self.finish_episode()
        finally:
            super().close()
