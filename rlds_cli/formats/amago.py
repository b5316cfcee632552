"""AMAGO trajectory folders: one ``.npz`` (or pickled ``.traj``) file per trajectory.

AMAGO saves a trajectory of ``L`` timesteps as ``_OBS_KEY_<name>`` arrays (``L`` rows), ``rews``,
``dones`` and ``actions`` (``L - 1`` rows: timesteps 1..L-1), ``time_idxs`` (``L``) and ``rl2s``
(previous reward and action per timestep). Rules (``docs/formats.md``):

* Step ``t`` is ``(obs[t], actions[t]) -> obs[t + 1]`` with ``rews[t]``; ``dones[t]`` is
  ``next/terminated``. AMAGO records termination only, so a trajectory whose last ``dones`` is
  false ends **truncated** (a time limit, or a ``save_every`` chunk); ``dones`` set before the
  last step is an error.
* A single ``_OBS_KEY_observation`` array becomes ``observation``; several become
  ``observation/<name>``. ``time_idxs`` is stored once as ``time_idx`` (observation-like);
  ``rl2s`` (the previous reward and action again) is not stored.
* Files are read in sorted path order (``buffer/fifo`` and ``buffer/protected`` alike) by worker
  processes; each file is one episode, and chunks of one long episode (separate files whose first
  timestep repeats the previous chunk's last) are not joined.
* ``.traj`` files are Python pickles (unpickling runs code): refused unless ``allow_pickle``
  (CLI ``--allow-pickle``) is given, and then ``amago`` must be importable.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceError, SourceFormatError
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Episode,
    EpisodeSchema,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    renamed_note,
)
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.folders import BadFiles, default_workers, folder_files, ordered_map
from rlds_cli.formats.npz_util import NpyStream, npz_keys, npz_names, open_npz
from rlds_cli.formats.untrusted import require_numeric

OBS_PREFIX = "_OBS_KEY_"
REQUIRED_KEYS = ("rews", "dones", "actions")
_KNOWN = {*REQUIRED_KEYS, "time_idxs", "rl2s"}


def sniff(path: Path) -> bool:
    """Whether ``path`` is an AMAGO trajectory: a ``.traj`` file, or an ``.npz`` with
    ``_OBS_KEY_*`` arrays or ``rews`` and ``dones``."""
    if path.name.lower().endswith(".traj"):
        return not path.is_dir()
    names = npz_names(path) or ()
    return any(k.startswith("_OBS_KEY_") for k in names) or {"rews", "dones"} <= set(names)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The trajectory files of an AMAGO source, sorted by path."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += folder_files(p, lambda q: q.suffix in (".npz", ".traj"))
        else:
            out.append(p)
    return out


def _readable(files: list[Path], bad: BadFiles) -> tuple[list[Path], str | None]:
    """``files`` whose ``.npz`` opens (a half-written one has no zip directory yet); an unreadable one
    stops the conversion or, when the user asked, is skipped and noted."""
    kept = []
    for f in files:
        if f.suffix == ".npz":
            try:
                open_npz(f).close()
            except SourceFormatError as exc:
                bad.handle(f, exc)
                continue
        kept.append(f)
    return kept, bad.note()


def _obs_key_map(obs_keys: list[str]) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """``_OBS_KEY_<name>`` array -> TED key (``observation`` alone, else ``observation/<name>``, cleaned
    by :func:`clean_keys`), and the key parts before cleaning."""
    if obs_keys == [f"{OBS_PREFIX}observation"]:
        return {obs_keys[0]: "observation"}, {obs_keys[0]: ("observation",)}
    wanted = {key: ("observation", *key[len(OBS_PREFIX) :].split("/")) for key in obs_keys}
    return clean_keys(wanted), wanted


def _episode_from_arrays(arrays: dict[str, np.ndarray], label: str, index: int) -> Episode:
    obs_keys = sorted(k for k in arrays if k.startswith(OBS_PREFIX))
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing or not obs_keys:
        what = missing[0] if missing else f"{OBS_PREFIX}*"
        raise SourceFormatError(
            f"{label} has no {what!r} array; an AMAGO trajectory needs {OBS_PREFIX}<name>, "
            f"{', '.join(REQUIRED_KEYS)} (found: {', '.join(sorted(arrays)) or 'nothing'})"
        )
    unknown = sorted(set(arrays) - _KNOWN - set(obs_keys))
    if unknown:
        raise SourceFormatError(f"{label}: unknown arrays {unknown} (not in AMAGO's trajectory layout)")
    for key in (*REQUIRED_KEYS, *obs_keys, *(["time_idxs"] if "time_idxs" in arrays else [])):
        require_numeric(label, key, arrays[key].dtype)  # untrusted input: numbers (or bools) only
    t = int(arrays["actions"].shape[0]) if arrays["actions"].ndim else -1
    for key in REQUIRED_KEYS:
        if arrays[key].ndim == 0 or arrays[key].shape[0] != t:
            raise SourceFormatError(
                f"{label}: {key!r} has {arrays[key].shape[0] if arrays[key].ndim else 0} rows, "
                f"'actions' has {t} (ragged trajectory)"
            )
    cleaned, _ = _obs_key_map(obs_keys)
    obs: dict[str, np.ndarray] = {cleaned[key]: arrays[key] for key in obs_keys}
    if "time_idxs" in arrays:
        obs["time_idx"] = arrays["time_idxs"]
    for key, value in obs.items():
        if value.ndim == 0 or value.shape[0] != t + 1:
            raise SourceFormatError(
                f"{label}: {key!r} has {value.shape[0] if value.ndim else 0} rows, expected {t + 1} "
                f"({t} steps + the final observation; ragged trajectory)"
            )
    dones = arrays["dones"].reshape(t) != 0
    early = np.flatnonzero(dones[:-1])
    if len(early):
        raise SourceFormatError(f"{label}: 'dones' is set at step {int(early[0])}, before the last step")
    steps = {"action": arrays["actions"], "next/reward": _column(arrays["rews"])}
    return Episode(label, obs, steps, bool(dones[-1]) if t > 0 else False, source_id=index)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    zf = open_npz(path)
    try:
        out = {}
        for key in npz_keys(zf):
            stream = NpyStream(zf, key, path)
            try:
                out[key] = np.array(stream.read(stream.shape[0] if stream.shape else 1))
            finally:
                stream.close()
        return out
    finally:
        zf.close()


def _read_traj(path: Path) -> dict[str, np.ndarray]:
    """A pickled ``amago.hindsight.Trajectory`` -> the ``.npz`` layout (``FrozenTraj``)."""
    try:
        with open(path, "rb") as fh:
            traj = pickle.load(fh)  # only with allow_pickle, see the module doc
    except ModuleNotFoundError as exc:
        raise SourceError(
            f"{path}: unpickling the trajectory needs the module {exc.name!r} (pip install amago)"
        ) from exc
    except Exception as exc:  # a damaged pickle raises many types
        raise SourceFormatError(
            f"{path}: not a readable pickled trajectory ({type(exc).__name__}: {exc})"
        ) from exc
    timesteps = getattr(traj, "timesteps", None)
    if not timesteps:
        raise SourceFormatError(f"{path}: the pickle holds no trajectory with timesteps")
    out: dict[str, np.ndarray] = {}
    for key in timesteps[0].obs:
        out[OBS_PREFIX + key] = np.concatenate([np.asarray(ts.obs[key]) for ts in timesteps])
    rest = timesteps[1:]

    def column(attr: str, dtype: Any) -> np.ndarray:
        return np.stack([np.asarray(getattr(ts, attr), dtype).reshape(-1) for ts in rest]).reshape(
            len(rest), -1
        )

    out["actions"] = column("prev_action", np.float32)
    out["rews"] = column("reward", np.float32)
    out["dones"] = column("terminal", bool)
    out["time_idxs"] = np.asarray(
        [int(np.asarray(ts.time_idx).reshape(-1)[0]) for ts in timesteps], np.int64
    )[:, None]
    return out


def read_trajectory(arg: tuple[str, int, bool]) -> Episode:
    """Read one trajectory file (runs in a worker process)."""
    path, index, allow_pickle = Path(arg[0]), arg[1], arg[2]
    if path.suffix == ".traj":
        if not allow_pickle:
            raise SourceError(
                f"{path} is a pickled .traj file; unpickling runs arbitrary code, so rlds refuses it",
                hint="pass --allow-pickle (options={'allow_pickle': True}) only if you trust the file, or "
                "save the trajectories as npz (AMAGO's default)",
            )
        arrays = _read_traj(path)
    else:
        arrays = _read_npz(path)
    return _episode_from_arrays(arrays, str(path), index)


@dataclass(frozen=True)
class AmagoOptions(ReaderOptions):
    """Options of :class:`AmagoReader` (its keyword arguments)."""

    workers: int | None = None
    allow_pickle: bool = False
    skip_bad_files: bool = False


class AmagoReader(Reader):
    """Streams an AMAGO trajectory folder as :class:`StepBlock` s.

    Args:
        path: A directory of trajectory files, one file, or a list of files.
        workers: Worker processes reading files (default: the cores for large sources, else 1).
        allow_pickle: Read pickled ``.traj`` files (unpickling runs code: trusted files only).
    """

    format_name = "amago"
    expected_files = ".traj (or .npz) trajectory files with _OBS_KEY_* arrays, rews, dones and actions"
    Options = AmagoOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        workers: int | None = None,
        allow_pickle: bool = False,
        skip_bad_files: bool = False,
    ) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.path = paths[0]
        self.files, skipped = _readable(source_files(paths), BadFiles(skip_bad_files))
        if not self.files:
            raise SourceFormatError(f"{self.path} holds no .npz or .traj trajectory files")
        self.allow_pickle = allow_pickle
        pickled = [f for f in self.files if f.suffix == ".traj"]
        if pickled and not allow_pickle:
            raise SourceError(
                f"{pickled[0]} is a pickled .traj file ({len(pickled)} in the source); unpickling runs "
                "arbitrary code, so rlds refuses it",
                hint="pass --allow-pickle (options={'allow_pickle': True}) only if you trust the files",
            )
        self.workers = (
            workers
            if workers
            else default_workers(len(self.files), sum(f.stat().st_size for f in self.files))
        )
        self.report = ConversionReport(rules="amago-v1")
        self.report.expected = {"num_episodes": len(self.files)}
        self.report.notes.append("'rl2s' is not stored: it repeats each step's previous reward and action")
        if skipped:
            self.report.notes.append(skipped)

    def total_rows(self) -> int:
        return len(self.files)

    def source_metadata(self) -> dict[str, Any]:
        return {"amago": {"trajectories": len(self.files)}}

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the trajectories in sorted file order (progress counts files)."""
        if self.files[0].suffix == ".npz":  # list renamed observation keys once, from the first file
            zf = open_npz(self.files[0])
            try:
                obs_keys = sorted(k for k in npz_keys(zf) if k.startswith(OBS_PREFIX))
            finally:
                zf.close()
            renamed = renamed_note(*_obs_key_map(obs_keys)) if obs_keys else None
            if renamed:
                self.report.notes.append(renamed)
        packer = BlockPacker(admit=EpisodeSchema(self.report))
        args = [(str(f), i, self.allow_pickle) for i, f in enumerate(self.files)]
        for ep in ordered_map(read_trajectory, args, self.workers, window=4 * self.workers):
            self.report.source_rows += ep.length + 1
            yield from packer.add(ep)
            if progress is not None:
                progress(1)
        yield from packer.finish()
