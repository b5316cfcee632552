"""TFRecord files and ``tf.train.Example`` records, read and written without TensorFlow.

**Framing.** A TFRecord file is a run of records, each ``u64 length | u32 masked crc32c(length
bytes) | data | u32 masked crc32c(data)`` (little-endian); a CRC is masked as
``((crc >> 15) | (crc << 17)) + 0xa282ead8`` modulo 2**32. :func:`scan_records` checks both CRCs of
each record; a file ending inside a record is *truncated*, a CRC mismatch is *damage*; both are
reported with the record's number and byte offset.

**Records are mapped, not read.** :class:`MappedRecord` maps one record's byte range read-only,
so decoding steps 200..240 of a 50 MB episode touches only those steps' pages, and no copy of the
file is held.

**``tf.train.Example`` wire format** (protobuf): ``Example{features = 1: Features}``,
``Features{feature = 1: map<string, Feature>}`` (each map entry ``{key = 1, value = 2}``),
``Feature{oneof: bytes_list = 1, float_list = 2, int64_list = 3}``, each list ``{value = 1
repeated}``. Floats are little-endian float32, packed or one fixed32 field per value; int64s are
varints, packed or not. :func:`parse_example` locates each feature's list without decoding it;
:func:`count_values`, :func:`float_values`, :func:`int64_values` and :func:`bytes_spans` decode
on demand (packed floats as a zero-copy view, packed varints vectorised). As in protobuf, a later
map entry of the same key and a later list kind replace earlier ones; unknown fields are skipped;
groups (wire types 3 and 4) are refused.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Bytes of a record's header (length + its masked CRC) and footer (the data's masked CRC).
HEADER_BYTES = 12
FOOTER_BYTES = 4
#: Largest record read (an episode is one record; real ones are tens of MB); a record claiming
#: more is refused before anything is mapped.
MAX_RECORD_BYTES = 2 << 30
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

BYTES_LIST, FLOAT_LIST, INT64_LIST = "bytes", "float", "int64"
_KINDS = {1: BYTES_LIST, 2: FLOAT_LIST, 3: INT64_LIST}


class WireError(ValueError):
    """Bytes that are not a well-formed ``tf.train.Example`` (the caller names the record)."""


class FramingError(ValueError):
    """A TFRecord file that is truncated or damaged; ``str()`` names the record and offset.

    Attributes:
        truncated: The file ends inside a record (else a CRC or length is wrong).
    """

    def __init__(self, message: str, *, truncated: bool) -> None:
        super().__init__(message)
        self.truncated = truncated


def _load_crc32c() -> Callable[[Any], int] | None:
    """The crc32c function of an installed C-backed package (``crc32c``, else ``google-crc32c``)."""
    try:
        import crc32c

        return crc32c.crc32c
    except ImportError:
        pass
    try:
        import google_crc32c
    except ImportError:
        return None

    def value(data: Any) -> int:
        # google-crc32c takes bytes only (not a memoryview of a mapping): one copy
        return int(google_crc32c.value(bytes(data)))

    return value


_crc32c = _load_crc32c()


def have_crc32c() -> bool:
    """Whether a crc32c implementation is installed (``pip install 'rlds-cli[rlds]'``)."""
    return _crc32c is not None


def masked_crc(data: Any) -> int:
    """TFRecord's masked crc32c of ``data`` (bytes or a buffer)."""
    if _crc32c is None:
        raise RuntimeError("no crc32c implementation is installed (pip install crc32c)")
    crc = _crc32c(data) & _U32
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


# --------------------------------------------------------------------------- framing


@dataclass(frozen=True)
class RecordInfo:
    """Where one record lies in its file.

    Attributes:
        index: Its position in the file (0-based).
        offset: Byte offset of its header.
        length: Bytes of its data (the serialized ``Example``).
    """

    index: int
    offset: int
    length: int


