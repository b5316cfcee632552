"""A zarr v2 store as a read-only source: a directory store or a ``.zip`` (zarr 2's ``ZipStore``).

Keys are listed and ``.zarray``/``.zgroup`` JSON read as untrusted input; arrays are opened
through zarr-python 3 once every codec is known to numcodecs. ``imagecodecs_*`` codecs (UMI's
JPEG-XL camera arrays) are registered from imagecodecs (the ``umi`` extra) when an array names
one; a codec numcodecs does not know is refused, naming the array and codec, before a chunk is read.
Every chunk is decoded into at most its own size (:class:`BoundedChunkDecoder`).
"""

from __future__ import annotations

import bz2
import contextlib
import json
import lzma
import math
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError, import_extra

#: How to install imagecodecs, said where an array needs it.
UMI_EXTRA_HINT = "pip install 'rlds-cli[umi]' (or pip install imagecodecs)"
#: Largest ``.zarray``/``.zgroup`` read (metadata is a few hundred bytes; a bigger one is no zarr).
MAX_METADATA_BYTES = 1 << 20


def is_zip(path: Path) -> bool:
    """Whether ``path`` is a file that zipfile can open (its central directory is read)."""
    return path.is_file() and zipfile.is_zipfile(path)


class ZarrV2Store:
    """A read-only zarr v2 store at ``path`` (a directory, or a zip file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip: zipfile.ZipFile | None = None
        self._zarr_store: Any = None
        if path.is_dir():
            self._names: set[str] | None = None
        else:
            try:
                self._zip = zipfile.ZipFile(path)
            except (OSError, zipfile.BadZipFile) as exc:
                raise SourceFormatError(
                    f"{path}: not a readable zip file, truncated or damaged ({exc})",
                    hint="fetch or write the file again",
                ) from None
            self._names = {i.filename for i in self._zip.infolist() if not i.is_dir()}

    # ------------------------------------------------------------------ raw keys

    def has(self, key: str) -> bool:
        """Whether the store holds the key ``key`` (``meta/episode_ends/.zarray``)."""
        if self._names is not None:
            return key in self._names
        return (self.path / key).is_file()

    def read_json(self, key: str) -> dict[str, Any] | None:
        """The JSON object stored at ``key``; ``None`` where there is none.

        Raises:
            SourceFormatError: The key holds something that is not a JSON object.
        """
        if not self.has(key):
            return None
        try:
            if self._zip is not None:
                info = self._zip.getinfo(key)
                if info.file_size > MAX_METADATA_BYTES:
                    raise ValueError(f"{info.file_size:,} bytes")
                raw = self._zip.read(key)
            else:
                file = self.path / key
                if file.stat().st_size > MAX_METADATA_BYTES:
                    raise ValueError(f"{file.stat().st_size:,} bytes")
                raw = file.read_bytes()
            value = json.loads(raw)
        except (
            OSError,
            ValueError,
            zipfile.BadZipFile,
            NotImplementedError,
        ) as exc:  # (an unknown zip method)
            raise SourceFormatError(
                f"{self.path}: {key} is not a readable zarr metadata file ({exc})"
            ) from None
        if not isinstance(value, dict):
            raise SourceFormatError(f"{self.path}: {key} holds no JSON object")
        return value

    def children(self, group: str) -> list[str]:
        """Names of the arrays and groups directly in ``group`` (``data``), sorted."""
        prefix = f"{group}/"
        found: set[str] = set()
        holding: set[str] = set()  # entries holding anything (an array without metadata: damage)
        if self._names is not None:
            for name in self._names:
                if name.startswith(prefix):
                    rest = name[len(prefix) :].split("/")
                    if len(rest) >= 2:
                        holding.add(rest[0])
                    if len(rest) >= 2 and rest[1] in (".zarray", ".zgroup"):
                        found.add(rest[0])
        else:
            folder = self.path / group
            if folder.is_dir():
                for p in folder.iterdir():
                    if (p / ".zarray").is_file() or (p / ".zgroup").is_file():
                        found.add(p.name)
                    elif p.is_dir():
                        with contextlib.suppress(OSError):  # unreadable: named where it is read
                            if any(p.iterdir()):
                                holding.add(p.name)
        orphans = sorted(holding - found)
        if orphans:
            raise SourceFormatError(
                f"{self.path}: {prefix}{orphans[0]} holds files but no readable .zarray or .zgroup (its zarr "
                "metadata): the store is damaged",
                hint="copy the store again from its source",
            )
        return sorted(found)

    def missing_chunks(self, array: str, meta: dict[str, Any]) -> tuple[int, int]:
        """``(missing, expected)``: the chunks of ``array`` (its ``.zarray`` ``meta``) the store
        lacks, of those a full writer writes. Only keys naming a chunk inside the array count (a
        stray file never stands in for a lost chunk)."""
        shape = [int(n) for n in meta.get("shape") or []]
        chunks = [int(n) for n in meta.get("chunks") or []]
        grid = [math.ceil(s / c) if c else 0 for s, c in zip(shape, chunks, strict=False)]
        separator = meta.get("dimension_separator") or "."
        prefix = f"{array}/"
        if self._names is not None:
            keys = [n[len(prefix) :] for n in self._names if n.startswith(prefix)]
        else:
            folder = self.path / array
            keys = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        found: set[tuple[int, ...]] = set()
        for key in keys:
            parts = key.split(separator) if grid else [key]
            if len(parts) == max(1, len(grid)) and all(p.isdigit() for p in parts):
                index = tuple(int(p) for p in parts)
                if all(i < g for i, g in zip(index, grid or [1], strict=True)):
                    found.add(index)
        expected = math.prod(grid)
        return expected - len(found), expected

    def stored_bytes(self, array: str) -> int:
        """Bytes the store holds for ``array``'s chunks (compressed, as stored)."""
        prefix = f"{array}/"
        if self._zip is not None:
            return sum(
                i.compress_size
                for i in self._zip.infolist()
                if i.filename.startswith(prefix) and not i.filename.rsplit("/", 1)[-1].startswith(".")
            )
        folder = self.path / array
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))

    # ------------------------------------------------------------------ zarr

    def open_array(self, key: str) -> Any:
        """The zarr array at ``key``, opened read-only through zarr-python 3 (zarr format 2).

        Raises:
            SourceFormatError: zarr cannot open it (its metadata is damaged).
        """
        import zarr

        if self._zarr_store is None:
            if self._zip is not None:
                from zarr.storage import ZipStore

                self._zarr_store = ZipStore(self.path, mode="r")
            else:
                from zarr.storage import LocalStore

                self._zarr_store = LocalStore(self.path, read_only=True)
        try:
            array = zarr.open_array(self._zarr_store, path=key, mode="r", zarr_format=2)
        except Exception as exc:  # zarr's own errors on damaged metadata are of many classes
            raise SourceFormatError(
                f"{self.path}: zarr cannot open the array {key} ({type(exc).__name__}: {exc})",
                hint="the store is damaged or was not written by zarr",
            ) from None
        from zarr.core.array import Array, AsyncArray
        from zarr.core.metadata import ArrayV2Metadata

        meta = array.metadata
        assert isinstance(meta, ArrayV2Metadata)  # opened with zarr_format=2
        if meta.filters:  # a filter's output size is its own: no bound holds (a zlib filter inflated 3 GB)
            names = ", ".join(str(getattr(f, "codec_id", f)) for f in meta.filters)
            raise SourceFormatError(
                f"{self.path}: the array {key} decodes through zarr filters ({names}); rlds reads arrays "
                "with a compressor alone, as diffusion_policy and UMI write them",
                hint="rewrite the array without filters (zarr: filters=None), or convert it yourself",
            )
        self._check_zip_members(key, math.prod(meta.chunks) * meta.dtype.to_native_dtype().itemsize)
        if meta.compressor is None:
            return array

        bounded = BoundedChunkDecoder(meta.compressor, meta.chunks, meta.dtype.to_native_dtype())
        return Array(AsyncArray(replace(meta, compressor=bounded), array.async_array.store_path))

    def _check_zip_members(self, key: str, chunk_bytes: int) -> None:
        """Refuse a chunk of the zipped array ``key`` whose zip entry holds more bytes than a chunk
        of ``chunk_bytes`` compresses to at worst: zarr's ZipStore inflates an entry whole before
        its codec sees it, and zipfile bounds the inflation by neither the declared size (a
        deflated entry of a few KB declaring 16 bytes inflated 600 MB) nor anything else. A
        compressed entry is inflated here first, into at most that bound plus one byte."""
        if self._zip is None:
            return
        limit = 2 * chunk_bytes + (1 << 20)  # a codec's worst expansion, with room to spare
        prefix = f"{key}/"
        for info in self._zip.infolist():
            name = info.filename
            if not name.startswith(prefix) or name.rsplit("/", 1)[-1].startswith("."):
                continue
            size = max(info.file_size, info.compress_size)  # zipfile reads the compressed bytes whole
            if size <= limit and info.compress_type != zipfile.ZIP_STORED:
                size = self._inflated_size(info, limit)
            if size > limit:
                raise SourceFormatError(
                    f"{self.path}: the zip entry {name} holds more than {limit:,} bytes, more than a "
                    f"chunk of {key} ({chunk_bytes:,} bytes decoded) can hold: the store is damaged",
                    hint="copy the store again from its source",
                )

    def _inflated_size(self, info: zipfile.ZipInfo, limit: int) -> int:
        """How many bytes the compressed zip entry ``info`` inflates to, counted to ``limit + 1`` at
        most (its compressed bytes read from the archive, inflated by a bounded decompressor)."""
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            header = f.read(30)
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                raise SourceFormatError(
                    f"{self.path}: the zip entry {info.filename} has no local header: damaged"
                )
            name_length, extra_length = (
                int.from_bytes(header[26:28], "little"),
                int.from_bytes(header[28:30], "little"),
            )
            f.seek(info.header_offset + 30 + name_length + extra_length)
            raw = f.read(info.compress_size)  # at most the limit (checked by the caller)
        try:
            if info.compress_type == zipfile.ZIP_DEFLATED:
                return len(zlib.decompressobj(-15).decompress(raw, limit + 1))
            if info.compress_type == zipfile.ZIP_BZIP2:
                return len(bz2.BZ2Decompressor().decompress(raw, max_length=limit + 1))
            if info.compress_type == zipfile.ZIP_LZMA:
                return len(
                    _zip_lzma(raw).decompress(
                        raw[4 + int.from_bytes(raw[2:4], "little") :], max_length=limit + 1
                    )
                )
        except (OSError, ValueError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise SourceFormatError(
                f"{self.path}: the zip entry {info.filename} does not inflate ({type(exc).__name__}: {exc}): "
                "the store is damaged",
                hint="copy the store again from its source",
            ) from None
        raise SourceFormatError(
            f"{self.path}: the zip entry {info.filename} is compressed with zip method {info.compress_type}, "
            "which rlds does not read",
            hint="zip the store again stored or deflated (zarr's ZipStore writes stored entries)",
        )

    def close(self) -> None:
        if self._zarr_store is not None:
            self._zarr_store.close()
            self._zarr_store = None
        if self._zip is not None:
            self._zip.close()
            self._zip = None


def _zip_lzma(raw: bytes) -> lzma.LZMADecompressor:
    """A decompressor of a zip LZMA entry's stream, from the entry's header (APPNOTE 5.8.8: a
    version, the size of the LZMA1 properties, then the properties: ``lc``/``lp``/``pb`` in one
    byte, the dictionary size in four)."""
    size = int.from_bytes(raw[2:4], "little")
    props = raw[4 : 4 + size]
    if size != 5 or len(props) != 5 or props[0] >= 9 * 5 * 5:
        raise ValueError("its LZMA properties are not the five bytes of LZMA1")
    pb, rest = divmod(props[0], 9 * 5)
    lp, lc = divmod(rest, 9)
    lzma1 = {
        "id": lzma.FILTER_LZMA1,
        "dict_size": int.from_bytes(props[1:5], "little"),
        "lc": lc,
        "lp": lp,
        "pb": pb,
    }
    return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[lzma1])


