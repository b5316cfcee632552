"""Gen-DGRL (Procgen) trajectories: a ``.tar.xz`` of one ``.npy`` or ``.npz`` file per trajectory,
streamed member by member, never unpacked to disk.

Gen-DGRL's files: the layout, ``sniff``, ``source_files``, the level seed in the collector's file
names, and reading them (an archive as a stream, a trajectory file into its dict of arrays).

The released archives (``<game>.tar.xz`` at ``dl.fbaipublicfiles.com/DGRL/Procgen/...``) hold one
file per trajectory, which TorchRL reads with ``np.load(member, allow_pickle=True).tolist()``: a
``.npy`` of a **pickled dict** (``np.save(f, dict)``, a 0-d object array). The gen_dgrl collector
writes ``np.savez_compressed`` episodes named
``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}.npz``. Both are read, in an archive or as loose
files. Keys: ``observations`` ``(T + 1, 3, 64, 64)``, ``actions`` ``(T, 1)``, ``rewards``
``(T, 1)``, ``dones`` ``(T,)``.

**Reading.** A trajectory file (an archive member's bytes or a loose file) is a ``.npy`` of a
pickled dict (read by :mod:`rlds_cli.formats.untrusted` unless ``allow_pickle``) or an ``.npz``
(each array streamed and checked).

The Gen-DGRL reader: each trajectory's dict of arrays -> checked arrays -> episodes
(:func:`trajectory_episodes`).

Rules (``docs/formats.md``, "Gen-DGRL"):

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
  :data:`~rlds_cli.formats.gen_dgrl.MAX_MEMBER_BYTES`, or more bytes (or a higher ratio to
  archive bytes) than the archive limits are refused, naming archive and member. Nothing is
  written to disk; memory is one trajectory plus one block.
"""

from __future__ import annotations

import io
import lzma
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

import numpy as np

from rlds_cli.errors import RldsError, SourceFormatError, SourceNotReadableError
from rlds_cli.formats.archives import TAR_SUFFIXES, Limits, UnsafeArchiveError
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Episode,
    EpisodeSchema,
    Reader,
    ReaderOptions,
    StepBlock,
)
from rlds_cli.formats.base import column as _column
from rlds_cli.formats.folders import BadFiles, folder_files
from rlds_cli.formats.npz_util import NpyStream, npz_keys, open_npz
from rlds_cli.formats.untrusted import UnsafeSourceError, require_numeric, require_rows, unpickle

__all__ = [
    "MAX_MEMBER_BYTES",
    "REQUIRED_KEYS",
    "RULES",
    "TAR_SUFFIXES",
    "TRAJECTORY_SUFFIXES",
    "GenDGRLOptions",
    "GenDGRLReader",
    "Trajectory",
    "sniff",
    "source_files",
    "trajectory_episodes",
]


REQUIRED_KEYS = ("observations", "actions", "rewards", "dones")


#: Trajectory files, loose or inside an archive.
TRAJECTORY_SUFFIXES = (".npy", ".npz")


#: How far into a pickled ``.npy`` sniffing looks for the ``observations`` key.
_SNIFF_BYTES = 256 << 10


#: Largest first ``.npz`` member sniffing reads to see its keys.
_SNIFF_NPZ_BYTES = 64 << 20


#: The collector's file names: ``{timestamp}_{idx}_{len}_{level_seed}_{return:.2f}``.
_COLLECTOR_NAME = re.compile(r"^[^_]+_(?P<index>\d+)_(?P<length>\d+)_(?P<seed>-?\d+)_[^_]+$")


TRAJECTORY_KEYS = "observations, actions, rewards and dones"


def is_tar(path: Path) -> bool:
    return path.name.lower().endswith(TAR_SUFFIXES)


