"""A zarr v2 store as a read-only source: a directory store or a ``.zip`` (zarr 2's ``ZipStore``).

Keys are listed and ``.zarray``/``.zgroup`` JSON read as untrusted input; arrays are opened
through zarr-python 3 once every codec is known to numcodecs. ``imagecodecs_*`` codecs (UMI's
JPEG-XL camera arrays) are registered from imagecodecs (the ``umi`` extra) when an array names
one; a codec numcodecs does not know is refused, naming the array and codec, before a chunk is read.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path
from typing import Any

from rlds_cli.errors import MissingExtraError, SourceFormatError

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
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
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
        if self._names is not None:
            for name in self._names:
                if name.startswith(prefix):
                    rest = name[len(prefix) :].split("/")
                    if len(rest) >= 2 and rest[1] in (".zarray", ".zgroup"):
                        found.add(rest[0])
        else:
            folder = self.path / group
            if folder.is_dir():
                found = {
                    p.name for p in folder.iterdir() if (p / ".zarray").is_file() or (p / ".zgroup").is_file()
                }
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
            return zarr.open_array(self._zarr_store, path=key, mode="r", zarr_format=2)
        except Exception as exc:  # zarr's own errors on damaged metadata are of many classes
            raise SourceFormatError(
                f"{self.path}: zarr cannot open the array {key} ({type(exc).__name__}: {exc})",
                hint="the store is damaged or was not written by zarr",
            ) from None

    def close(self) -> None:
        if self._zarr_store is not None:
            self._zarr_store.close()
            self._zarr_store = None
        if self._zip is not None:
            self._zip.close()
            self._zip = None


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
    try:
        import imagecodecs.numcodecs
    except ImportError:
        raise MissingExtraError(
            f"{where}: {key} is compressed with {codec}, read with imagecodecs, which is not installed "
            "(rlds-cli's 'umi' extra)",
            hint=UMI_EXTRA_HINT,
        ) from None
    imagecodecs.numcodecs.register_codecs(verbose=False)
