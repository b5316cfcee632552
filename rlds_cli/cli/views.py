"""``rlds view`` and ``rlds split``: derived datasets that share their parent's arrays."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption

ParentArgument = Annotated[str, typer.Argument(help="The dataset to derive from.")]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace existing datasets of the new names.")]


@handle_errors
def view(
    parent: ParentArgument,
    name: Annotated[str, typer.Argument(help="Name of the new view.")],
    episodes: Annotated[str, typer.Option("--episodes", "-e", help="Episode range A:B (slice rules).")],
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Create a view of a contiguous range of episodes (no data is copied)."""
    from rlds_cli.cache.dataset import open_dataset
    from rlds_cli.cache.views import create_view, parse_episode_range

    selection = parse_episode_range(episodes, open_dataset(parent, root).num_episodes)
    manifest = create_view(parent, name, selection, root=root, replace=force)
    _report([manifest], json=json, quiet=quiet)


@handle_errors
def split(
    parent: ParentArgument,
    val: Annotated[float, typer.Option("--val", help="Fraction of episodes (the last ones) for validation.")],
    train_name: Annotated[str | None, typer.Option("--train-name", help="Default: PARENT-train.")] = None,
    val_name: Annotated[str | None, typer.Option("--val-name", help="Default: PARENT-val.")] = None,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Split a dataset by episode into train and validation views (no data is copied)."""
    from rlds_cli.cache.views import split_dataset

    manifests = split_dataset(parent, val, train_name=train_name, val_name=val_name, root=root, replace=force)
    _report(list(manifests), json=json, quiet=quiet)


def _report(manifests: list, *, json: bool, quiet: bool) -> None:  # type: ignore[type-arg]
    rows = [
        {
            "name": m.name,
            "parent": m.source["parent"],
            "episodes": m.source["episodes"],
            "num_steps": m.num_steps,
            "num_episodes": m.num_episodes,
        }
        for m in manifests
    ]
    if json:
        _output.print_json(rows if len(rows) > 1 else rows[0])
    elif not quiet:
        for r in rows:
            a, b = r["episodes"]
            _output.console.print(
                f"[green]{_output.escape(r['name'])}[/]: episodes {a}:{b} of {_output.escape(r['parent'])} "
                f"({r['num_episodes']:,} episodes, {r['num_steps']:,} steps), sharing its arrays",
                soft_wrap=True,
            )
