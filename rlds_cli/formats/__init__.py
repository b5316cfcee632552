"""Source format readers, found by name through a lazy registry, and format auto-detection.

:data:`READERS` maps a format name to ``"module:Class"`` (a :class:`~rlds_cli.formats.base.Reader`),
imported only when that format is used or detection asks it, so h5py stays out of ``rlds --help``.
Each reader recognises its own files (``sniff``); this module asks them in order. Other packages
add readers through the ``rlds_cli.readers`` entry-point group.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import cast

from rlds_cli._util.lazy import resolve
from rlds_cli.errors import SourceFormatError, SourceNotReadableError, UnknownFormatError
from rlds_cli.formats.base import Reader
from rlds_cli.formats.hdf5_util import HDF5_SUFFIXES, hdf5_top_keys, is_hdf5_name
from rlds_cli.formats.npz_util import npz_names

READERS: dict[str, str] = {
    "d4rl": "rlds_cli.formats.d4rl:D4RLReader",
    "minari": "rlds_cli.formats.minari:MinariReader",
    "roboset": "rlds_cli.formats.roboset:RobosetReader",
    "ogbench": "rlds_cli.formats.ogbench:OGBenchReader",
    "amago": "rlds_cli.formats.amago:AmagoReader",
    "torchrl": "rlds_cli.formats.torchrl_memmap:TorchRLMemmapReader",
    "lerobot": "rlds_cli.formats.lerobot:LeRobotReader",
    "rlds": "rlds_cli.formats.rlds_tfrecord.reader:RldsTFRecordReader",
    "vd4rl": "rlds_cli.formats.vd4rl:VD4RLReader",
    "atari_dqn": "rlds_cli.formats.atari_dqn.reader:AtariDQNReader",
    "gen_dgrl": "rlds_cli.formats.gen_dgrl:GenDGRLReader",
    "robomimic": "rlds_cli.formats.robomimic:RobomimicReader",
    "replay_buffer": "rlds_cli.formats.replay_buffer:ReplayBufferReader",
}

#: The order in which formats are asked whether a path is theirs (:meth:`Reader.sniff`): the more
#: specific rules first (an HDF5 file with ``Trial`` groups is Roboset's, even with D4RL's keys; one
#: with ``data/demo_*`` groups is robomimic's); plugins after. ``replay_buffer`` precedes the HDF5
#: and ``.npz`` formats: its check reads directory entries or a zip's index only.
DETECTION_ORDER = (
    "rlds", "atari_dqn", "vd4rl", "gen_dgrl", "lerobot", "replay_buffer", "torchrl", "roboset", "robomimic",
    "minari", "amago", "d4rl", "ogbench",
)  # fmt: skip

#: What kinds of path (:func:`path_kind`) each built-in format's ``sniff`` can recognise; detection
#: imports only the readers that may claim the path (importing all cost ~65 ms of a first
#: `rlds download`).
SNIFFED_KINDS: dict[str, frozenset[str]] = {
    fmt: frozenset(kinds.split())
    for fmt, kinds in {
        "rlds": "folder other",  # features.json, *.tfrecord* shards
        "atari_dqn": "folder other",  # *_ckpt.N.gz
        "vd4rl": "folder hdf5 npz",
        "gen_dgrl": "folder npz other",  # tar archives, .npy
        "lerobot": "folder other",  # meta/info.json
        "replay_buffer": "folder other",  # .zip
        "torchrl": "folder",
        "roboset": "hdf5",
        "robomimic": "hdf5",
        "minari": "folder hdf5 other",  # metadata.json
        "amago": "npz other",  # .traj
        "d4rl": "hdf5 npz",
        "ogbench": "npz",
    }.items()
}


def path_kind(path: Path) -> str:
    """``"folder"``, ``"hdf5"`` (named ``.h5``/``.hdf5``), ``"npz"`` (named ``.npz``) or ``"other"``."""
    if path.is_dir():
        return "folder"
    if is_hdf5_name(path):
        return "hdf5"
    return "npz" if path.name.lower().endswith(".npz") else "other"


#: Entry-point group for other packages' readers: ``name = "module:Class"`` (a
#: :class:`~rlds_cli.formats.base.Reader`). Looked up only for a name that is not built in, or when
#: no built-in format recognises a source.
ENTRY_POINT_GROUP = "rlds_cli.readers"

#: Archive suffixes unpacked before conversion: a copy of
#: ``rlds_cli.formats.archives.ARCHIVE_SUFFIXES``, so that detection does not import it.
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")


def _plugins() -> dict[str, EntryPoint]:
    """Readers of other packages, by format name (a built-in name cannot be taken over)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in READERS}


