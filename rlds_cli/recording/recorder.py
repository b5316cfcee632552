"""Recording from a gymnasium environment: ``rlds_cli.record`` (a policy run, its episodes saved) and
the ``RecordEpisodes`` wrapper.

::

    ds = rlds_cli.record("CartPole-v1", None, name="cartpole-random", episodes=10)

Stored beside the episodes (keys: :mod:`rlds_cli.recording.episode`):

* the environment's spec (``EnvSpec.to_json()``), for ``Dataset.recover_environment()``, and its
  spaces as Minari serializes them, so ``rlds export NAME DIR --to minari`` writes a dataset
  minari loads with the same spaces and spec;
* every episode's reset seed (``seed + i`` for episode ``i`` when ``seed`` is given, else 64
  random bits, as Minari's ``DataCollector`` draws them), so any episode can be replayed.

``record(steps=N)`` stops after exactly N steps; an episode the budget cuts is kept, its last
step marked truncated.

``RecordEpisodes`` is a drop-in for Minari's ``DataCollector`` that writes to a
:class:`~rlds_cli.DatasetWriter`: the same episodes (reset observation, then each step's action,
reward, terminated, truncated and next observation), reset seeds (64 random bits when ``reset()``
gets none) and selected ``info`` keys. An episode goes to ``writer.add_episode`` when a step ends
it and is committed whole on the writer's commit thread while the next is recorded: a process
killed mid-episode loses that episode and those whose commit had not landed, nothing more.

An episode cut short by the user (``reset()``, ``close()`` or
:meth:`RecordEpisodes.finish_episode` before it ended) is committed with its last step marked
truncated, as ``DataCollector`` keeps it; one without a step is dropped; one still running when
the writer is closed without ``env.close()`` is not committed.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from rlds_cli.errors import GYMNASIUM_INSTALL, MissingExtraError, RecordingError
from rlds_cli.recording.episode import EpisodeAssembler
from rlds_cli.write.writer import DatasetWriter

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset
    from rlds_cli.write.writer import DatasetWriter


def env_spec_json(env: Any) -> str | None:
    """The environment's spec as ``EnvSpec.to_json()`` writes it (``None``: the environment was
    not made by ``gym.make`` and has no spec).

    Raises:
        RecordingError: the spec holds arguments JSON cannot write (a callable, an object).
    """
    spec = getattr(env, "spec", None)
    if spec is None:
        return None
    try:
        return str(spec.to_json())
    except Exception as exc:  # gymnasium raises ValueError (or TypeError) for such kwargs
        raise RecordingError(
            f"the env spec of {spec.id!r} cannot be saved as JSON ({exc})",
            hint="make the environment with JSON-serializable keyword arguments (numbers, strings, lists)",
        ) from None


def recording_metadata(
    observation_space: Any, action_space: Any, spec_json: str | None, recorder: str, policy: Any = None
) -> dict[str, Any]:
    """What the manifest keeps about a recording: the spaces as Minari serializes them (with the
    Minari path of every TED key, as a converted Minari dataset has them) and who recorded.

    Raises:
        RecordingError: a space rlds cannot store.
    """
    from rlds_cli.recording.episode import serialize_space, space_leaves

    leaves = [*space_leaves(observation_space, "observation"), *space_leaves(action_space, "action")]
    spaces = {
        "serializer": "minari",
        "observation_space": serialize_space(observation_space),
        "action_space": serialize_space(action_space),
        "env_spec": json.loads(spec_json) if spec_json else None,
        "jpeg_encoding": False,
        "paths": {leaf.key: leaf.minari_path for leaf in leaves},
        "text_keys": [leaf.key for leaf in leaves if leaf.kind == "Text"],
    }
    about: dict[str, Any] = {"recorder": recorder}
    if policy is not None:
        about["policy"] = getattr(policy, "__qualname__", None) or type(policy).__name__
    return {"spaces": spaces, "recording": about}


def recording_writer(env: Any, name: str, **writer_kwargs: Any) -> DatasetWriter:
    """A :class:`~rlds_cli.DatasetWriter` for recording ``env`` with
    :class:`~rlds_cli.RecordEpisodes`: the manifest keeps the env spec (so
    ``Dataset.recover_environment()`` works) and the spaces (so ``rlds export --to minari`` writes
    them back). ``writer_kwargs`` go to the writer (``mode``, ``root``, ``episodes_per_commit``...).

    Raises:
        RecordingError: a space rlds cannot store, or a spec JSON cannot hold.
    """
    from rlds_cli.write.writer import DatasetWriter

    spec_json = env_spec_json(env)
    policy = writer_kwargs.pop("policy", None)
    recorder = writer_kwargs.pop("recorder", "rlds_cli.RecordEpisodes")
    metadata = recording_metadata(env.observation_space, env.action_space, spec_json, recorder, policy)
    return DatasetWriter(name, env_spec=spec_json, metadata=metadata, **writer_kwargs)


def record(
    env: Any,
    policy: Callable[[Any], Any] | None = None,
    *,
    name: str,
    episodes: int | None = None,
    steps: int | None = None,
    root: str | os.PathLike[str] | None = None,
    storage: str = "memmap",
    seed: int | None = None,
    info_keys: Sequence[str] | str | None = None,
    mode: str = "create",
    env_kwargs: Mapping[str, Any] | None = None,
    episodes_per_commit: int = 1,
    capacity: int | None = None,
    min_size: int = 0,
    min_total: int = 0,
    protected: bool = False,
    frames: str | None = None,
) -> Dataset:
    """Run ``policy`` in ``env`` for ``episodes`` episodes or ``steps`` steps and save them.

    Args:
        env: A gymnasium environment, or an id for ``gym.make`` (then made here with
            ``env_kwargs`` and closed at the end; a given environment is left open).
        policy: ``policy(observation) -> action``; ``None`` samples the action space.
        name: The dataset's cache name.
        episodes: Record this many whole episodes. Exactly one of ``episodes`` and ``steps``.
        steps: Record exactly this many steps (the last episode may be cut: truncated).
        root: The cache root (default: ``RLDS_HOME`` or the user cache).
        storage: ``"memmap"`` or ``"zarr"``.
        seed: Episode ``i`` is reset with ``seed + i`` and the random policy's action space is
            seeded with ``seed``; ``None`` draws a 64-bit seed per episode (stored either way).
        info_keys: ``info`` entries to keep: ``None``, ``"all"`` or a list of names.
        mode: ``"create"`` a new dataset or ``"append"`` to an existing one.
        env_kwargs: Keyword arguments for ``gym.make`` when ``env`` is an id.
        episodes_per_commit: Episodes a commit waits for (1: each episode is committed, durable
            and visible, on the writer's commit thread while the next one is recorded; more:
            fewer, larger commits). ``record`` returns once every episode is committed.
        capacity: Unprotected steps the dataset keeps, oldest evicted first (``None``: all).
        min_size: Unprotected steps before ``Dataset.ready``; ``min_total``: steps in all.
            ``capacity``, ``min_size`` and ``min_total`` are the dataset's settings: they apply
            when this call creates it, a later writer reads them (see
            :class:`~rlds_cli.DatasetWriter`, which also has ``capacity_episodes``).
        protected: These episodes are never evicted (demonstrations recorded into a buffer).
        frames: How camera frames (image observations) are stored: ``keep`` (default, as
            arrays), ``jpeg[:QUALITY]``, ``png`` or ``webp`` (see :class:`~rlds_cli.DatasetWriter`).

    Returns:
        The dataset, opened.

    Raises:
        RecordingError: bad arguments, a space rlds cannot store, or values outside their space.
        ValueError: a bad ``capacity``, ``min_size`` or ``min_total`` (the writer's check, before
            anything is written).
    """
    _check_record_args(policy, episodes, steps, seed, episodes_per_commit)
    writer_args = {
        "root": root,
        "storage": storage,
        "mode": mode,
        "episodes_per_commit": episodes_per_commit,
        "capacity": capacity,
        "min_size": min_size,
        "min_total": min_total,
        "protected": protected,
        "frames": frames,
    }
    owned = isinstance(env, str)
    if owned:
        import gymnasium as gym

        try:
            env = gym.make(env, **dict(env_kwargs or {}))
        except gym.error.Error as exc:
            raise RecordingError(f"record(): gymnasium cannot make {env!r}: {exc}") from None
    elif env_kwargs:
        raise RecordingError("record(): env_kwargs= applies only when env is an id for gym.make")
    try:
        return _record(env, policy, name, episodes, steps, seed, info_keys, writer_args, RecordEpisodes)
    finally:
        if owned:
            env.close()


def _check_record_args(
    policy: Any, episodes: int | None, steps: int | None, seed: int | None, episodes_per_commit: int
) -> None:
    """record()'s own arguments (the writer checks its settings)."""
    for label, value in (
        ("episodes", episodes),
        ("steps", steps),
        ("episodes_per_commit", episodes_per_commit),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RecordingError(f"record(): {label}={value!r} is not a positive integer")
    if (episodes is None) == (steps is None):
        raise RecordingError(
            "record() takes exactly one of episodes= and steps=",
            hint="e.g. record(env, policy, name='mine', episodes=10)",
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise RecordingError(f"record(): seed={seed!r} is not a non-negative integer")
    # episode i is reset with seed + i; steps=N makes at most N episodes
    most = cast(int, episodes if episodes is not None else steps)  # exactly one, checked above
    if seed is not None and seed + most - 1 >= 2**64:
        raise RecordingError(
            f"record(): seed={seed} leaves no room for {most} episode seeds below 2**64 "
            f"(episode i is reset with seed + i, kept in 64 bits; "
            f"{'episodes' if episodes is not None else 'steps'}={most} may make {most} episodes)",
            hint="pick a smaller seed",
        )
    if policy is not None and not callable(policy):
        raise RecordingError(
            f"record(): policy is a {type(policy).__name__}, not a callable observation -> action",
            hint="pass a function (or None for random actions)",
        )


def _record(
    env: Any,
    policy: Callable[[Any], Any] | None,
    name: str,
    episodes: int | None,
    steps: int | None,
    seed: int | None,
    info_keys: Sequence[str] | str | None,
    writer_args: dict[str, Any],
    wrapper: type[RecordEpisodes],
) -> Dataset:
    from rlds_cli.cache.opening import open_dataset  # the cache name just written

    if policy is None:
        space = env.action_space
        if seed is not None:
            space.seed(seed)
        policy = _random_policy(space)
    # spaces and info_keys are checked before anything is created
    wrapper(env, _NoSink(), info_keys=info_keys)
    with recording_writer(env, name, policy=policy, recorder="rlds_cli.record", **writer_args) as w:
        recorder = wrapper(env, w, info_keys=info_keys)
        _run(recorder, policy, episodes, steps, seed)
        recorder.finish_episode()  # the step budget cut an episode: truncated
    return open_dataset(name, root=writer_args["root"])


def _random_policy(space: Any) -> Callable[[Any], Any]:
    def random_policy(observation: Any) -> Any:
        return space.sample()

    return random_policy


class _NoSink:
    def add_episode(self, episode: Any) -> None:
        raise AssertionError("the probe recorder commits nothing")


def _run(
    recorder: RecordEpisodes,
    policy: Callable[[Any], Any],
    episodes: int | None,
    steps: int | None,
    seed: int | None,
) -> None:
    finished = taken = 0
    i = 0
    while (episodes is None or finished < episodes) and (steps is None or taken < steps):
        obs, _ = recorder.reset(seed=None if seed is None else seed + i)
        i += 1
        while True:
            obs, _, terminated, truncated, _ = recorder.step(policy(obs))
            taken += 1
            if terminated or truncated:
                finished += 1
                break
            if steps is not None and taken >= steps:
                break


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
            # raises before stepping: the environment is not advanced
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
