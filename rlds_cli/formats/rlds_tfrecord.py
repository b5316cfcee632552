"""RLDS / Open X-Embodiment datasets in TFDS's TFRecord layout, read without TensorFlow.

A dataset version folder (``gs://gresearch/robotics/<dataset>/<version>/``) holds
``features.json`` (the TFDS feature tree: shapes, dtypes, image encodings; parsed by
:mod:`.tfds_features`), ``dataset_info.json`` (name, version, splits and records per shard) and
shards ``<name>-<split>.tfrecord-00000-of-000NN``. Each record is one ``tf.train.Example`` per
**episode** (framing and wire format: :mod:`.tfrecord_io`): ``steps/<path>`` features hold the
episode's ``T`` steps flattened along time, ``episode_metadata/<path>`` one value per episode.
The rules below are written out in ``docs/formats.md`` ("RLDS / Open X-Embodiment"), rules
``rlds-tfrecord-v1``:

* **Keys.** ``steps/observation/<k>`` becomes ``observation/<k>`` (flat, stored once; a single
  tensor ``steps/observation`` becomes ``observation``); ``steps/action`` becomes ``action`` (a
  dict action ``action/<k>``); ``steps/reward`` becomes ``next/reward``; ``is_first``,
  ``is_last`` and ``is_terminal`` are consumed; every other step feature ``steps/<p>``
  (``discount``, ``language_embedding``...) becomes ``info/<p>``, scalars with TED's trailing
  ``[1]``. Text (``language_instruction``) is stored as an int64 index, ``<key>_index``, into a
  table of its distinct strings in ``source.metadata.rlds.text``. ``episode_metadata/<p>``
  becomes the per-episode source array ``rlds/episode_<p>`` (text: an index into
  ``source.metadata.rlds.episode_text``). Names go through the key cleaner of every reader.
* **Images** (``Image`` features, PNG or JPEG) are decoded with Pillow to ``uint8`` HWC (a
  single-channel ``uint16`` PNG to ``uint16``), converted to the declared channel count as
  TensorFlow's decoder does.
* **The last step.** Strict RLDS puts only the final observation on an episode's ``is_last``
  step (its action and reward mean nothing); many OXE datasets put a real action and reward
  there. ``last_step="auto"`` (default): when the last step's action and reward are all zero it
  is the final observation only (``T - 1`` transitions, ``final_known = true``); otherwise it is
  kept as a transition whose next observation is unknown (``T`` transitions, the final
  observation repeats the last one, ``final_known = false``). ``"observation"`` and
  ``"transition"`` force either. The episode ends **terminated** when the last step's
  ``is_terminal`` is set, **truncated** otherwise.
* **Checks.** Both CRCs of every record; every feature's value count against ``features.json``
  (``T * prod(shape)``); ``is_first`` set only on step 0 and ``is_last``/``is_terminal`` only on
  the last step (an episode per record); every shard of a split present, with the records
  ``dataset_info.json`` gives it.
* **Streaming and workers.** The main process walks the shards in order, checking the framing
  and planning each episode as pieces of about :data:`UNIT_BYTES` of decoded steps; worker
  processes (the ``workers`` option) decode the pieces from memory-mapped records and the main
  process packs them into blocks in shard order, so the output is identical for any number of
  workers and memory is bounded by a few pieces, never by a shard or an episode.
"""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.errors import MissingExtraError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats._episodes import _concat
from rlds_cli.formats._parallel import default_workers, ordered_map
from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock
from rlds_cli.formats.keys import clean_keys, renamed_note
from rlds_cli.formats.tfds_features import IMAGE, TEXT, Features, Leaf, parse_features
from rlds_cli.formats.tfrecord_io import (
    BYTES_LIST,
    FLOAT_LIST,
    HEADER_BYTES,
    INT64_LIST,
    FramingError,
    MappedRecord,
    RawFeature,
    RecordInfo,
    WireError,
    bytes_spans,
    count_values,
    float_values,
    have_crc32c,
    int64_values,
    parse_example,
    scan_records,
)
from rlds_cli.formats.untrusted import UnsafeSourceError, check_declared, side_array_max_bytes

RULES = "rlds-tfrecord-v1"
FEATURES_FILE = "features.json"
INFO_FILE = "dataset_info.json"
#: Largest JSON metadata file read.
MAX_JSON_BYTES = 64 << 20
#: Decoded bytes of steps per worker task (a piece of an episode, or several small episodes).
UNIT_BYTES = 8 << 20
#: Decoded bytes gathered before a block is yielded.
BLOCK_BYTES = 8 << 20
#: Side assumed for an image dimension features.json leaves unknown (-1), when planning pieces.
UNKNOWN_SIDE = 512
#: Largest decoded frame of an image of unknown size (a header claiming more is refused).
MAX_FRAME_BYTES = 256 << 20
#: Largest per-episode value kept as a source array (values per episode).
MAX_EPISODE_VALUES = 4096
LAST_STEP_RULES = ("auto", "observation", "transition")
_FLAGS = ("is_first", "is_last", "is_terminal")
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")
_SHARD = re.compile(r"^(?P<name>.+)-(?P<split>[^-.]+)\.tfrecord(?:-(?P<index>\d+)-of-(?P<count>\d+))?$")
_EXTRA_HINT = "pip install 'rlds-cli[rlds]' (crc32c and pillow)"
_REDOWNLOAD = "the shard is damaged: download it again"


# --------------------------------------------------------------------------- layout


def _is_shard_name(name: str) -> bool:
    return ".tfrecord" in name and not name.startswith(".")


@dataclass(frozen=True)
class _Shard:
    path: Path
    split: str
    index: int
    count: int  # shards of the split its name declares (0: not said)


