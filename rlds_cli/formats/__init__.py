"""Source format readers, found by name through a lazy registry, and format auto-detection.

Each entry maps a format name to ``"module:Class"``; the module is imported only when that
format is used, so h5py and friends stay out of ``rlds --help``.
"""

from __future__ import annotations

import importlib
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlds_cli.errors import SourceFormatError, SourceNotReadableError, UnknownFormatError

READERS: dict[str, str] = {
    "d4rl": "rlds_cli.formats.d4rl:D4RLReader",
    "minari": "rlds_cli.formats.minari:MinariReader",
    "roboset": "rlds_cli.formats.roboset:RobosetReader",
    "ogbench": "rlds_cli.formats.ogbench:OGBenchReader",
    "amago": "rlds_cli.formats.amago:AmagoReader",
    "torchrl": "rlds_cli.formats.torchrl_memmap:TorchRLMemmapReader",
    "lerobot": "rlds_cli.formats.lerobot:LeRobotReader",
    "rlds": "rlds_cli.formats.rlds_tfrecord:RldsTFRecordReader",
    "vd4rl": "rlds_cli.formats.vd4rl:VD4RLReader",
    "atari_dqn": "rlds_cli.formats.atari_dqn:AtariDQNReader",
    "gen_dgrl": "rlds_cli.formats.gen_dgrl:GenDGRLReader",
}

#: Formats that recognise their own files and folders: ``"module:function"``, the function taking
#: a path (file or directory) and returning whether it is of that format. A sniffer is cheap,
#: imports nothing heavy at module level and never raises on a path of another format. They are
#: tried in this order, before the layout rules of the older formats below.
SNIFFERS: dict[str, str] = {
    "rlds": "rlds_cli.formats.rlds_tfrecord:sniff",
    "atari_dqn": "rlds_cli.formats.atari_dqn:sniff",
    "vd4rl": "rlds_cli.formats.vd4rl:sniff",
    "gen_dgrl": "rlds_cli.formats.gen_dgrl:sniff",
}

#: Archive suffixes that :mod:`rlds_cli.archives` unpacks before conversion (the same tuple as
#: ``rlds_cli.archives.ARCHIVE_SUFFIXES``, repeated so that detection does not import it).
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
_HDF5 = (".hdf5", ".h5")

#: What a source of each format looks like, said in hints (a wheel ships no docs/ to point at).
EXPECTED_FILES: dict[str, str] = {
    "d4rl": "one .hdf5/.h5 (or .npz) file with observations, actions, rewards and terminals",
    "minari": "a Minari dataset folder: data/metadata.json with data/main_data.hdf5 (or the "
    "numbered episode folders of an arrow/parquet dataset)",
    "roboset": ".h5/.hdf5 files whose groups are named Trial0, Trial1, ...",
    "ogbench": ".npz files with observations, actions and terminals",
    "amago": ".traj (or .npz) trajectory files with _OBS_KEY_* arrays, rews, dones and actions",
    "torchrl": "a TensorDict memmap folder (meta.json), or a replay-buffer dump holding storage/",
    "lerobot": "a LeRobot v3.0 or v2.1 dataset folder: meta/info.json (with codebase_version), data/, "
    "videos/",
    "rlds": "an RLDS/TFDS folder (Open X-Embodiment): features.json and *.tfrecord-NNNNN-of-NNNNN shards",
    "vd4rl": "V-D4RL data: Dreamer episode .npz files (image, action, reward, is_first, is_last) or a "
    "drqbc .hdf5 with observation, action, reward, discount and step_type",
    "atari_dqn": "a Dopamine replay_logs folder of gzip'd .npy files ($store$_observation_ckpt.N.gz, "
    "$store$_action_ckpt.N.gz, ..., add_count_ckpt.N.gz, invalid_range_ckpt.N.gz)",
    "gen_dgrl": "a Gen-DGRL (Procgen) .tar.xz of per-trajectory .npy (pickled dict) or .npz files with "
    "observations, actions, rewards and dones",
}


def sniff_format(path: Path) -> str | None:
    """The first format of :data:`SNIFFERS` that recognises ``path``, or ``None``."""
    for fmt, target in SNIFFERS.items():
        module, _, attr = target.partition(":")
        if getattr(importlib.import_module(module), attr)(path):
            return fmt
    return None


def known_formats() -> list[str]:
    """Names accepted by ``--format``."""
    return sorted(READERS)


def reader_class(format_name: str) -> Any:
    """The reader class registered for ``format_name``."""
    try:
        target = READERS[format_name]
    except KeyError:
        raise UnknownFormatError(
            f"unknown source format {format_name!r}",
            hint=f"known formats: {', '.join(known_formats())}",
        ) from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def is_archive(path: Path) -> bool:
    """Whether ``path`` is a file with an archive suffix (``.zip``, ``.tar``, ``.tar.gz``, ...)."""
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def source_files(format_name: str, paths: Sequence[Path]) -> list[Path]:
    """The files a conversion of ``paths`` in ``format_name`` reads, in reading order."""
    module = (
        importlib.import_module(READERS[format_name].partition(":")[0]) if format_name in READERS else None
    )
    finder = getattr(module, "source_files", None)
    if finder is not None:
        files = finder(list(paths))
    else:  # every file, a directory's in sorted order
        files = [
            f for p in paths for f in (sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p])
        ]
    if not files:
        expected = EXPECTED_FILES.get(format_name, "a file or folder of that format")
        raise SourceFormatError(
            f"{paths[0]} holds no {format_name} source files",
            hint=f"the {format_name} format reads {expected}; check the path, or pass --format "
            f"(known formats: {', '.join(known_formats())})",
        )
    for f in files:  # an unreadable file fails here, naming it, not midway through a conversion
        try:
            with open(f, "rb"):
                pass
        except PermissionError:
            raise SourceNotReadableError(f"cannot read source file {f}: permission denied") from None
    return files