def _sniff_npy(fh: IO[bytes]) -> bool:
    """A 0-d object array (a pickled object) whose pickle names ``observations`` early on."""
    version = np.lib.format.read_magic(fh)
    read_header = (
        np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read_header(fh)
    return bool(dtype.hasobject) and shape == () and b"observations" in fh.read(_SNIFF_BYTES)


def _sniff_npz(zf: zipfile.ZipFile) -> bool:
    """The four trajectory keys, and no ``terminals`` (that is OGBench's or D4RL's layout)."""
    keys = set(npz_keys(zf))
    return set(REQUIRED_KEYS) <= keys and "terminals" not in keys


def _sniff_tar(path: Path) -> bool:
    """Peek at the first file member only (directories before it are skipped)."""
    from rlds_cli.formats.archives import decompressing_reader

    with (
        open(path, "rb") as raw,
        decompressing_reader(raw) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tf,
    ):
        for seen, member in enumerate(tf):
            if member.isdir() and seen < 64:
                continue
            name = member.name.lower()
            fh = tf.extractfile(member) if member.isfile() else None
            if fh is None:
                return False
            if name.endswith(".npy"):
                return _sniff_npy(fh)
            if name.endswith(".npz") and member.size <= _SNIFF_NPZ_BYTES:
                with zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
                    return _sniff_npz(zf)
            return False
    return False


def _sniff_file(path: Path) -> bool:
    name = path.name.lower()
    if is_tar(path):
        return _sniff_tar(path)
    if name.endswith(".npy"):
        with open(path, "rb") as fh:
            return _sniff_npy(fh)
    if name.endswith(".npz"):
        with zipfile.ZipFile(path) as zf:
            return _sniff_npz(zf)
    return False


#: What a source of this format looks like, said in hints (the reader's ``expected_files``).
EXPECTED_FILES = (
    "a Gen-DGRL (Procgen) .tar.xz of per-trajectory .npy (pickled dict) or .npz files with "
    "observations, actions, rewards and dones"
)


def sniff(path: Path) -> bool:
    """Whether ``path`` is a Gen-DGRL source: a tar archive whose first file is a trajectory ``.npy``
    (pickled dict) or ``.npz``, such a loose file, or a folder of them (judged by its first
    trajectory file). Reads one member or file header; never raises."""
    try:
        if path.is_dir():
            files = source_files([path])
            return bool(files) and _sniff_file(files[0])
        return path.is_file() and _sniff_file(path)
    except Exception:  # any other format's file: not ours
        return False


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a Gen-DGRL conversion reads: each archive or file given, and a folder's
    ``.npy``/``.npz`` files in sorted path order."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += folder_files(p, lambda q: q.suffix.lower() in TRAJECTORY_SUFFIXES)
        else:
            out.append(p)
    return out


def level_seed(name: str) -> int:
    """The level seed of a collector file name (``..._{level_seed}_{return}``), else -1."""
    match = _COLLECTOR_NAME.match(PurePosixPath(name).stem)
    return int(match["seed"]) if match else -1


#: Largest trajectory member or loose ``.npy`` read (held in memory while decoded). A 1,000-step
#: Procgen episode (the time limit) of float32 frames is about 50 MB.
MAX_MEMBER_BYTES = 1 << 30


def _load_npy(data: bytes, where: str, allow_pickle: bool) -> Any:
    """A ``.npy`` holding a pickled object (``np.save(f, dict)``) -> the object."""
    fh = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fh)
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read_header(fh)
    except (ValueError, EOFError, OSError) as exc:
        raise SourceFormatError(f"{where}: not a readable .npy file (truncated or corrupt?): {exc}") from exc
    if not dtype.hasobject or shape != ():
        raise SourceFormatError(
            f"{where}: holds an array of shape {tuple(shape)} ({dtype}), not a pickled dict of one "
            f"trajectory ({TRAJECTORY_KEYS})",
            hint="Gen-DGRL .npy files are written by np.save(f, {'observations': ..., ...})",
        )
    obj = unpickle(fh, where, allow_pickle)
    # numpy pickles the 0-d object array itself; its one element is the dict (TorchRL's .tolist())
    return obj.item() if isinstance(obj, np.ndarray) and obj.shape == () and obj.dtype.hasobject else obj


