"""Two ranks under torchrun (gloo, CPU, loopback only): rank, world size and the run seed come
from ``torch.distributed``; each rank's epoch shard is disjoint from the other's and complete
together; a run killed with SIGKILL resumes exactly (no batch repeated or missed), for the
Loader and for a TedDataLoader with worker processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlds_cli.loader import EpochSampler
from rlds_cli.loader.epoch import epoch_permutation, shard
from tests.loader_fixtures import make_ted

LENGTHS = [60, 25, 90, 45, 100, 80]  # 400 steps: ranks' shards need no padding
N = sum(LENGTHS)
BATCH = 16
PER_RANK = N // 2

WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from rlds_cli.loader import Loader
    from rlds_cli.loader.data_loader import TedDataLoader
    from rlds_cli.loader.torch_data import TedIterableDataset

    def save(path, data):
        tmp = path.with_suffix(".tmp")
        torch.save(data, tmp)
        os.replace(tmp, path)  # a checkpoint is whole or absent, whenever the kill comes

    def main():
        out, name, batch, kill_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        # no rank, world size or seed given: all from torch.distributed (the seeds are broadcast)
        loader = Loader(name, batch_size=batch, sampler="epoch", keys=[])
        data = TedIterableDataset(name, batch, keys=[])
        workers = TedDataLoader(data, num_workers=2, multiprocessing_context="fork")
        checkpoint = out / f"checkpoint-{rank}.pt"
        seen, phase = {"loader": [], "workers": []}, 0
        if checkpoint.exists():
            state = torch.load(checkpoint, weights_only=False)
            loader.load_state_dict(state["loader"])
            workers.load_state_dict(state["workers"])
            seen, phase = state["seen"], state["phase"]  # as a training loop saves its epoch
        info = {"rank": rank, "world": dist.get_world_size(), "loader_rank": loader.rank,
                "loader_world": loader.world_size, "loader_seed": loader.seed, "data_seed": data.seed}
        count = len(seen["loader"]) + len(seen["workers"])
        for p, (key, source) in enumerate((("loader", loader), ("workers", workers))):
            if p < phase:
                continue
            for b in source:
                seen[key].append(b["index"].tolist())
                state = {"loader": loader.state_dict(), "workers": workers.state_dict()}
                save(checkpoint, {**state, "seen": seen, "phase": p})
                count += 1
                if count == kill_at + rank:
                    os.kill(os.getpid(), signal.SIGKILL)
        (out / f"result-{rank}.json").write_text(json.dumps({**info, **seen}))
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(script: Path, out: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "--local_addr", "127.0.0.1",
        "--max_restarts", "0", str(script), str(out), "ted", str(BATCH), str(kill_at),
    ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # loopback only
    env.pop("RLDS_SEED", None)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_two_ranks_disjoint_shards_and_exact_resume_after_sigkill(
    isolated_cache: Path, tmp_path: Path
) -> None:
    isolated_cache.mkdir(parents=True, exist_ok=True)
    make_ted(isolated_cache, "ted", LENGTHS)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    per_source = -(-PER_RANK // BATCH)  # 13 batches per rank and source
    # rank 0 kills itself after its 5th batch, in the Loader's epoch, then (after a restart) in
    # the middle of the TedDataLoader's epoch; rank 1 a batch later, unless torchrun stops it
    # first when rank 0 dies, at any point
    for kill_at in (5, per_source + 5):
        killed = _torchrun(script, out, kill_at=kill_at)
        assert killed.returncode != 0, killed.stdout + killed.stderr
        assert not list(out.glob("result-*.json")) and (out / "checkpoint-0.pt").exists()
    second = _torchrun(script, out, kill_at=-10)
    assert second.returncode == 0, second.stdout + second.stderr
    results = [json.loads((out / f"result-{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["loader_rank"], r["loader_world"]) for r in results] == [(0, 0, 2), (1, 1, 2)]
    seed = results[0]["loader_seed"]
    assert results[1]["loader_seed"] == seed and results[0]["data_seed"] == results[1]["data_seed"]
    shards = {"loader": [], "workers": []}
    for r, res in enumerate(results):
        for key in shards:
            steps = [i for batch in res[key] for i in batch]
            assert len(res[key]) == per_source and len(steps) == PER_RANK  # no batch repeated or missed
            shards[key].append(steps)
        # the same order as an uninterrupted run of this rank
        assert shards["loader"][r] == EpochSampler(N, N, seed, rank=r, world_size=2).sample().tolist()
        order = shard(epoch_permutation(N, results[r]["data_seed"], 0), r, 2)
        assert shards["workers"][r] == order.tolist()
    for key, (a, b) in shards.items():
        assert not set(a) & set(b), key  # disjoint
        assert sorted(a + b) == list(range(N)), key  # complete
    assert np.unique(shards["loader"][0]).size == PER_RANK
