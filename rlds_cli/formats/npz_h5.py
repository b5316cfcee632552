"""A read-only, h5py-like view of an ``.npz`` file, so the D4RL reader reads the D4RL layout
from ``.npz`` too (what ``rlds export --to npz`` writes), streaming row blocks from the zip."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from rlds_cli.formats.npz_util import NpyStream, npz_keys, open_npz


class NpzColumn:
    """One ``.npz`` member read forward in row ranges; a range may start at most where the
    previous one did (the reader's one-row lookahead), anything earlier reopens the member."""

    attrs: ClassVar[Mapping[str, Any]] = MappingProxyType({})  # npz members have no attributes

    def __init__(self, zf: zipfile.ZipFile, key: str, path: Path) -> None:
        self._zf, self.key, self.path = zf, key, path
        self._open()
        self.shape, self.dtype = self._stream.shape, self._stream.dtype
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.ndim = len(self.shape)

    def _open(self) -> None:
        self._stream = NpyStream(self._zf, self.key, self.path)
        self._buf_start = 0
        self._buf = np.empty((0, *self._stream.shape[1:]), self._stream.dtype) if self._stream.shape else None

    def __getitem__(self, index: Any) -> np.ndarray:
        if index == () or index is Ellipsis or not self.shape:
            return self._whole()
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("NpzColumn supports contiguous row slices only")
        start, stop, _ = index.indices(self.shape[0])
        if start < self._buf_start:
            self._open()
        assert self._buf is not None
        drop = min(start - self._buf_start, len(self._buf))
        self._buf, self._buf_start = self._buf[drop:], self._buf_start + drop
        while self._stream.pos < start:  # skip forward
            self._stream.read(min(start - self._stream.pos, 1 << 16))
            self._buf_start = self._stream.pos
        if self._stream.pos < stop:
            self._buf = np.concatenate([self._buf, self._stream.read(stop - self._stream.pos)])
        return self._buf[start - self._buf_start : stop - self._buf_start]

    def _whole(self) -> np.ndarray:
        stream = NpyStream(self._zf, self.key, self.path)
        data = stream.read(stream.shape[0]) if stream.shape else stream._read_bytes(stream.dtype.itemsize)[0]
        stream.close()
        return data


class NpzAsH5:
    """The parts of ``h5py.File`` the D4RL reader uses, over an ``.npz`` (keys may contain ``/``)."""

    attrs: ClassVar[Mapping[str, Any]] = MappingProxyType({})  # npz members have no attributes

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zf = open_npz(path)
        self._keys = npz_keys(self._zf)
        self._columns: dict[str, NpzColumn] = {}

    def get(self, key: str) -> NpzColumn | None:
        if key not in self._keys:
            return None
        if key not in self._columns:
            self._columns[key] = NpzColumn(self._zf, key, self.path)
        return self._columns[key]

    def __getitem__(self, key: str) -> NpzColumn:
        column = self.get(key)
        if column is None:
            raise KeyError(key)
        return column

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def keys(self) -> list[str]:
        return sorted({k.split("/", 1)[0] for k in self._keys})

    def visititems(self, fn: Callable[[str, Any], None]) -> None:
        for key in sorted(self._keys):
            fn(key, self[key])

    def close(self) -> None:
        self._zf.close()