def _load_npz(zf: zipfile.ZipFile, where: str) -> dict[str, np.ndarray | None]:
    """Every array of an ``.npz`` (streamed and checked by :class:`NpyStream`)."""
    for info in zf.infolist():
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # Python inflates bzip2 and LZMA members without an output bound
            raise UnsafeSourceError(
                f"{where}: array {info.filename!r} uses zip compression method {info.compress_type} (only "
                "stored and deflated arrays are read, as np.savez and np.savez_compressed write them)"
            )
    keys = npz_keys(zf)
    out: dict[str, np.ndarray | None] = {k: None for k in keys if k not in REQUIRED_KEYS}  # not stored
    label = cast(Path, where)  # NpyStream only prints it
    for key in (k for k in REQUIRED_KEYS if k in keys):
        stream = NpyStream(zf, key, label)
        try:
            require_rows(where, key, stream.shape)
            out[key] = stream.read(stream.shape[0])
        finally:
            stream.close()
    return out


def _npz_from_bytes(data: bytes, where: str) -> dict[str, np.ndarray | None]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise SourceFormatError(
            f"{where}: not a readable .npz (zip) file (truncated or corrupt?): {exc}"
        ) from exc
    with zf:
        return _load_npz(zf, where)


def decode_member(kind: str, data: bytes, where: str, allow_pickle: bool) -> Any:
    return _load_npy(data, where, allow_pickle) if kind == ".npy" else _npz_from_bytes(data, where)


def read_loose(path: Path, allow_pickle: bool) -> Any:
    """A loose trajectory file -> its dict of arrays."""
    kind = path.suffix.lower()
    if kind == ".npz":
        zf = open_npz(path)
        with zf:
            return _load_npz(zf, str(path))
    size = path.stat().st_size
    if size > MAX_MEMBER_BYTES:
        raise UnsafeSourceError(
            f"{path}: {size:,} bytes, over the {MAX_MEMBER_BYTES:,} a trajectory file may take "
            "(it is read whole)"
        )
    try:
        data = path.read_bytes()
    except PermissionError as exc:
        raise SourceNotReadableError(f"cannot read source file {path}: permission denied") from exc
    return _load_npy(data, str(path), allow_pickle)


#: Bytes read from an archive at a time, each counted against the archive limits before the next.
_CHUNK = 1 << 20