def known_formats() -> list[str]:
    """Names accepted by ``--format``: the built-in formats and those of installed plugins."""
    return sorted({*READERS, *_plugins()})


def reader_class(format_name: str) -> type[Reader]:
    """The reader class registered for ``format_name`` (built in, or through
    :data:`ENTRY_POINT_GROUP`).

    Raises:
        UnknownFormatError: No such format, or a plugin's entry point that cannot be loaded (its
            module or a module it imports is missing, its import fails) or names something that
            is not a :class:`~rlds_cli.formats.base.Reader`; the message names the plugin.
    """
    if format_name in READERS:
        cls = resolve(READERS, format_name, what="source format", error=UnknownFormatError)
        return cast(type[Reader], cls)
    plugin = _plugins().get(format_name)
    if plugin is None:
        raise UnknownFormatError(
            f"unknown source format {format_name!r}",
            hint=f"known formats: {', '.join(known_formats())}",
        )
    return _load_plugin(plugin)


def _load_plugin(plugin: EntryPoint) -> type[Reader]:
    """The reader class ``plugin`` names, imported on call.

    Raises:
        UnknownFormatError: It cannot be used; the message names the plugin, its entry point and why."""
    try:
        cls = plugin.load()
    except Exception as exc:  # another package's import may raise anything
        raise UnknownFormatError(
            f"reader plugin {plugin.name!r} ({ENTRY_POINT_GROUP} entry point {plugin.value} of the "
            f"package {_dist_name(plugin)}) cannot be loaded: {_load_failure(exc)}",
            hint=f"reinstall the package {_dist_name(plugin)} with what it needs, or uninstall it",
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Reader)):
        raise UnknownFormatError(
            f"format {plugin.name!r} of the {ENTRY_POINT_GROUP} entry points is {plugin.value}, "
            "which is not a subclass of rlds_cli.formats.base.Reader",
            hint=f"fix the plugin's entry point, or uninstall the package {_dist_name(plugin)}",
        )
    return cls


