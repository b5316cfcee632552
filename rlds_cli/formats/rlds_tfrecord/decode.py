"""A record's features as TED columns: the column plan (``features.json`` leaves -> TED keys, roles,
row shapes), each record checked against it, and the worker-side decoding of one piece of an
episode (a record's steps ``start:stop``) from a memory-mapped record.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import FrameError, SourceFormatError
from rlds_cli.formats.base import ConversionReport, clean_keys
from rlds_cli.formats.tfds_features import IMAGE, TEXT, Features, Leaf
from rlds_cli.formats.tfrecord_io import (
    BYTES_LIST,
    FLOAT_LIST,
    HEADER_BYTES,
    INT64_LIST,
    MappedRecord,
    RawFeature,
    WireError,
    bytes_spans,
    count_values,
    float_values,
    int64_values,
    parse_example,
)
from rlds_cli.frames.codecs import EncodedFrames, FrameFormat, image_format

#: Largest per-episode value kept as a source array (values per episode).
MAX_EPISODE_VALUES = 4096
#: Largest decoded frame of an image of unknown size (a header claiming more is refused).
MAX_FRAME_BYTES = 256 << 20
#: The hint of every error that says a shard's bytes are damaged.
REDOWNLOAD_HINT = "the shard is damaged: download it again"
_FLAGS = ("is_first", "is_last", "is_terminal")
#: The per-episode bool rlds's RLDS export writes: whether the last step holds the final
#: observation only (else a transition with unknown next observation); ``auto`` follows it.
LAST_STEP_FEATURE = "episode_metadata/last_step_is_observation"
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")


@dataclass(frozen=True)
class Column:
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
        """Whether the feature is text (stored as an index into a table of its strings)."""
        return self.leaf.kind == TEXT


@dataclass(frozen=True)
class Plan:
    """What workers need to decode pieces (pickled with every task)."""

    columns: tuple[Column, ...]


def plan_columns(features: Features, where: Path) -> tuple[list[Column], dict[str, tuple[str, ...]]]:
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
    columns: list[Column] = []
    for leaf in features.steps:
        role = roles[leaf.name]
        if role == "flag":
            columns.append(Column(leaf, role, leaf.path[-1], ()))
            continue
        key = "next/reward" if role == "reward" else cleaned[leaf.name]
        if leaf.kind == TEXT:
            shape: tuple[int, ...] = () if role == "obs" else (1,)
        elif role in ("reward", "step") and leaf.shape == () and not key.startswith("action"):
            shape = (1,)  # TED's trailing axis for scalar rewards and infos
        else:
            shape = leaf.shape
        columns.append(Column(leaf, role, key, shape))
    source = {k: v for k, v in wanted.items() if not k.startswith("\0")}
    return columns, source


def episode_columns(features: Features, report: ConversionReport) -> list[Column]:
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
    return [Column(leaf, "episode", "rlds/" + cleaned[leaf.name], leaf.shape) for leaf in kept]


@dataclass(frozen=True)
class PieceRef:
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
        """The record, for messages: its shard, index and byte offset."""
        return f"{self.shard}: record {self.record} (byte {self.offset})"


@dataclass
class Unit:
    """One worker task: pieces decoded with one plan."""

    plan: Plan
    pieces: list[PieceRef]


@dataclass
class Decoded:
    """A piece decoded by a worker: columns by TED key (text as strings; image files kept as
    they are, :class:`~rlds_cli.frames.codecs.EncodedFrames`), and the flags."""

    ref: PieceRef
    columns: dict[str, np.ndarray | EncodedFrames] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    flags: dict[str, np.ndarray] = field(default_factory=dict)


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
            problem = _damaged_jpeg(data)  # its size checked first: decoded whole here
            if problem is not None:  # Pillow decodes it anyway, warning: a damaged frame published
                raise SourceFormatError(f"{what} is a damaged JPEG image: {problem}")
            if leaf.dtype == "uint16":
                if img.mode not in (*_SIXTEEN_BIT_GRAY, "L"):
                    raise SourceFormatError(f"{what} is a {img.mode} image, not a 16-bit grayscale PNG")
                frame = np.asarray(img)
                if frame.dtype.kind != "u" and (frame.min(initial=0) < 0 or frame.max(initial=0) > 0xFFFF):
                    raise SourceFormatError(f"{what} holds values outside 0..65535")
                return frame.astype(np.uint16).reshape(h, w, 1)
            mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
            if img.mode in _SIXTEEN_BIT_GRAY:
                # TensorFlow's decode_png(dtype=uint8) keeps the high byte (libpng's strip_16), then
                # gray to RGB(A); Pillow's convert clipped at 255 (33375 read 255, not 130)
                frame = np.asarray(img)
                if frame.min(initial=0) < 0 or frame.max(initial=0) > 0xFFFF:
                    raise SourceFormatError(f"{what} holds values outside 0..65535")
                gray = (frame.astype(np.uint32) >> 8).astype(np.uint8).reshape(h, w, 1)
                if channels == 4:
                    return np.concatenate([gray, gray, gray, np.full_like(gray, 255)], axis=2)
                return np.repeat(gray, channels, axis=2)
            if img.mode != mode:
                img.load()
                converted = img.convert(mode)
                return np.asarray(converted, np.uint8).reshape(h, w, channels)
            return np.asarray(img, np.uint8).reshape(h, w, channels)
    except SourceFormatError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        # Pillow names the stream it was given (<_io.BytesIO object at 0x...>): a new address each run
        why = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", f"its {len(data):,} bytes", str(exc))
        raise SourceFormatError(f"{what} does not decode as a PNG or JPEG image: {why}") from None


def _damaged_jpeg(data: bytes) -> str | None:
    """Why ``data``, a JPEG (by its first bytes), is damaged: its header does not parse, or
    libjpeg warns of corrupt data decoding it (gray or RGB; other colour spaces are left to
    Pillow); ``None`` for an intact one or another format. TensorFlow's decoder refuses both."""
    if not data.startswith(b"\xff\xd8"):
        return None
    import simplejpeg

    try:
        colorspace = simplejpeg.decode_jpeg_header(data)[2]
        if colorspace in ("Gray", "YCbCr", "RGB"):
            simplejpeg.decode_jpeg(data, colorspace="GRAY" if colorspace == "Gray" else "RGB", strict=True)
    except ValueError as exc:
        return str(exc)
    return None


