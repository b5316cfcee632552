"""``rlds list --remote`` and ``rlds info``: the registry, without downloading anything."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from rlds_cli.cli import _output
from rlds_cli.cli._errors import handle_errors
from rlds_cli.cli.options import JsonOption, RootOption


def _size(value: int | None) -> str:
    return "?" if value is None else _output.human_bytes(value)


def _state(row: dict[str, Any]) -> str:
    if row["cached"]:
        return "converted"
    return "downloaded" if row["downloaded"] else "-"


def list_remote(root: Any, json: bool) -> None:
    """Print every registry entry with its size, steps, format and local state."""
    from rlds_cli import registry
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.net.status import entry_status

    cache = CacheRoot(root)
    rows = [entry_status(e, cache) for e in registry.entries()]
    if json:
        _output.print_json({"root": str(cache.path), "datasets": rows})
        return
    table = Table(title=f"registry datasets ({len(rows)})", title_justify="left")
    for col, justify in (("id", "left"), ("format", "left"), ("size", "right"), ("steps", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    table.add_column("local")
    for r in rows:
        steps = f"{r['num_steps']:,}" if r["num_steps"] else "?"
        table.add_row(_output.escape(r["id"]), r["format"], _size(r["size_bytes"]), steps, _state(r))
    _output.console.print(table)
    _output.console.print("size '?': not published; known after the first download ('rlds info ID')")


@handle_errors
def info(
    dataset_id: Annotated[str, typer.Argument(help="A registry id or alias.", metavar="ID")],
    root: RootOption = None,
    json: JsonOption = False,
) -> None:
    """Show a registry entry (files, URLs, hashes, local state) without downloading it."""
    from rlds_cli import registry
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.net.status import entry_status

    row = entry_status(registry.resolve(dataset_id), CacheRoot(root))
    if json:
        _output.print_json(row)
        return
    out, esc = _output.console, _output.escape
    out.print(f"[bold]{esc(row['id'])}[/]  ({row['format']})  {esc(row['description'])}", soft_wrap=True)
    if row["aliases"]:
        out.print(f"aliases  {esc(', '.join(row['aliases']))}")
    out.print(f"license  {esc(row['license'] or '?')}")
    out.print(f"cache name  {esc(row['cache_name'])}   local: {_state(row)}")
    if row["options"]:
        out.print("reader hints  " + ", ".join(f"{k}={v}" for k, v in row["options"].items()))
    if row["listing"]:
        lst = row["listing"]
        out.print(
            f"files  listed from the Hugging Face folder {esc(lst['hf_repo'])}/{esc(lst['path'])} "
            "at download time",
            soft_wrap=True,
        )
    for f in row["files"]:
        sha = f["sha256"] or "unknown (recorded on first download)"
        origin = f" ({f['sha256_origin']})" if f["sha256"] else ""
        out.print(f"  {esc(f['name'])}  size {_size(f['size'])}  sha256 {sha}{origin}", soft_wrap=True)
        for url in f["urls"]:
            out.print(f"    {esc(url)}", soft_wrap=True)
    out.print(f"defined in {esc(row['registry_file'])}", soft_wrap=True)