class MappedRecord:
    """One record's data mapped read-only: ``view`` is a memoryview of exactly its bytes.

    A context manager. Arrays made with ``numpy.frombuffer`` on ``view`` must be copied before it
    closes (otherwise the mapping lives until they are gone).
    """

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self._mm: mmap.mmap | None = None
        if length == 0:  # mmap refuses an empty range
            self.view = memoryview(b"")
            return
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        self._mm = mmap.mmap(fd, length + offset - start, access=mmap.ACCESS_READ, offset=start)
        self._base = memoryview(self._mm)
        self.view = self._base[offset - start :]

    def close(self) -> None:
        if self._mm is None:
            return
        try:
            self.view.release()
            self._base.release()
            self._mm.close()
        except BufferError:  # a numpy view still points into it: the GC unmaps it later
            pass
        self._mm = None

    def __enter__(self) -> MappedRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan_records(
    fd: int, where: object, *, size: int | None = None
) -> Iterator[tuple[RecordInfo, MappedRecord]]:
    """Walk the records of the open file ``fd``, checking both CRCs of each; yields each record with its
    data mapped (closed when the next one is asked for).

    Raises:
        FramingError: A header cut short or data running past the end of the file (``truncated``),
            a length or data CRC mismatch, or a record over :data:`MAX_RECORD_BYTES`; the message
            names ``where``, the record and its offset.
    """
    if size is None:
        size = os.fstat(fd).st_size
    pos = index = 0
    while pos < size:
        header = os.pread(fd, HEADER_BYTES, pos)
        if len(header) < HEADER_BYTES:
            raise FramingError(
                f"{where} is truncated: the file ends inside the header of record {index} "
                f"(byte {pos}; {len(header)} of {HEADER_BYTES} header bytes)",
                truncated=True,
            )
        length, length_crc = struct.unpack("<QI", header)
        if masked_crc(header[:8]) != length_crc:
            raise FramingError(
                f"{where}: record {index} at byte {pos}: the CRC of its length field does not match "
                "(damaged, or not a TFRecord file)",
                truncated=False,
            )
        end = pos + HEADER_BYTES + length + FOOTER_BYTES
        if end > size:
            raise FramingError(
                f"{where} is truncated: record {index} at byte {pos} declares {length:,} bytes of data, "
                f"but the file ends {size - pos - HEADER_BYTES:,} bytes after its header",
                truncated=True,
            )
        if length > MAX_RECORD_BYTES:
            raise FramingError(
                f"{where}: record {index} at byte {pos} is {length:,} bytes, over the "
                f"{MAX_RECORD_BYTES:,} read for one record",
                truncated=False,
            )
        (data_crc,) = struct.unpack("<I", os.pread(fd, FOOTER_BYTES, end - FOOTER_BYTES))
        with MappedRecord(fd, pos + HEADER_BYTES, length) as rec:
            if masked_crc(rec.view) != data_crc:
                raise FramingError(
                    f"{where}: record {index} at byte {pos}: the CRC of its {length:,} data bytes does "
                    "not match (the file is damaged)",
                    truncated=False,
                )
            yield RecordInfo(index, pos, length), rec
        pos, index = end, index + 1