def _shard(path: Path) -> _Shard:
    match = _SHARD.match(path.name)
    if match is None:
        return _Shard(path, "", 0, 0)
    index, count = match.group("index"), match.group("count")
    return _Shard(path, match.group("split"), int(index or 0), int(count or 0))


def _root_and_shards(path: Path) -> tuple[Path, list[Path], bool]:
    """The dataset folder of ``path``, its shard files (sorted), and whether ``path`` named a
    single shard (then only that one is read)."""
    if path.is_dir():
        root = path
    elif path.name in (FEATURES_FILE, INFO_FILE):
        root = path.parent
    else:
        return path.parent, [path], True
    shards = sorted(p for p in root.iterdir() if _is_shard_name(p.name) and p.is_file())
    return root, shards, False


def sniff(path: Path) -> bool:
    """Whether ``path`` is an RLDS/TFDS folder (``features.json`` next to ``*.tfrecord*`` shards),
    one of its shards, or its ``features.json``."""
    try:
        if path.is_dir():
            return (path / FEATURES_FILE).is_file() and any(_is_shard_name(p.name) for p in path.iterdir())
        if path.is_file():
            if path.name == FEATURES_FILE:
                return any(_is_shard_name(p.name) for p in path.parent.iterdir())
            return _is_shard_name(path.name) and (path.parent / FEATURES_FILE).is_file()
    except OSError:
        return False
    return False


def _inside(root: Path, file: Path) -> Path:
    """``file`` if it stays inside the dataset folder once symlinks are followed."""
    try:
        real = file.resolve()
    except (OSError, RuntimeError) as exc:
        raise UnsafeSourceError(f"{file} cannot be resolved: {exc}") from None
    if not real.is_relative_to(root.resolve()):
        raise UnsafeSourceError(
            f"{file} escapes the dataset folder {root} (to {real})",
            hint="rlds reads only files inside the dataset folder; the dataset is malicious or broken",
        )
    return file


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads and hashes: ``features.json``, ``dataset_info.json`` and the
    shards (all of the folder's, or the one shard named)."""
    out: list[Path] = []
    for p in paths:
        root, shards, _ = _root_and_shards(p)
        meta = [root / name for name in (FEATURES_FILE, INFO_FILE) if (root / name).is_file()]
        out += [_inside(root, f) for f in (*meta, *shards)]
    return list(dict.fromkeys(out))


def _read_json(path: Path, what: str) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise SourceFormatError(f"{path} is {size:,} bytes, over the {MAX_JSON_BYTES:,} read for {what}")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SourceFormatError(f"{path} is not readable JSON: {exc}") from None


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class _Column:
    """One feature and where it goes.

    ``role``: ``"obs"`` (flat), ``"step"`` (per step), ``"reward"``, ``"flag"`` (consumed) or
    ``"episode"`` (a per-episode source array).
    """

    leaf: Leaf
    role: str
    key: str
    row_shape: tuple[int, ...]

    @property
    def text(self) -> bool:
        return self.leaf.kind == TEXT


@dataclass(frozen=True)
class _Plan:
    """What workers need to decode pieces (pickled with every task)."""

    columns: tuple[_Column, ...]


@dataclass(frozen=True)
class _PieceRef:
    """Steps ``start .. stop`` of one episode (record) of ``steps`` steps."""

    shard: str
    record: int
    offset: int
    length: int
    steps: int
    start: int
    stop: int
    episode: int

    @property
    def where(self) -> str:
        return f"{self.shard}: record {self.record} (byte {self.offset})"


@dataclass
class _Unit:
    plan: _Plan
    pieces: list[_PieceRef]


@dataclass
class _Decoded:
    """A piece decoded by a worker: columns by TED key (text as strings), and the flags."""

    ref: _PieceRef
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    flags: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _Part:
    """Rows of one episode ready to pack (the final observation included when ``ended``)."""

    steps: dict[str, np.ndarray]
    observations: dict[str, np.ndarray]
    ended: bool
    terminated: bool = False
    final_known: bool = True
    episode: int = 0

    @property
    def num_steps(self) -> int:
        return len(next(iter(self.steps.values())))

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.steps.values()) + sum(v.nbytes for v in self.observations.values())


def _plan_columns(features: Features, where: Path) -> tuple[list[_Column], dict[str, tuple[str, ...]]]:
    """Each leaf's role and TED key (through the key cleaner), and the key parts before cleaning."""
    wanted: dict[str, tuple[str, ...]] = {f"\0{k}": tuple(k.split("/")) for k in _FIXED}
    roles: dict[str, str] = {}
    for leaf in features.steps:
        rel = leaf.path[1:]
        if rel in (("observation",), ("action",)) and leaf.kind == TEXT:
            raise SourceFormatError(f"{where}: steps/{rel[0]} is text; rlds needs numeric {rel[0]}s")
        if len(rel) == 1 and rel[0] in _FLAGS and leaf.kind == "tensor" and len(leaf.shape) <= 1:
            roles[leaf.name] = "flag"
            continue
        if rel == ("reward",) and leaf.kind == "tensor":
            roles[leaf.name] = "reward"
            continue
        if rel and rel[0] == "observation":
            parts: tuple[str, ...] = ("observation", *rel[1:])
            roles[leaf.name] = "obs"
        elif rel and rel[0] == "action":
            parts = ("action", *rel[1:])
            roles[leaf.name] = "step"
        else:
            parts = ("info", *rel)
            roles[leaf.name] = "step"
        if leaf.kind == TEXT:
            parts = (*parts[:-1], parts[-1] + "_index")
        wanted[leaf.name] = parts
    names = [leaf.name for leaf in features.steps]
    if not any(n == "steps/action" or n.startswith("steps/action/") for n in names):
        raise SourceFormatError(f"{where} declares no steps/action; rlds needs the actions")
    if not any(roles.get(n) == "obs" for n in names):
        raise SourceFormatError(f"{where} declares no readable steps/observation")
    cleaned = clean_keys(wanted)
    columns: list[_Column] = []
    for leaf in features.steps:
        role = roles[leaf.name]
        if role == "flag":
            columns.append(_Column(leaf, role, leaf.path[-1], ()))
            continue
        key = "next/reward" if role == "reward" else cleaned[leaf.name]
        if leaf.kind == TEXT:
            shape: tuple[int, ...] = () if role == "obs" else (1,)
        elif role in ("reward", "step") and leaf.shape == () and not key.startswith("action"):
            shape = (1,)  # TED's trailing axis for scalar rewards and infos
        else:
            shape = leaf.shape
        columns.append(_Column(leaf, role, key, shape))
    source = {k: v for k, v in wanted.items() if not k.startswith("\0")}
    return columns, source


