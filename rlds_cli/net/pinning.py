"""When a first-seen hash may be trusted, and what a failed conversion does to it.

A file whose registry entry (or the user, with ``--sha256``, or the Hugging Face Hub) gives a
sha256 is checked against that authority, and nothing here applies to it. A file without one is
"trust on first use": its first download's sha256 is recorded *unconfirmed* (``pinned=False`` in
``hashes.json``) and is pinned only once the file converted (:meth:`HashStore.pin`).

A conversion that fails marks the unconfirmed files of that download as failed
(:func:`mark_failed`): the next run does not reuse such a file but fetches it again
(:func:`must_refetch`), so once the server sends the real file (a captive portal gone, a
truncated or gzip-encoded body fixed) the same command succeeds, with no file deleted by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rlds_cli.errors import RldsError, SourceError
from rlds_cli.net.hashes import FileRecord, HashStore

if TYPE_CHECKING:
    from rlds_cli.net.fetch import RemoteFile

#: Said after a conversion error when downloaded files were marked for a fresh download.
REFETCH_HINT = (
    "the downloaded file is not trusted until it converts: run the same command again to fetch it "
    "afresh; if it fails the same way, open the URL in a browser (a login page or a broken server?)"
)


def must_refetch(file: RemoteFile, record: FileRecord | None) -> bool:
    """Whether the finished raw file of ``file`` must be fetched again instead of reused: its
    hash is its own first download's, unconfirmed, and its conversion failed."""
    return not file.sha256 and record is not None and not record.pinned and record.convert_failed


def mark_failed(folder: Path, names: Iterable[str]) -> list[str]:
    """Mark the unconfirmed records of ``names`` in ``folder`` as failed to convert (a pinned
    hash, or one from an authority, stays as it is). Returns the names marked."""
    store = HashStore(folder)
    records = store.read()
    marked = [n for n in names if n in records and not records[n].pinned and records[n].origin == "recorded"]
    if marked:
        store.mark_failed(marked)
    return marked


@contextmanager
def confirmed_by_conversion(folder: Path, names: Iterable[str]) -> Iterator[None]:
    """Around the conversion of the downloaded files ``names`` of ``folder``: pin their hashes
    when it succeeds; when the files could not be read (a :class:`SourceError`, or an error rlds
    did not foresee), mark the unconfirmed ones for a fresh download and say so in the hint.
    Other errors (a name taken, a full disk) and an interruption say nothing about the bytes."""
    wanted = list(names)
    try:
        yield
    except RldsError as exc:
        if isinstance(exc, SourceError) and mark_failed(folder, wanted):
            exc.hint = REFETCH_HINT
        raise
    except Exception:
        mark_failed(folder, wanted)
        raise
    HashStore(folder).pin(wanted)
