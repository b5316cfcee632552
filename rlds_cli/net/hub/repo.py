"""Naming a Hub dataset repo and listing its files at one commit.

``hf://datasets/ORG/REPO[/PATH][@REVISION]`` is parsed by :func:`parse_hf_url`; :func:`resolve`
asks the Hub (``HfApi.dataset_info``, ``HfApi.list_repo_tree``; 429s waited out per
``Retry-After``) for the commit sha the revision points at and the files below ``PATH`` there.
The token is the client's (``HF_TOKEN`` or its token file); no message built here holds it:
errors name the repo, the revision and the status.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlds_cli.errors import (
    ChecksumMismatchError,
    DownloadFailedError,
    HostNotFoundError,
    HTTPStatusError,
    RldsError,
    SettingError,
    UnsupportedSourceError,
    import_extra,
)
from rlds_cli.net.http import HttpConfig, RetryBudget, name_not_resolved, parse_retry_after
from rlds_cli.net.layout import is_reserved

T = TypeVar("T")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_OID = re.compile(r"^[0-9a-f]{40}$")
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PREFIX = "hf://"


@dataclass(frozen=True)
class HubPath:
    """A dataset repo, a folder inside it and a revision (branch, tag or commit sha)."""

    repo: str
    path: str = ""
    revision: str = "main"

    def __str__(self) -> str:
        tail = f"/{self.path}" if self.path else ""
        return f"hf://datasets/{self.repo}{tail}@{self.revision}"


@dataclass(frozen=True)
class HubFile:
    """One file of a repo at a commit. ``sha256``: what the Hub publishes for an LFS (or Xet)
    file, ``None`` for a small git file; ``git_oid``: a small git file's blob id, if listed."""

    path: str
    size: int
    sha256: str | None
    git_oid: str | None = None


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (what the Hub lists as a small file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_hf_url(source: str) -> bool:
    """Whether ``source`` names something on the Hub (``hf://...``)."""
    return source.startswith(PREFIX)


def parse_hf_url(source: str) -> HubPath:
    """``hf://datasets/ORG/REPO[/PATH][@REVISION]`` -> :class:`HubPath`.

    Raises:
        UnsupportedSourceError: Not a dataset repo URL of that shape.
    """
    rest = source[len(PREFIX) :] if is_hf_url(source) else source
    revision = "main"
    if "@" in rest:
        rest, revision = rest.rsplit("@", 1)
    parts = [p for p in rest.split("/") if p]
    if len(parts) < 3 or parts[0] != "datasets" or not revision:
        raise UnsupportedSourceError(
            f"cannot read {source!r}: rlds fetches Hub dataset repos named "
            "hf://datasets/ORG/REPO[/PATH][@REVISION]",
            hint="models and spaces are not datasets; name the dataset repo, e.g. hf://datasets/lerobot/pusht",
        )
    org, name, sub = parts[1], parts[2], parts[3:]
    if not (_REPO_PART.match(org) and _REPO_PART.match(name)) or ".." in sub or ".." in revision.split("/"):
        raise UnsupportedSourceError(f"cannot read {source!r}: {org}/{name} is not a valid repo id")
    return HubPath(f"{org}/{name}", "/".join(sub), revision)


def endpoint() -> str:
    """The Hub's base URL, read at each call (the client reads ``HF_ENDPOINT`` once, at import):
    ``RLDS_HF_ENDPOINT``, else ``HF_ENDPOINT``, else https://huggingface.co."""
    return (
        os.environ.get("RLDS_HF_ENDPOINT", "").rstrip("/")
        or os.environ.get("HF_ENDPOINT", "").rstrip("/")
        or "https://huggingface.co"
    )


#: The hint for a Hub that cannot be reached, shared by every command that talks to it.
UNREACHABLE_HINT = (
    "check the network, then run the same command again; a Hub at another address (a mirror, a "
    "local server) is set with RLDS_HF_ENDPOINT (else HF_ENDPOINT)"
)


def unreachable_message(what: str, exc: BaseException) -> str:
    """The error line for a Hub that cannot be reached (download, push, pull, export, remote
    reads): ``cannot reach the Hub at ENDPOINT for WHAT: CAUSE``, the cause in words (name not
    resolved, refused, timed out) else the client error's class name; never the client's text
    (it may quote request headers)."""
    if name_not_resolved(exc):
        host = urllib.parse.urlsplit(endpoint()).hostname or endpoint()
        cause = f"cannot resolve the host name {host!r}"
    elif in_chain(exc, lambda e: isinstance(e, ConnectionRefusedError)) is not None:
        cause = "the connection was refused"
    elif in_chain(exc, lambda e: isinstance(e, TimeoutError) or "Timeout" in type(e).__name__) is not None:
        cause = "the connection timed out"
    else:
        cause = type(exc).__name__
    return f"cannot reach the Hub at {endpoint()} for {what}: {cause}"


def hf_api() -> Any:
    """A ``huggingface_hub.HfApi`` on :func:`endpoint` (its token: ``HF_TOKEN`` or the client's
    token file)."""
    hub = import_extra(
        "huggingface_hub",
        "reading Hub repos (hf:// sources, and registry ids whose files are listed from the Hub)",
        hint="pip install huggingface_hub (a dependency of rlds-cli: the install is incomplete)",
    )
    check_token()
    return hub.HfApi(endpoint=endpoint())


def resolve(where: HubPath) -> tuple[str, list[HubFile]]:
    """The commit sha ``where.revision`` points at, and the files below ``where.path`` there.

    Raises:
        HTTPStatusError: No such repo, revision or folder (404), or a gated/private repo without
            a token that may read it (401/403).
        DownloadFailedError: The Hub kept failing (network errors, 429 and 5xx after retries).
    """
    api = hf_api()
    with translated(where):
        info = with_rate_limit(lambda: api.dataset_info(where.repo, revision=where.revision))
        sha = str(info.sha or "")
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise DownloadFailedError(f"the Hub gave no commit sha for {where}")
        entries = api.list_repo_tree(
            where.repo, path_in_repo=where.path or None, recursive=True, revision=sha, repo_type="dataset"
        )
        files = [f for e in entries if (f := _to_file(e)) is not None]
    if not files:
        raise HTTPStatusError(
            f"{where} holds no files", hint="check the folder and the revision on the Hub", status=404
        )
    return sha, sorted(files, key=lambda f: f.path)


def with_rate_limit(call: Callable[[], T], config: HttpConfig | None = None) -> T:
    """``call()``, retried after each 429 once its ``Retry-After`` (or rlds's back-off) has passed,
    within rlds's retry budget. For the revision lookup, which the client sends as one plain GET
    (it retries listings and downloads itself)."""
    from huggingface_hub import errors as hf_errors

    config = config or HttpConfig()
    budget = RetryBudget(config.retries, config.base_delay)
    while True:
        try:
            return call()
        except hf_errors.HfHubHTTPError as exc:
            resp = getattr(exc, "response", None)
            if resp is None or resp.status_code != 429:
                raise
            delay = budget.next_delay(parse_retry_after(resp.headers.get("Retry-After")))
            if delay is None:
                raise
            config.sleep(delay)


def _to_file(entry: Any) -> HubFile | None:
    lfs = getattr(entry, "lfs", None)
    sha = getattr(lfs, "sha256", None) if lfs is not None else None
    # an LFS file's blob id is its pointer's: only a small file's is the id of its bytes
    oid = getattr(entry, "blob_id", None) if lfs is None else None
    return hub_file(getattr(entry, "path", None), getattr(entry, "size", None), sha, oid)


def hub_file(path: Any, size: Any, sha256: Any, git_oid: Any = None) -> HubFile | None:
    """A :class:`HubFile` of a listing's entry (the Hub's answer or a kept listing); ``None`` for a
    folder or a name that would escape the download folder or reach ``.rlds/``."""
    if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None  # a folder
    if path.startswith("/") or ".." in path.split("/") or is_reserved(path):
        return None
    sha = str(sha256).lower() if sha256 else None
    oid = str(git_oid).lower() if git_oid else None
    return HubFile(
        path,
        size,
        sha if sha and _SHA256.match(sha) else None,
        oid if oid and _GIT_OID.match(oid) and not sha else None,
    )


def check_token() -> None:
    """Refuse a token the client could not send (not printable ASCII) with a
    :class:`~rlds_cli.errors.SettingError` naming its source, never the token."""
    try:
        from huggingface_hub import get_token
    except ImportError:  # pragma: no cover - hf_api says so
        return
    token = get_token()
    if token and not (token.isascii() and token.isprintable()):
        raise SettingError(
            "the Hub token (HF_TOKEN, else the token file of `hf auth login`) holds characters a "
            "token never has (not printable ASCII)",
            hint="set HF_TOKEN to the token the Hub gave you, or unset it",
        )


def in_chain(exc: BaseException, test: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception of ``exc``'s chain of causes that passes ``test``, or ``None``."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; a cycle must not loop
        if seen is None:
            return None
        if test(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def http_error(exc: BaseException) -> BaseException | None:
    """The client's HTTP error (it holds the response) in ``exc``'s chain of causes: the client
    wraps a 404 of a file's HEAD in ``LocalEntryNotFoundError``, ``HfFileSystem`` a refusal in
    an ``OSError``, the uploader in a ``RuntimeError``."""
    return in_chain(exc, lambda e: getattr(e, "response", None) is not None and is_client_error(e))


def is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from huggingface_hub or the HTTP library under it."""
    return any(c.__module__.startswith(("huggingface_hub", "httpx", "httpcore")) for c in type(exc).__mro__)


class translated:
    """Turn the client's exceptions into rlds errors whose text rlds wrote (the client's own
    messages may quote server text; none of ours holds a token)."""

    def __init__(self, where: HubPath, file: str = "") -> None:
        self.where = where
        self.file = file

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is None or isinstance(exc, RldsError):
            return
        from huggingface_hub import errors as hf_errors

        what = f"{self.where}" + (f" file {self.file!r}" if self.file else "")
        http = http_error(exc)
        if http is not None:
            status = int(http.response.status_code)  # type: ignore[attr-defined]
            if status in (401, 403):
                raise HTTPStatusError(
                    f"the Hub refused {what} (HTTP {status}): the repo is gated or private",
                    hint="accept its terms on the Hub and set HF_TOKEN (or run `hf auth login`) with a "
                    "token that may read it",
                    status=status,
                ) from None
            if status == 404:
                raise HTTPStatusError(
                    f"the Hub has no {what} (HTTP 404)",
                    hint="check the repo id, the revision and the path",
                    status=404,
                ) from None
            raise DownloadFailedError(f"the Hub answered HTTP {status} for {what}") from None
        if isinstance(exc, OSError) and "consistency check failed" in str(exc).lower():
            # the client's own size check of a download (its message, matched: no class of its own)
            raise ChecksumMismatchError(
                f"{what} arrived with another size than the Hub lists",
                hint="run the same command again; if it happens again, the repo's copy is damaged",
            ) from None
        unreachable = isinstance(exc, hf_errors.LocalEntryNotFoundError | OSError) or is_client_error(exc)
        if unreachable:  # a host name that does not resolve: offline, no retry would help
            kind = HostNotFoundError if name_not_resolved(exc) else DownloadFailedError
            # this side reads: --offline can use the files already downloaded
            hint = (
                f"{UNREACHABLE_HINT}; without a network, --offline (or RLDS_OFFLINE=1) uses the "
                "files already downloaded"
            )
            raise kind(unreachable_message(what, exc), hint=hint) from None