#: Pillow's modes of a 16-bit grayscale PNG.
_SIXTEEN_BIT_GRAY = ("I;16", "I;16B", "I;16L", "I")


def _kept_images(buf: memoryview, spans: list[tuple[int, int]], leaf: Leaf) -> EncodedFrames | None:
    """The steps' image files as they are (``--frames keep``: bit for bit) when each is a PNG or JPEG of
    the declared ``uint8`` size and channel count, all one codec; else ``None`` (the frames are then
    decoded and converted as TensorFlow's decoder does, errors reported there)."""
    if leaf.dtype != "uint8" or any(d < 0 for d in leaf.shape) or not spans:
        return None
    try:
        fmt = FrameFormat("png", tuple(leaf.shape))  # the codec is the first file's, below
    except FrameError:
        return None
    files = [bytes(buf[a:b]) for a, b in spans]
    try:
        found = {image_format(data) for data in files}
    except FrameError:
        return None
    if len(found) != 1:
        return None
    (first,) = found
    if first.image_shape != fmt.image_shape:
        return None
    return EncodedFrames(files, FrameFormat(first.codec, fmt.shape))


def _image_rows(
    buf: memoryview, raw: RawFeature, leaf: Leaf, steps: int, start: int, stop: int, where: str
) -> np.ndarray | EncodedFrames:
    _check_kind(leaf, raw, where)
    spans = bytes_spans(buf, raw) if raw.kind is not None else []
    _values_per_step(leaf, len(spans), steps, where)
    kept = _kept_images(buf, spans[start:stop], leaf)
    if kept is not None:
        return kept
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
    # bytes that are not UTF-8 as \xNN: two such texts stay two (U+FFFD made "caf\xe9" and
    # "caf\xe8" one instruction), and what the source held is readable
    return [bytes(buf[a:b]).decode("utf-8", errors="backslashreplace") for a, b in spans[start:stop]]


def _feature(feats: dict[str, RawFeature], leaf: Leaf, where: str) -> RawFeature:
    raw = feats.get(leaf.name)
    if raw is None:
        raise SourceFormatError(f"{where} has no feature {leaf.name!r}, which features.json declares")
    return raw


def _parse(buf: memoryview, where: str) -> dict[str, RawFeature]:
    try:
        return parse_example(buf)
    except WireError as exc:
        raise SourceFormatError(f"{where} is not a tf.train.Example: {exc}", hint=REDOWNLOAD_HINT) from None


def check_record(
    buf: memoryview, columns: Sequence[Column], per_episode: Sequence[Column], where: str
) -> tuple[int, dict[str, int], dict[str, Any]]:
    """One record checked against features.json: every feature present, of the declared kind and
    count. Returns its steps, the values each of ``columns`` holds (by leaf name) and the values of
    the ``per_episode`` columns (by key)."""
    feats = _parse(buf, where)
    counts: dict[str, int] = {}
    steps: int | None = None
    for col in columns:
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
    for col in columns:
        _values_per_step(col.leaf, counts[col.leaf.name], steps, where)
    values: dict[str, Any] = {}
    for col in per_episode:
        raw = _feature(feats, col.leaf, where)
        if col.text:
            values[col.key] = _text_rows(buf, raw, col.leaf, 1, 0, 1, where)[0]
        else:
            values[col.key] = _tensor_rows(buf, raw, col.leaf, 1, 0, 1, where)[0]
    return steps, counts, values


def _decode_piece(plan: Plan, ref: PieceRef, fd: int) -> Decoded:
    out = Decoded(ref)
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


def decode_unit(unit: Unit) -> list[Decoded]:
    """Decode the pieces of one task (runs in a worker process; module level to be pickled)."""
    out: list[Decoded] = []
    files: dict[str, int] = {}
    try:
        for ref in unit.pieces:
            if ref.start == ref.stop:
                out.append(Decoded(ref))
                continue
            if ref.shard not in files:
                files[ref.shard] = os.open(ref.shard, os.O_RDONLY)
            out.append(_decode_piece(unit.plan, ref, files[ref.shard]))
    finally:
        for fd in files.values():
            os.close(fd)
    return out
