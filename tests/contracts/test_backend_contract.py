"""Every storage backend against the shared contract (:mod:`rlds_cli.testing.contracts`)."""

from __future__ import annotations

import pytest

from rlds_cli.cache.backends import Backend, get_backend
from rlds_cli.cache.backends.zarr import write as backends
from rlds_cli.testing.contracts import BackendContract


class TestMemmapBackend(BackendContract):
    def backend(self) -> Backend:
        return get_backend("memmap")


class TestZarrBackend(BackendContract):
    def backend(self) -> Backend:
        return get_backend("zarr")


class TestZarrBackendSmallShards(BackendContract):
    """Many chunks and shards for 203 rows: every chunk and shard edge is crossed."""

    @pytest.fixture(autouse=True)
    def small_layout(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(backends, "ZARR_CHUNK_BYTES", 200)
        monkeypatch.setattr(backends, "ZARR_SHARD_BYTES", 1000)

    def backend(self) -> Backend:
        return get_backend("zarr")


class TestZarrBackendOneFilePerChunk(TestZarrBackendSmallShards):
    """The layout rlds wrote before shards (still read)."""

    @pytest.fixture(autouse=True)
    def small_layout(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(backends, "ZARR_CHUNK_BYTES", 200)
        monkeypatch.setattr(backends, "ZARR_SHARD_BYTES", 0)
