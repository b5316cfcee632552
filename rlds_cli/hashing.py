"""File hashing: the one copy is :func:`rlds_cli._io.sha256_file`; this name stays for its
importers (``convert.py``, ``preprocess/fnref.py``) until they import it from there."""

from __future__ import annotations

from rlds_cli._io import sha256_file as sha256_file

__all__ = ["sha256_file"]
