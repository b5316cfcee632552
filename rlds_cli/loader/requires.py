"""The loader's torch requirement, checked before any torch-using loader module is imported.

torch is not a dependency of rlds-cli (its build depends on the machine: CPU, CUDA version);
:func:`require_torch` (called by ``rlds_cli.loader.__getattr__``) says what to install.
"""

from __future__ import annotations

from rlds_cli.errors import MissingExtraError

#: What to do when torch is missing.
INSTALL_TORCH = "install PyTorch first: pip install torch (any 2.x from 2.3 on), then run the command again"


def require_torch() -> None:
    """Import torch, or raise :class:`~rlds_cli.errors.MissingExtraError` (an ``ImportError``)
    saying it is not installed, or installed but broken (e.g. a CUDA library it cannot load)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "torch").split(".")[0] != "torch":  # torch found, one of its own imports not
            raise _broken(exc) from exc
        raise MissingExtraError(
            "the rlds loader needs torch, which is not installed", hint=INSTALL_TORCH
        ) from None
    except ImportError as exc:
        raise _broken(exc) from exc


def _broken(exc: ImportError) -> MissingExtraError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return MissingExtraError(
        f"torch is installed but cannot be imported: {first}",
        hint="reinstall PyTorch for this machine (pip install --force-reinstall torch); "
        "RLDS_DEBUG=1 shows the full traceback",
    )
