"""The progress callbacks: how a long operation reports how far it is, to a CLI bar or a
caller (the library never prints)."""

from __future__ import annotations

from collections.abc import Callable

#: ``callback(event, file_name, value)``, called from worker threads. Events:
#:
#: - ``"start"``: a transfer begins; ``value`` is the file's total size in bytes (0 if unknown).
#: - ``"resume"``: ``value`` bytes were already on disk from an earlier attempt.
#: - ``"advance"``: ``value`` more bytes arrived.
#: - ``"reset"``: the server ignored the Range request; the file restarts from 0 bytes.
#: - ``"retry"``: a transient error; ``value`` is the retry number.
#: - ``"wait"``: another process holds the file's lock (it is downloading it); waiting.
#: - ``"verify"``: hashing ``value`` bytes.
#: - ``"done"``: the file is verified and in place (``value`` = its size).
#: - ``"cached"``: the file was already downloaded and verified (``value`` = its size).
DownloadProgress = Callable[[str, str, int], None]

#: ``callback(event, amount)``: a conversion, a push or pull, a preprocess job. ``"start"``
#: (the total: rows, bytes or steps), ``"advance"`` (more done), and each operation's own
#: events, listed where it takes the callback (``"skip"``, ``"hash"``, ``"resume"``).
Progress = Callable[[str, int], None]


def ignore(event: str, name: str, value: int) -> None:
    """A callback that does nothing."""
