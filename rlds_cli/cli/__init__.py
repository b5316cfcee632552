"""The ``rlds`` command line: thin commands that call the library and render its results."""

from __future__ import annotations


def main() -> None:
    """The ``rlds`` entry point: Ctrl-C and SIGTERM are interruptions from the first moment
    (:mod:`rlds_cli._util.signals`), before the application's imports, then
    :func:`rlds_cli.cli.app.main`."""
    import sys

    from rlds_cli._util import signals

    signals.install()
    try:
        from rlds_cli.cli.app import main as run_app
    except KeyboardInterrupt:  # while the commands are imported: nothing was started
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(signals.exit_code()) from None
    run_app()
