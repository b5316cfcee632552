"""Fetching remote files: resumable, retried, verified HTTP downloads, and Hub repos (``net/hub.py``).

``requests`` is imported inside functions only, so ``rlds --help`` stays fast. Nothing here
prints: progress goes to a :data:`DownloadProgress` callback.
"""

from __future__ import annotations

from rlds_cli._util.progress import DownloadProgress
from rlds_cli.net.fetch import FetchResult, RemoteFile, fetch_files

__all__ = ["DownloadProgress", "FetchResult", "RemoteFile", "fetch_files"]
