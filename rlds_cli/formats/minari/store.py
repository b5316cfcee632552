"""The plug point between :class:`~rlds_cli.formats.minari.reader.MinariReader` and Minari's
storages (:mod:`.hdf5_store`, :mod:`.arrow_store`): each reads one episode at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rlds_cli.formats.minari.spaces import Leaf

STEP_KEYS = ("actions", "rewards", "terminations", "truncations")


class Store(Protocol):
    """One of Minari's storages, read episode by episode."""

    where: Path

    def episode_ids(self) -> list[int]:
        """The episode ids, sorted (a format error when there are none)."""

    def count_mismatch(self, declared: int, found: list[int]) -> str:
        """The error text for ``total_episodes`` = ``declared`` when ``found`` differ."""

    def plan(self, first: int, spaces: dict[str, Any]) -> list[Leaf]:
        """The leaves of episode ``first`` (read from every episode), given the JSON ``spaces``."""

    def count_steps(self, ids: list[int]) -> int:
        """The number of steps of the episodes ``ids``, from sizes, without reading the data."""

    def read(self, i: int, leaves: list[Leaf]) -> tuple[str, list[tuple[Leaf, Any]], Any]:
        """Episode ``i``: its label (for errors), each leaf's array (image files: kept as they are,
        :class:`~rlds_cli.frames.encoded.EncodedFrames`), and its raw ``seed`` (or ``None``)."""

    def close(self) -> None:
        """Release what the storage holds open."""
