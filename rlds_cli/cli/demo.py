"""``rlds demo``: the main job end to end on the bundled dataset, no network."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    JsonOption,
    QuietOption,
    RootOption,
    StorageOption,
    VerboseOption,
    handle_errors,
)

DEMO_ID = "pointmass-demo-v0"


@handle_errors
def demo(
    storage: StorageOption = None,
    batches: Annotated[int, typer.Option("--batches", min=1, help="Batches to sample.")] = 3,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Transitions per batch.")] = 256,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Convert the bundled demo dataset, inspect it, and sample batches through the loader.

    With -q only the dataset's name is printed; --json prints what each step found.
    """
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cli.datasets import render_summary
    from rlds_cli.inspection.summary import describe
    from rlds_cli.sources.download import download

    show = not (json or quiet)
    out = output.console
    if show:
        out.rule("1. download + convert (bundled registry entry, no network)")
    with output.conversion_progress(enabled=show) as progress:
        result = download(DEMO_ID, root=root, backend=storage, progress=progress)
    if show:
        verb = "reused the cached copy of" if result.reused else "converted"
        out.print(f"{verb} [green]{DEMO_ID}[/] into {output.escape(str(result.path))}", soft_wrap=True)
        out.rule("2. inspect")
    dataset = open_dataset(DEMO_ID, root)
    if show:
        render_summary(describe(dataset))
        out.rule("3. sample through the loader (torch)")
    from rlds_cli.loader import Loader

    loader = Loader(dataset, batch_size=batch_size, seed=0, num_batches=batches)
    sampled: list[dict[str, Any]] = []
    for i, batch in enumerate(loader):
        shapes = {
            k: list(v.shape)
            for k, v in batch.items()
            if k in ("observation", "action", "next/observation", "next/reward")
        }
        done = batch["next", "done"]
        facts = {
            "shapes": shapes,
            "mean_reward": float(batch["next", "reward"].mean().item()),
            "episode_ends": int(done.sum()),
            "episodes": len(set(batch["episode"].tolist())),
        }
        sampled.append(facts)
        if show:
            text = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
            out.print(
                f"batch {i}: {text}; mean reward {facts['mean_reward']:+.3f}, "
                f"{facts['episode_ends']} episode ends, from {facts['episodes']} episodes",
                soft_wrap=True,  # one line a batch, whatever the console's width
            )
    if json:
        output.print_json(
            {
                "name": DEMO_ID,
                "path": str(result.path),
                "reused": result.reused,
                "num_steps": dataset.num_steps,
                "num_episodes": dataset.num_episodes,
                "batches": sampled,
            }
        )
    elif quiet:
        out.print(Text(DEMO_ID), soft_wrap=True)
    else:
        cache = output.escape(str(result.path.parent.parent))
        out.print(f"[bold green]demo done[/]: cache at {output.escape(str(cache))}", soft_wrap=True)
        out.print("next: rlds list; rlds inspect demo (the README walks on from here)")
