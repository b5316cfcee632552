"""Published datasets on object storage: :func:`rlds_cli.remote.push.push` copies a cached
dataset to any fsspec URL (``s3://bucket/prefix/NAME``, ``gcs://...``, ``file:///...``) and
:func:`rlds_cli.remote.pull.pull` brings it back into a cache.

The remote layout is the dataset's directory, file for file, plus ``rlds-files.json`` (every
file's size and sha256, and the sha256 of the manifest they belong to). ``manifest.json`` is
uploaded last and is the commit marker: a URL without it is not a dataset (or a push is still
under way). Both need the ``remote`` extra (fsspec, and s3fs for ``s3://``); nothing imports
fsspec until a transfer starts.
"""

from rlds_cli import settings
from rlds_cli.errors import OfflineError

#: fsspec protocols that stay on this machine: the only ones offline mode lets through.
LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})


def refuse_offline(url: str) -> None:
    """Raise :class:`~rlds_cli.errors.OfflineError` when offline mode is on (``RLDS_OFFLINE``)
    and ``url`` needs the network: any protocol but a local folder, ``file://`` or ``memory://``
    (each part of a chained URL, ``simplecache::s3://...``, counts)."""
    if not settings.offline():
        return
    remote = [p for p in url.split("::") if "://" in p and p.split("://", 1)[0] not in LOCAL_PROTOCOLS]
    if remote:
        raise OfflineError(
            f"{url} needs the network, and offline mode is on (RLDS_OFFLINE)",
            hint="unset RLDS_OFFLINE to reach it; file:// URLs and local folders work offline",
        )