def codec_ids(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The codec configurations of a ``.zarray``: its filters, then its compressor."""
    configs = [f for f in meta.get("filters") or [] if isinstance(f, dict)]
    if isinstance(meta.get("compressor"), dict):
        configs.append(meta["compressor"])
    return configs


def require_codecs(where: Path, key: str, meta: dict[str, Any]) -> None:
    """Make sure numcodecs can build every codec of the array ``key``, registering imagecodecs' codecs
    for an ``imagecodecs_*`` one.

    Raises:
        MissingExtraError: An ``imagecodecs_*`` codec, and imagecodecs is not installed.
        SourceFormatError: A codec numcodecs does not know, or whose settings it refuses.
    """
    import numcodecs

    for config in codec_ids(meta):
        codec = str(config.get("id", ""))
        if codec.startswith("imagecodecs_"):
            register_imagecodecs(where, key, codec)
        try:
            numcodecs.get_codec(dict(config))
        except Exception as exc:  # numcodecs raises UnknownCodecError, or the codec's own init errors
            raise SourceFormatError(
                f"{where}: {key} is compressed with the codec {codec!r}, which numcodecs cannot build "
                f"({type(exc).__name__}: {exc})",
                hint="install the package that registers that codec with numcodecs, or re-save the "
                "array with a standard compressor (e.g. blosc)",
            ) from None


def register_imagecodecs(where: Path, key: str, codec: str) -> None:
    """Register imagecodecs' numcodecs codecs (once per process; idempotent).

    Raises:
        MissingExtraError: imagecodecs is not installed.
    """
    codecs = import_extra(
        "imagecodecs.numcodecs",
        f"{where}: {key}, compressed with {codec} (rlds-cli's 'umi' extra),",
        hint=UMI_EXTRA_HINT,
    )
    codecs.register_codecs(verbose=False)


class BoundedChunkDecoder:
    """A zarr v2 array's compressor that decodes a chunk into at most the chunk's own bytes.

    zarr decodes a chunk whole before it checks its size, so a damaged or hostile chunk (a JPEG-XL
    image of 60,000 x 60,000 pixels in a 224 x 224 array, a blosc header declaring gigabytes, a zlib
    stream of a gigabyte of zeros) would be allocated and decoded first. Here imagecodecs' image
    codecs (:data:`_IMAGE_CODECS`) decode into an array of the chunk's shape (imagecodecs compares
    the image's header with it before decoding); blosc, LZ4 and zstd are refused when their header
    declares another size, then decode into the chunk's buffer; zlib, gzip, bz2 and LZMA inflate at
    most one byte past it, and so do imagecodecs' byte codecs (:data:`_BYTE_CODECS`: given a buffer,
    each fills it and stops, or raises, so one byte more tells a larger chunk, which would otherwise
    be cut to fit without a word). Other codecs decode as zarr does. A refused chunk raises
    ``ValueError`` naming the sizes (the reader names the array and rows).

    ``encode``, ``get_config`` and ``from_config`` complete numcodecs' protocol, which zarr checks.
    """

    #: zarr takes a compressor by its class's ``codec_id``; each instance carries its inner codec's.
    codec_id = "bounded"

    def __init__(self, inner: Any, chunks: tuple[int, ...], dtype: np.dtype) -> None:
        self.inner = inner
        self.codec_id = str(inner.codec_id)
        self.shape = tuple(int(n) for n in chunks)
        self.dtype = np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize

    def decode(self, buf: Any, out: Any = None) -> Any:
        data = memoryview(buf).cast("B")
        if self.codec_id in _IMAGE_CODECS:
            trailer = _IMAGE_TRAILERS.get(self.codec_id)
            if trailer is not None and not bytes(data[-64:]).rstrip(b"\0").endswith(trailer):
                # the decoder serves a cut image, its missing rows grey, with no error
                raise ValueError("the image is cut short (it lacks its end marker)")
            return self.inner.decode(data, out=np.empty(self.shape, self.dtype))
        if self.codec_id in _STREAMS:
            return self._inflate(data)
        if self.codec_id in _BYTE_CODECS:
            room = np.empty(self.nbytes + 1, np.uint8)
            try:
                got = len(memoryview(self.inner.decode(data, out=room)).cast("B"))
            except Exception as exc:  # imagecodecs' own error classes: larger than the room, or damaged
                raise ValueError(
                    f"the chunk does not decode into the {self.nbytes:,} bytes chunks of this array hold "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            if got != self.nbytes:
                raise ValueError(
                    f"the chunk decodes to {'more than ' if got > self.nbytes else ''}"
                    f"{min(got, self.nbytes):,} bytes; chunks of this array hold {self.nbytes:,}"
                )
            return room[: self.nbytes].view(self.dtype).reshape(self.shape)
        if self.codec_id not in _SIZED:
            return self.inner.decode(data)
        declared = _declared_size(self.codec_id, data)
        if declared is not None and declared != self.nbytes:
            raise ValueError(
                f"the chunk declares {declared:,} bytes; chunks of this array hold {self.nbytes:,}"
            )
        # numcodecs decodes a zstd frame of no declared size into ``out`` only if it fits exactly
        return self.inner.decode(data, out=np.empty(self.shape, self.dtype))

    def _inflate(self, data: memoryview) -> np.ndarray:
        limit = self.nbytes + 1
        if self.codec_id == "bz2":
            raw = bz2.BZ2Decompressor().decompress(data, max_length=limit)
        elif self.codec_id == "lzma":  # a hostile header's window (up to 1.5 GiB) is bounded too
            limit_memory = {} if self.inner.format == lzma.FORMAT_RAW else {"memlimit": LZMA_MEMORY_LIMIT}
            unpack = lzma.LZMADecompressor(
                format=self.inner.format, filters=self.inner.filters, **limit_memory
            )
            raw = unpack.decompress(data, max_length=limit)
        else:  # zlib, or gzip (wbits 31)
            raw = zlib.decompressobj(31 if self.codec_id == "gzip" else 15).decompress(data, limit)
        if len(raw) != self.nbytes:
            raise ValueError(
                f"the chunk inflates to {'more than ' if len(raw) == limit else ''}{len(raw):,} bytes; "
                f"chunks of this array hold {self.nbytes:,}"
            )
        return np.frombuffer(raw, self.dtype).reshape(self.shape)

    def encode(self, buf: Any) -> Any:
        return self.inner.encode(buf)

    def get_config(self) -> dict[str, Any]:
        return dict(self.inner.get_config())

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        import numcodecs

        return numcodecs.get_codec(config)


def read_rows(array: Any, start: int | None = None, stop: int | None = None) -> np.ndarray:
    """Rows ``start:stop`` of the zarr ``array`` (``None``: all of it).

    When the read fails (a chunk that does not decode), the error is raised only once every other
    chunk read still running on zarr's event loop has ended: zarr raises its first chunk's error
    while the other chunks' decodes go on in its threads, which would outlive the refusal (and the
    store they read; under ``tracemalloc`` such a thread crashed the interpreter when tracing
    stopped).
    """
    try:
        return np.asarray(array[...] if start is None else array[start:stop])
    except Exception:  # not an interrupt (Ctrl-C): that one stops at once
        _wait_for_other_reads(SETTLE_SECONDS)
        raise


#: Longest a failed read waits for zarr's other chunk reads to end before it raises.
SETTLE_SECONDS = 60.0


def _wait_for_other_reads(timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) until no task but this one is left on zarr's event loop."""
    import asyncio

    from zarr.core.sync import sync

    async def others_ended() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # a task still running may start others (zarr nests its chunk reads): look again until none
        while (others := asyncio.all_tasks() - {asyncio.current_task()}) and loop.time() < deadline:
            await asyncio.wait(others, timeout=deadline - loop.time())

    sync(others_ended())


