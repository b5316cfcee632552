"""_writev_all: every buffer written in order, whatever writev accepts in one call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlds_cli.cache.backends.zarr import write as backends


@pytest.mark.parametrize("most_bytes", [1, 7, 1000, None])
@pytest.mark.parametrize("iov_max", [1, 3, 1024])
def test_every_buffer_is_written_in_order_after_partial_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, most_bytes: int | None, iov_max: int
) -> None:
    rng = np.random.default_rng(0)
    buffers: list[Any] = [rng.integers(0, 256, n, dtype=np.uint8) for n in (5, 0, 300, 1, 64)]
    buffers += [b"header", np.arange(10, dtype="<u8").reshape(2, 5)]
    real_writev = os.writev
    calls: list[int] = []

    def short_writev(fd: int, bufs: list[Any]) -> int:
        assert len(bufs) <= iov_max
        calls.append(len(bufs))
        if most_bytes is None:
            return real_writev(fd, bufs)
        data = b"".join(bytes(b) for b in bufs)[
            :most_bytes
        ]  # a partial write, as a full disk or a signal can cause
        return os.write(fd, data)

    monkeypatch.setattr(os, "writev", short_writev)
    monkeypatch.setattr(os, "sysconf", lambda name: iov_max)
    path = tmp_path / "out.bin"
    with open(path, "wb") as fh:
        backends._writev_all(fh.fileno(), buffers)
    expected = b"".join(memoryview(b).cast("B").tobytes() for b in buffers)
    assert path.read_bytes() == expected
    assert calls  # it went through writev
