"""Hub dataset repos as a store for ``rlds push``/``pull`` and remote reads.

:func:`open_hub` gives the ``HfFileSystem`` (huggingface_hub's fsspec filesystem) and the path of
``hf://datasets/ORG/REPO[/PATH][@REVISION]`` with the revision resolved to a commit sha first:
every read after that (manifest, files index, data files, byte ranges) is of that one commit, so
a push landing mid-pull or mid-read cannot mix two versions. :func:`access_error` turns what the
client raises into one line naming the repo and the HTTP status, never the token (the client's
own messages may quote request headers or server text).
"""

from __future__ import annotations

from typing import Any

from rlds_cli.errors import RemoteAccessError, RldsError
from rlds_cli.net.hub.repo import (
    UNREACHABLE_HINT,
    HubPath,
    check_token,
    endpoint,
    hf_api,
    http_error,
    in_chain,
    is_client_error,
    parse_hf_url,
    unreachable_message,
    with_rate_limit,
)
from rlds_cli.remote import refuse_offline

_READ_HINT = (
    "accept the repo's terms on the Hub and set HF_TOKEN (or run `hf auth login`) with a token that may "
    "read it"
)
_WRITE_HINT = "set HF_TOKEN (or run `hf auth login`) with a token that may write to the repo"


def repo_path(where: HubPath, revision: str) -> str:
    """The ``HfFileSystem`` path of ``where``'s folder at ``revision`` (a sha, or a quoted ref)."""
    from urllib.parse import quote

    tail = f"/{where.path}" if where.path else ""
    return f"datasets/{where.repo}@{quote(revision, safe='')}{tail}"


def head_commit(where: HubPath, *, write: bool = False) -> str:
    """The commit sha ``where.revision`` points at now.

    Raises:
        OfflineError: Offline mode is on (``RLDS_OFFLINE``): every Hub call starts here.
        RemoteAccessError: No such repo or revision, no token that may read (or write) it, the
            Hub unreachable.
    """
    refuse_offline(str(where))
    api = hf_api()
    with translated(str(where), write=write):
        info = with_rate_limit(lambda: api.dataset_info(where.repo, revision=where.revision))
    sha = str(getattr(info, "sha", "") or "")
    if len(sha) != 40:
        raise RemoteAccessError(f"the Hub gave no commit sha for {where}")
    return sha


def open_hub(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """``HfFileSystem`` and the path of ``url``'s folder at the commit its revision points at now.

    Raises:
        UnsupportedSourceError: ``url`` is not ``hf://datasets/ORG/REPO[/PATH][@REVISION]``.
        RemoteAccessError: See :func:`head_commit`.
    """
    where = parse_hf_url(url)
    sha = head_commit(where)
    fs = hub_filesystem(storage_options)
    fs.invalidate_cache()
    return fs, repo_path(where, sha)


def hub_filesystem(storage_options: dict[str, Any] | None = None, *, fresh: bool = False) -> Any:
    """An ``HfFileSystem`` on this process's endpoint.

    ``fresh``: a new instance, not the one huggingface_hub's instance cache holds. That cache
    does not key on the process id (unlike fsspec's own), so a forked DataLoader worker would be
    handed the parent's instance with its listings; a worker asks for a fresh one (its HTTP client
    is huggingface_hub's shared one, which the client itself closes in a forked child).
    """
    from huggingface_hub import HfFileSystem

    check_token()
    options = {"endpoint": endpoint(), **(storage_options or {})}
    if fresh:
        options["skip_instance_cache"] = True
    return HfFileSystem(**options)


def access_error(url: str, exc: BaseException, *, write: bool = False) -> RldsError:
    """One line for what the Hub (or the way to it) answered; the client's text is never quoted."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    verb = "write to" if write else "read"
    if status in (401, 403):
        what = "no token, or one without write access" if write else "the repo is gated or private"
        return RemoteAccessError(
            f"the Hub refused to {verb} {url} (HTTP {status}): {what}",
            hint=_WRITE_HINT if write else _READ_HINT,
        )
    if status == 404:
        hint = (
            "check the repo id, the branch and the path (a private repo looks missing without a token "
            "that may read it: set HF_TOKEN)"
        )
        if write:
            hint += "; rlds does not create repos: hf repo create ORG/REPO --repo-type dataset"
        return RemoteAccessError(f"the Hub has no {url} (HTTP 404)", hint=hint)
    if status in (409, 412):
        return RemoteAccessError(
            f"{url} changed during the push (another commit landed first, HTTP {status}); nothing was "
            "committed",
            hint="run the push again",
        )
    if status is not None:
        again = "run the same command again later"
        return RemoteAccessError(
            f"the Hub answered HTTP {status} to {url}",
            hint=f"{again} (files already uploaded are not sent twice)" if write else again,
        )
    return RemoteAccessError(unreachable_message(url, exc), hint=UNREACHABLE_HINT)


class translated:
    """Turn the client's exceptions (and those of the HTTP library under it) into
    :func:`access_error`'s line; rlds's own errors pass."""

    def __init__(self, url: str, *, write: bool = False) -> None:
        self.url = url
        self.write = write

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is None or isinstance(exc, RldsError):
            return
        hub = hub_cause(exc)
        if hub is not None:
            raise access_error(self.url, hub, write=self.write) from None


def hub_cause(exc: BaseException) -> BaseException | None:
    """The client's exception in ``exc``'s chain of causes (``HfFileSystem`` wraps a refusal in an
    ``OSError``, the uploader in a ``RuntimeError``; the client's own holds the HTTP status), or
    ``None`` when the client raised none of them."""
    return http_error(exc) or in_chain(exc, is_client_error)
