"""Camera-like frames for the tests of frame columns: smooth pictures with hard edges and a
little noise (what JPEG is made for), different in every step, and datasets built of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.ted import StepBlock


def scene(h: int = 48, w: int = 64, c: int | None = 3, seed: int = 0) -> np.ndarray:
    """A smooth picture with a few hard edges, ``(h, w[, c])`` uint8 (``c=None``: gray 2-D)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = 100 + 60 * np.sin(x / 7 + seed) * np.cos(y / 5) + (x > (w // 2 + seed % 7)) * 50
    channels = [base + 20 * k + rng.normal(0, 2, (h, w)) for k in range(c or 1)]
    image = np.clip(np.stack(channels, -1), 0, 255).astype(np.uint8)
    return image if c is not None else image[..., 0]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 arrays, in dB (``inf``: equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def frame_rows(rows: int, shape: tuple[int, ...] = (48, 64, 3), first: int = 0) -> np.ndarray:
    """``rows`` different frames of ``shape`` (H, W, C), (H, W) or (C, H, W) when C is 1 or 3
    and first."""
    if len(shape) == 3 and shape[0] in (1, 3) and shape[2] not in (1, 3, 4):
        return np.stack(
            [scene(shape[1], shape[2], shape[0], first + i).transpose(2, 0, 1) for i in range(rows)]
        )
    c = shape[2] if len(shape) == 3 else None
    return np.stack([scene(shape[0], shape[1], c, first + i) for i in range(rows)])


def frames_block(
    lengths: list[int], shape: tuple[int, ...] = (48, 64, 3), first: int = 0, prefix: str = ""
) -> tuple[StepBlock, np.ndarray]:
    """One builder block of whole episodes of ``lengths`` with ``pixels`` frames of ``shape`` and a
    low-dim ``state`` (keys after ``prefix``); returns the block and its flat frames (each step's,
    then each episode's final one)."""
    n, k = sum(lengths), len(lengths)
    ends = np.cumsum(lengths) - 1
    pixels = frame_rows(n + k, shape, first)
    done = np.zeros(n, bool)
    done[ends] = True
    steps = {
        "action": np.arange(n, dtype=np.float32)[:, None] + first,
        "next/reward": np.ones(n, np.float32),
        "next/terminated": np.zeros(n, bool),
        "next/truncated": done,
    }
    state = np.arange(n + k, dtype=np.float32)[:, None]
    observations = {f"{prefix}pixels": pixels, f"{prefix}state": state}
    return StepBlock(steps=steps, observations=observations, ends=ends), pixels


def build_frames(
    root: Path,
    name: str,
    lengths: list[int],
    frames: str,
    *,
    backend: str = "memmap",
    shape: tuple[int, ...] = (48, 64, 3),
    prefix: str = "",
    **kw: Any,
) -> np.ndarray:
    """Dataset ``name`` under ``root`` of :func:`frames_block`, stored with ``--frames frames``;
    returns its flat frames as they were given."""
    block, pixels = frames_block(lengths, shape, prefix=prefix)
    with DatasetBuilder(name, root=root, backend=backend, frames=frames, **kw) as builder:
        builder.append(block)
        builder.commit()
    return pixels