# --------------------------------------------------------------------------- protobuf wire


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError("a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("a varint is longer than 10 bytes")


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """The fields of the message in ``buf[start:end]``: ``(number, wire type, a, b)`` where
    ``a`` is the varint's value (type 0) or the payload's start (types 1, 2, 5), ``b`` its end."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError("a field numbered 0")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
            continue
        if wire == 2:
            size, pos = _varint(buf, pos, end)
            stop = pos + size
        elif wire == 1:
            stop = pos + 8
        elif wire == 5:
            stop = pos + 4
        else:
            raise WireError(f"wire type {wire} (groups or invalid) in field {number}")
        if stop > end:
            raise WireError(f"field {number} runs past the end of its message")
        yield number, wire, pos, stop
        pos = stop


@dataclass(frozen=True)
class RawFeature:
    """One feature of an ``Example``, located but not decoded.

    Attributes:
        kind: ``"bytes"``, ``"float"``, ``"int64"``, or ``None`` for a ``Feature`` with no list.
        start: Start of the list message in the record.
        end: Its end.
    """

    kind: str | None
    start: int
    end: int


def parse_example(buf: memoryview) -> dict[str, RawFeature]:
    """The features of the serialized ``Example`` in ``buf``, by name (not yet decoded).

    Raises:
        WireError: The bytes are not a well-formed ``Example``.
    """
    out: dict[str, RawFeature] = {}
    for number, wire, a, b in _fields(buf, 0, len(buf)):
        if number != 1:
            continue
        if wire != 2:
            raise WireError("Example.features is not a message")
        for n2, w2, a2, b2 in _fields(buf, a, b):  # Features: repeated map entries
            if n2 != 1:
                continue
            if w2 != 2:
                raise WireError("a Features map entry is not a message")
            key: str | None = None
            value = RawFeature(None, b2, b2)
            for n3, w3, a3, b3 in _fields(buf, a2, b2):
                if n3 == 1 and w3 == 2:
                    try:
                        key = bytes(buf[a3:b3]).decode("utf-8")
                    except UnicodeDecodeError:
                        raise WireError("a feature name is not UTF-8") from None
                elif n3 == 2 and w3 == 2:
                    value = _feature(buf, a3, b3)
            if key is None:
                raise WireError("a Features map entry has no key")
            out[key] = value
    return out


def _feature(buf: memoryview, start: int, end: int) -> RawFeature:
    found = RawFeature(None, end, end)
    for number, wire, a, b in _fields(buf, start, end):
        if number in _KINDS:
            if wire != 2:
                raise WireError("a Feature's list is not a message")
            found = RawFeature(_KINDS[number], a, b)
    return found


def count_values(buf: memoryview, feature: RawFeature) -> int:
    """How many values the feature's list holds (without decoding them)."""
    if feature.kind is None:
        return 0
    count = 0
    for number, wire, a, b in _fields(buf, feature.start, feature.end):
        if number != 1:
            continue
        if feature.kind == BYTES_LIST:
            count += wire == 2
        elif feature.kind == FLOAT_LIST:
            count += (b - a) // 4 if wire == 2 else int(wire == 5)
        elif wire == 2:  # packed varints: one value per byte with the high bit clear
            count += int(np.count_nonzero(np.frombuffer(buf[a:b], np.uint8) < 0x80))
        else:
            count += int(wire == 0)
    return count


def float_values(buf: memoryview, feature: RawFeature) -> np.ndarray:
    """A float_list's values as float32 (a view into ``buf`` when stored packed in one run)."""
    parts: list[np.ndarray] = []
    for number, wire, a, b in _fields(buf, feature.start, feature.end):
        if number != 1:
            continue
        if wire == 2:
            if (b - a) % 4:
                raise WireError("a packed float list is not a multiple of 4 bytes")
            parts.append(np.frombuffer(buf, "<f4", (b - a) // 4, a))
        elif wire == 5:
            parts.append(np.frombuffer(buf, "<f4", 1, a))
        else:
            raise WireError(f"a float list value has wire type {wire}")
    if not parts:
        return np.zeros(0, np.float32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def decode_varints(payload: np.ndarray) -> np.ndarray:
    """Packed varints (a ``uint8`` array) as int64 values (two's complement, as protobuf)."""
    if payload.size == 0:
        return np.zeros(0, np.int64)
    if payload[-1] >= 0x80:
        raise WireError("a packed int64 list ends inside a varint")
    ends = np.flatnonzero(payload < 0x80)
    if len(ends) == payload.size:  # every value one byte (flags, small integers): the common case
        return payload.astype(np.int64)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > 10:
        raise WireError("a varint is longer than 10 bytes")
    low = (payload & 0x7F).astype(np.uint64)
    out = np.zeros(len(ends), np.uint64)
    for k in range(longest):
        rows = np.flatnonzero(lengths > k)
        out[rows] |= low[starts[rows] + k] << np.uint64(7 * k)
    return out.view(np.int64)


def int64_values(buf: memoryview, feature: RawFeature) -> np.ndarray:
    """An int64_list's values."""
    parts: list[np.ndarray] = []
    for number, wire, a, b in _fields(buf, feature.start, feature.end):
        if number != 1:
            continue
        if wire == 2:
            parts.append(decode_varints(np.frombuffer(buf[a:b], np.uint8)))
        elif wire == 0:
            parts.append(np.array([a & 0xFFFFFFFFFFFFFFFF], np.uint64).view(np.int64))
        else:
            raise WireError(f"an int64 list value has wire type {wire}")
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def bytes_spans(buf: memoryview, feature: RawFeature) -> list[tuple[int, int]]:
    """Where each value of a bytes_list lies in ``buf`` (``buf[a:b]``)."""
    spans: list[tuple[int, int]] = []
    for number, wire, a, b in _fields(buf, feature.start, feature.end):
        if number != 1:
            continue
        if wire != 2:
            raise WireError(f"a bytes list value has wire type {wire}")
        spans.append((a, b))
    return spans


# --------------------------------------------------------------------------- writing


def frame_record(data: bytes) -> bytes:
    """One TFRecord record holding ``data``: length, the length's masked CRC, data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def encode_varints(values: np.ndarray) -> bytes:
    """``values`` (integers) as back-to-back protobuf varints; negative int64s as 64-bit two's complement
    (10 bytes), as protobuf writes ``int64``."""
    raw = np.ascontiguousarray(values).astype(np.int64, copy=False).view(np.uint64).reshape(-1)
    if raw.size == 0:
        return b""
    if int(raw.max()) < 0x80:  # every value one byte (flags, small integers): the common case
        return raw.astype(np.uint8).tobytes()
    sizes = np.ones(raw.size, np.int64)
    rest = raw >> np.uint64(7)
    while rest.any():
        sizes += rest > 0
        rest >>= np.uint64(7)
    ends = np.cumsum(sizes)
    out = np.empty(int(ends[-1]), np.uint8)
    starts = ends - sizes
    for k in range(int(sizes.max())):
        rows = np.flatnonzero(sizes > k)
        group = (raw[rows] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (sizes[rows] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[rows] + k] = (group | more).astype(np.uint8)
    return out.tobytes()


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint_bytes(number << 3 | 2) + _varint_bytes(len(payload)) + payload


def encode_feature(kind: str, values: Any) -> bytes:
    """A serialized ``Feature`` message: ``kind`` :data:`BYTES_LIST` (``values``: a sequence of
    bytes), :data:`FLOAT_LIST` (numbers, written as packed little-endian float32) or
    :data:`INT64_LIST` (integers or bools, packed varints)."""
    if kind == BYTES_LIST:
        body = b"".join(_delimited(1, bytes(v)) for v in values)
        number = 1
    elif kind == FLOAT_LIST:
        packed = np.ascontiguousarray(values, dtype="<f4").tobytes()
        body, number = (_delimited(1, packed) if packed else b""), 2
    elif kind == INT64_LIST:
        packed = encode_varints(np.asarray(values).astype(np.int64))
        body, number = (_delimited(1, packed) if packed else b""), 3
    else:
        raise ValueError(f"no list kind {kind!r}")
    return _delimited(number, body)


def encode_example(features: dict[str, bytes]) -> bytes:
    """A serialized ``tf.train.Example`` of the named, already serialized ``Feature`` messages
    (:func:`encode_feature`), in the order given."""
    entries = b"".join(
        _delimited(1, _delimited(1, name.encode("utf-8")) + _delimited(2, feature))
        for name, feature in features.items()
    )
    return _delimited(1, entries)
