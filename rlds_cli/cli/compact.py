"""``rlds compact NAME``: merge a growing dataset's segments (see :mod:`rlds_cli.write.compact`)."""

from __future__ import annotations

from typing import Annotated

import typer

from rlds_cli.cli import output
from rlds_cli.cli.exits import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption


@handle_errors
def compact(
    name: Annotated[str, typer.Argument(help="A growing dataset (written with DatasetWriter).")],
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            help="Seconds to keep the merged segments' files for readers of older views "
            "(default: the dataset's grace_seconds; 0: remove them now).",
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Merge the segments of a growing dataset so it reads as fast as a converted one.

    Safe while writers append and readers sample: readers keep their view (the old segments'
    files stay for the grace period) and see the merged segment when they refresh.
    """
    from rlds_cli.catalog.names import resolve_name
    from rlds_cli.write.compact import compact as run

    report = run(resolve_name(name, root), root, grace_seconds=grace)
    if json:
        output.print_json(report.to_dict())
        return
    if quiet:
        return
    output.console.print(
        f"{output.escape(report.name)}: {output.count(report.segments_before, 'segment')} -> "
        f"{report.segments_after:,} ({output.count(report.episodes, 'episode')}, "
        f"{output.count(report.steps, 'step')}); {len(report.removed):,} retired files removed",
        soft_wrap=True,
    )
