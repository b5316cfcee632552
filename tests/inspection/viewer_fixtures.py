"""Reading an ``rlds show`` page back in the tests: its data and its frames, as the page's own
script reads them (``rlds_cli/data/viewer.html``)."""

from __future__ import annotations

import base64
import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import StepBlock
from tests.inspection.audit_fixtures import TEXT, episodes

_CHUNK = re.compile(rb'<script type="text/plain" id="f(\d+)-(\d+)-(\d+)" data-n="([0-9,]*)">([^<]*)</script>')
_DATA = re.compile(rb'<script type="application/json" id="rlds-data">(.*?)</script>', re.S)


#: The cameras' frames are the audit fixture's 8x8 pixels, each drawn as SCALE x SCALE: 32x32,
#: the smallest frames a frame column holds (rlds_cli.frames.codecs.MIN_SIDE).
SCALE = 4


def build_viewer_dataset(
    root: Path, name: str, *, frames: str | None = "png", backend: str = "memmap", faults: bool = True
) -> list[dict[str, np.ndarray]]:
    """The audit fixture's episodes (``audit_fixtures.episodes``) as dataset ``name`` under
    ``root``, camera ``pixels`` 32x32 stored with ``--frames frames``; returns the episodes."""
    eps = episodes(faults=faults)
    for e in eps:
        e["pixels"] = np.repeat(np.repeat(e["pixels"], SCALE, axis=1), SCALE, axis=2)
    with DatasetBuilder(name, root=root, backend=backend, frames=frames) as builder:
        for e in eps:
            n = len(e["action"])
            truncated = np.zeros((n, 1), bool)
            truncated[-1] = True
            steps = {
                "action": e["action"], "next/reward": e["next/reward"],
                "next/terminated": np.zeros((n, 1), bool), "next/truncated": truncated,
                "info/instruction_index": e["info/instruction_index"],
            }  # fmt: skip
            observations = {"state": e["state"], "pixels": e["pixels"]}
            builder.append(StepBlock(steps=steps, observations=observations, ends=np.array([n - 1])))
        builder.commit(
            source={
                "generator": "viewer-fixture",
                "metadata": {"rlds": {"text": {"info/instruction_index": TEXT}}},
            }
        )
    return eps


def page_data(page: bytes) -> dict[str, Any]:
    """The page's data element, parsed."""
    found = _DATA.search(page)
    assert found is not None, "no rlds-data element"
    return json.loads(found.group(1).decode())


def page_frames(page: bytes) -> dict[tuple[int, int], list[bytes]]:
    """(episode, camera) -> the image files the page embeds, in step order."""
    out: dict[tuple[int, int], list[tuple[int, list[bytes]]]] = {}
    for e, c, k, lens, text in _CHUNK.findall(page):
        ends = np.cumsum([0, *map(int, lens.split(b","))]).tolist()
        files = [base64.b64decode(text[a:b], validate=True) for a, b in itertools.pairwise(ends)]
        out.setdefault((int(e), int(c)), []).append((int(k), files))
    return {key: [f for _, files in sorted(chunks) for f in files] for key, chunks in out.items()}


def stored_frames(ds: Dataset, key: str, episode: int) -> list[bytes]:
    """Episode ``episode``'s steps' frames of frame column ``key`` as the dataset stores them."""
    column = ds.column(key)
    start, length = int(ds.episode_index["start"][episode]), int(ds.episode_index["length"][episode])
    lo = start + episode  # a flat key: each earlier episode's final observation before
    return [bytes(column.frame_bytes(r)) for r in range(lo, lo + length)]


def read_page(path: Path) -> bytes:
    return Path(path).read_bytes()
