"""Roboset / RoboHive HDF5 files (``Trial<N>`` groups), one episode per trial.

RoboHive stores a rollout of horizon ``h`` as ``L = h + 1`` time-aligned rows: row ``t`` holds
``observations[t]``, ``actions[t]`` (taken from it), and the ``rewards``, ``done`` and
``env_infos`` returned with ``observations[t]`` (row 0's from the reset). The last row's action is
NaN. Rules (``docs/formats.md``):

* A trial of ``L`` rows is ``L - 1`` transitions: step ``t`` is
  ``(observations[t], actions[t]) -> observations[t + 1]`` with reward ``rewards[t + 1]`` and
  ``terminated = done[t + 1]``. The last row is the final observation; its NaN action and the
  reset row's reward are not stored (TorchRL keeps the NaN action and zero-fills the final next
  observation; rlds makes nothing up).
* ``env_infos/*`` and ``time`` are row-aligned like observations: stored once as ``info/*`` and
  ``time``, read back at t and t + 1 (``next/info/*``).
* A trial ends terminated when ``done`` is set on its last row, else truncated (the horizon);
  ``done`` on an earlier row is an error.
* Episodes never span files; files are read in sorted order (a directory) or as given, trials by
  number. Each episode's file is in ``source_metadata.npz`` (``roboset/episode_file``, an index
  into ``source.files``).
* Files are read in parallel worker processes (``workers``), results kept in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Episode,
    EpisodeSchema,
    Reader,
    ReaderOptions,
    StepBlock,
    clean_keys,
    is_text,
    renamed_note,
    text_note,
)
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.folders import default_workers, ordered_map
from rlds_cli.formats.hdf5_util import hdf5_top_keys, is_hdf5_name, open_hdf5, read_error
from rlds_cli.formats.untrusted import require_numeric

_TRIAL_RE = re.compile(r"^Trial(\d+)$")
_REQUIRED = ("observations", "actions", "rewards", "done")
_KNOWN = {*_REQUIRED, "time"}


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Roboset file: an HDF5 file with ``Trial*`` groups at its root."""
    keys = hdf5_top_keys(path) if is_hdf5_name(path) else None
    return keys is not None and any(k.startswith("Trial") for k in keys)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The ``.h5``/``.hdf5`` files of a Roboset source, in reading order."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in (".h5", ".hdf5"))
        else:
            out.append(p)
    return out


def _ted_parts(path: str) -> tuple[str, ...]:
    """``env_infos/x`` -> the parts of ``info/x`` (cleaned by :func:`clean_keys`)."""
    name = path[len("env_infos/") :] if path.startswith("env_infos/") else path
    return ("info", *name.split("/"))


def _trials(f: Any, path: Path) -> list[tuple[int, str]]:
    import h5py

    trials = []
    for name in f:
        m = _TRIAL_RE.match(name)
        if m and isinstance(f[name], h5py.Group):
            trials.append((int(m.group(1)), name))
    if not trials:
        raise SourceFormatError(
            f"{path} has no Trial<N> groups (found: {sorted(f)[:6]}); is it a RoboHive-schema file?"
        )
    return sorted(trials)


def _read_group(group: Any, path: Path, name: str) -> dict[str, np.ndarray]:
    """Every dataset below a trial group, by ``/``-joined path."""
    import h5py

    data: dict[str, np.ndarray] = {}

    def visit(key: str, node: Any) -> None:
        if isinstance(node, h5py.Dataset):
            try:
                data[key] = np.asarray(node[()])
            except (OSError, RuntimeError) as exc:
                raise read_error(path, f"{name}/{key}", exc) from exc

    group.visititems(visit)
    return data


