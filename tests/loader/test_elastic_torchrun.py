"""Elastic resume under a real torchrun (gloo, CPU, 127.0.0.1 only): two ranks train part of an
epoch, saving ``Loader.state_dict()`` (which gathers every rank's progress) at every batch; rank 0
dies (SIGKILL); the checkpoint of any rank then finishes the epoch on one rank (``"blocks"``) or
on three (``"epoch"``): every step of the epoch is seen exactly once over both runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import rlds_cli
from tests.loader_fixtures import make_ted

ROOT = Path(rlds_cli.__file__).resolve().parents[1]

LENGTHS = [60, 25, 90, 45, 100, 80]  # 400 steps: the "epoch" sampler's 2 shards need no padding
N = sum(LENGTHS)
BATCH = 16

WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path

    import torch.distributed as dist

    from rlds_cli.loader import Loader

    def main():
        out, name, sampler, stop_at, resume = Path(sys.argv[1]), *sys.argv[2:4], int(sys.argv[4]), sys.argv[5]
        if "RANK" in os.environ:
            dist.init_process_group("gloo")
        extra = {"block_rows": 50, "shuffle_window": 2} if sampler == "blocks" else {}
        # no seed: rank 0 draws one and broadcasts it; a resumed run takes the checkpoint's
        loader = Loader(name, batch_size=16, sampler=sampler, keys=[], **extra)
        if resume != "-":
            loader.load_state_dict(json.loads(Path(resume).read_text())["loader"])
        rank, seen = loader.rank, []
        for i, batch in enumerate(loader, 1):
            seen.append(batch["index"].tolist())
            state = loader.state_dict()  # a collective: every rank's progress in each copy
            tmp = out / f"rank-{rank}.tmp"
            tmp.write_text(json.dumps({"loader": state, "seen": seen}))
            os.replace(tmp, out / f"rank-{rank}.json")  # a checkpoint is whole or absent
            if i == stop_at:
                if dist.is_initialized():  # every rank's checkpoint of this batch is written first:
                    dist.barrier()  # else torchrun may stop rank 1 before it writes its own
                if rank == 0:
                    os.kill(os.getpid(), signal.SIGKILL)  # rank 0 dies; torchrun stops the others
        (out / f"done-{rank}.json").write_text(json.dumps({"seen": seen, "world": loader.world_size}))
        if dist.is_initialized():
            dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(script: Path, out: Path, ranks: int, sampler: str, stop_at: int, resume: str) -> None:
    out.mkdir()
    args = [str(script), str(out), "ted", sampler, str(stop_at), resume]
    if ranks == 1:  # one plain process: no torch.distributed at all
        cmd = [sys.executable, *args]
    else:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "--local_addr", "127.0.0.1",
            "--max_restarts", "0", *args,
        ]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # loopback only
    # the package under test, wherever the interpreter's own install points
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("RLDS_SEED", None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode != 0) == (stop_at > 0), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "resume_ranks"), [("blocks", 1), ("epoch", 3)])
def test_two_ranks_killed_mid_epoch_resume_on_another_world_size(
    isolated_cache: Path, tmp_path: Path, sampler: str, resume_ranks: int
) -> None:
    isolated_cache.mkdir(parents=True, exist_ok=True)
    make_ted(isolated_cache, "ted", LENGTHS)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    first, second = tmp_path / "first", tmp_path / "second"
    _run(script, first, 2, sampler, stop_at=5, resume="-")
    saved = [json.loads((first / f"rank-{r}.json").read_text()) for r in range(2)]
    assert not list(first.glob("done-*.json"))
    assert saved[0]["loader"]["ranks"] == saved[1]["loader"]["ranks"]  # any rank's copy will do
    assert [len(s["seen"]) for s in saved] == [5, 5]
    _run(script, second, resume_ranks, sampler, stop_at=-1, resume=str(first / "rank-1.json"))
    done = [json.loads((second / f"done-{r}.json").read_text()) for r in range(resume_ranks)]
    assert {d["world"] for d in done} == {resume_ranks}
    assert len({len(d["seen"]) for d in done}) == 1  # every new rank ran the same number of batches
    steps = [i for s in saved for b in s["seen"] for i in b] + [i for d in done for b in d["seen"] for i in b]
    counts = Counter(steps)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}  # each step exactly once
