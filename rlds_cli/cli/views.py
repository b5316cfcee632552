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


def _check_fraction(value: float | None) -> float | None:
    if value is not None and not 0.0 < value < 1.0:
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
        typer.Option(
            "--episodes",
            "-e",
            help="Episodes: a range A:B (Python slice rules) or a list of positions and ranges, e.g. "
            "0,5,9-20 (inclusive; negative positions count from the end).",
            show_default=False,
        ),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            "-w",
            help='Keep the episodes for which a predicate holds, e.g. "length >= 50 and return > 100" '
            "(columns of the episode table: length, return, start, source_id, episode...; "
            "with --episodes: among those).",
            show_default=False,
        ),
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
    """Create a view of any episodes of a dataset, or of a filter key's episodes (no data is
    copied).

    Example: rlds view hopper-medium-v2 --episodes 0,5,9-20 --name hopper-some
    """
    import numpy as np

    from rlds_cli.cache.derive import create_selection, create_view
    from rlds_cli.cache.episode_select import parse_episode_list, select_where
    from rlds_cli.cache.filter_keys import filter_key_episodes
    from rlds_cli.cache.opening import open_dataset
    from rlds_cli.cache.views import parse_episode_range
    from rlds_cli.catalog.names import resolve_name
    from rlds_cli.errors import InvalidSelectionError

    if name is None:
        raise typer.BadParameter("the new view's name is required", param_hint="'--name' / '-n'")
    if episodes is None and where is None and filter_key is None:
        raise typer.BadParameter(
            "say which episodes: --episodes 0:100 or 0,5,9-20, --where PREDICATE or --filter-key KEY",
            param_hint="'--episodes' / '--where' / '--filter-key'",
        )
    parent = resolve_name(parent, root)
    ds = open_dataset(parent, root)
    if episodes is not None and ":" in episodes and where is None and filter_key is None:
        manifest = create_view(
            parent, name, parse_episode_range(episodes, ds.num_episodes), root=root, replace=force
        )
        _report([manifest], json=json, quiet=quiet, many=False)
        return
    how: list[str] = []
    ids = None
    if episodes is not None:
        if ":" in episodes:
            a, b = parse_episode_range(episodes, ds.num_episodes)
            ids = np.arange(a, b, dtype=np.int64)
        else:
            ids = parse_episode_list(episodes, ds.num_episodes)
        how.append(f"episodes {episodes}")
    if filter_key is not None:
        keyed = filter_key_episodes(ds, filter_key)
        ids = keyed if ids is None else np.intersect1d(ids, keyed)
        how.append(f"filter key {filter_key!r}")
    if where is not None:
        matching = select_where(where, ds.episodes)
        among = f" among {', '.join(how)}" if how else ""
        ids = matching if ids is None else np.intersect1d(ids, matching)
        how.append(f"where {where}")
        if len(ids) == 0:
            raise InvalidSelectionError(
                f"--where {where!r} holds for no episode of {parent!r}{among}",
                hint="look at the episodes' statistics with 'rlds inspect'",
            )
    assert ids is not None
    if len(ids) == 0:
        raise InvalidSelectionError(f"no episode of {parent!r} is in all of: {', '.join(how)}")
    manifest = create_selection(parent, name, ids, how=", ".join(how), root=root, replace=force)
    _report([manifest], json=json, quiet=quiet, many=False)


@handle_errors
def split(
    parent: ParentArgument,
    val: Annotated[
        float | None,
        typer.Option(
            "--val",
            help="Fraction of episodes for validation, between 0 and 1 (e.g. 0.1): drawn at random "
            "(--seed), or the last ones (--last).",
            callback=_check_fraction,
            show_default=False,
        ),
    ] = None,
    val_episodes: Annotated[
        str | None,
        typer.Option(
            "--val-episodes",
            help="The validation episodes themselves instead of --val: positions and ranges, e.g. "
            "0,5,9-20 (the others are for training).",
            show_default=False,
        ),
    ] = None,
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
    ones; --val-episodes names them. Neither view is made when either name is taken (unless
    --force).
    """
    from rlds_cli.cache.derive import split_dataset
    from rlds_cli.catalog.names import resolve_name

    parent = resolve_name(parent, root)
    base = name if name is not None else parent
    if (val is None) == (val_episodes is None):
        raise typer.BadParameter(
            "give either --val FRACTION or --val-episodes LIST", param_hint="'--val' / '--val-episodes'"
        )
    if val_episodes is not None and last:
        raise typer.BadParameter("--last picks episodes for --val, not --val-episodes", param_hint="'--last'")
    manifests = split_dataset(
        parent,
        val,
        val_episodes=val_episodes,
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
