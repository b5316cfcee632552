"""One Gen-DGRL trajectory (its dict of arrays) -> checked arrays -> episodes: frames cast to
uint8 only where lossless, split after every ``done``, the last frame used as the final
observation only where no reset followed (the rules of :mod:`rlds_cli.formats.gen_dgrl.reader`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.episode_schema import Episode
from rlds_cli.formats.gen_dgrl.files import REQUIRED_KEYS, TRAJECTORY_KEYS
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
