"""``rlds_cli.DatasetWriter``: write episodes into a growing dataset of the cache.

A growing dataset (``layout: "segmented"``, ``docs/cache-format.md``) is sealed segments and a
commit log. A writer validates each episode in the caller's thread (:mod:`rlds_cli.write.validate`)
and hands it to its commit thread (:mod:`rlds_cli.write.committer`), which commits
``episodes_per_commit`` of them, or every episode waiting, as one segment
(:func:`rlds_cli.write.segments.commit_segment`): visible to readers whole, at once; a writer
killed at any moment loses only what it had not committed. ``flush()`` waits until every episode
added is committed. Several writer processes append to one dataset at once; none waits for another.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.backends.frames import with_frames
from rlds_cli.cache.growing import DEFAULT_GRACE_SECONDS, creator_settings, growing_settings
from rlds_cli.cache.layout import SEGMENTED_LAYOUT
from rlds_cli.cache.manifest import Manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import DatasetExistsError, EpisodeFormatError, SchemaMismatchError
from rlds_cli.frames.codecs import FramesMode
from rlds_cli.write import segments
from rlds_cli.write.committer import Committer, SegmentSink
from rlds_cli.write.compact import try_compaction_lock
from rlds_cli.write.segments import wait_deleted
from rlds_cli.write.validate import (
    EpisodeColumns,
    check_schema,
    drop_extras,
    episode_columns,
    flatten,
    length,
    schema_fields,
    split,
)

log = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """One call at a time on a writer, so threads sharing it add whole episodes (the open
    episode's steps, the dataset's creation and the waiting episodes are per writer)."""

    @functools.wraps(method)
    def call(self: DatasetWriter, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


Mode = Literal["create", "append"]

#: Seconds between the starts of two commits of one writer, at the least (``commit_interval``).
DEFAULT_COMMIT_INTERVAL = 0.05


def _env_spec_json(env_spec: Any) -> Any:
    """A gymnasium ``EnvSpec`` (or its JSON, or a dict) as the JSON object Minari conversions
    keep under ``source.metadata.spaces.env_spec``."""
    if env_spec is None or isinstance(env_spec, dict):
        return env_spec
    if hasattr(env_spec, "to_json"):
        env_spec = env_spec.to_json()
    if isinstance(env_spec, str):
        try:
            return json.loads(env_spec)
        except ValueError:
            return env_spec
    raise TypeError(
        f"env_spec must be a gymnasium EnvSpec, its JSON or a dict, not {type(env_spec).__name__}"
    )


class DatasetWriter:
    """Write episodes into a growing dataset (create it, or append to it). A context manager.

    Args:
        name: The dataset's name in the cache.
        root: Cache root (``None``: ``$RLDS_HOME`` or the default).
        storage: ``"memmap"`` or ``"zarr"`` (appending: ``None`` takes the dataset's).
        mode: ``"create"`` (the name must be free) or ``"append"`` (a growing dataset of that
            name, created by the first commit when there is none yet).
        env_spec: The environment's gymnasium ``EnvSpec`` (or its JSON): kept in the manifest's
            ``source.metadata.spaces.env_spec``, where Minari conversions keep theirs.
        metadata: JSON-able facts about the data (kept in ``source.metadata``).
        capacity: Keep at most this many unprotected steps: older episodes are evicted first
            in, first out, after each commit (``None``: no limit).
        capacity_episodes: The same in episodes.
        min_size: Unprotected steps (those ``capacity`` counts: not a ``protected`` writer's)
            before the dataset counts as ready (``Dataset.ready``), or eviction begun (whole
            episodes may keep a full buffer a few steps under it). At most ``capacity``.
        min_total: Steps before the dataset counts as ready, protected ones included. Both
            must be reached; 0 (the default) for either: no such condition.
        protected: This writer's episodes are never evicted (demonstrations).
        episodes_per_commit: Episodes a commit waits for (1: each episode is committed, and
            visible to readers, one commit's time after it is added, or up to
            ``commit_interval`` more; more: fewer, larger segments and fewer fsyncs). Commits
            run on the writer's own thread; episodes that end while one is under way go
            together into the next (group commit).
        commit_interval: Minimum seconds between the starts of two commits; episodes that end
            in between go together into the next (0: a commit starts as soon as
            ``episodes_per_commit`` episodes wait). The default, 50 ms, bounds the commits a fast
            environment pays for (each holds the GIL ~0.5 ms) and keeps an episode visible ~50 ms
            after it ends; ``flush()`` and ``close()`` never wait for it.
        grace_seconds: How long the files of evicted or compacted segments are kept for readers
            of older views.
        schema: The dataset's keys as TED keys -> ``(shape, dtype)`` per step (what
            ``Dataset.fields`` returns); ``None``: from the first episode. Given, the dataset is
            created at once (empty) and every episode is checked against it.
        frames: How camera frames (``uint8`` observations of an image's shape, see
            :mod:`rlds_cli.frames.codecs`) are stored when this writer creates the dataset:
            ``keep`` (default) and ``raw`` as arrays, ``jpeg[:QUALITY]``, ``png`` or ``webp``
            encoded on the commit thread (on every core). Appending keeps the dataset's codecs;
            ``frames`` then sets the JPEG quality of what this writer encodes.

    The settings (capacity, min_size, min_total, grace) are the dataset's: fixed by its creator,
    read by every later writer.

    ``add_episode`` returns once the episode is checked and handed to the commit thread;
    :meth:`flush` (and :meth:`close`) return once every episode added is committed. A commit
    that fails there is raised by the writer's next call (:class:`~rlds_cli.errors.CommitFailedError`).
    """

    def __init__(
        self,
        name: str,
        *,
        root: CacheRoot | str | os.PathLike[str] | None = None,
        storage: str | None = None,
        mode: Mode = "create",
        env_spec: Any = None,
        metadata: dict[str, Any] | None = None,
        capacity: int | None = None,
        capacity_episodes: int | None = None,
        min_size: int = 0,
        min_total: int = 0,
        protected: bool = False,
        episodes_per_commit: int = 1,
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        schema: dict[Any, Any] | None = None,
        frames: FramesMode | str | None = None,
    ) -> None:
        self.frames = FramesMode.parse(frames)
        self._frames_asked = frames is not None
        if mode not in ("create", "append"):
            raise ValueError(f"mode must be 'create' or 'append', not {mode!r}")
        whole = isinstance(episodes_per_commit, int | np.integer) and not isinstance(
            episodes_per_commit, bool
        )
        if not whole or episodes_per_commit < 1:
            raise ValueError(
                f"episodes_per_commit must be a whole number of 1 or more, not {episodes_per_commit!r}"
            )
        if not commit_interval >= 0:
            raise ValueError(f"commit_interval must be 0 or more seconds, not {commit_interval!r}")
        self.cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
        from rlds_cli.cache.layout import validate_name

        self.name = validate_name(name)
        self.mode = mode
        if not isinstance(protected, bool | np.bool_):  # "no" is true: every episode kept for ever
            raise ValueError(f"protected must be True or False, not {protected!r}")
        self.protected = bool(protected)
        self.episodes_per_commit = episodes_per_commit
        self.commit_interval = float(commit_interval)
        self.fsync = settings.fsync_enabled()
        self.directory: Path = self.cache.dataset_dir(self.name)
        self._storage = storage
        growing = creator_settings(
            name,
            capacity=capacity,
            capacity_episodes=capacity_episodes,
            min_size=min_size,
            min_total=min_total,
            grace_seconds=grace_seconds,
        )
        meta = dict(metadata or {})
        spec = _env_spec_json(env_spec)
        if spec is not None:
            meta.setdefault("spaces", {})["env_spec"] = spec
        self._writer = segments.writer_identity()
        self._sink = SegmentSink(
            self.directory,
            protected=protected,
            fsync=self.fsync,
            writer=self._writer,
            try_lock=functools.partial(try_compaction_lock, self.cache, self.name),
            quality=self.frames.quality,
        )
        self._source: dict[str, Any] = {
            "format": "rlds-writer",
            "writer": self._writer,
            "metadata": meta,
            "growing": growing,
        }
        self.head: Manifest | None = None
        if self.cache.exists(self.name):
            if mode == "create":
                raise DatasetExistsError(
                    f"dataset {self.name!r} already exists at {self.directory}",
                    hint="open it with mode='append', or pick another name",
                )
            self._adopt(self.cache.manifest(self.name))
        if schema is not None:
            fields = schema_fields(schema)
            if self.head is None:
                self._create_with(fields)
            else:
                check_schema(fields, self.head.fields, self.name)
        self._lock = threading.RLock()
        self._steps: list[dict[str, np.ndarray]] = []
        self._tail: dict[str, np.ndarray] | None = None
        self._closed = False
        self._first_fields: dict[str, Any] | None = None  # the schema before the dataset exists
        self._committer = Committer(
            self._sink.commit, episodes_per_commit, name=self.name, commit_interval=self.commit_interval
        )
        # a writer dropped without close() commits its full batches, as one closed on an error
        self._finalizer = weakref.finalize(self, self._committer.finish, due_only=True)
        self._finalizer.atexit = False  # type: ignore[misc]  # at exit, the committer's own hook does it

    @property
    def episodes_written(self) -> int:
        """Episodes this writer committed."""
        return self._sink.episodes_written

    @property
    def steps_written(self) -> int:
        """Steps this writer committed."""
        return self._sink.steps_written

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # an error inside the block: full batches are committed, the rest dropped
            self._closed = True
            self._finalizer.detach()
            self._committer.finish(due_only=True)

    @_locked
    def close(self) -> None:
        """Commit every episode added and wait for it (raises a commit's error), and for the
        deletion of the retired segments this process renamed away. Steps of an episode that
        has not ended are dropped (logged): an episode is written whole or not at all."""
        if self._closed:
            return
        try:
            if self.head is None and self._first_fields is not None and self._committer.waiting:
                self._create_head(self._first_fields)
        finally:
            self._closed = True
            self._finalizer.detach()
            try:
                self._committer.finish(due_only=False)
            finally:
                wait_deleted()  # the retired segments this writer renamed away, deleted
        open_steps = len(self._steps) + (0 if self._tail is None else len(next(iter(self._tail.values()))))
        if open_steps:
            log.warning(
                "dataset %r: %d steps of an unfinished episode were not written", self.name, open_steps
            )

    @property
    def settings(self) -> dict[str, Any]:
        """The dataset's growing settings (capacity, capacity_episodes, min_size, min_total,
        grace_seconds)."""
        if self.head is not None:
            return growing_settings(self.head)
        return growing_settings(Manifest(self.name, "memmap", 0, 0, {}, source=self._source))

    # ------------------------------------------------------------------ adding

    @_locked
    def add_episode(self, episode: Any, *, copy: bool = True) -> None:
        """Add one whole episode: a mapping of TED keys (what ``Dataset.episode(i)`` returns;
        numpy arrays, torch tensors or a TensorDict; nested or tuple keys). Its last step, and
        only it, has ``next/terminated`` or ``next/truncated`` set. Checked whole before
        anything is written (:class:`~rlds_cli.errors.EpisodeFormatError`,
        :class:`~rlds_cli.errors.SchemaMismatchError`).

        The episode is copied (its commit comes later, on the commit thread), so the caller
        may reuse its arrays at once. ``copy=False`` hands the arrays over instead: the caller
        promises not to change them until they are committed (e.g. arrays built for this call
        alone, as the recorder's are), and the writer saves a copy of every frame."""
        self._check_open()
        self._add(episode_columns(flatten(episode)), copy=copy)

    @_locked
    def add_step(
        self,
        *,
        observation: Any,
        action: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        next_observation: Any,
        **extra: Any,
    ) -> None:
        """Add one transition; the episode is committed when a step ends it (``terminated`` or
        ``truncated``). A reward given as a number (Python or numpy) is stored as float32, or in
        the float dtype the dataset already stores (a ``record()``'s float64). ``extra`` keys are
        stored per step (``info={"qpos": ...}`` becomes
        ``info/qpos``); a mapping observation becomes ``observation/<key>`` columns."""
        self._check_open()
        step: dict[str, Any] = {
            "observation": observation,
            "next/observation": next_observation,
            "action": action,
            **extra,
        }
        for key, value in (("next/terminated", terminated), ("next/truncated", truncated)):
            flag = np.asarray(value)
            if flag.dtype != np.bool_ or flag.size != 1:
                raise EpisodeFormatError(f"add_step: {key!r} must be one bool, got {flag.dtype} {flag.shape}")
            step[key] = flag.reshape(1)
        if isinstance(reward, np.bool_):  # as a Python bool is: a number
            reward = bool(reward)
        if isinstance(reward, int | float):  # a number: float32, or the dataset's float dtype
            stored = self.head.fields.get("next/reward") if self.head is not None else None
            kind = np.dtype(stored.dtype) if stored is not None else np.dtype(np.float32)
            with np.errstate(over="ignore"):  # refused below, by name
                r = np.asarray(reward, dtype=kind if kind.kind == "f" else np.float32)
            if math.isfinite(reward) and not np.isfinite(r):
                raise EpisodeFormatError(
                    f"add_step: the reward {reward!r} overflows {r.dtype} (it would be stored as {r})",
                    hint="scale the rewards, or give them as np.float64 so the dataset stores float64",
                )
        else:
            r = np.asarray(reward)
        if r.size != 1:
            raise EpisodeFormatError(
                f"add_step: 'next/reward' must be one number, got shape {r.shape}",
                hint="a reward of several values: pass it as an extra key (info/rewards=...) and "
                "its sum or the one to learn from as reward",
            )
        step["next/reward"] = r.reshape(1)
        # copied: an env may hand out the same observation array every step, refilled in place
        row = {k: np.array(v) for k, v in flatten(step, "step").items()}
        if self._steps:  # refused before it joins: the episode's earlier steps stay as they are
            first = {k: v[None] for k, v in self._steps[0].items()}  # one row each
            _same_rows(
                first, {k: v[None] for k, v in row.items()}, "add_step: this step", "the episode's first step"
            )
        self._steps.append(row)
        if step["next/terminated"][0] or step["next/truncated"][0]:
            rows, self._steps = self._steps, []
            keys = rows[0].keys()
            self._add(  # np.stack made new arrays: nothing of the caller's to copy
                episode_columns({k: np.stack([r[k] for r in rows]) for k in keys}, "episode (add_step)"),
                copy=False,
            )

    @_locked
    def extend(self, batch: Any) -> int:
        """Add a run of consecutive steps (TED layout; e.g. a TorchRL collector's rollout
        TensorDict, reshaped to one time axis). Every episode that ends in it is committed;
        the steps after the last end are kept for the next ``extend``. TorchRL's root
        ``done``/``terminated``/``truncated`` and ``collector/`` keys are ignored. Returns the
        number of episodes completed."""
        self._check_open()
        cols = drop_extras(flatten(batch, "batch"))
        length(cols, "extend: the batch")  # rows checked before the open episode's are joined
        if self._tail is not None:
            first = {k: v[:1] for k, v in self._tail.items()}
            _same_rows(
                first, {k: v[:1] for k, v in cols.items()}, "extend: the batch", "the open episode's steps"
            )
            cols = {k: np.concatenate([self._tail[k], v]) for k, v in cols.items()}
        ends, n = split(cols, "batch")
        episodes = []
        start = 0
        for end in ends:
            episodes.append(episode_columns({k: v[start : end + 1] for k, v in cols.items()}, "batch"))
            start = end + 1
        # the open episode's steps are copied: they may be views of the caller's batch, which
        # it may refill before the next extend (a collector's reused buffer)
        self._tail = {k: v[start:].copy() for k, v in cols.items()} if start < n else None
        for ep in episodes:
            self._add(ep)
        return len(episodes)

    def _add(self, episode: EpisodeColumns, *, copy: bool = True) -> None:
        fields = episode.fields()
        schema = self.head.fields if self.head is not None else self._first_fields
        if schema is None:
            self._first_fields = fields
        else:
            check_schema(fields, schema, self.name)
        if copy:  # the commit comes later, on its thread: the caller may reuse its arrays
            episode = episode.owned()
        if self.head is None and self._committer.waiting + 1 >= self.episodes_per_commit:
            self._create_head(fields)  # the first commit is due: the dataset is made now
        self._committer.add(episode)

    def _create_head(self, fields: dict[str, Any]) -> None:
        """Make the dataset before its first commit; on failure (e.g. another writer made it
        meanwhile with other keys) the episodes waiting for it are dropped."""
        try:
            self._create_with(fields)
        except BaseException:
            self._committer.discard()
            self._first_fields = None
            raise

    def _check_open(self) -> None:
        """Before a call changes anything: ``RuntimeError`` if the writer is closed; a commit
        that failed since the last call is raised now (the call adds nothing)."""
        if self._closed:
            raise RuntimeError(f"the writer of dataset {self.name!r} is closed")
        self._committer.check()

    # ------------------------------------------------------------------ committing

    @_locked
    def flush(self) -> None:
        """Commit every episode added so far and wait until it is (visible to readers, and
        durable with fsync on). Raises :class:`~rlds_cli.errors.CommitFailedError` for a
        commit that failed."""
        self._check_open()
        if self.head is None and self._first_fields is not None and self._committer.waiting:
            self._create_head(self._first_fields)
        self._committer.flush()

    def _create_with(self, fields: dict[str, Any]) -> None:
        storage = self._storage or "memmap"
        get_backend(storage)  # an unknown name fails before anything is written
        try:
            stored = with_frames(fields, self.frames)
            self._adopt(segments.create_head(self.cache, self.name, storage, stored, self._source))
        except DatasetExistsError:
            if self.mode == "create":
                raise
            self._adopt(self.cache.manifest(self.name))  # another writer created it meanwhile
        assert self.head is not None
        check_schema(fields, self.head.fields, self.name)

    def _adopt(self, head: Manifest) -> None:
        if head.layout != SEGMENTED_LAYOUT:
            raise SchemaMismatchError(
                f"dataset {self.name!r} is a converted dataset ({head.layout}), not a growing one",
                hint="write to a new name; a converted dataset cannot be appended to",
            )
        if self._storage is not None and self._storage != head.backend:
            raise SchemaMismatchError(
                f"dataset {self.name!r} is stored as {head.backend}, the writer asked for {self._storage}"
            )
        self._check_same_environment(head)
        self.head = head
        self._sink.adopt(head)
        if self._frames_asked:  # the dataset's codecs stand: say so where this writer's differ
            plain = {k: replace(s, codec="raw", channels_first=False) for k, s in head.fields.items()}
            wanted = with_frames(plain, self.frames)
            other = [k for k, s in head.fields.items() if wanted[k].codec != s.codec]
            if other:
                log.warning(
                    "dataset %r stores %s as %s: this writer's frames=%r does not change it",
                    self.name,
                    other[0],
                    head.fields[other[0]].codec,
                    str(self.frames),
                )

    def _check_same_environment(self, head: Manifest) -> None:
        """Refuse an environment other than the one the dataset records (its id, arguments and
        time limit): the dataset's spec names the environment of every episode."""
        stored = (((head.source.get("metadata") or {}).get("spaces") or {}).get("env_spec")) or None
        given = self._source["metadata"].get("spaces", {}).get("env_spec")
        if not isinstance(stored, dict) or not isinstance(given, dict):
            return

        def facts(spec: dict[str, Any]) -> dict[str, Any]:  # how it renders changes no transition
            kwargs = {k: v for k, v in (spec.get("kwargs") or {}).items() if k != "render_mode"}
            limit = spec.get("max_episode_steps")
            return {"id": spec.get("id"), "kwargs": kwargs, "max_episode_steps": limit}

        old, new = facts(stored), facts(given)
        differ = [f for f in old if old[f] != new[f]]
        if differ:
            what = differ[0]
            raise SchemaMismatchError(
                f"dataset {self.name!r} records environment {old['id']!r} with {what} {old[what]!r}; "
                f"this writer's has {new[what]!r}",
                hint="record another environment into another dataset",
            )


def _same_rows(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], what: str, against: str) -> None:
    """Refuse rows of another key set, row shape or dtype than ``ref``'s (one episode's steps
    are stacked into one array a key: numpy would raise, or cast every row to the wider dtype)."""
    if got.keys() != ref.keys():
        raise EpisodeFormatError(
            f"{what} has other keys than {against}: {sorted(set(got) ^ set(ref))}",
            hint="every step of an episode has the same keys",
        )
    for key, value in got.items():
        if value.shape[1:] != ref[key].shape[1:] or value.dtype != ref[key].dtype:
            raise EpisodeFormatError(
                f"{what}: key {key!r} is {value.shape[1:]} {value.dtype}, {against} "
                f"{ref[key].shape[1:]} {ref[key].dtype}",
                hint="every step of an episode has the same shape and dtype a key",
            )


__all__ = ["DatasetWriter"]
