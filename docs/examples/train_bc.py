"""Behavior cloning on the bundled demo dataset with the rlds loader (CPU, well under a minute).

Run it from a fresh install::

    python docs/examples/train_bc.py              # converts the demo into the cache if missing
    python docs/examples/train_bc.py --epochs 2 --root /tmp/rlds --checkpoint bc.pt

It trains a small MLP to predict the demo policy's ``action`` from the ``observation``, with
observations normalized by statistics of the dataset, one epoch at a time without replacement,
and prints the training MSE of each epoch and the final MSE over the whole dataset (against the
MSE of predicting the mean action). With ``--checkpoint PATH`` it also saves the model, the
optimizer and the loader's state there (so a resumed run sees exactly the batches it would have
seen); without it, nothing is written but the demo's conversion.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import rlds_cli
from rlds_cli.errors import DatasetNotFoundError
from rlds_cli.loader.transforms import Normalize

DATASET = "pointmass-demo-v0"


def open_demo(root: str | None) -> rlds_cli.Dataset:
    """The demo dataset, converted into the cache first if it is not there yet."""
    try:
        return rlds_cli.open_dataset(DATASET, root)
    except DatasetNotFoundError:
        from rlds_cli.sources.download import download

        download("demo", root=root)  # bundled with rlds: no network needed
        return rlds_cli.open_dataset(DATASET, root)


def main(argv: list[str] | None = None) -> float:
    """Train; return the final mean squared error on the whole dataset."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--root", help="cache root (default: $RLDS_HOME or the platform cache)")
    parser.add_argument("--checkpoint", type=Path, help="where to save model + loader state")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    ds = open_demo(args.root)
    loader = rlds_cli.Loader(
        ds,
        batch_size=args.batch_size,
        sampler="epoch",  # every step once per epoch, reshuffled each epoch
        seed=args.seed,
        keys=["observation", "action"],  # nothing else is ever read
        in_memory=True,  # 5,000 steps: load once, gather from RAM
        transform=Normalize(keys=["observation"]),  # statistics computed from the dataset
    )
    obs_dim = ds.fields["observation"][0][0]
    act_dim = ds.fields["action"][0][0]
    model = nn.Sequential(
        nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, act_dim)
    )
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        total, rows = 0.0, 0
        for batch in loader:  # one epoch
            loss = nn.functional.mse_loss(model(batch["observation"]), batch["action"])
            optim.zero_grad()
            loss.backward()
            optim.step()
            total += loss.item() * len(batch["index"])
            rows += len(batch["index"])
        print(f"epoch {epoch + 1:3d}  train mse {total / rows:.5f}")

    # evaluation: the whole dataset in order, through the same normalization
    evaluation = rlds_cli.Loader(
        ds, 1024, sampler="epoch", shuffle=False, keys=["observation", "action"], transform=loader.transforms
    )
    with torch.no_grad():
        errors = [
            nn.functional.mse_loss(model(b["observation"]), b["action"], reduction="sum") for b in evaluation
        ]
        mse = float(sum(errors)) / (len(ds) * act_dim)
        actions = ds.gather(range(len(ds)), ["action"])["action"]
        baseline = float(((actions - actions.mean(0)) ** 2).mean())
    seconds = time.perf_counter() - start
    print(f"final mse {mse:.5f} (predicting the mean action: {baseline:.5f}); {seconds:.1f} s")
    if args.checkpoint:
        torch.save(
            {"model": model.state_dict(), "optim": optim.state_dict(), "loader": loader.state_dict()},
            args.checkpoint,
        )
        print(f"saved {args.checkpoint}")
    return mse


if __name__ == "__main__":
    main()
