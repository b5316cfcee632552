"""Turning exceptions into one red line, a hint and an exit code."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from rlds_cli import settings
from rlds_cli.cli import _output
from rlds_cli.errors import RldsError

F = TypeVar("F", bound=Callable[..., Any])

DEBUG_HINT = "set RLDS_DEBUG=1 for the full traceback"


def handle_errors(func: F) -> F:
    """Wrap a command: rlds errors become ``error: ...`` + hint and exit code 1; anything
    unexpected too, with a pointer to ``RLDS_DEBUG=1``; Ctrl-C exits 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except RldsError as exc:
            if settings.debug():
                raise
            _output.error(exc.message, exc.hint)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            _output.error("interrupted; nothing was published")
            raise typer.Exit(130) from None
        except Exception as exc:
            if settings.debug():
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            _output.error(f"unexpected {type(exc).__name__}: {first}", DEBUG_HINT)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
