"""``rlds view`` and ``rlds split``: derived datasets that share their parent's arrays."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.exits import handle_errors
from rlds_cli.cli.options import (
    JsonOption,
    NameOption,
    QuietOption,
    RootOption,
    VerboseOption,
    force_option,
)


def _check_fraction(value: float) -> float:
    if not 0.0 < value < 1.0:
        raise typer.BadParameter(f"{value} is not between 0 and 1 (a fraction of the episodes, e.g. 0.1)")
    return value


ParentArgument = Annotated[str, typer.Argument(help="The dataset to derive from (or a registry alias).")]
ForceOption = Annotated[bool, force_option("Replace existing datasets of the new names.")]


@handle_errors
def view(
    parent: ParentArgument,
    name: NameOption = None,
    episodes: Annotated[
        str | None,
        typer.Option("--episodes", "-e", help="Episode range A:B (Python slice rules).", show_default=False),
    ] = None,
    filter_key: Annotated[
        str | None,
        typer.Option(
            "--filter-key",
            help="The episodes of one of the dataset's filter keys (robomimic's mask/<key>, e.g. train).",
            show_default=False,
        ),
    ] = None,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Create a view of a contiguous range of episodes, or of a filter key's episodes (no data
    is copied).

    Example: rlds view hopper-medium-v2 --episodes 0:100 --name hopper-first-100
    """
    from rlds_cli.cache.derive import create_selection, create_view
    from rlds_cli.cache.filter_keys import filter_key_episodes
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cache.views import parse_episode_range
    from rlds_cli.catalog.names import resolve_name

    if name is None:
        raise typer.BadParameter("the new view's name is required", param_hint="'--name' / '-n'")
    if (episodes is None) == (filter_key is None):
        raise typer.BadParameter(
            "give either a range A:B (e.g. 0:100) or --filter-key KEY", param_hint="'--episodes' / '-e'"
        )
    parent = resolve_name(parent, root)
    if filter_key is not None:
        ids = filter_key_episodes(open_dataset(parent, root), filter_key)
        how = f"filter key {filter_key!r}"
        manifest = create_selection(parent, name, ids, how=how, root=root, replace=force)
    else:
        assert episodes is not None
        selection = parse_episode_range(episodes, open_dataset(parent, root).num_episodes)
        manifest = create_view(parent, name, selection, root=root, replace=force)
    _report([manifest], json=json, quiet=quiet, many=False)


@handle_errors
def split(
    parent: ParentArgument,
    val: Annotated[
        float,
        typer.Option(
            "--val",
            help="Fraction of episodes for validation, between 0 and 1 (e.g. 0.1): drawn at random "
            "(--seed), or the last ones (--last).",
            callback=_check_fraction,
        ),
    ],
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            help="Base of the new names: NAME-train and NAME-val (default: PARENT).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            help="Seed of the random draw of the validation episodes (the same seed, the same split).",
            min=0,
        ),
    ] = 0,
    last: Annotated[
        bool,
        typer.Option("--last", help="Take the last episodes for validation instead (a split in time)."),
    ] = False,
    force: ForceOption = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Split a dataset by episode into train and validation views (no data is copied).

    The validation episodes are drawn at random (--seed, 0 by default: the same split every
    time), so a dataset ordered by time or by policy is split evenly; --last takes the last
    ones. Neither view is made when either name is taken (unless --force).
    """
    from rlds_cli.cache.derive import split_dataset
    from rlds_cli.catalog.names import resolve_name

    parent = resolve_name(parent, root)
    base = name if name is not None else parent
    manifests = split_dataset(
        parent,
        val,
        train_name=f"{base}-train",
        val_name=f"{base}-val",
        root=root,
        replace=force,
        seed=seed,
        last=last,
    )
    _report(list(manifests), json=json, quiet=quiet, many=True)


def _report(manifests: list[Any], *, json: bool, quiet: bool, many: bool) -> None:
    rows = [
        {
            "name": m.name,
            "parent": m.source["parent"],
            "episodes": m.source["episodes"],
            **({"selection": m.source["selection"]} if m.source.get("selection") else {}),
            "num_steps": m.num_steps,
            "num_episodes": m.num_episodes,
        }
        for m in manifests
    ]
    if json:
        output.print_json(rows if many else rows[0])
    elif quiet:
        for r in rows:
            output.console.print(Text(r["name"]), soft_wrap=True)
    else:
        for r in rows:
            a, b = r["episodes"]
            chosen = output.escape(r.get("selection") or f"episodes {a}:{b}")
            output.console.print(
                f"[green]{output.escape(r['name'])}[/]: {chosen} of {output.escape(r['parent'])} "
                f"({r['num_episodes']:,} episodes, {r['num_steps']:,} steps), sharing its arrays",
                soft_wrap=True,
            )
