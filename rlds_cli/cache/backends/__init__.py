"""Storage backends: how one column (one TED key) is written and read on disk.

Two backends share one small interface, so the builder and the reader never care which is
in use:

* ``memmap`` (default): one ``.npy`` file per key under ``arrays/`` (``arrays/next/reward.npy``),
  uncompressed and C-contiguous, that plain ``numpy.load(path, mmap_mode="r")`` opens. Rows
  are appended as they stream in; the header is written with room to spare and patched with
  the final row count when the column is closed.
* ``zarr``: one zarr v3 group at ``arrays/`` with one array per key, chunked along time in
  small chunks (about 16 KiB, so a random row decodes little) grouped into shards (about 16 MiB
  per file; a smaller column is one shard of just its chunks) and compressed with Blosc/LZ4 +
  byte shuffle (fast to decode, which matters more for sampling than the last percent of
  ratio). Datasets written before sharding (512 KiB chunks, one file each) keep reading.

Besides appending, a column can be preallocated at its final size and then written region by
region (:meth:`Backend.preallocate`, :meth:`Backend.open_region`): parallel workers each fill
their own rows, as a per-step preprocess job does.

The interface is :mod:`rlds_cli.cache.backends.base`; the backends are
:mod:`rlds_cli.cache.backends.memmap` and :mod:`rlds_cli.cache.backends.zarr` (``write``: the
backend and its writer, ``read``: columns and the chunk reader, ``codec``: Blosc). This module
names them (:func:`get_backend`) and keeps every public name importable from one place.
"""

from __future__ import annotations

from rlds_cli.cache.backends.base import Backend, ColumnWriter, RegionWriter, key_path
from rlds_cli.cache.backends.memmap import (
    NPY_HEADER_BYTES,
    MemmapBackend,
    NpyColumnWriter,
    npy_header,
    reserve,
    save_npz,
)
from rlds_cli.cache.backends.zarr.read import ALL_CHUNKS_ATTR, ZarrColumn
from rlds_cli.cache.backends.zarr.write import (
    ZARR_CHUNK_BYTES,
    ZARR_IN_RAM_BYTES,
    ZARR_MAX_CHUNK_ROWS,
    ZARR_ROW_CHUNK_BYTES,
    ZARR_SHARD_BYTES,
    ZarrBackend,
    ZarrColumnWriter,
    check_zarr_grid,
    zarr_chunk_rows,
    zarr_fitted_shard_rows,
    zarr_shard_rows,
)

__all__ = [
    "ALL_CHUNKS_ATTR",
    "BACKENDS",
    "NPY_HEADER_BYTES",
    "ZARR_CHUNK_BYTES",
    "ZARR_IN_RAM_BYTES",
    "ZARR_MAX_CHUNK_ROWS",
    "ZARR_ROW_CHUNK_BYTES",
    "ZARR_SHARD_BYTES",
    "Backend",
    "ColumnWriter",
    "MemmapBackend",
    "NpyColumnWriter",
    "RegionWriter",
    "ZarrBackend",
    "ZarrColumn",
    "ZarrColumnWriter",
    "check_zarr_grid",
    "get_backend",
    "key_path",
    "npy_header",
    "reserve",
    "save_npz",
    "zarr_chunk_rows",
    "zarr_fitted_shard_rows",
    "zarr_shard_rows",
]


BACKENDS: dict[str, Backend] = {b.name: b for b in (MemmapBackend(), ZarrBackend())}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``memmap`` or ``zarr``)."""
    try:
        return BACKENDS[name]
    except KeyError:
        from rlds_cli.errors import CacheError

        raise CacheError(
            f"unknown storage backend {name!r}", hint=f"use one of: {', '.join(BACKENDS)}"
        ) from None