def read_file(arg: tuple[str, int]) -> tuple[list[Episode], int, int, list[str]]:
    """Read every trial of one file (runs in a worker process).

    Returns:
        The episodes, the number of source rows, the number of last-row actions that were
        not NaN (dropped all the same), and conversion notes (text columns dropped, keys renamed).
    """
    import h5py

    path = Path(arg[0])
    episodes: list[Episode] = []
    rows = non_nan_last = 0
    notes: list[str] = []
    with open_hdf5(path) as f:
        for number, name in _trials(f, path):
            group = f[name]
            label = f"{path}:{name}"
            missing = [k for k in _REQUIRED if not isinstance(group.get(k), h5py.Dataset)]
            if missing:
                raise SourceFormatError(
                    f"{label} has no {missing[0]!r} dataset (RoboHive schema needs {_REQUIRED})"
                )
            obs: dict[str, np.ndarray] = {}
            data = _read_group(group, path, name)
            unknown = sorted(k for k in data if k not in _KNOWN and not k.startswith("env_infos/"))
            if unknown:
                raise SourceFormatError(
                    f"{label}: unknown datasets {unknown} (not in the RoboHive schema: "
                    f"{', '.join(sorted(_KNOWN))}, env_infos/*)"
                )
            for key in sorted(_KNOWN & set(data)):  # untrusted input: numbers (or bools) only
                require_numeric(label, key, data[key].dtype)
            length = int(data["actions"].shape[0]) if data["actions"].ndim else 0
            for key, value in data.items():
                if value.ndim == 0 or value.shape[0] != length:
                    raise SourceFormatError(
                        f"{label}: {key!r} has {value.shape[0] if value.ndim else 0} rows, 'actions' has "
                        f"{length} (rows must be time-aligned)"
                    )
            rows += length
            done = data["done"].reshape(length) != 0
            early = np.flatnonzero(done[:-1])
            if len(early):
                raise SourceFormatError(f"{label}: 'done' is set on row {int(early[0])}, before the last row")
            last_action = data["actions"][-1:]
            if length and last_action.dtype.kind == "f" and not np.isnan(last_action).all():
                non_nan_last += 1
            t = length - 1
            obs["observation"] = data["observations"]
            infos: dict[str, tuple[str, ...]] = {}
            for key, value in data.items():
                if not key.startswith("env_infos/"):
                    continue
                if is_text(value.dtype):  # strings: never stored as object pointers
                    notes.append(text_note(key, value.dtype))
                else:
                    require_numeric(label, key, value.dtype)
                    infos[key] = _ted_parts(key)
            # one cleaner for every reader: distinct source names never share a key
            cleaned = clean_keys(infos)
            for key in infos:
                obs[cleaned[key]] = data[key]
            notes.append(renamed_note(cleaned, infos) or "")
            if "time" in data:
                obs["time"] = data["time"]
            steps = {
                "action": data["actions"][:t],
                "next/reward": _column(data["rewards"][1:]),
            }
            terminated = bool(done[-1]) if t > 0 else False
            episodes.append(Episode(label, obs, steps, terminated, source_id=number))
    return episodes, rows, non_nan_last, list(dict.fromkeys(n for n in notes if n))


@dataclass(frozen=True)
class RobosetOptions(ReaderOptions):
    """Options of :class:`RobosetReader` (its keyword arguments)."""

    workers: int | None = None


class RobosetReader(Reader):
    """Streams a set of Roboset (RoboHive schema) ``.h5`` files as :class:`StepBlock` s.

    Args:
        path: A ``.h5`` file, a directory of them, or a list of files.
        workers: Worker processes reading files (default: the cores for large sources, else 1).
    """

    format_name = "roboset"
    expected_files = ".h5/.hdf5 files whose groups are named Trial0, Trial1, ..."
    Options = RobosetOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(self, path: str | Path | Sequence[str | Path], *, workers: int | None = None) -> None:
        paths = [Path(p) for p in ([path] if isinstance(path, str | Path) else path)]
        self.path = paths[0]
        self.files = source_files(paths)
        self.report = ConversionReport(rules="roboset-v1")
        total_bytes = sum(f.stat().st_size for f in self.files)
        self.workers = workers if workers else default_workers(len(self.files), total_bytes)
        self._total = 0
        self._trials = 0
        for f in self.files:  # check every file opens and count rows before writing anything
            with open_hdf5(f) as h5:
                for _, name in _trials(h5, f):
                    self._trials += 1
                    actions = h5[name].get("actions")
                    self._total += int(actions.shape[0]) if actions is not None and actions.shape else 0
        self.report.source_rows = self._total
        self.report.expected = {"num_episodes": self._trials}
        self._episode_file: list[int] = []

    def total_rows(self) -> int:
        return self._total

    def source_metadata(self) -> dict[str, Any]:
        return {"roboset": {"files": [f.name for f in self.files], "trials": self._trials}}

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {"roboset/episode_file": np.asarray(self._episode_file, np.int64)}

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield every trial of every file, in file order then trial-number order."""
        packer = BlockPacker(admit=EpisodeSchema(self.report))
        non_nan = 0
        args = [(str(f), i) for i, f in enumerate(self.files)]
        for index, (episodes, rows, non_nan_last, notes) in enumerate(
            ordered_map(read_file, args, self.workers)
        ):
            non_nan += non_nan_last
            for note in notes:  # the same note from every trial is kept once
                if note not in self.report.notes:
                    self.report.notes.append(note)
            for ep in episodes:
                if ep.length:
                    self._episode_file.append(index)
                yield from packer.add(ep)
            self.report.dropped_rows += len(episodes)  # each trial's action-less last row
            if progress is not None:
                progress(rows)
        yield from packer.finish()
        self.report.notes.append(
            "each trial's last row is its final observation: its action (NaN in RoboHive files) and "
            "the reset row's reward are not transitions and are not stored"
        )
        if non_nan:
            self.report.notes.append(f"{non_nan} trial(s) had a last-row action that is not NaN; dropped too")
