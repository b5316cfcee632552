"""``open_dataset("hf://...")`` read by fork-started torch DataLoader workers (issue 28), against the
Hub stand-in (tests/hub_standin.py).

An earlier version of this test hung. The cause was the stand-in: it wrote each response's
headers and body in two small sends without TCP_NODELAY, so every request waited out the
client's 40 ms delayed ACK (Nagle): ~16 requests a batch, 0.7 s a batch, a 313-batch epoch over
3.5 minutes, longer with workers and client retries, which looked like a hang. The stand-in now
sets TCP_NODELAY (~20 ms a batch). The workers run in a child process under a timeout, so a
hang of the readers (a lock or connection inherited across fork) fails the test instead of
stalling the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.hub_standin import HubStandin
from tests.remote.test_hub_push import ROOT, TOKEN, URL, cli_env, hub  # noqa: F401 - the fixture
from tests.remote.test_remote import make_demo

pytest.importorskip("huggingface_hub")
torch = pytest.importorskip("torch")

BATCH = 256  # the demo's 5,000 steps: 20 batches an epoch

#: Reads the pushed dataset with two forked DataLoader workers, twice: from the URL, and from a
#: dataset the parent has already read (its HTTP client has pooled connections when it forks).
READ_WITH_WORKERS = textwrap.dedent(
    """
    import sys
    import numpy as np
    from torch.utils.data import DataLoader
    from rlds_cli import open_dataset
    from rlds_cli.loader.torch_data import TedIterableDataset, collate_ted

    url, out = sys.argv[1], sys.argv[2]

    def epoch(source):
        data = TedIterableDataset(source, {batch}, seed=7)
        loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork",
                            collate_fn=collate_ted)
        return [{{k: v.numpy() for k, v in b.items()}} for b in loader]

    fresh = epoch(url)
    remote = open_dataset(url)
    remote.gather(np.arange(0, remote.num_steps, 97))  # the parent reads before it forks
    warm = epoch(remote)
    arrays = {{}}
    for run, batches in (("fresh", fresh), ("warm", warm)):
        for i, b in enumerate(batches):
            for k, v in b.items():
                arrays[f"{{run}}|{{i}}|{{k}}"] = v
    np.savez(out, **arrays)
    """
).format(batch=BATCH)


def test_forked_dataloader_workers_read_hf_like_the_local_dataset(
    hub: HubStandin,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    from torch.utils.data import DataLoader

    from rlds_cli.loader.torch_data import TedIterableDataset, collate_ted
    from rlds_cli.remote.push import push

    make_demo("demo", "zarr")
    push("demo", URL)
    script, out = tmp_path / "read.py", tmp_path / "batches.npz"
    script.write_text(READ_WITH_WORKERS)
    env = {**cli_env(hub, tmp_path, TOKEN), "RLDS_HOME": os.environ["RLDS_HOME"], "RLDS_FSYNC": "0"}
    run = subprocess.run(
        [sys.executable, str(script), URL, str(out)], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    want = [
        {k: v.numpy() for k, v in b.items()}
        for b in DataLoader(
            TedIterableDataset("demo", BATCH, seed=7), batch_size=None, collate_fn=collate_ted
        )
    ]
    got = np.load(out)
    assert len(want) == 20
    for run_name in ("fresh", "warm"):
        keys = {name.split("|", 2)[2] for name in got.files if name.startswith(f"{run_name}|")}
        assert keys == set(want[0]), run_name
        for i, batch in enumerate(want):
            for key, value in batch.items():
                np.testing.assert_array_equal(
                    got[f"{run_name}|{i}|{key}"], value, err_msg=f"{run_name} {i} {key}"
                )
        assert f"{run_name}|{len(want)}|index" not in got.files  # no batch twice, none extra
