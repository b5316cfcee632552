"""The Gen-DGRL reader: each trajectory's dict of arrays -> checked arrays -> episodes
(:func:`trajectory_episodes`).

Layout: :mod:`~rlds_cli.formats.gen_dgrl.files`; archive reading:
:mod:`~rlds_cli.formats.gen_dgrl.files`. Rules (``docs/formats.md``, "Gen-DGRL"):

* **Pickles are read by a restricted unpickler** (:mod:`rlds_cli.formats.untrusted`): numpy
  arrays, checked dtypes and scalars only (numpy 1.x and 2.x spellings, protocols 2 to 5), and
  ``latin1`` encodes within a budget of the pickle's size. Any other global (``os.system``,
  ``builtins.eval``, a package's class) is refused before it is looked up, naming file, member and
  global. ``allow_pickle`` (CLI ``--allow-pickle``) lifts the restriction for trusted files.
* **Mapping** (rules ``gen-dgrl-v1``): ``observations`` -> ``observation`` (flat, uint8, stored
  layout: CHW); ``actions`` -> ``action`` as stored; ``rewards`` -> ``next/reward`` ``[T, 1]``;
  ``dones`` -> ``next/terminated`` (no truncation signal in Procgen data). Float frames become
  uint8 only when every value is a whole number in 0..255; anything else is refused naming the
  value and where.
* **The last observation is not used.** Procgen resets by itself, so ``observations[T]`` (recorded
  with ``done``) is the *next* episode's first frame: an episode ending with ``done`` repeats its
  last observation as final, ``final_known = false`` (counted in
  ``synthesized_final_observations``). A trajectory whose last ``done`` is false was cut without a
  reset: it ends **truncated** and ``observations[T]`` is its real final observation.
* **``done`` before the last step**: the trajectory is split there into episodes (the frame after
  a ``done`` starts the next one).
* The level seed (from the collector's file name) goes to ``gen_dgrl/episode_level_seed`` (-1 when
  the name has none or the file holds several episodes); ``gen_dgrl/episode_trajectory`` is the
  index of each episode's file or member.
* **Tar safety**: absolute paths or ``..``, links, devices, duplicate members, more members than
  :class:`rlds_cli.formats.archives.Limits` allows, a member over
  :data:`~rlds_cli.formats.gen_dgrl.files.MAX_MEMBER_BYTES`, or more bytes (or a higher ratio to
  archive bytes) than the archive limits are refused, naming archive and member. Nothing is
  written to disk; memory is one trajectory plus one block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock, from_layout
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.folders import BadFiles
from rlds_cli.formats.gen_dgrl import files as layout
from rlds_cli.formats.gen_dgrl.files import (
    REQUIRED_KEYS,
    TRAJECTORY_KEYS,
    TRAJECTORY_SUFFIXES,
    TarTrajectories,
    is_tar,
    level_seed,
    read_loose,
    source_files,
)
from rlds_cli.formats.packing import BlockPacker, Episode, EpisodeSchema
from rlds_cli.formats.untrusted import require_numeric, require_rows


def _array(value: Any, where: str, key: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # an object of a trusted pickle that is no array
        raise SourceFormatError(f"{where}: {key!r} is not an array ({type(value).__name__}: {exc})") from exc
    require_numeric(where, key, arr.dtype)
    require_rows(where, key, arr.shape)
    return arr


def _frames(obs: np.ndarray, where: str) -> np.ndarray:
    """Observations as uint8, only where the cast loses nothing (whole numbers in 0..255)."""
    if obs.dtype == np.uint8:
        return obs
    if obs.dtype.kind not in "biuf":
        raise SourceFormatError(
            f"{where}: 'observations' holds {obs.dtype} values; frames are whole numbers 0..255"
        )
    with np.errstate(invalid="ignore"):  # out-of-range floats cast to garbage: caught just below
        frames = obs.astype(np.uint8)
    bad = frames != obs  # NaN, fractions and values out of 0..255 all differ from their cast
    if bad.any():
        at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), obs.shape))
        raise SourceFormatError(
            f"{where}: 'observations' holds {obs[at].item()!r} at {at}; frames must be whole numbers in "
            f"0..255 to become uint8 ({obs.dtype} in the file)",
            hint="Procgen frames are uint8 images; rlds stores them as such and refuses a lossy cast",
        )
    return frames


def _dones(dones: np.ndarray, t: int, where: str) -> np.ndarray:
    if dones.ndim > 2 or (dones.ndim == 2 and dones.shape[1] != 1):
        raise SourceFormatError(f"{where}: 'dones' has shape {dones.shape}; expected ({t},) or ({t}, 1)")
    flat = dones.reshape(t)
    if flat.dtype.kind != "b":
        bad = (flat != 0) & (flat != 1)  # the collector may save them as float32 0.0/1.0
        if bad.any():
            row = int(np.argmax(bad))
            raise SourceFormatError(
                f"{where}: 'dones' holds {flat[row].item()!r} at row {row}; expected 0 or 1"
            )
    return flat != 0


@dataclass
class Trajectory:
    """One trajectory file as episodes.

    Attributes:
        episodes: Its episodes, split after every ``done`` (none for a trajectory without steps).
        unused_keys: Keys of the file other than the four trajectory arrays (not stored).
        observation_dtype: The dtype of ``observations`` in the file (before the uint8 cast).
    """

    episodes: list[Episode]
    unused_keys: list[str]
    observation_dtype: str


def trajectory_episodes(arrays: Any, where: str) -> Trajectory:
    """One trajectory dict (``observations``, ``actions``, ``rewards``, ``dones``) -> its episodes.

    Raises:
        SourceFormatError: Not a dict of the four arrays, arrays that are not numbers, ragged
            lengths, ``dones`` other than 0/1, frames that are not whole numbers in 0..255.
    """
    if not isinstance(arrays, Mapping) or not all(isinstance(k, str) for k in arrays):
        raise SourceFormatError(
            f"{where}: holds a {type(arrays).__name__}, not a dict of arrays ({TRAJECTORY_KEYS})"
        )
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing:
        raise SourceFormatError(
            f"{where} has no {missing[0]!r} array; a Gen-DGRL trajectory needs {TRAJECTORY_KEYS} "
            f"(found: {', '.join(sorted(arrays)) or 'nothing'})"
        )
    obs, actions, rewards, dones = (_array(arrays[k], where, k) for k in REQUIRED_KEYS)
    t = int(actions.shape[0])
    for key, arr in (("rewards", rewards), ("dones", dones)):
        if arr.shape[0] != t:
            raise SourceFormatError(
                f"{where}: {key!r} has {arr.shape[0]} rows, 'actions' has {t} (ragged trajectory)"
            )
    if obs.shape[0] != t + 1:
        raise SourceFormatError(
            f"{where}: 'observations' has {obs.shape[0]} rows, expected {t + 1} ({t} actions + the last "
            "observation; ragged trajectory)"
        )
    if rewards.ndim > 2 or (rewards.ndim == 2 and rewards.shape[1] != 1):
        raise SourceFormatError(f"{where}: 'rewards' has shape {rewards.shape}; expected ({t},) or ({t}, 1)")
    done = _dones(dones, t, where)
    frames = _frames(obs, where)
    rewards = _column(rewards)
    episodes: list[Episode] = []
    start = 0
    for end in np.flatnonzero(done).tolist():  # ends with a reset: the next frame is another episode's
        final = frames[end : end + 1]  # repeated: the frame recorded with done is not this episode's
        episodes.append(
            Episode(
                f"{where} (episode {len(episodes)})",
                {"observation": np.concatenate([frames[start : end + 1], final])},
                {"action": actions[start : end + 1], "next/reward": rewards[start : end + 1]},
                terminated=True,
                final_known=False,
            )
        )
        start = end + 1
    if start < t:  # cut without done: no reset happened, so the last frame is the real final one
        episodes.append(
            Episode(
                f"{where} (episode {len(episodes)})",
                {"observation": frames[start:]},
                {"action": actions[start:], "next/reward": rewards[start:]},
                terminated=False,
                final_known=True,
            )
        )
    return Trajectory(episodes, sorted(k for k in arrays if k not in REQUIRED_KEYS), obs.dtype.str)


RULES = "gen-dgrl-v1"


def _nbytes(ep: Episode) -> int:
    return sum(v.nbytes for v in ep.observations.values()) + sum(v.nbytes for v in ep.steps.values())


@dataclass(frozen=True)
class GenDGRLOptions(ReaderOptions):
    """Options of :class:`GenDGRLReader` (its keyword arguments)."""

    allow_pickle: bool = False
    skip_bad_files: bool = False


@from_layout(layout)  # sniff, source_files and EXPECTED_FILES: formats/gen_dgrl/files.py
class GenDGRLReader(Reader):
    """Streams Gen-DGRL (Procgen) trajectories as :class:`StepBlock` s.

    Args:
        path: A tar archive (``.tar.xz``; any tar compression) of trajectory files, one
            trajectory ``.npy``/``.npz``, a folder of them, or a list of archives and files.
        allow_pickle: Unpickle ``.npy`` trajectories without restriction (runs code: trusted
            files only). Without it, pickles may build numpy arrays and nothing else.
    """

    format_name = "gen_dgrl"
    Options = GenDGRLOptions

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        allow_pickle: bool = False,
        skip_bad_files: bool = False,
    ) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.path = paths[0]
        self.files = source_files(paths)
        if not self.files:
            raise SourceFormatError(f"{self.path} holds no .npy or .npz trajectory files")
        for f in self.files:
            if not (is_tar(f) or f.suffix.lower() in TRAJECTORY_SUFFIXES):
                raise SourceFormatError(
                    f"{f} is not a Gen-DGRL source file (a .tar.xz of trajectories, or a .npy/.npz "
                    "trajectory)"
                )
        self.allow_pickle = allow_pickle
        self._bad = BadFiles(skip_bad_files)  # loose files only: an archive is one file
        self.report = ConversionReport(rules=RULES)
        self._seeds: list[int] = []
        self._trajectory_of: list[int] = []
        self._trajectories = 0
        self._split = 0
        self._ignored: list[str] = []
        self._extra_keys: set[str] = set()
        self._observation_dtypes: set[str] = set()

    def total_rows(self) -> int:
        """Bytes of the source files (progress counts archive and file bytes read)."""
        return sum(f.stat().st_size for f in self.files)

    def source_metadata(self) -> dict[str, Any]:
        return {
            "gen_dgrl": {
                "trajectories": self._trajectories,
                "split_trajectories": self._split,
                "observation_dtypes_in_source": sorted(self._observation_dtypes),
                "ignored_members": len(self._ignored),
            }
        }

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {
            "gen_dgrl/episode_level_seed": np.asarray(self._seeds, np.int64),
            "gen_dgrl/episode_trajectory": np.asarray(self._trajectory_of, np.int64),
        }

    def _raw_trajectories(
        self, progress: Callable[[int], None] | None
    ) -> Iterator[tuple[str, str, Any, TarTrajectories | None]]:
        """``(where, name, decoded object, its archive or None)`` per trajectory file, in order."""
        for f in self.files:
            if is_tar(f):
                members = TarTrajectories(f, self.allow_pickle)
                done = 0
                try:
                    for where, name, decoded in members:
                        yield where, name, decoded, members
                        if progress is not None:
                            progress(members.consumed - done)
                        done = members.consumed
                finally:
                    self._ignored += [f"{f.name}: {name}" for name in members.ignored]
                if progress is not None:
                    progress(f.stat().st_size - done)
            else:
                try:
                    decoded = read_loose(f, self.allow_pickle)
                except SourceFormatError as exc:  # half-written or corrupt: stop, or skip if asked
                    self._bad.handle(f, exc)
                    continue
                yield str(f), f.name, decoded, None
                if progress is not None:
                    progress(f.stat().st_size)

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the trajectories in archive (or sorted file) order, split at every ``done``."""
        packer = BlockPacker(admit=EpisodeSchema(self.report))
        self._update_notes()
        for where, name, arrays, archive in self._raw_trajectories(progress):
            trajectory = trajectory_episodes(arrays, where)
            episodes = trajectory.episodes
            if archive is not None:  # what the archive makes rlds write, against its ratio limit
                archive.take(sum(_nbytes(ep) for ep in episodes), name)
            self._extra_keys.update(trajectory.unused_keys)
            self._observation_dtypes.add(np.dtype(trajectory.observation_dtype).name)
            self.report.source_rows += sum(ep.length for ep in episodes)
            if not episodes:
                self.report.dropped_episodes += 1  # one observation and no step
            seed = level_seed(name) if len(episodes) == 1 else -1
            self._split += len(episodes) > 1
            for ep in episodes:
                ep.source_id = len(self._seeds)
                self._seeds.append(seed)
                self._trajectory_of.append(self._trajectories)
                self.report.synthesized_final_observations += not ep.final_known
                yield from packer.add(ep)
            self._trajectories += 1
            self._update_notes()  # kept current: a subset (--episodes) may stop reading at any point
        self._update_notes()
        yield from packer.finish()

    def _update_notes(self) -> None:
        notes = [
            "Procgen resets by itself: each episode ending with 'dones' has its last observation repeated as "
            "its final observation (final_known false; the file's last frame is the next episode's first)",
            "'dones' is stored as next/terminated: Gen-DGRL records no truncation",
        ]
        converted = sorted(d for d in self._observation_dtypes if d != "uint8")
        if converted:
            notes.append(
                f"observations cast from {', '.join(converted)} to uint8 (every value a whole number 0..255)"
            )
        if self._split:
            notes.append(
                f"{self._split} trajectories hold several episodes ('dones' before the last step): split"
            )
        if self._extra_keys:
            notes.append(f"keys other than {TRAJECTORY_KEYS} are not stored: {sorted(self._extra_keys)}")
        if self._ignored:
            shown = ", ".join(self._ignored[:3]) + (
                f" and {len(self._ignored) - 3} more" if len(self._ignored) > 3 else ""
            )
            notes.append(f"{len(self._ignored)} archive members that are not .npy/.npz were ignored: {shown}")
        skipped = self._bad.note()
        if skipped:
            notes.append(skipped)
        self.report.notes[:] = notes
