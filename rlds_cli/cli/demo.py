"""``rlds demo``: the main job end to end on the bundled dataset, no network."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import BackendOption, RootOption

DEMO_ID = "pointmass-demo-v0"


@handle_errors
def demo(
    root: RootOption = None,
    backend: BackendOption = "memmap",
    batches: Annotated[int, typer.Option("--batches", min=1, help="Batches to sample.")] = 3,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Transitions per batch.")] = 256,
) -> None:
    """Convert the bundled demo dataset, inspect it, and sample batches through the loader."""
    from rlds_cli.cache.dataset import open_dataset
    from rlds_cli.cli.datasets import render_summary
    from rlds_cli.download import download
    from rlds_cli.summary import describe

    out = _output.console
    out.rule("1. download + convert (bundled registry entry, no network)")
    with _output.conversion_progress(enabled=True) as progress:
        result = download(DEMO_ID, root=root, backend=backend, progress=progress)
    verb = "reused the cached copy of" if result.reused else "converted"
    out.print(f"{verb} [green]{DEMO_ID}[/] into {_output.escape(str(result.path))}")

    out.rule("2. inspect")
    dataset = open_dataset(DEMO_ID, root)
    render_summary(describe(dataset))

    out.rule("3. sample through the loader (torch)")
    from rlds_cli.loader import Loader

    loader = Loader(dataset, batch_size=batch_size, seed=0, num_batches=batches)
    for i, batch in enumerate(loader):
        shapes = ", ".join(
            f"{k} {tuple(v.shape)}"
            for k, v in batch.items()
            if k in ("observation", "action", "next/observation", "next/reward")
        )
        done = batch["next", "done"]
        out.print(
            f"batch {i}: {shapes}; mean reward {batch['next', 'reward'].mean().item():+.3f}, "
            f"{int(done.sum())} episode ends, from {len(set(batch['episode'].tolist()))} episodes"
        )
    out.print(f"[bold green]demo done[/]: cache at {_output.escape(str(result.path.parent.parent))}")