def _load_failure(exc: Exception) -> str:
    """Why an entry point's import failed, in words: the missing module by name, else the error."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"module {exc.name!r} is not installed"
    return f"{type(exc).__name__}: {exc}"


def _dist_name(plugin: EntryPoint) -> str:
    return plugin.dist.name if plugin.dist is not None else "that provides it"


def _skipped_plugin(message: str, hint: str) -> None:
    """Warn that detection goes on without a plugin (:func:`warnings.warn`: one ``warning:`` line, once
    per message and process)."""
    warnings.warn(f"{message}; format detection goes on without it ({hint})", UserWarning, stacklevel=2)


def sniff_format(path: Path) -> str | None:
    """The first format that recognises ``path`` (built in, in :data:`DETECTION_ORDER` among those that
    may claim its kind, then plugins), or ``None``.

    A plugin that cannot be loaded, or whose ``sniff`` raises, is skipped with a warning naming it.
    """
    kind = path_kind(path)
    for fmt in DETECTION_ORDER:
        if kind in SNIFFED_KINDS[fmt] and reader_class(fmt).sniff(path):
            return fmt
    for fmt, plugin in sorted(_plugins().items()):
        try:
            cls = _load_plugin(plugin)
        except UnknownFormatError as exc:
            _skipped_plugin(exc.message, exc.hint)
            continue
        try:
            recognised = cls.sniff(path)
        except Exception as exc:  # the plugin's code, on a file that may be of any format
            _skipped_plugin(
                f"reader plugin {fmt!r} failed on {path}: {type(exc).__name__}: {exc}",
                f"fix or uninstall the package {_dist_name(plugin)}",
            )
            continue
        if recognised:
            return fmt
    return None


def is_archive(path: Path) -> bool:
    """Whether ``path`` is a file with an archive suffix (``.zip``, ``.tar``, ``.tar.gz``, ...)."""
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def source_files(format_name: str, paths: Sequence[Path]) -> list[Path]:
    """The files a conversion of ``paths`` in ``format_name`` reads, in reading order."""
    reader = reader_class(format_name)
    files = reader.source_files(list(paths))
    if not files:
        raise SourceFormatError(
            f"{paths[0]} holds no {format_name} source files",
            hint=f"the {format_name} format reads {reader.expected_files}; check the path, or pass --format "
            f"(known formats: {', '.join(known_formats())})",
        )
    for f in files:  # fail early, naming an unreadable file or a git-LFS pointer
        try:
            _refuse_lfs_pointer(f)
        except PermissionError:
            raise SourceNotReadableError(f"cannot read source file {f}: permission denied") from None
    return files


#: How a git-LFS pointer file begins (a clone without git-lfs holds these in place of the files).
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def _refuse_lfs_pointer(path: Path) -> None:
    """Raise :class:`SourceFormatError` when ``path`` is a git-LFS pointer; ``OSError`` when it cannot
    be read."""
    with open(path, "rb") as fh:
        if fh.read(len(LFS_POINTER)) != LFS_POINTER:
            return
    raise SourceFormatError(
        f"{path} is a git-LFS pointer ({path.stat().st_size} bytes), not the file it stands for",
        hint="fetch the file itself: 'git lfs pull' in the clone (with git-lfs installed), or download "
        "it from its repo (an hf:// URL for a Hugging Face repo)",
    )


def _unknown(path: Path, why: str = "") -> UnknownFormatError:
    return UnknownFormatError(
        f"cannot tell the format of {path}{': ' + why if why else ''}",
        hint=f"pass --format (known formats: {', '.join(known_formats())}; archives: .zip, .tar, .tar.gz, "
        ".tar.bz2, .tar.xz)",
    )


def _detect_file(path: Path) -> str:
    with contextlib.suppress(OSError):  # an unreadable file is named by the sniffers, or by the reader
        _refuse_lfs_pointer(path)
    sniffed = sniff_format(path)
    if sniffed is not None:
        return sniffed
    if is_hdf5_name(path):
        keys = hdf5_top_keys(path) or ()
        why = f"an HDF5 file with none of the known layouts (top-level keys: {sorted(keys)[:8]})"
        raise _unknown(path, why)
    if path.name.lower().endswith(".npz"):
        names = npz_names(path)
        if names is None:
            raise SourceFormatError(f"{path}: not a readable .npz (zip) file (truncated or corrupt?)")
        raise _unknown(path, f"an .npz with none of the known layouts (keys: {sorted(names)[:8]})")
    raise _unknown(path)


def _detect_dir(path: Path) -> str:
    sniffed = sniff_format(path)
    if sniffed is not None:
        return sniffed
    # a folder of files: of one format, whichever recognises them
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise _unknown(path, "an empty directory")
    kinds = set()
    for f in files:
        low = f.name.lower()
        if low == "metadata.json" and f.parent.name == "data":  # a Minari dataset below (a namespace)
            kinds.add("minari")
        elif low.endswith((*HDF5_SUFFIXES, ".npz", ".traj")):
            kinds.add(_detect_file(f))
    # an RLDS/TFDS dataset folder below (name/version/), as on the Hub; several are refused
    from rlds_cli.formats.rlds_tfrecord.reader import nested_dataset_folder

    if nested_dataset_folder(path, [f.relative_to(path).as_posix() for f in files]) is not None:
        kinds.add("rlds")
    # a diffusion_policy / UMI replay buffer below (an unpacked pusht.zip): its reader finds it
    from rlds_cli.formats.replay_buffer import nested_store

    if nested_store(path) is not None:
        kinds.add("replay_buffer")
    if len(kinds) == 1:
        return kinds.pop()
    if not kinds:
        raise _unknown(
            path,
            "no .h5/.hdf5/.npz/.traj files, Minari metadata.json, RLDS/TFDS dataset folder or replay "
            "buffer inside",
        )
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