def _episode_columns(features: Features, report: ConversionReport) -> list[_Column]:
    """Per-episode leaves as source arrays ``rlds/episode_<name>``."""
    wanted: dict[str, tuple[str, ...]] = {}
    kept: list[Leaf] = []
    for leaf in features.episode:
        rel = leaf.path[1:] if leaf.path[0] == "episode_metadata" and len(leaf.path) > 1 else leaf.path
        if leaf.kind == IMAGE:
            report.notes.append(f"{leaf.name}: per-episode images are not stored")
            continue
        if leaf.kind != TEXT and (any(d < 0 for d in leaf.shape) or leaf.known_values > MAX_EPISODE_VALUES):
            report.notes.append(
                f"{leaf.name}: per-episode values of shape {list(leaf.shape)} are not stored "
                f"(at most {MAX_EPISODE_VALUES} values of known shape)"
            )
            continue
        wanted[leaf.name] = ("episode_" + ".".join(rel),)
        kept.append(leaf)
    cleaned = clean_keys(wanted) if wanted else {}
    return [_Column(leaf, "episode", "rlds/" + cleaned[leaf.name], leaf.shape) for leaf in kept]


# --------------------------------------------------------------------------- decoding (workers)


def _values_per_step(leaf: Leaf, count: int, steps: int, where: str) -> int:
    """Values one step holds in the Example (an unknown dimension is inferred from ``count``)."""
    per = leaf.known_values
    if not any(d < 0 for d in leaf.shape) or leaf.kind != "tensor":
        if count != steps * per:
            raise SourceFormatError(
                f"{where}: feature {leaf.name!r} holds {count} values, but features.json declares "
                f"{per} per step ({leaf.kind} of shape {list(leaf.shape)}) and the episode has {steps} steps"
            )
        return per
    if steps == 0:
        if count:
            raise SourceFormatError(f"{where}: feature {leaf.name!r} holds {count} values for 0 steps")
        return 0
    if count % (steps * per):
        raise SourceFormatError(
            f"{where}: feature {leaf.name!r} holds {count} values, not a multiple of {steps} steps x "
            f"{per} (its known dimensions {list(leaf.shape)})"
        )
    return count // steps


