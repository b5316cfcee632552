"""Datasets for the audit's tests: clean episodes (random actions and states, distinct camera
frames, returns of one scale) and the same with one injected fault per chosen episode."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlds_cli.cache.builder import DatasetBuilder
from rlds_cli.cache.ted import StepBlock

#: flag -> the episodes given that fault by :func:`build_audit_dataset` (``faults=True``).
INJECTED = {
    "idle": [2],
    "frozen:pixels": [4],
    "spike": [6],
    "jerk": [8],
    "duplicate": [10],
    "nonfinite": [12],
    "length_outlier": [14],
    "return_outlier": [16],
    "empty_instruction": [18],
}
TEXT = ["pick up the cup", "", "open the drawer"]
NUM_EPISODES = 20


def _episode(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "action": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        "state": rng.uniform(-1, 1, (n + 1, 3)).astype(np.float32),
        "pixels": rng.integers(0, 256, (n + 1, 8, 8, 3), np.uint8),
        "next/reward": rng.uniform(0, 1, (n, 1)).astype(np.float32),
        "info/instruction_index": np.full((n, 1), 2 * int(rng.integers(0, 2)), np.int64),
    }


def episodes(*, faults: bool, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The episodes' arrays (flat keys ``state``/``pixels`` with their final row)."""
    rng = np.random.default_rng(seed)
    out = [_episode(rng, int(rng.integers(55, 66))) for _ in range(NUM_EPISODES)]
    if not faults:
        return out
    e = out[2]  # idle from step 10 to 40: action, state and frame held
    e["action"][10:41] = e["action"][10]
    e["state"][10:41] = e["state"][10]
    e["pixels"][10:41] = e["pixels"][10]
    out[4]["pixels"][20:31] = out[4]["pixels"][20]  # the camera shows one frame while the robot moves
    out[6]["action"][30, 0] += 10.0  # one action jumps
    n8 = len(out[8]["action"])
    out[8]["action"][:] = np.where(np.arange(n8) % 2 == 0, 1.0, -1.0)[:, None]  # shaking
    out[10] = {k: v.copy() for k, v in out[9].items()}  # the same episode twice
    out[12]["state"][5, 1] = np.nan
    out[14] = _episode(rng, 300)
    out[14]["next/reward"] *= 0.2  # a typical return: only its length is out of line
    out[16]["next/reward"][:] = 2.0
    out[18]["info/instruction_index"][:] = 1  # the empty string
    return out


def build_audit_dataset(
    root: Path, name: str, *, faults: bool, frames: str | None = "png", backend: str = "memmap"
) -> None:
    """Build ``name`` under ``root`` (camera ``pixels`` stored with ``--frames frames``)."""
    with DatasetBuilder(name, root=root, backend=backend, frames=frames) as builder:
        for e in episodes(faults=faults):
            n = len(e["action"])
            truncated = np.zeros((n, 1), bool)
            truncated[-1] = True
            builder.append(
                StepBlock(
                    steps={
                        "action": e["action"],
                        "next/reward": e["next/reward"],
                        "next/terminated": np.zeros((n, 1), bool),
                        "next/truncated": truncated,
                        "info/instruction_index": e["info/instruction_index"],
                    },
                    observations={"state": e["state"], "pixels": e["pixels"]},
                    ends=np.array([n - 1]),
                )
            )
        builder.commit(
            source={
                "generator": "audit-fixture",
                "metadata": {"rlds": {"text": {"info/instruction_index": TEXT}}},
            }
        )
