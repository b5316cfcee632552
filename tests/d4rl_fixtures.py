"""Code that writes D4RL-format HDF5 files in the exact real layout, for the tests, and the one
hand-written table of what the golden file converts to (every test that checks the golden
conversion compares with it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

# the writer and the golden file are shipped with the contract suites (rlds_cli.testing)
from rlds_cli.testing.sources import golden_three_episodes as golden_three_episodes
from rlds_cli.testing.sources import write_d4rl as write_d4rl

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset


class GoldenFactory(Protocol):
    """The ``golden_dataset`` fixture (tests/conftest.py): the golden file converted into the
    test's cache as ``name``, with or without next_observations, on ``backend`` (None: the
    default)."""

    def __call__(
        self, name: str = "golden", *, with_next: bool = False, backend: str | None = None
    ) -> Dataset: ...


# ----------------------------------------------------------------------------- the golden conversion

# Without next_observations: episode 0 (rows 0-2) terminates at row 2, so all 3 rows stay and
# the final observation repeats row 2 (final_known False); episode 1 (rows 3-5) times out at
# row 5, so row 5 is dropped and its observation becomes the final one; episode 2 (rows 6-7) is
# cut by the end of the file, so row 7 is dropped the same way.
GOLDEN_NO_NEXT: dict[str, Any] = {
    "num_steps": 6,
    "num_episodes": 3,
    "columns": {
        "observation": [[0, 0], [1, 10], [2, 20], [3, 30], [4, 40], [6, 60]],
        "action": [[0.0], [0.5], [1.0], [1.5], [2.0], [3.0]],
        "next/observation": [[1, 10], [2, 20], [2, 20], [4, 40], [5, 50], [7, 70]],
        "next/reward": [[1], [2], [3], [4], [5], [7]],
        "next/done": [[False], [False], [True], [False], [True], [True]],
        "next/terminated": [[False], [False], [True], [False], [False], [False]],
        "next/truncated": [[False], [False], [False], [False], [True], [True]],
        "episode": [0, 0, 0, 1, 1, 2],
        "info/qpos": [-0.0, -1.0, -2.0, -3.0, -4.0, -6.0],
    },
    "start": [0, 3, 5],
    "length": [3, 2, 1],
    "source_id": [0, 1, 2],
    "final_known": [False, True, True],
    "flat_observation": [[0, 0], [1, 10], [2, 20], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60], [7, 70]],
    "conversion": {
        "rules": "d4rl-v1",
        "source_rows": 8,
        "dropped_rows": 2,
        "dropped_episodes": 0,
        "synthesized_final_observations": 1,
        "inferred_boundaries": 0,
        "notes": [],
    },
}

# With next_observations every row is a transition and each episode's final observation is
# next_observations at its last row ([102, 0], [105, 0], [107, 0]).
GOLDEN_NEXT: dict[str, Any] = {
    "num_steps": 8,
    "num_episodes": 3,
    "columns": {
        "observation": [[0, 0], [1, 10], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60], [7, 70]],
        "action": [[0.0], [0.5], [1.0], [1.5], [2.0], [2.5], [3.0], [3.5]],
        "next/observation": [[1, 10], [2, 20], [102, 0], [4, 40], [5, 50], [105, 0], [7, 70], [107, 0]],
        "next/reward": [[1], [2], [3], [4], [5], [6], [7], [8]],
        "next/done": [[False], [False], [True], [False], [False], [True], [False], [True]],
        "next/terminated": [[False], [False], [True], [False], [False], [False], [False], [False]],
        "next/truncated": [[False], [False], [False], [False], [False], [True], [False], [True]],
        "episode": [0, 0, 0, 1, 1, 1, 2, 2],
        "info/qpos": [-0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0],
    },
    "start": [0, 3, 6],
    "length": [3, 3, 2],
    "source_id": [0, 1, 2],
    "final_known": [True, True, True],
    "flat_observation": [
        [0, 0],
        [1, 10],
        [2, 20],
        [102, 0],
        [3, 30],
        [4, 40],
        [5, 50],
        [105, 0],
        [6, 60],
        [7, 70],
        [107, 0],
    ],
    "conversion": {
        "rules": "d4rl-v1",
        "source_rows": 8,
        "dropped_rows": 0,
        "dropped_episodes": 0,
        "synthesized_final_observations": 0,
        "inferred_boundaries": 0,
        "notes": [],
    },
}

GOLDEN_DTYPES = {
    "observation": np.float32,
    "action": np.float32,
    "next/observation": np.float32,
    "next/reward": np.float32,
    "next/done": np.bool_,
    "next/terminated": np.bool_,
    "next/truncated": np.bool_,
    "episode": np.int64,
    "info/qpos": np.float32,
}

GOLDEN_STORED_FIELDS = {
    "action": {"shape": [1], "dtype": "float32", "storage": "step"},
    "next/reward": {"shape": [1], "dtype": "float32", "storage": "step"},
    "info/qpos": {"shape": [], "dtype": "float32", "storage": "step"},
    "next/terminated": {"shape": [1], "dtype": "bool", "storage": "step"},
    "next/truncated": {"shape": [1], "dtype": "bool", "storage": "step"},
    "observation": {"shape": [2], "dtype": "float32", "storage": "flat"},
}

GOLDEN_TED_FIELDS = {
    "action": ((1,), "float32"),
    "episode": ((), "int64"),
    "info/qpos": ((), "float32"),
    "observation": ((2,), "float32"),
    "next/done": ((1,), "bool"),
    "next/observation": ((2,), "float32"),
    "next/reward": ((1,), "float32"),
    "next/terminated": ((1,), "bool"),
    "next/truncated": ((1,), "bool"),
}

#: Every TED key of the golden dataset.
GOLDEN_KEYS = tuple(GOLDEN_DTYPES)


def golden_expected(with_next: bool) -> dict[str, Any]:
    """The expected conversion of :func:`golden_three_episodes` (with or without next_observations)."""
    return GOLDEN_NEXT if with_next else GOLDEN_NO_NEXT


def golden_column(with_next: bool, key: str) -> np.ndarray:
    """One expected TED column of the golden file, with its dtype."""
    return np.asarray(golden_expected(with_next)["columns"][key], dtype=GOLDEN_DTYPES[key])