def _resolved_shape(leaf: Leaf, per_step: int) -> tuple[int, ...]:
    known = leaf.known_values
    return tuple(d if d >= 0 else per_step // max(known, 1) for d in leaf.shape)


def _check_kind(leaf: Leaf, raw: RawFeature, where: str) -> None:
    if leaf.kind == "tensor" and leaf.encoding == "none":
        assert leaf.dtype is not None
        want = FLOAT_LIST if np.dtype(leaf.dtype).kind == "f" else INT64_LIST
    else:
        want = BYTES_LIST
    if raw.kind is not None and raw.kind != want:
        raise SourceFormatError(
            f"{where}: feature {leaf.name!r} is a {raw.kind}_list, but features.json declares "
            f"{leaf.dtype or 'text'} {leaf.kind} values (stored as a {want}_list)"
        )


def _numeric(buf: memoryview, raw: RawFeature, leaf: Leaf) -> np.ndarray:
    """All values of a numeric feature, in its declared dtype (TFDS's casts: floats were stored
    as float32, integers and bools as int64, uint64 bit-cast)."""
    assert leaf.dtype is not None
    dtype = np.dtype(leaf.dtype)
    if raw.kind is None:
        return np.zeros(0, dtype)
    if raw.kind == FLOAT_LIST:
        return float_values(buf, raw)
    values = int64_values(buf, raw)
    if dtype == np.bool_:
        return values != 0
    return values.view(np.uint64) if dtype == np.uint64 else values


def _tensor_rows(
    buf: memoryview, raw: RawFeature, leaf: Leaf, steps: int, start: int, stop: int, where: str
) -> np.ndarray:
    """Rows ``start .. stop`` of a tensor feature, as ``[rows, *shape]`` in its dtype (a copy)."""
    assert leaf.dtype is not None
    dtype = np.dtype(leaf.dtype)
    _check_kind(leaf, raw, where)
    if leaf.encoding == "none":
        values = _numeric(buf, raw, leaf)
        per = _values_per_step(leaf, len(values), steps, where)
        rows = values[start * per : stop * per]
        return np.array(rows, dtype=dtype, copy=True).reshape(stop - start, *_resolved_shape(leaf, per))
    spans = bytes_spans(buf, raw) if raw.kind is not None else []
    _values_per_step(leaf, len(spans), steps, where)
    size = int(np.prod(leaf.shape, dtype=np.int64)) * dtype.itemsize  # shapes are known (tfds_features)
    out = np.empty((stop - start, *leaf.shape), dtype)
    raw_dtype = dtype.newbyteorder("<")  # TFDS writes tobytes() of little-endian machines
    for t in range(start, stop):
        a, b = spans[t]
        data = bytes(buf[a:b])
        if leaf.encoding == "zlib":
            inflater = zlib.decompressobj()
            try:
                data = inflater.decompress(data, size + 1)  # bounded: a bomb stops here
            except zlib.error as exc:
                raise SourceFormatError(
                    f"{where}: step {t} of {leaf.name!r} is not zlib data: {exc}"
                ) from None
            if not inflater.eof:
                data += b"\0"  # more bytes than declared: reported below
        if len(data) != size:
            raise SourceFormatError(
                f"{where}: step {t} of {leaf.name!r} holds {len(data)} bytes, but features.json declares "
                f"{list(leaf.shape)} {leaf.dtype} ({size} bytes)"
            )
        out[t - start] = np.frombuffer(data, raw_dtype).reshape(leaf.shape)
    return out


def _decode_image(data: bytes, leaf: Leaf, where: str, step: int) -> np.ndarray:
    """One encoded frame as ``(H, W, C)`` in the leaf's dtype, converted to its channel count."""
    from PIL import Image

    height, width, channels = leaf.shape
    what = f"{where}: step {step} of {leaf.name!r}"
    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as img:
            w, h = img.size
            if (height >= 0 and h != height) or (width >= 0 and w != width):
                raise SourceFormatError(
                    f"{what} is a {h}x{w} image, but features.json declares {list(leaf.shape)}"
                )
            if h * w * channels * np.dtype(str(leaf.dtype)).itemsize > MAX_FRAME_BYTES:
                raise SourceFormatError(f"{what} is a {h}x{w} image, over {MAX_FRAME_BYTES:,} bytes decoded")
            if leaf.dtype == "uint16":
                if img.mode not in ("I;16", "I;16B", "I;16L", "I", "L"):
                    raise SourceFormatError(f"{what} is a {img.mode} image, not a 16-bit grayscale PNG")
                frame = np.asarray(img)
                if frame.dtype.kind != "u" and (frame.min(initial=0) < 0 or frame.max(initial=0) > 0xFFFF):
                    raise SourceFormatError(f"{what} holds values outside 0..65535")
                return frame.astype(np.uint16).reshape(h, w, 1)
            mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
            if img.mode != mode:
                img.load()
                converted = img.convert(mode)
                return np.asarray(converted, np.uint8).reshape(h, w, channels)
            return np.asarray(img, np.uint8).reshape(h, w, channels)
    except SourceFormatError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise SourceFormatError(f"{what} does not decode as a PNG or JPEG image: {exc}") from None


def _image_rows(
    buf: memoryview, raw: RawFeature, leaf: Leaf, steps: int, start: int, stop: int, where: str
) -> np.ndarray:
    _check_kind(leaf, raw, where)
    spans = bytes_spans(buf, raw) if raw.kind is not None else []
    _values_per_step(leaf, len(spans), steps, where)
    out: np.ndarray | None = None
    for t in range(start, stop):
        a, b = spans[t]
        frame = _decode_image(bytes(buf[a:b]), leaf, where, t)
        if out is None:
            out = np.empty((stop - start, *frame.shape), frame.dtype)
        elif frame.shape != out.shape[1:]:
            raise SourceFormatError(
                f"{where}: step {t} of {leaf.name!r} is {frame.shape[0]}x{frame.shape[1]}, step {start} "
                f"{out.shape[1]}x{out.shape[2]} (frames of one feature must have one size)"
            )
        out[t - start] = frame
    assert out is not None
    return out


def _text_rows(
    buf: memoryview, raw: RawFeature, leaf: Leaf, steps: int, start: int, stop: int, where: str
) -> list[str]:
    _check_kind(leaf, raw, where)
    spans = bytes_spans(buf, raw) if raw.kind is not None else []
    _values_per_step(leaf, len(spans), steps, where)
    return [bytes(buf[a:b]).decode("utf-8", errors="replace") for a, b in spans[start:stop]]


def _feature(feats: dict[str, RawFeature], leaf: Leaf, where: str) -> RawFeature:
    raw = feats.get(leaf.name)
    if raw is None:
        raise SourceFormatError(f"{where} has no feature {leaf.name!r}, which features.json declares")
    return raw


def _parse(buf: memoryview, where: str) -> dict[str, RawFeature]:
    try:
        return parse_example(buf)
    except WireError as exc:
        raise SourceFormatError(f"{where} is not a tf.train.Example: {exc}", hint=_REDOWNLOAD) from None


def _decode_piece(plan: _Plan, ref: _PieceRef, fd: int) -> _Decoded:
    out = _Decoded(ref)
    if ref.start == ref.stop:
        return out
    where = ref.where
    with MappedRecord(fd, ref.offset + HEADER_BYTES, ref.length) as rec:
        buf = rec.view
        feats = _parse(buf, where)
        for col in plan.columns:
            if col.role == "episode":
                continue
            leaf = col.leaf
            raw = _feature(feats, leaf, where)
            if col.text:
                out.texts[col.key] = _text_rows(buf, raw, leaf, ref.steps, ref.start, ref.stop, where)
            elif leaf.kind == IMAGE:
                out.columns[col.key] = _image_rows(buf, raw, leaf, ref.steps, ref.start, ref.stop, where)
            else:
                rows = _tensor_rows(buf, raw, leaf, ref.steps, ref.start, ref.stop, where)
                if col.role == "flag":
                    out.flags[col.key] = np.asarray(rows.reshape(len(rows), -1).any(axis=1), bool)
                else:
                    out.columns[col.key] = (
                        rows.reshape(len(rows), *col.row_shape) if col.row_shape == (1,) else rows
                    )
        del feats, buf
    return out


def decode_unit(unit: _Unit) -> list[_Decoded]:
    """Decode the pieces of one task (runs in a worker process; module level to be pickled)."""
    out: list[_Decoded] = []
    files: dict[str, int] = {}
    try:
        for ref in unit.pieces:
            if ref.start == ref.stop:
                out.append(_Decoded(ref))
                continue
            if ref.shard not in files:
                files[ref.shard] = os.open(ref.shard, os.O_RDONLY)
            out.append(_decode_piece(unit.plan, ref, files[ref.shard]))
    finally:
        for fd in files.values():
            os.close(fd)
    return out


# --------------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class RldsOptions(ReaderOptions):
    """Options of :class:`RldsTFRecordReader` (its keyword arguments)."""

    split: str | None = None
    last_step: Literal["auto", "observation", "transition"] = "auto"
    workers: int | None = None
    block_rows: int | None = None


class RldsTFRecordReader(Reader):
    """Streams an RLDS/TFDS TFRecord dataset (a version folder, or one shard) in TED layout."""

    format_name = "rlds"
    expected_files = (
        "an RLDS/TFDS folder (Open X-Embodiment): features.json and *.tfrecord-NNNNN-of-NNNNN shards"
    )
    Options = RldsOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        split: str | None = None,
        last_step: str = "auto",
        workers: int | None = None,
        block_rows: int | None = None,
    ) -> None:
        """Plan a conversion of the dataset at ``path``.

        Args:
            path: The version folder (``features.json``, ``dataset_info.json`` and the shards), its
                ``features.json``, or one shard (then only that shard is read).
            split: Which split's shards to read (default: ``train`` when there are several, else
                the only one).
            last_step: ``"auto"``, ``"observation"`` or ``"transition"``: what an episode's last
                step is (see the module doc and ``docs/formats.md``).
            workers: Worker processes decoding pieces (default: the cores for sources over 32 MB).
            block_rows: Most steps per piece and per block (default: about 8 MiB of decoded steps).
        """
        if last_step not in LAST_STEP_RULES:
            raise SourceFormatError(
                f"last_step is {last_step!r}; the rlds format takes {', '.join(map(repr, LAST_STEP_RULES))}"
            )
        if not isinstance(path, str | Path):
            raise SourceFormatError(
                "the rlds format reads one dataset folder (or one shard), got several paths"
            )
        self.path = Path(path)
        if not self.path.exists():
            raise SourceNotFoundError(f"source {self.path} does not exist")
        if not have_crc32c():
            raise MissingExtraError(
                f"{self.path}: TFRecord checksums need a crc32c package, which is not installed",
                hint=_EXTRA_HINT,
            )
        self.last_step = last_step
        self.block_rows = block_rows if block_rows and block_rows > 0 else None
        self.report = ConversionReport(rules=RULES)
        self.root, shard_files, self.single = _root_and_shards(self.path)
        self._read_metadata()
        self.shards = self._select_shards([_shard(_inside(self.root, p)) for p in shard_files], split)
        self._plan()
        total = sum(s.path.stat().st_size for s in self.shards)
        self.workers = workers if workers else default_workers(max(2, len(self.shards)), total)
        self._counts = {"observation": 0, "transition": 0, "dropped": 0, "first": 0, "last": 0}
        self._rule_note = len(self.report.notes)
        self.report.notes.append("")
        self._update_notes()
        self._text_tables: dict[str, dict[str, int]] = {c.key: {} for c in self.columns if c.text}
        self._episode_text: dict[str, dict[str, int]] = {c.key: {} for c in self.episode_columns if c.text}
        self._text_bytes = 0
        self._episode_values: dict[int, dict[str, Any]] = {}
        self._episode_arrays: dict[str, list[np.ndarray]] = {c.key: [] for c in self.episode_columns}
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}

    # ------------------------------------------------------------------ metadata and plan

    def _read_metadata(self) -> None:
        features_path = self.root / FEATURES_FILE
        if not features_path.is_file():
            raise SourceFormatError(
                f"{self.root} has no {FEATURES_FILE}; an RLDS/TFDS dataset folder holds it next to the "
                "shards",
                hint="download the whole dataset version folder (features.json, dataset_info.json and the "
                "shards)",
            )
        self.features_path = _inside(self.root, features_path)
        self.features = parse_features(_read_json(self.features_path, "features"), self.features_path)
        info_path = self.root / INFO_FILE
        self.info: dict[str, Any] = {}
        if info_path.is_file():
            info = _read_json(_inside(self.root, info_path), "dataset info")
            if not isinstance(info, dict):
                raise SourceFormatError(f"{info_path} is not a JSON object")
            self.info = info
        self.info_path = info_path

    def _declared_lengths(self, split: str) -> list[int] | None:
        """Records per shard that ``dataset_info.json`` gives the split (``None``: not said)."""
        for entry in self.info.get("splits") or []:
            if isinstance(entry, dict) and entry.get("name") == split:
                lengths = entry.get("shardLengths", entry.get("shard_lengths"))
                if not isinstance(lengths, list):
                    return None
                try:
                    return [int(x) for x in lengths]
                except (TypeError, ValueError):
                    raise SourceFormatError(
                        f"{self.info_path}: split {split!r} has shardLengths {lengths!r}"
                    ) from None
        return None

    def _select_shards(self, shards: list[_Shard], split: str | None) -> list[_Shard]:
        if not shards:
            raise SourceFormatError(
                f"{self.root} holds no *.tfrecord* shards",
                hint="download the shards (<name>-<split>.tfrecord-NNNNN-of-NNNNN) next to features.json",
            )
        splits = sorted({s.split for s in shards})
        if split is None:
            split = "train" if "train" in splits else splits[0] if len(splits) == 1 else None
            if split is None:
                raise SourceFormatError(
                    f"{self.root} holds the splits {', '.join(map(repr, splits))} and none is 'train'",
                    hint="pick one: convert(path, name, options={'split': NAME})",
                )
        if split not in splits:
            raise SourceFormatError(
                f"{self.root} has no shards of split {split!r} (splits: {', '.join(map(repr, splits))})"
            )
        if len(splits) > 1:
            others = ", ".join(repr(s) for s in splits if s != split)
            self.report.notes.append(f"split {split!r} read; the folder also holds {others} (option 'split')")
        self.split = split
        chosen = sorted((s for s in shards if s.split == split), key=lambda s: (s.index, s.path.name))
        counts = {s.count for s in chosen}
        self.declared = self._declared_lengths(split)
        if self.single:
            self.report.notes.append(f"one shard read: {chosen[0].path.name}")
            return chosen
        if len(counts) > 1:
            raise SourceFormatError(
                f"{self.root}: the shards of split {split!r} disagree on their count ({sorted(counts)})"
            )
        count = counts.pop()
        if count:
            have = {s.index for s in chosen}
            missing = [i for i in range(count) if i not in have]
            if missing:
                name = _SHARD.sub(r"\g<name>-\g<split>.tfrecord", chosen[0].path.name)
                raise SourceFormatError(
                    f"{self.root}: shard {name}-{missing[0]:05d}-of-{count:05d} is missing "
                    f"({len(missing)} of {count} shards of split {split!r})",
                    hint="the download is incomplete: fetch every shard of the split",
                )
        if self.declared is not None and len(self.declared) != len(chosen):
            raise SourceFormatError(
                f"{self.info_path} gives split {split!r} {len(self.declared)} shards, the folder holds "
                f"{len(chosen)}"
            )
        if self.declared is not None:
            self.report.expected = {"num_episodes": sum(self.declared)}
        return chosen

    def _plan(self) -> None:
        columns, wanted = _plan_columns(self.features, self.features_path)
        self.columns = columns
        self.episode_columns = _episode_columns(self.features, self.report)
        self.plan = _Plan(tuple(columns))
        for name, why in self.features.skipped:
            self.report.notes.append(f"{name}: {why}; not stored")
        keys = {c.leaf.name: c.key for c in columns if c.role != "flag" and c.role != "reward"}
        renamed = renamed_note({k: keys[k] for k in wanted}, wanted)
        if renamed:
            self.report.notes.append(renamed)
        self.keys = {c.leaf.name: c.key for c in [*columns, *self.episode_columns] if c.role != "flag"}
        flags = {c.key for c in columns if c.role == "flag"}
        if "is_terminal" not in flags:
            self.report.notes.append("no steps/is_terminal: every episode ends truncated")
        if not any(c.role == "reward" for c in columns):
            self.report.notes.append("no steps/reward: next/reward = 0")
        if any(c.leaf.kind == IMAGE for c in columns):
            try:
                import PIL.Image  # noqa: F401
            except ImportError:
                raise MissingExtraError(
                    f"{self.features_path}: RLDS images are decoded with Pillow, which is not installed",
                    hint=_EXTRA_HINT,
                ) from None
        self.obs_keys = [c.key for c in columns if c.role == "obs"]
        self.action_keys = [
            c.key for c in columns if c.role == "step" and (c.key == "action" or c.key.startswith("action/"))
        ]

    def _step_bytes(self, counts: dict[str, int], steps: int) -> int:
        """Decoded bytes of one step (images of unknown size planned at :data:`UNKNOWN_SIDE`)."""
        total = 0
        for col in self.columns:
            leaf = col.leaf
            if leaf.kind == IMAGE:
                sides = [d if d >= 0 else UNKNOWN_SIDE for d in leaf.shape]
                total += sides[0] * sides[1] * sides[2] * np.dtype(str(leaf.dtype)).itemsize
            elif leaf.kind == TEXT:
                total += 8
            else:
                itemsize = np.dtype(str(leaf.dtype)).itemsize
                per = counts.get(leaf.name, 0) // steps if steps else leaf.known_values
                total += max(per, leaf.known_values) * itemsize
        return max(total, 1)

    # ------------------------------------------------------------------ reading

    def total_rows(self) -> int:
        """Records (episodes) to read: from ``dataset_info.json``, else counted from the headers."""
        if self.declared is not None and not self.single:
            return sum(self.declared)
        count = 0
        for shard in self.shards:
            with open(shard.path, "rb") as fh:
                size, pos = os.fstat(fh.fileno()).st_size, 0
                while pos + HEADER_BYTES <= size:
                    (length,) = np.frombuffer(os.pread(fh.fileno(), 8, pos), "<u8")
                    pos += HEADER_BYTES + int(length) + 4
                    count += 1
        return count

    def source_metadata(self) -> dict[str, Any]:
        info = self.info
        meta: dict[str, Any] = {
            "name": info.get("name"),
            "version": info.get("version"),
            "split": self.split,
            "shards": [s.path.name for s in self.shards],
            "last_step": self.last_step,
            "keys": self.keys,
            "text": {k: list(v) for k, v in self._text_tables.items()},
            "episode_text": {k: list(v) for k, v in self._episode_text.items()},
        }
        description = info.get("description")
        if isinstance(description, str):
            meta["description"] = description[:4000]
        return {"rlds": meta}

    def source_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for col in self.episode_columns:
            parts = self._episode_arrays[col.key]
            dtype = np.int64 if col.text else np.dtype(str(col.leaf.dtype))
            out[col.key] = np.stack(parts) if parts else np.zeros((0, *col.row_shape), dtype)
        return out

    def _where(self, shard: _Shard, rec: RecordInfo) -> str:
        return f"{shard.path}: record {rec.index} (byte {rec.offset})"

    def _scan_record(self, shard: _Shard, rec: RecordInfo, buf: memoryview, episode: int) -> tuple[int, int]:
        """Check one record against features.json: every feature present, of the right kind and
        count. Returns its steps and the decoded bytes of one step; keeps its episode values."""
        where = self._where(shard, rec)
        feats = _parse(buf, where)
        counts: dict[str, int] = {}
        steps: int | None = None
        for col in self.columns:
            raw = _feature(feats, col.leaf, where)
            _check_kind(col.leaf, raw, where)
            counts[col.leaf.name] = count_values(buf, raw)
            if steps is None and not (col.leaf.kind == "tensor" and any(d < 0 for d in col.leaf.shape)):
                per = col.leaf.known_values
                if per == 0:
                    continue
                if counts[col.leaf.name] % per:
                    raise SourceFormatError(
                        f"{where}: feature {col.leaf.name!r} holds {counts[col.leaf.name]} values, not a "
                        f"multiple of the {per} per step features.json declares"
                    )
                steps = counts[col.leaf.name] // per
        steps = steps or 0
        for col in self.columns:
            _values_per_step(col.leaf, counts[col.leaf.name], steps, where)
        values: dict[str, Any] = {}
        for col in self.episode_columns:
            raw = _feature(feats, col.leaf, where)
            if col.text:
                values[col.key] = _text_rows(buf, raw, col.leaf, 1, 0, 1, where)[0]
            else:
                values[col.key] = _tensor_rows(buf, raw, col.leaf, 1, 0, 1, where)[0]
        self._episode_values[episode] = values
        del feats
        return steps, self._step_bytes(counts, steps)

    def _scan_shard(
        self, shard: _Shard, position: int, first_episode: int
    ) -> list[tuple[RecordInfo, int, int]]:
        """Every record of a shard checked (framing, CRCs, counts), with its steps and step bytes,
        before any of it is decoded."""
        out: list[tuple[RecordInfo, int, int]] = []
        with open(shard.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            try:
                for rec, mapped in scan_records(fh.fileno(), shard.path, size=size):
                    steps, row_bytes = self._scan_record(shard, rec, mapped.view, first_episode + len(out))
                    out.append((rec, steps, row_bytes))
            except FramingError as exc:
                raise SourceFormatError(str(exc), hint=_REDOWNLOAD) from None
            except OSError as exc:  # a read or mapping that fails (I/O error, out of address space)
                raise SourceFormatError(f"{shard.path} cannot be read: {exc}") from None
        slot = shard.index if self.single else position
        if self.declared is not None and slot < len(self.declared):
            declared = self.declared[slot]
            if declared != len(out):
                raise SourceFormatError(
                    f"{shard.path} holds {len(out)} records, but {INFO_FILE} gives it {declared} "
                    "(shardLengths)",
                    hint="the shard is truncated or not the one the dataset lists: download it again",
                )
        # untrusted input: a small shard cannot make rlds write far more than it stores
        decoded = sum(steps * row_bytes for _, steps, row_bytes in out)
        check_declared(shard.path, "steps", decoded, size, how="stores")
        return out

    def _pieces(
        self, shard: _Shard, rec: RecordInfo, steps: int, row_bytes: int, episode: int
    ) -> list[_PieceRef]:
        """One episode cut into pieces of about :data:`UNIT_BYTES` (or ``block_rows`` steps); the
        last piece keeps at least two steps, so the last-step rule sees its step ``T - 2`` too."""
        rows = self.block_rows or max(1, UNIT_BYTES // row_bytes)
        starts = list(range(0, steps, rows)) or [0]
        if len(starts) > 1 and steps - starts[-1] == 1:
            starts.pop()
        stops = [*starts[1:], steps]
        return [
            _PieceRef(str(shard.path), rec.index, rec.offset, rec.length, steps, a, b, episode)
            for a, b in zip(starts, stops, strict=True)
        ]

    def _units(self) -> Iterator[_Unit]:
        """Worker tasks in shard order, each about :data:`UNIT_BYTES` of decoded steps."""
        pending: list[_PieceRef] = []
        size = rows = 0
        episode = 0
        for position, shard in enumerate(self.shards):
            for rec, steps, row_bytes in self._scan_shard(shard, position, episode):
                for piece in self._pieces(shard, rec, steps, row_bytes, episode):
                    pending.append(piece)
                    size += (piece.stop - piece.start) * row_bytes
                    rows += piece.stop - piece.start
                    if size >= UNIT_BYTES or (self.block_rows and rows >= self.block_rows):
                        yield _Unit(self.plan, pending)
                        pending, size, rows = [], 0, 0
                episode += 1
        if pending:
            yield _Unit(self.plan, pending)

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the episodes in shard and record order; ``progress`` counts episodes."""
        pending: list[_Part] = []
        size = rows = 0
        for decoded in ordered_map(decode_unit, self._units(), self.workers):
            for piece in decoded:
                part = self._assemble(piece)
                if piece.ref.stop == piece.ref.steps and progress is not None:
                    progress(1)
                if part is None:
                    continue
                pending.append(part)
                size += part.nbytes
                rows += part.num_steps
                if size >= BLOCK_BYTES or (self.block_rows and rows >= self.block_rows):
                    yield self._pack(pending)
                    pending, size, rows = [], 0, 0
        if pending:
            yield self._pack(pending)

    # ------------------------------------------------------------------ assembling

    def _index(self, table: dict[str, int], text: str, where: str, key: str) -> int:
        index = table.get(text)
        if index is None:
            self._text_bytes += len(text.encode("utf-8", errors="replace")) + 8
            limit = side_array_max_bytes()
            if self._text_bytes > limit:
                raise UnsafeSourceError(
                    f"{where}: the distinct strings of {key!r} and the other text features take over "
                    f"{limit:,} bytes, the limit for tables kept in the manifest",
                    hint="if you trust the dataset, raise RLDS_SIDE_ARRAY_MAX_BYTES",
                )
            index = table[text] = len(table)
        return index

    def _check_flags(self, decoded: _Decoded) -> None:
        ref = decoded.ref
        rows = np.arange(ref.start, ref.stop)
        first = decoded.flags.get("is_first")
        if first is not None:
            late = rows[first & (rows > 0)]
            if len(late):
                raise SourceFormatError(
                    f"{ref.where}: is_first is set on step {int(late[0])} of {ref.steps}; rlds reads one "
                    "episode per record (is_first on step 0 only)"
                )
            if ref.start == 0 and not first[0]:
                self._counts["first"] += 1
        for name in ("is_last", "is_terminal"):
            flag = decoded.flags.get(name)
            if flag is None:
                continue
            early = rows[flag & (rows < ref.steps - 1)]
            if len(early):
                raise SourceFormatError(
                    f"{ref.where}: {name} is set on step {int(early[0])} of {ref.steps}, before the last step"
                )
        last = decoded.flags.get("is_last")
        if last is not None and ref.stop == ref.steps and not last[-1]:
            self._counts["last"] += 1

    def _check_shapes(self, columns: dict[str, np.ndarray], where: str) -> None:
        """Every piece's rows have the shape and dtype of the first piece's (sizes features.json
        leaves unknown are fixed by the first episode)."""
        for key, rows in columns.items():
            spec = (tuple(rows.shape[1:]), rows.dtype.str)
            first = self._shapes.setdefault(key, spec)
            if spec != first:
                raise SourceFormatError(
                    f"{where}: {key!r} has rows of shape {list(spec[0])}, earlier episodes {list(first[0])}"
                )

    def _last_is_observation(self, decoded: _Decoded) -> bool:
        """Whether the last step is the final observation only (the last-step rule)."""
        if self.last_step != "auto":
            return self.last_step == "observation"
        keys = [*self.action_keys, "next/reward"]
        return all(not np.any(decoded.columns[k][-1] != 0) for k in keys if k in decoded.columns)

    def _assemble(self, decoded: _Decoded) -> _Part | None:
        """A decoded piece as the rows it adds (the last-step rule applied on an episode's last
        piece); ``None`` when it adds none (an empty episode, or one step that is only a final
        observation)."""
        ref = decoded.ref
        if ref.steps == 0:
            self.report.dropped_episodes += 1
            self._episode_values.pop(ref.episode, None)
            return None
        if ref.start == 0:
            self.report.source_rows += ref.steps
        self._check_flags(decoded)
        columns = dict(decoded.columns)
        for key, texts in decoded.texts.items():
            table = self._text_tables[key]
            index = np.array([self._index(table, s, ref.where, key) for s in texts], np.int64)
            columns[key] = index.reshape(len(index), *(() if key in self.obs_keys else (1,)))
        self._check_shapes(columns, ref.where)
        obs = {k: columns[k] for k in self.obs_keys}
        steps = {k: v for k, v in columns.items() if k not in obs}
        if "next/reward" not in steps:
            steps["next/reward"] = np.zeros((len(next(iter(obs.values()))), 1), np.float32)
        if ref.stop < ref.steps:
            return _Part(steps, obs, False, episode=ref.episode)
        terminated = bool(decoded.flags["is_terminal"][-1]) if "is_terminal" in decoded.flags else False
        observation = self._last_is_observation(decoded)
        if observation:
            self._counts["observation"] += 1
            if any(np.any(steps[k][-1] != 0) for k in [*self.action_keys, "next/reward"] if k in steps):
                self.report.dropped_rows += 1  # a forced rule discarded a real action or reward
            if ref.steps == 1:
                self.report.dropped_episodes += 1
                self._counts["dropped"] += 1
                self._episode_values.pop(ref.episode, None)
                self._update_notes()
                return None
            steps = {k: v[:-1] for k, v in steps.items()}
        else:
            self._counts["transition"] += 1
            self.report.synthesized_final_observations += 1
            obs = {k: np.concatenate([v, v[-1:]], axis=0) for k, v in obs.items()}
        self._keep_episode_values(ref)
        self._update_notes()
        return _Part(steps, obs, True, terminated, observation, ref.episode)

    def _keep_episode_values(self, ref: _PieceRef) -> None:
        values = self._episode_values.pop(ref.episode, {})
        for col in self.episode_columns:
            value = values[col.key]
            if col.text:
                value = np.int64(self._index(self._episode_text[col.key], value, ref.where, col.key))
            self._episode_arrays[col.key].append(np.asarray(value))

    def _update_notes(self) -> None:
        """The rule's notes, kept current episode by episode (a conversion of ``--episodes A:B``
        stops reading early)."""
        c = self._counts
        text = (
            f"last_step={self.last_step!r}: {c['observation']} episode(s) end with a step that is the "
            f"final observation only (final_known = true), {c['transition']} keep their last step as a "
            "transition whose next observation is unknown (final_known = false; the final observation "
            "repeats the last one)"
        )
        if c["dropped"]:
            text += f"; {c['dropped']} episode(s) of one step had no transition and were dropped"
        if c["first"]:
            text += f"; {c['first']} episode(s) do not set is_first on step 0"
        if c["last"]:
            text += f"; {c['last']} episode(s) do not set is_last on their last step"
        self.report.notes[self._rule_note] = text

    def _pack(self, parts: list[_Part]) -> StepBlock:
        lengths = np.array([p.num_steps for p in parts], np.int64)
        n = int(lengths.sum())
        ended = [p for p in parts if p.ended]
        ends = (np.cumsum(lengths) - 1)[[p.ended for p in parts]].astype(np.int64)
        steps = {k: _concat([p.steps[k] for p in parts]) for k in parts[0].steps}
        observations = {k: _concat([p.observations[k] for p in parts]) for k in parts[0].observations}
        term = np.zeros((n, 1), bool)
        trunc = np.zeros((n, 1), bool)
        term[ends, 0] = [p.terminated for p in ended]
        trunc[ends, 0] = [not p.terminated for p in ended]
        steps["next/terminated"] = term
        steps["next/truncated"] = trunc
        return StepBlock(
            steps=steps,
            observations=observations,
            ends=ends,
            final_known=np.array([p.final_known for p in ended], bool),
            episode_ids=np.array([p.episode for p in ended], np.int64),
        )
