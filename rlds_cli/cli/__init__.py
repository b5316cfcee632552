"""The ``rlds`` command line: thin commands that call the library and render its results."""

from __future__ import annotations


def main() -> None:
    """The ``rlds`` entry point: Ctrl-C and SIGTERM are interruptions from the first moment
    (:mod:`rlds_cli._util.signals`), before the application's imports, then
    :func:`rlds_cli.cli.app.main`. An interrupted command, once it has said so, ends the process
    without waiting for threads still running (one blocked in a read of a stalled server waits
    for the read timeout); a signal after the command's end is ignored (it can stop nothing, and
    killed the process without a word)."""
    import contextlib
    import os
    import signal
    import sys

    from rlds_cli._util import signals

    signals.install()
    try:
        from rlds_cli.cli.app import main as run_app
    except KeyboardInterrupt:  # while the commands are imported: nothing was started
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(signals.exit_code()) from None
    try:
        run_app()
    except SystemExit as exc:
        interrupted = (signals.INTERRUPTED_EXIT, signals.TERMINATED_EXIT)
        if isinstance(exc.code, int) and exc.code in interrupted and _threads_left():
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(exc.code)
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def _threads_left() -> bool:
    """Whether a thread the interpreter would wait for at exit is still running."""
    import threading

    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())
