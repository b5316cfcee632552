"""The command line's interruptions: Ctrl-C (SIGINT) and SIGTERM (``kill``, ``timeout``, ``docker
stop``, SLURM) raise :class:`KeyboardInterrupt` in the command, so the same cleanup runs for both
(temporary files removed, nothing published) and the command says so in one line. A publish (one
rename) is never cut: an interruption during it waits for its end (:func:`publishing`), and the
command then says what it published.

Installed by the ``rlds`` entry point only: the library leaves a program's signals to it. An
interruption is also remembered: one raised inside a library's cleanup is dropped there (h5py's
object cleanup prints "Exception ignored" and goes on), so :func:`raise_if_interrupted` raises it
again before anything is published.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM received: handled as Ctrl-C is (a :class:`KeyboardInterrupt`)."""


_received: int | None = None
_owner: int | None = None
_deferring = 0
_published: list[str] = []
_previous_hook: Callable[[Any], object] = sys.unraisablehook


def install() -> None:
    """Make SIGINT and SIGTERM interruptions of this process (see the module docstring)."""
    global _owner
    _owner = os.getpid()
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    if sys.unraisablehook is not _unraisable:
        global _previous_hook
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _unraisable(unraisable: Any) -> None:
    """Python's report of an exception it drops ("Exception ignored in ..."): silent for an
    interruption (remembered, and raised again: :func:`raise_if_interrupted`)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    _previous_hook(unraisable)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The handler :func:`install` sets: remember the signal, raise it as an interruption."""
    global _received
    if os.getpid() != _owner:  # a forked child: Python's own handling (a pool's terminate())
        if signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received = signum
    if not _deferring:
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


#: Exit codes of an interrupted command: 128 + the signal's number, as a shell reports it.
INTERRUPTED_EXIT, TERMINATED_EXIT = 128 + signal.SIGINT, 128 + signal.SIGTERM


def exit_code(exc: BaseException | None = None) -> int:
    """The exit code of a command the interruption ``exc`` (or the signal received) stopped:
    :data:`TERMINATED_EXIT` for SIGTERM, else :data:`INTERRUPTED_EXIT` (Ctrl-C's). The signal
    counts where a command raised an interruption of its own after catching SIGTERM's."""
    term = isinstance(exc, Terminated) or _received == signal.SIGTERM
    return TERMINATED_EXIT if term else INTERRUPTED_EXIT


def raise_if_interrupted() -> None:
    """Raise the interruption received (see the module docstring), once; nothing when none was."""
    global _received
    signum, _received = _received, None
    if signum is not None:
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def held() -> Iterator[None]:
    """Run the block whole: an interruption received during it is raised once it has run (blocks
    nest; the outermost raises it)."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        raise_if_interrupted()


@contextmanager
def publishing(what: str) -> Iterator[None]:
    """Run the block that publishes ``what`` (``dataset 'x'``, a path: one rename) whole
    (:func:`held`); once it has run, ``what`` is among :func:`published`: an interruption then
    says so, never "nothing was published"."""
    if not _deferring:
        raise_if_interrupted()  # one a library's cleanup dropped: nothing is published
    with held():
        yield
        _published.append(what)


def published() -> list[str]:
    """What :func:`publishing` blocks published since :func:`forget_published`."""
    return list(_published)


def forget_published() -> None:
    """Start a new command's record of what it published."""
    _published.clear()
