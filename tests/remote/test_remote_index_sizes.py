"""A remote files index whose sizes no file can have (issue 24, 8(d)): a size of 2**62 or -1
gave "OSError: [Errno 22]" / "bytes 0--1 asked". Now the index is refused when read, in one
line naming it, by ``rlds pull`` and by ``open_dataset(URL)``; nothing is written locally."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlds_cli.cache.root import CacheRoot
from rlds_cli.cli.app import app
from rlds_cli.errors import RemoteCorruptError
from rlds_cli.loader.opening import open_dataset

fsspec = pytest.importorskip("fsspec")

from rlds_cli.remote.push import push  # noqa: E402
from rlds_cli.remote.store import index_bytes  # noqa: E402

runner = CliRunner()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """The pushed dataset's folder: a file:// store (the CLI refuses memory://, a store of one
    process)."""
    return tmp_path / "bucket" / "sizes"


@pytest.fixture
def pushed(store: Path) -> dict[str, Any]:
    result = runner.invoke(app, ["download", "demo", "--storage", "zarr", "--name", "d", "-q"])
    assert result.exit_code == 0, result.output
    push("d", f"file://{store}")
    return json.loads((store / "rlds-files.json").read_bytes())


@pytest.mark.parametrize("size", [2**62, -1, True, 1.5, "12", None])
def test_an_impossible_size_names_the_index(
    size: Any, pushed: dict[str, Any], store: Path, tmp_path: Path
) -> None:
    url = f"file://{store}"
    rel = sorted(pushed["files"])[0]
    pushed["files"][rel]["size"] = size
    (store / "rlds-files.json").write_bytes(index_bytes(pushed))  # a consistent index
    other = CacheRoot(tmp_path / "other")
    result = runner.invoke(app, ["pull", url, "--root", str(other.path)])
    assert result.exit_code == 1, result.output
    error, *rest = result.stderr.splitlines()
    assert error.startswith(f"error: {url}/rlds-files.json ") and len(rest) <= 1, result.stderr
    assert (
        "Errno" not in result.stderr
        and "unexpected" not in result.stderr
        and "Traceback" not in result.output
    )
    assert "rlds push" in result.stderr  # what to do: push it again
    assert not other.exists("d")
    with pytest.raises(RemoteCorruptError, match=r"rlds-files\.json"):
        open_dataset(url)


def test_the_largest_plausible_sizes_are_accepted(pushed: dict[str, Any], store: Path) -> None:
    """0 (an empty file) is a size; the real index opens."""
    from rlds_cli.remote.store import MAX_FILE_SIZE, FileEntry, RemoteIndex

    index = RemoteIndex("0" * 64, {"a": FileEntry(0, "0" * 64), "b": FileEntry(MAX_FILE_SIZE, "0" * 64)})
    assert RemoteIndex.from_json(index.to_json(), "x").files == index.files
    assert open_dataset(f"file://{store}").manifest.num_steps > 0
