"""Hugging Face Hub folders over plain HTTPS: the public tree API and ``resolve`` URLs.

No ``huggingface_hub`` dependency: the Hub's API answers
``GET {endpoint}/api/datasets/{repo}/tree/{revision}/{path}?recursive=true`` with a JSON list of
``{"type", "path", "size", "lfs": {"oid": <sha256>, "size"}}`` (paged with ``Link: <...>;
rel="next"``), and serves each file at ``{endpoint}/datasets/{repo}/resolve/{revision}/{path}``.
The endpoint is ``RLDS_HF_ENDPOINT`` (tests point it at a local server).

Why registry entries listed from the Hub (RoboSet, V-D4RL) still come this way, not through
``huggingface_hub`` (:mod:`rlds_cli.net.hub`, ``hf://`` sources): their files are then fetched by
:func:`rlds_cli.net.fetch.fetch_files` into the entry's own folder, with what that path gives and
the Hub client's does not: a ``.part`` resumed across runs (the client deletes a failed
transfer's partial file), several files at once, download progress, per-file locks, first-seen
hashes pinned only after a conversion succeeded, the remembered listing when the API is down or
offline, and the folder that ``rlds info``/``verify`` read.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from rlds_cli import settings
from rlds_cli.errors import DownloadFailedError, HostNotFoundError, HTTPStatusError, RegistryFormatError
from rlds_cli.net.fetch import RemoteFile
from rlds_cli.net.http import HttpConfig, new_session, open_url
from rlds_cli.net.layout import is_reserved
from rlds_cli.net.request_errors import describe_error, name_not_resolved
from rlds_cli.net.retry import RetryBudget, is_retryable_status, parse_retry_after

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


def quote_path(path: str) -> str:
    """URL-quote a repo path the way the Hub client does (``(`` becomes ``%28``)."""
    return urllib.parse.quote(path, safe="/")


def resolve_url(repo: str, path: str, revision: str = "main", endpoint: str | None = None) -> str:
    """The download URL of one file of a dataset repo."""
    base = endpoint or settings.hf_endpoint()
    return f"{base}/datasets/{repo}/resolve/{quote_path(revision)}/{quote_path(path)}"


def list_folder(
    repo: str,
    path: str,
    *,
    revision: str = "main",
    suffix: str = "",
    endpoint: str | None = None,
    config: HttpConfig | None = None,
) -> list[RemoteFile]:
    """The files under ``path`` of dataset repo ``repo`` (recursively), as :class:`RemoteFile`.

    Names are relative to ``path``; LFS files carry the sha256 and size the Hub reports.

    Raises:
        HTTPStatusError: The folder or repo does not exist (404) or is private (401/403).
        HostNotFoundError: The endpoint's host name does not resolve (offline; not retried).
        DownloadFailedError: The API kept failing (network errors, 429, 5xx).
        RedirectError: The API redirects in a loop or to a non-HTTP URL.
        RegistryFormatError: The folder holds no file ending in ``suffix``.
    """
    base = endpoint or settings.hf_endpoint()
    url: str | None = (
        f"{base}/api/datasets/{repo}/tree/{quote_path(revision)}/{quote_path(path)}?recursive=true"
    )
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    files: list[RemoteFile] = []
    with new_session() as session:
        while url:
            items, url = _get_page(session, url, config or HttpConfig())
            for item in items:
                remote = _to_remote(item, repo, revision, prefix, suffix, base)
                if remote is not None:
                    files.append(remote)
    if not files:
        raise RegistryFormatError(
            f"the Hugging Face folder {repo}/{path} holds no file ending in {suffix!r}",
            hint="the repository layout may have changed; check the folder on the Hub",
        )
    return sorted(files, key=lambda f: f.name)


def _to_remote(item: Any, repo: str, revision: str, prefix: str, suffix: str, base: str) -> RemoteFile | None:
    if not isinstance(item, dict) or item.get("type") != "file":
        return None
    full = str(item.get("path", ""))
    if not full.startswith(prefix) or not full.endswith(suffix):
        return None
    name = full[len(prefix) :]
    if not name or ".." in name.split("/") or name.startswith("/") or is_reserved(name):
        return None  # never let a server-provided name escape the download folder or reach .rlds/
    lfs = item.get("lfs")
    if not isinstance(lfs, dict):
        lfs = {}
    oid = str(lfs.get("oid", "")).removeprefix("sha256:").lower()
    size = lfs.get("size", item.get("size"))
    return RemoteFile(
        name=name,
        urls=(resolve_url(repo, full, revision, base),),
        size=int(size) if isinstance(size, int) else None,
        sha256=oid if _SHA256.match(oid) else None,
        hash_origin="hub",
    )


def _get_page(session: Any, url: str, config: HttpConfig) -> tuple[list[Any], str | None]:
    """One page of the tree API, with the same retry policy as file downloads."""
    import requests

    last = ""
    budget = RetryBudget(config.retries, config.base_delay)
    while True:
        retry_after = None
        try:
            resp = open_url(session, url, {}, config)
        except (requests.ConnectionError, requests.Timeout) as exc:
            if name_not_resolved(exc):  # offline: retrying a name that does not resolve only waits
                host = urllib.parse.urlsplit(url).hostname or url
                raise HostNotFoundError(
                    f"listing {url}: cannot resolve the host name {host!r} ({describe_error(exc)})"
                ) from None
            last = describe_error(exc)
        else:
            with resp:
                if resp.status_code == 200:
                    m = _NEXT.search(resp.headers.get("Link", ""))
                    try:
                        return list(resp.json()), (m.group(1) if m else None)
                    except (ValueError, requests.RequestException):
                        last = "the answer is not a JSON list"
                elif is_retryable_status(resp.status_code):
                    last = f"HTTP {resp.status_code}"
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                else:
                    raise HTTPStatusError(
                        f"listing {url} answered HTTP {resp.status_code} {resp.reason or ''}".strip(),
                        url=url,
                        status=resp.status_code,
                    )
        delay = budget.next_delay(retry_after)
        if delay is None:
            raise DownloadFailedError(f"listing {url} failed {budget.failures} times; last error: {last}")
        config.sleep(delay)
