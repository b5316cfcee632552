"""Datasets written by minari itself, for the tests that check rlds against minari's own writer
and reader: ``MINARI_DATASETS_PATH`` pointed at a folder, and a random policy recorded with
minari's ``DataCollector`` (its defaults otherwise). Needs minari[create] (jax) to record."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def minari_path(root: Path) -> Iterator[None]:
    """``MINARI_DATASETS_PATH`` pointed at ``root`` for minari's own reader and writer."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def record_random(
    env: Any,
    dataset_id: str,
    episodes: int,
    *,
    seed: int | None = None,
    unseeded: bool = False,
    record_infos: bool = False,
    **metadata: Any,
) -> None:
    """Record ``episodes`` episodes of random actions on ``env`` with minari's ``DataCollector``
    (reset seeds ``seed + i``, the action space seeded with ``seed`` when given, else reset seeds
    ``i``; with ``unseeded``, minari's default: each reset draws a random 64-bit seed and
    records it) and create ``dataset_id`` in ``$MINARI_DATASETS_PATH`` with ``metadata``
    (``code_permalink``, ``description``, ``eval_env``, ``ref_min_score``...)."""
    from minari import DataCollector

    collector = DataCollector(env, record_infos=record_infos)
    if seed is not None:
        collector.action_space.seed(seed)
    for i in range(episodes):
        collector.reset(seed=None if unseeded else (seed or 0) + i)
        while True:
            _, _, term, trunc, _ = collector.step(collector.action_space.sample())
            if term or trunc:
                break
    collector.create_dataset(
        dataset_id=dataset_id,
        algorithm_name="random",
        author="rlds tests",
        author_email="tests@example.invalid",
        **metadata,
    )
    collector.close()
