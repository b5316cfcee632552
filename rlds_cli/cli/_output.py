"""All terminal rendering lives here (the library never prints).

Text that comes from outside (paths, names, messages) goes through :func:`escape` before it is
printed with Rich markup, so a ``[`` in a path is printed as is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Rich honours NO_COLOR and drops styling when stdout is not a terminal.
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Write one JSON document to stdout, unstyled and unwrapped (for pipes and scripts)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def error(message: str, hint: str = "") -> None:
    """One red line, then a dim hint line."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, markup=True, emoji=False)
    if hint:
        err_console.print(f"[dim]hint:[/] {escape(hint)}", soft_wrap=True, emoji=False)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True, emoji=False)


def configure_logging(verbosity: int) -> None:
    """Send the library's log records to stderr: ``1`` shows info, ``2`` and more debug."""
    import logging

    from rich.logging import RichHandler

    handler = RichHandler(console=err_console, show_path=False, markup=False, rich_tracebacks=False)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("rlds_cli")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbosity >= 2 else logging.INFO)
    logger.propagate = False


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


@contextmanager
def conversion_progress(enabled: bool) -> Iterator[Any]:
    """A progress callback for :func:`rlds_cli.convert.convert`, drawn on stderr when it is a
    terminal (and silent otherwise)."""
    show = enabled and err_console.is_terminal
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=not show,
    )
    task: list[Any] = []

    def callback(event: str, amount: int) -> None:
        if event == "hash":
            progress.log(f"hashed source ({human_bytes(amount)})") if show else None
        elif event == "start":
            task.append(progress.add_task("converting", total=amount))
        elif event == "advance" and task:
            progress.advance(task[0], amount)

    with progress:
        yield callback


__all__ = [
    "DownloadColumn",
    "console",
    "conversion_progress",
    "err_console",
    "error",
    "escape",
    "human_bytes",
    "print_json",
    "warn",
]