def _unknown(path: Path, why: str = "") -> UnknownFormatError:
    return UnknownFormatError(
        f"cannot tell the format of {path}{': ' + why if why else ''}",
        hint=f"pass --format (known formats: {', '.join(known_formats())}; archives: .zip, .tar, .tar.gz, "
        ".tar.bz2, .tar.xz)",
    )


def _npz_keys(path: Path) -> list[str] | None:
    try:
        with zipfile.ZipFile(path) as z:
            return [n[:-4] if n.endswith(".npy") else n for n in z.namelist()]
    except (OSError, zipfile.BadZipFile):
        return None


def _detect_hdf5(path: Path) -> str:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            keys = list(f.keys())
    except OSError:
        # an HDF5 name that will not open: let the likeliest reader report why
        return "minari" if (path.name == "main_data.hdf5") else "d4rl"
    if any(k.startswith("Trial") for k in keys):
        return "roboset"
    if any(k.startswith("episode_") for k in keys):
        return "minari"
    # Any of D4RL's root datasets: a file missing one of them still goes to the D4RL reader,
    # whose error then names the missing key.
    if any(key in keys for key in ("observations", "actions", "rewards", "terminals")):
        return "d4rl"
    raise _unknown(path, f"an HDF5 file with none of the known layouts (top-level keys: {sorted(keys)[:8]})")


def _detect_npz(path: Path) -> str:
    keys = _npz_keys(path)
    if keys is None:
        raise SourceFormatError(f"{path}: not a readable .npz (zip) file (truncated or corrupt?)")
    if any(k.startswith("_OBS_KEY_") for k in keys) or {"rews", "dones"} <= set(keys):
        return "amago"
    # the D4RL layout in an .npz ('rlds export --to npz'): OGBench files have no rewards/timeouts
    if {"observations", "actions", "rewards", "terminals"} <= set(keys) and (
        "timeouts" in keys or "next_observations" in keys
    ):
        return "d4rl"
    if "observations" in keys and "terminals" in keys:
        return "ogbench"
    raise _unknown(path, f"an .npz with none of the known layouts (keys: {sorted(keys)[:8]})")


def _detect_file(path: Path) -> str:
    sniffed = sniff_format(path)
    if sniffed is not None:
        return sniffed
    name = path.name.lower()
    if name == "metadata.json":
        return "minari"
    if name == "info.json" and path.parent.name == "meta":
        from rlds_cli.formats.lerobot import is_lerobot

        if is_lerobot(path):
            return "lerobot"
    if name.endswith(_HDF5):
        return _detect_hdf5(path)
    if name.endswith(".npz"):
        return _detect_npz(path)
    if name.endswith(".traj"):
        return "amago"
    raise _unknown(path)


def _detect_dir(path: Path) -> str:
    sniffed = sniff_format(path)
    if sniffed is not None:
        return sniffed
    if (path / "meta" / "info.json").is_file():  # a LeRobot dataset (info.json has a codebase_version)
        from rlds_cli.formats.lerobot import is_lerobot

        if is_lerobot(path):
            return "lerobot"
    if (path / "meta.json").is_file() or (path / "storage" / "meta.json").is_file():  # a buffer dump
        from rlds_cli.formats.torchrl_memmap import is_tensordict_memmap

        if is_tensordict_memmap(path):
            return "torchrl"
    if (path / "data" / "metadata.json").is_file() or (path / "metadata.json").is_file():
        return "minari"
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise _unknown(path, "an empty directory")
    kinds = set()
    for f in files:
        low = f.name.lower()
        if low == "metadata.json" and f.parent.name == "data":  # a Minari dataset below (a namespace)
            kinds.add("minari")
        elif low.endswith((*_HDF5, ".npz", ".traj")):
            kinds.add(_detect_file(f))
    if len(kinds) == 1:
        return kinds.pop()
    if not kinds:
        raise _unknown(path, "no .h5/.hdf5/.npz/.traj files or Minari metadata.json inside")
    raise _unknown(path, f"files of several formats inside ({', '.join(sorted(kinds))})")


def detect_format(path: Path | Sequence[Path]) -> str:
    """Guess the format of a local source (a file, a directory, or a list of files).

    Raises:
        UnknownFormatError: Nothing matched; the message lists the known formats.
    """
    if not isinstance(path, Path):
        paths = list(path)
        kinds = {detect_format(p) for p in paths}
        if len(kinds) != 1:
            raise _unknown(paths[0], f"the files given are of several formats ({', '.join(sorted(kinds))})")
        return kinds.pop()
    if path.is_dir():
        return _detect_dir(path)
    return _detect_file(path)
