"""The training example in docs/examples runs (briefly) and learns something."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "train_bc.py"


def test_train_bc_example_runs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_bc", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checkpoint = tmp_path / "ck.pt"
    mse = module.main(["--epochs", "2", "--root", str(tmp_path / "cache"), "--checkpoint", str(checkpoint)])
    out = capsys.readouterr().out
    assert "epoch   2" in out and "final mse" in out
    baseline = float(out.split("predicting the mean action: ")[1].split(")")[0])
    assert mse < baseline  # better than predicting the mean action
    saved = torch.load(checkpoint, weights_only=False)
    assert set(saved) == {"model", "optim", "loader"} and saved["loader"]["sampler"]["epoch"] >= 1
