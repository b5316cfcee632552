"""The read path is lean: opening a local dataset, gathering rows, reading an episode and
iterating a :class:`~rlds_cli.loader.Loader` import no source format, no conversion, no network
or object-storage code and no writer (issue 29, part 3; docs/architecture.md)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.dataset_fixtures import make_dataset
from tests.meta.test_imports import run_python

#: Module prefixes the read path of a local dataset must not load.
FORBIDDEN = (
    "rlds_cli.formats",
    "rlds_cli.sources.convert",
    "rlds_cli.sources.download",
    "rlds_cli.net",
    "rlds_cli.remote",
    "rlds_cli.cache.builder",
    "rlds_cli.cache.transaction",
    "rlds_cli.write",
    "rlds_cli.testing",
    "pytest",
)

READ = """
import json, sys
import numpy as np
from rlds_cli import Loader, open_dataset

ds = open_dataset("small")
batch = ds.gather(np.array([0, 3, 10]))
episode = ds.episode(1)
batches = iter(Loader("small", batch_size=4, seed=0))
shapes = [len(next(batches)["action"]) for _ in range(3)]
forbidden = {forbidden!r}
loaded = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
print(json.dumps({{"gathered": len(batch["action"]), "episode": len(episode["action"]), "batches": shapes,
                  "loaded": loaded}}))
"""


def test_reading_a_local_dataset_imports_no_writer_format_or_network(tmp_path: Path) -> None:
    make_dataset("small", [5, 7, 3, 9])  # in the test's cache: RLDS_HOME is tmp_path/rlds-home
    proc = run_python(READ.format(forbidden=FORBIDDEN), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # the reads happened (the check is not of an empty run)
    assert got["gathered"] == 3 and got["episode"] == 7 and got["batches"] == [4, 4, 4]
    assert got["loaded"] == [], f"the read path of a local dataset loaded {got['loaded']}"
