"""Small datasets built with the cache's own builder, for the tests of what reads or derives
from a cache (preprocess, verify, remote, trust): known values at every step, so a test can
state what each output must hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.layout import MANIFEST_FILE
from rlds_cli.cache.manifest import SELF_DIGEST, canonical_sha256
from rlds_cli.cache.opening import open_dataset
from rlds_cli.testing.sources import make_dataset as make_dataset


def everything(name: str) -> dict[str, np.ndarray]:
    ds = open_dataset(name)
    return dict(ds[:]) | {"_episodes": ds.episode_index}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert np.array_equal(a[key], b[key]), key


def uid_episode(uid: int, length: int) -> dict[str, np.ndarray]:
    """An episode for ``DatasetWriter.add_episode`` whose every row says which episode it is
    (``info/episode_uid`` and ``observation[:, 0]``) and its step (``observation[:, 1]``): a
    served row that belongs to no committed, live episode shows."""
    t = np.arange(length + 1, dtype=np.float32)
    obs = np.stack([np.full_like(t, uid), t], axis=1)
    flags = np.zeros((length, 1), bool)
    flags[-1] = True
    return {
        "observation": obs[:-1],
        "next/observation": obs[1:],
        "action": np.zeros((length, 1), np.float32),
        "next/reward": np.ones((length, 1), np.float32),
        "next/terminated": flags,
        "next/truncated": np.zeros_like(flags),
        "info/episode_uid": np.full(length, uid, np.int64),
    }


def rewrite_manifest(
    path: Path, edit: Callable[[dict[str, Any]], Any] | None = None, *, signed: bool = True
) -> Path:
    """Apply ``edit`` to the manifest at ``path`` (a ``manifest.json``, or a dataset folder) and
    write it back with a fresh own digest, as an rlds that wrote those values would (``signed=False``:
    without one, as an rlds before the manifest's own digest wrote it): what tests of the checks
    behind that digest start from. Returns the file's path."""
    path = path / MANIFEST_FILE if path.is_dir() else path
    data = json.loads(path.read_text())
    data.pop(SELF_DIGEST, None)
    if edit is not None:
        edit(data)
    if signed:
        data[SELF_DIGEST] = canonical_sha256(data)
    path.write_text(json.dumps(data, indent=2))
    return path
