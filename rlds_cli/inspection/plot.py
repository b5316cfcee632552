"""``rlds inspect --plot``: a figure of a dataset (matplotlib, an optional extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import MissingExtraError

#: Episodes whose observation traces are drawn.
TRACED_EPISODES = 3


def plot_dataset(ds: Dataset, out: str | Path) -> Path:
    """Write a PNG: episode return and length histograms, and the first observation
    dimensions of a few episodes over time.

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install 'rlds-cli[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(
            "--plot needs matplotlib, which is not installed", hint="pip install 'rlds-cli[plot]'"
        ) from None
    out = Path(out)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    table = ds.episodes
    axes[0].hist(table.returns, bins=30, color="tab:blue")
    axes[0].set(title="episode return", xlabel="return", ylabel="episodes")
    axes[1].hist(table.lengths, bins=30, color="tab:orange")
    axes[1].set(title="episode length", xlabel="steps", ylabel="episodes")
    obs_key = next((k for k, s in ds.stored_fields.items() if s.storage == "flat"), None)
    for i in range(min(TRACED_EPISODES, ds.num_episodes)):
        if obs_key is None:
            break
        values = np.asarray(ds.episode(i, [obs_key])[obs_key], dtype=np.float64).reshape(
            int(table.lengths[i]), -1
        )
        axes[2].plot(values[:, : min(3, values.shape[1])], alpha=0.8, label=f"episode {i}")
    axes[2].set(title=f"{obs_key} (first dims) over time", xlabel="step")
    fig.suptitle(f"{ds.name}: {ds.num_steps:,} steps, {ds.num_episodes:,} episodes")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
