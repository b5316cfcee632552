"""What a failed request says to a person: a DNS failure recognised through urllib3's wrapping,
and a short reason instead of urllib3's pool/URL preamble."""

from __future__ import annotations

import re
from typing import Any


def name_not_resolved(exc: BaseException) -> bool:
    """Whether a requests/urllib3 error comes from a failed DNS lookup (``socket.gaierror``,
    which urllib3 wraps as ``NameResolutionError`` inside ``MaxRetryError``)."""
    import socket

    import urllib3

    kinds: tuple[type[BaseException], ...] = (socket.gaierror,)
    if hasattr(urllib3.exceptions, "NameResolutionError"):
        kinds += (urllib3.exceptions.NameResolutionError,)
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kinds):
            return True
        stack.extend([e.__cause__, e.__context__, getattr(e, "reason", None), *e.args])
    return False


def describe_error(exc: BaseException) -> str:
    """A short reason: urllib3 nests the cause ("[Errno 111] Connection refused", "Read timed
    out") inside a long pool/URL preamble that the message already names."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text) or re.search(
        r"(Read timed out|Connection broken)", text
    )
    return f"{type(exc).__name__}: {m.group(1) if m else text}"[:300]
