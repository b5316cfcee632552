"""``rlds stats``: the normalization statistics of datasets, one table per source, as a mixture's
``Normalize`` per source takes them (the library's :class:`rlds_cli.NormalizationTable`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rlds_cli.cli import output
from rlds_cli.cli.exits import handle_errors
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption


def _fmt(values: Any, i: int) -> str:
    return "-" if values is None else f"{values[i] if isinstance(values, list) else values:.4g}"


@handle_errors
def stats(
    names: Annotated[
        list[str],
        typer.Argument(help="Datasets (cache names or aliases), one source each.", show_default=False),
    ],
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key", "-k", help="Key to summarize (repeatable; default: action).", show_default=False
        ),
    ] = None,
    normalization_table: Annotated[
        Path | None,
        typer.Option(
            "--normalization-table",
            metavar="OUT.json",
            help="Write the table (per source, per key mean/std/min/max/q01/q99) to this JSON file, "
            "read back by NormalizationTable.load to un-normalize actions at inference.",
            show_default=False,
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Per-source normalization statistics (mean, std, min, max, q01, q99 per dimension).

    Each dataset's own statistics (a view's parent's), as MixtureLoader(...,
    transforms={name: Normalize(keys=KEYS)}) uses them; --normalization-table writes them as
    one JSON table for un-normalizing a mixture policy's actions per robot.

    Example: rlds stats robot-a robot-b --key action --normalization-table norm.json
    """
    from rlds_cli.catalog.names import resolve_name
    from rlds_cli.errors import MixtureError
    from rlds_cli.loader.normalization_table import NormalizationTable

    if normalization_table is not None and not normalization_table.parent.is_dir():
        raise MixtureError(
            f"cannot write {normalization_table}: its folder {normalization_table.parent} does not exist",
            hint="create the folder first, or write the table elsewhere",
        )
    resolved = [resolve_name(n, root) for n in names]
    table = NormalizationTable.from_datasets(resolved, key or ["action"], root=root)
    if normalization_table is not None:
        table.save(normalization_table)
    data = table.to_dict()
    if json:
        output.print_json(data)
        return
    if quiet:
        if normalization_table is not None:
            output.console.print(output.escape(str(normalization_table)), soft_wrap=True)
        return
    columns = [output.Column("source", kind="key"), output.Column("key", kind="key"),
               output.Column("dim", "right", "fixed")]  # fmt: skip
    columns += [output.Column(s, "right", "fixed") for s in ("mean", "std", "min", "max", "q01", "q99")]
    rows: list[list[Any]] = []
    for name, entry in data["sources"].items():
        for k, s in entry["keys"].items():
            width = int(s["shape"][0]) if len(s["shape"]) == 1 else 1
            for i in range(width):
                rows.append(
                    [name, k, str(i), *(_fmt(s[n], i) for n in ("mean", "std", "min", "max", "q01", "q99"))]
                )
    output.print_table(columns, rows)
    if normalization_table is not None:
        output.note(f"wrote {normalization_table} ({output.count(len(data['sources']), 'source')})")
