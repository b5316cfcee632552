"""One Python session for the ``python`` blocks of one documentation page.

Run as a script (``python doc_session.py``): it reads blocks from stdin, each sent as a line
``<where> <length>`` followed by ``length`` bytes of code, runs each in the namespace of
``__main__`` (so ``if __name__ == "__main__":`` blocks run, as in a script), and answers one
JSON line per block on its original stdout. What the blocks print goes to stderr.

A spawned worker process imports this file again as ``__mp_main__``: the loop below is guarded,
so the worker only gets the definitions, as with any script.
"""

from __future__ import annotations

import json
import sys
import traceback


def _serve() -> None:
    replies = sys.stdout
    sys.stdout = sys.stderr  # the blocks' output must not mix with the replies
    namespace = sys.modules["__main__"].__dict__
    source = sys.stdin.buffer
    while True:
        header = source.readline()
        if not header:
            return
        where, length = header.decode().rsplit(" ", 1)
        code = source.read(int(length)).decode("utf-8")
        try:
            exec(compile(code, where, "exec"), namespace)  # running the docs is the point
            reply = {"ok": True}
        except BaseException:  # whatever a block raises is its report
            reply = {"ok": False, "error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    _serve()
