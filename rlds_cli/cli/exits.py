"""Turning exceptions into one red line, a hint and an exit code."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import typer
from typer._click.exceptions import ClickException  # typer vendors click: its usage errors

from rlds_cli import settings
from rlds_cli.cli import output
from rlds_cli.errors import GYMNASIUM_INSTALL, MissingExtraError, RldsError, from_os_error

F = TypeVar("F", bound=Callable[..., Any])

DEBUG_HINT = "set RLDS_DEBUG=1 for the full traceback"

#: Modules a command may need that a user can be missing: what to install for each.
INSTALL_HINTS = {
    "torch": "install PyTorch first: pip install torch (any 2.x from 2.3 on), then run the command again",
    "matplotlib": "pip install 'rlds-cli[plot]' (matplotlib)",
    "ray": "pip install 'rlds-cli[ray]'",
    "PIL": "pip install pillow (a dependency of rlds-cli: reinstall it)",
    "simplejpeg": "pip install simplejpeg (a dependency of rlds-cli: reinstall it)",
    "tensordict": "pip install 'rlds-cli[torchrl]' (torchrl, tensordict)",
    "torchrl": "pip install 'rlds-cli[torchrl]' (torchrl, tensordict)",
    "numba": "pip install numba (a dependency of rlds-cli: the install is incomplete)",
    "gymnasium": GYMNASIUM_INSTALL,
    "fsspec": "pip install 'rlds-cli[remote]' (fsspec, s3fs)",
    "s3fs": "pip install 'rlds-cli[remote]' (fsspec, s3fs)",
    "h5py": "pip install h5py (a dependency of rlds-cli: reinstall rlds-cli)",
    "zarr": "pip install zarr (a dependency of rlds-cli: reinstall rlds-cli)",
}


def missing_module_error(exc: ImportError) -> MissingExtraError | None:
    """The clear error for an import of a module a user can install (``None`` for any other:
    a broken import inside rlds is a bug, and stays "unexpected")."""
    top = (exc.name or "").split(".")[0]
    hint = INSTALL_HINTS.get(top)
    if hint is None or not isinstance(exc, ModuleNotFoundError):
        return None
    return MissingExtraError(f"this command needs {top}, which is not installed", hint=hint)


def handle_errors(func: F) -> F:
    """Wrap a command: rlds errors become ``error: ...`` + hint and exit code 1; a missing
    optional module says what to install; anything unexpected is one line with a pointer to
    ``RLDS_DEBUG=1``; Ctrl-C exits 130. A ``verbose`` argument (``-v`` after the command)
    turns on logging like ``rlds -v``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("verbose"):
            output.configure_logging(int(kwargs["verbose"]))
        try:
            return func(*args, **kwargs)
        except (typer.Exit, ClickException):  # usage errors: typer prints them, exit 2
            raise
        except RldsError as exc:
            if settings.debug():
                raise
            output.error(exc.message, exc.hint)
            raise typer.Exit(1) from None
        except ModuleNotFoundError as exc:
            missing = missing_module_error(exc)
            if missing is None or settings.debug():
                raise _unexpected(exc) from None
            output.error(missing.message, missing.hint)
            raise typer.Exit(1) from None
        except OSError as exc:
            translated = from_os_error(exc)
            if translated is None or settings.debug():
                raise _unexpected(exc) from None
            output.error(translated.message, translated.hint)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            output.error("interrupted; nothing was published")
            raise typer.Exit(130) from None
        except Exception as exc:
            raise _unexpected(exc) from None

    return cast(F, wrapper)  # functools.wraps: the same call signature as func


def _unexpected(exc: Exception) -> BaseException:
    """Re-raise under RLDS_DEBUG; else report ``unexpected ...`` and exit 1."""
    if settings.debug():
        return exc
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    output.error(f"unexpected {type(exc).__name__}: {first}", DEBUG_HINT)
    return typer.Exit(1)