#: Most memory LZMA's decoder may take (its window: 8 MiB at xz's default preset, 64 MiB at -9).
LZMA_MEMORY_LIMIT = 128 << 20
#: imagecodecs' image (and LERC, ZFP array) codecs that refuse an ``out`` of another shape than
#: the header gives, before decoding (each checked; GIF's frame axis does not fit a chunk's shape).
_IMAGE_CODECS = frozenset(
    f"imagecodecs_{name}"
    for name in (
        "jpegxl",
        "jpeg2k",
        "htj2k",
        "jpeg",
        "jpegls",
        "jpegxr",
        "png",
        "apng",
        "spng",
        "webp",
        "avif",
        "bmp",
        "qoi",
        "tiff",
        "lerc",
        "zfp",
    )
)
#: The end marker of image codecs whose decoders serve a cut image without an error (JPEG's EOI,
#: QOI's end padding): a chunk must end with it (trailing zero bytes aside).
_IMAGE_TRAILERS = {"imagecodecs_jpeg": b"\xff\xd9", "imagecodecs_qoi": b"\0" * 7 + b"\x01"}
#: imagecodecs' byte codecs that, given a buffer, decode at most into it (each checked: a larger
#: stream fills it or raises, a shorter one returns its length, and every dtype reads back exact:
#: not aec or bitshuffle, whose output depends on the buffer given).
_BYTE_CODECS = frozenset(
    f"imagecodecs_{name}"
    for name in (
        "zlib", "zlibng", "deflate", "zopfli", "brotli", "zstd", "lz4", "lz4f", "lzma", "bz2",
        "snappy", "lzw", "lzham", "lzf", "lzfse", "blosc", "blosc2", "packbits",
    )
)  # fmt: skip
#: Codecs of a stream with no declared size, inflated with a bound (numcodecs' ids).
_STREAMS = frozenset({"zlib", "gzip", "bz2", "lzma"})
#: Codecs whose header declares the decoded size (a zstd frame may leave it out).
_SIZED = frozenset({"blosc", "lz4", "zstd"})
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _declared_size(codec: str, data: memoryview) -> int | None:
    """The decoded size the header of a chunk of a :data:`_SIZED` codec declares; ``None`` for a
    zstd frame that does not declare it.

    Raises:
        ValueError: The header is cut short, or is not the codec's.
    """
    if codec == "blosc":  # a 16-byte header: version, versionlz, flags, typesize, nbytes, blocksize, cbytes
        if len(data) < 16:
            raise ValueError("the chunk is shorter than a blosc header")
        # c-blosc trusts cbytes: a chunk cut short (a memcpyed one above all) is read past its end
        compressed = int.from_bytes(data[12:16], "little")
        if compressed != len(data):
            raise ValueError(f"the chunk holds {len(data):,} bytes; its blosc header says {compressed:,}")
        return int.from_bytes(data[4:8], "little")
    if codec == "lz4":  # numcodecs prefixes the stream with its size, 4 bytes little-endian
        if len(data) < 4:
            raise ValueError("the chunk is shorter than its LZ4 size prefix")
        return int.from_bytes(data[:4], "little")
    return _zstd_content_size(data)


def _zstd_content_size(data: memoryview) -> int | None:
    """The content size of a zstd frame header (RFC 8878, 3.1.1.1); ``None`` where it has none.

    Raises:
        ValueError: Not a zstd frame.
    """
    if len(data) < 6 or bytes(data[:4]) != _ZSTD_MAGIC:
        raise ValueError("the chunk is not a zstd frame")
    descriptor = data[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    field = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if field == 0:
        return None
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    if len(data) < start + field:
        raise ValueError("the chunk's zstd header is cut short")
    value = int.from_bytes(data[start : start + field], "little")
    return value + 256 if field == 2 else value
