"""Storage backends: how one column (one TED key) is written and read on disk.

Two backends share the interface of :mod:`rlds_cli.cache.backends.base`:

* ``memmap`` (default, :mod:`~rlds_cli.cache.backends.memmap`): one plain ``.npy`` file per key
  under ``arrays/`` (``arrays/next/reward.npy``), memory-mapped for reading.
* ``zarr`` (:mod:`~rlds_cli.cache.backends.zarr`): one zarr v3 group at ``arrays/``, small
  chunks along time grouped into ~16 MiB shards, Blosc/LZ4 + byte shuffle. Unsharded datasets
  (512 KiB chunks, one file each) are still read.

A column is either appended to, or preallocated and written region by region by parallel
workers (:meth:`Backend.preallocate`, :meth:`Backend.open_region`). :func:`get_backend` names
the backends; every public name is importable from here.
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
