"""TED key helpers and the batch mapping returned by every read."""

from __future__ import annotations

from typing import Any

import numpy as np

#: Keys that are derived at read time rather than stored.
DERIVED_KEYS = ("next/done", "episode")


def join_key(key: str | tuple[str, ...]) -> str:
    """``("next", "reward")`` -> ``"next/reward"``; strings pass through."""
    return "/".join(key) if isinstance(key, tuple) else key


class TedBatch(dict[str, Any]):
    """A flat mapping from TED paths (``"next/reward"``) to arrays.

    Nested access works too: ``batch["next", "reward"] is batch["next/reward"]``.
    """

    def __getitem__(self, key: str | tuple[str, ...]) -> Any:
        return super().__getitem__(join_key(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(join_key(key) if isinstance(key, tuple | str) else key)

    def get(self, key: str | tuple[str, ...], default: Any = None) -> Any:
        return super().get(join_key(key), default)

    @property
    def batch_size(self) -> int:
        """Number of rows (the first dimension shared by every entry)."""
        return int(next(iter(self.values())).shape[0]) if self else 0

    def nested(self) -> dict[str, Any]:
        """The same data as nested dicts: ``{"next": {"reward": ...}, ...}``."""
        out: dict[str, Any] = {}
        for path, value in self.items():
            node = out
            *parents, leaf = path.split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    def to_numpy(self) -> TedBatch:
        """A copy with every entry as an in-memory numpy array (no memory maps)."""
        return TedBatch({k: np.array(v) for k, v in self.items()})
