"""Scripts without a main guard: a spawned worker re-runs the caller's script, which must not start
the job again.

Spawning imports the parent's ``__main__`` script again in each child (as ``__mp_main__``), so a
script that calls :func:`rlds_cli.preprocess.run` at its top level, outside
``if __name__ == "__main__":``, would start a job in every worker. The worker detects that
(:func:`stop_if_reimported`) and exits with :data:`REIMPORTED_EXIT`; the coordinator turns that exit
code into a :class:`~rlds_cli.errors.PreprocessError` that says what to do.

Imports only the standard library (spawned workers import it).
"""

from __future__ import annotations

import multiprocessing
import sys
from types import FrameType

#: Exit code of a worker whose import of the caller's script called ``preprocess.run``.
REIMPORTED_EXIT = 86

MESSAGE = (
    "the script that called preprocess.run has no main guard: each worker process re-runs it "
    "(worker processes are spawned, which imports the main script again) and started the job again"
)
HINT = 'put the call under `if __name__ == "__main__":`, or pass workers=1 (no worker processes)'


def reimported() -> bool:
    """Whether this process is a spawned child importing its parent's main script (as ``__mp_main__``)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        return True  # multiprocessing's own flag while a spawned child prepares (3.8 - 3.13)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:  # a frame running the re-imported script's top level
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def stop_if_reimported() -> None:
    """In a worker re-importing the caller's script, exit with :data:`REIMPORTED_EXIT`; elsewhere, nothing."""
    if reimported():
        raise SystemExit(REIMPORTED_EXIT)