class TarTrajectories:
    """The trajectory members of one tar archive, read front to back as a stream.

    Every member is checked as :mod:`rlds_cli.formats.archives` checks it (same :class:`Limits` and
    member rules), then read into memory in chunks (at most :data:`MAX_MEMBER_BYTES`); nothing is
    written to disk. Every byte read counts against the total limit; the bytes kept (arrays as
    cached, frames as uint8) plus skipped members' bytes count against the ratio to archive bytes
    read. Kept rather than read bytes, because float32 Procgen frames are four times their uint8
    size and xz packs them very tightly.
    """

    def __init__(self, archive: Path, allow_pickle: bool) -> None:
        self.archive, self.allow_pickle = archive, allow_pickle
        self.limits = Limits()
        self.unpacked = 0  # member bytes read
        self.taken = 0  # bytes kept of trajectories, plus skipped members' bytes
        self.members = 0
        self.ignored: list[str] = []
        self.consumed = 0  # archive bytes read so far (progress, and the ratio)

    def _refuse(self, name: str, why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"{self.archive}: member {name!r} {why}; refused")

    def _check(self, member: tarfile.TarInfo, seen: set[str]) -> None:
        """Refuse what the unpacker refuses: escaping names, links, devices, duplicates, sizes."""
        name = member.name
        self.members += 1
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(f"{self.archive}: more than {self.limits.max_members} members")
        pure = PurePosixPath(name)
        if "\\" in name or "\x00" in name:
            raise self._refuse(name, "has a backslash or NUL in its name")
        if pure.is_absolute():
            raise self._refuse(name, "has an absolute path")
        if ".." in pure.parts:
            raise self._refuse(name, "escapes the archive ('..')")
        if pure.parts and ":" in pure.parts[0]:
            raise self._refuse(name, "has a drive-letter path")
        if member.issym() or member.islnk():
            raise self._refuse(name, f"is a link (to {member.linkname!r})")
        if not (member.isfile() or member.isdir()):
            raise self._refuse(name, "is a device or FIFO")
        if member.isfile():
            if name in seen:
                raise self._refuse(name, "appears twice")
            seen.add(name)
            if member.size > MAX_MEMBER_BYTES:
                raise self._refuse(
                    name,
                    f"declares {member.size:,} bytes, over the {MAX_MEMBER_BYTES:,} a trajectory may take",
                )

    def _unpack(self, n: int, name: str) -> None:
        """Member bytes read so far against the archive's total limit."""
        self.unpacked += n
        if self.unpacked > self.limits.max_total_bytes:
            raise UnsafeArchiveError(
                f"{self.archive}: unpacks to more than {self.limits.max_total_bytes:,} bytes (at {name!r}); "
                "refusing (a decompression bomb?)",
                hint="raise the limit with RLDS_ARCHIVE_MAX_BYTES if the archive is trusted",
            )

    def take(self, n: int, name: str) -> None:
        """Count ``n`` bytes taken from the archive (kept, or skipped) against the ratio limit."""
        self.taken += n
        if self.taken > self.limits.ratio_floor_bytes:
            read = max(self.consumed, 1)
            if self.taken > self.limits.max_total_ratio * read:
                raise UnsafeArchiveError(
                    f"{self.archive}: yields {self.taken:,} bytes from {read:,} bytes of archive (ratio "
                    f"over {self.limits.max_total_ratio:g}, at {name!r}); refusing (a decompression bomb?)",
                    hint="raise the ratio limit with RLDS_ARCHIVE_MAX_RATIO if the archive is trusted",
                )

    def _read(self, fh: IO[bytes], member: tarfile.TarInfo, raw: IO[bytes], keep: bool) -> bytes:
        parts = []
        while chunk := fh.read(_CHUNK):
            self._unpack(len(chunk), member.name)
            self.consumed = raw.tell()
            if keep:
                parts.append(chunk)
            else:  # a skipped member yields nothing: all of it counts against the ratio
                self.take(len(chunk), member.name)
        if keep and sum(len(p) for p in parts) != member.size:
            raise tarfile.ReadError(f"member {member.name!r} ended early")
        return b"".join(parts)

    def __iter__(self) -> Iterator[tuple[str, str, Any]]:
        """``(where, member name, decoded object)`` per trajectory member, in archive order."""
        from rlds_cli.formats.archives import decompressing_reader

        try:
            raw = open(self.archive, "rb")  # noqa: SIM115 - closed below
        except PermissionError as exc:
            raise SourceNotReadableError(f"cannot read archive {self.archive}: permission denied") from exc
        seen: set[str] = set()
        try:
            with raw, decompressing_reader(raw) as stream, tarfile.open(fileobj=stream, mode="r|") as tf:
                for member in tf:
                    self._check(member, seen)
                    self.consumed = raw.tell()
                    if member.isdir():
                        continue
                    kind = PurePosixPath(member.name).suffix.lower()
                    keep = kind in TRAJECTORY_SUFFIXES
                    fh = tf.extractfile(member)
                    data = self._read(fh, member, raw, keep) if fh is not None else b""
                    self.consumed = raw.tell()
                    if not keep:
                        self.ignored.append(member.name)
                        continue
                    where = f"{self.archive}: member {member.name!r}"
                    yield where, member.name, decode_member(kind, data, where, self.allow_pickle)
        except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
            if isinstance(exc, RldsError):
                raise
            raise SourceFormatError(
                f"{self.archive}: damaged tar archive (truncated or corrupt?): {exc}"
            ) from exc


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
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)
    expected_files = EXPECTED_FILES

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
