"""A gzip chunk of an HDF5 source that inflates to fewer (or more) bytes than its rows: HDF5 does
not check that size, and h5py returned the missing rows from uninitialised memory (different numbers
on every run, exit 0; a chunk inflating to 1.5 GB took 1.6 GB of memory). Both readers of gzip
chunks, D4RL's and robomimic's, now refuse it naming the array, with no dataset published."""

from __future__ import annotations

import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from rlds_cli.cli.app import app
from tests.formats_fixtures import refused

T = 200
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("consoles")


def _short_chunk(f: h5py.File, path: str, payload: bytes, shuffle: bool) -> None:
    node = f.create_dataset(
        path, shape=(T, 7), dtype="f4", chunks=(T, 7), compression="gzip", shuffle=shuffle
    )
    node.id.write_direct_chunk((0, 0), zlib.compress(payload))


@pytest.mark.parametrize(
    "payload", [np.float32(1.5).tobytes(), bytes(T * 7 * 4 + 4096)], ids=["short", "long"]
)
@pytest.mark.parametrize("layout", ["d4rl", "robomimic"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["gzip", "shuffle+gzip"])
def test_a_chunk_that_does_not_inflate_to_its_rows_is_refused(
    tmp_path: Path, layout: str, payload: bytes, shuffle: bool
) -> None:
    path = tmp_path / f"{layout}.hdf5"
    with h5py.File(path, "w") as f:
        if layout == "d4rl":
            f["observations"] = np.zeros((T, 3), np.float32)
            _short_chunk(f, "actions", payload, shuffle)
            f["rewards"], f["terminals"] = np.zeros(T, np.float32), np.zeros(T, bool)
            f["timeouts"] = np.arange(T) == T - 1
            where = "'actions'"
        else:
            demo = f.create_group("data/demo_0")
            _short_chunk(demo, "actions", payload, shuffle)
            demo["rewards"], demo["dones"], demo["obs/x"] = np.zeros(T), np.zeros(T, "i8"), np.zeros((T, 2))
            where = "'data/demo_0/actions'"
    result = runner.invoke(app, ["download", str(path), "--name", "x"])
    refused(result, f"reading {where} failed", "chunk (0, 0) of /", hint=True, published=())
