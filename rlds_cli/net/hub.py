"""``hf://datasets/ORG/REPO[/PATH][@REVISION]``: the read side of Hugging Face Hub dataset repos,
through ``huggingface_hub`` (endpoints, tokens, pagination, retries), with rlds's own
guarantees on top: every LFS file checked against the sha256 the Hub publishes, resumed downloads,
atomic placement inside the cache's download folder, tokens never recorded.

**Naming and listing.** :func:`parse_hf_url` parses the URL; :func:`resolve` asks the Hub
(``HfApi.dataset_info``, ``HfApi.list_repo_tree``; 429s waited out per ``Retry-After``) for the
commit sha the revision points at and the files below ``PATH`` there. The token is the client's
(``HF_TOKEN`` or its token file); no message built here holds it: errors name the repo, the
revision and the status.

**Which files a download needs**, from file names only (nothing is downloaded to decide). A
LeRobot dataset (``meta/info.json`` at the folder's root) needs ``meta/``, ``data/`` and
``videos/``. An RLDS/TFDS dataset folder (``features.json`` next to
``<name>-<split>.tfrecord-NNNNN-of-NNNNN`` shards; Open X-Embodiment and its mirrors keep one per
``<name>/<version>/``, found at any depth below the folder named; recognised by
:mod:`rlds_cli._util.tfds_layout`) needs its ``features.json``, ``dataset_info.json`` and the shards
of the split read. Any other layout needs its files except the Hub's own (``.gitattributes``) and
the dataset card; its format is then sniffed from the downloaded files like a local folder's.

**A registry entry's Hub folder** (``[dataset.listing]``: RoboSet, V-D4RL): listed at one commit;
each file becomes a :class:`~rlds_cli.net.fetch.RemoteFile` whose URL is its ``resolve`` URL at
that sha (a branch that moves meanwhile cannot mix two versions), fetched by
:func:`rlds_cli.net.fetch.fetch_files`. The listing and its commit are kept in
``.rlds/listing.json`` for offline use and for when the Hub cannot be reached.

**Fetching a repo's files.** An LFS file (the Hub lists its sha256) is a
:class:`~rlds_cli.net.fetch.RemoteFile` at its ``resolve`` URL, fetched by
:func:`rlds_cli.net.fetch.fetch_files` (resumed across runs from its ``.part``, checked against the
sha256). A small git file goes through ``huggingface_hub.hf_hub_download`` into the staging folder
``<folder>/.rlds/hub/``, is checked against its size and git blob id, and only if it verifies is
moved (one ``os.replace``) into the folder and recorded in ``hashes.json``; one that does not is
deleted and never seen by a conversion. The client's partial files are never resumed across runs;
those a killed run left are deleted by the next fetch, under the staging lock.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from rlds_cli import settings
from rlds_cli._util.io import atomic_write, sha256_file
from rlds_cli._util.locks import FileLock
from rlds_cli._util.progress import DownloadProgress
from rlds_cli._util.tfds_layout import FEATURES_FILE, INFO_FILE, is_shard_name, one_tfds_folder, shard_split
from rlds_cli.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadFailedError,
    HostNotFoundError,
    HTTPStatusError,
    OfflineError,
    RegistryFormatError,
    RldsError,
    SettingError,
    SourceFormatError,
    UnsupportedSourceError,
    import_extra,
    is_disk_full,
)
from rlds_cli.net.fetch import FetchResult, RemoteFile, fetch_files
from rlds_cli.net.http import (
    HttpConfig,
    OriginAuth,
    RetryBudget,
    name_not_resolved,
    origin_of,
    parse_retry_after,
)
from rlds_cli.net.layout import FileRecord, HashStore, is_reserved, listing_path, meta_dir, stored_listing

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
    if not (_REPO_PART.match(org) and _REPO_PART.match(name)):
        raise UnsupportedSourceError(f"cannot read {source!r}: {org}/{name} is not a valid repo id")
    if ".." in sub or ".." in revision.split("/"):
        where = "its path inside the repo" if ".." in sub else "its revision"
        raise UnsupportedSourceError(
            f"cannot read {source!r}: {where} holds '..' (a path may not leave {org}/{name})",
            hint="name the folder from the repo's root: hf://datasets/ORG/REPO/PATH",
        )
    return HubPath(f"{org}/{name}", "/".join(sub), revision)


def endpoint() -> str:
    """The Hub's base URL, read at each call (the client reads ``HF_ENDPOINT`` once, at import):
    :func:`rlds_cli.settings.hf_endpoint`."""
    return settings.hf_endpoint()


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


def hub_refusal(what: str, status: int) -> HTTPStatusError | None:
    """The error of the Hub refusing ``what`` with HTTP ``status``, whoever asked (its client or
    rlds's downloader): a gated or private repo (401, 403), or nothing there (404); ``None`` for
    any other status."""
    if status in (401, 403):
        return HTTPStatusError(
            f"the Hub refused {what} (HTTP {status}): the repo is gated or private",
            hint="accept its terms on the Hub and set HF_TOKEN (or run `hf auth login`) with a token that "
            "may read it",
            status=status,
        )
    if status == 404:
        return HTTPStatusError(
            f"the Hub has no {what} (HTTP 404)",
            hint="check the repo id, the revision and the path",
            status=404,
        )
    return None


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
            refused = hub_refusal(what, status)
            if refused is not None:
                raise refused from None
            raise DownloadFailedError(f"the Hub answered HTTP {status} for {what}") from None
        if isinstance(exc, OSError) and "consistency check failed" in str(exc).lower():
            # the client's own size check of a download (its message, matched: no class of its own)
            raise ChecksumMismatchError(
                f"{what} arrived with another size than the Hub lists",
                hint="run the same command again; if it happens again, the repo's copy is damaged",
            ) from None
        if in_chain(exc, is_disk_full) is not None:  # the client's write failed: not the network
            raise DiskFullError(f"no space left on the disk for {what}: the download stopped") from None
        unreachable = isinstance(exc, hf_errors.LocalEntryNotFoundError | OSError) or is_client_error(exc)
        if unreachable:  # a host name that does not resolve: offline, no retry would help
            kind = HostNotFoundError if name_not_resolved(exc) else DownloadFailedError
            # this side reads: --offline can use the files already downloaded
            hint = (
                f"{UNREACHABLE_HINT}; without a network, --offline (or RLDS_OFFLINE=1) uses the "
                "files already downloaded"
            )
            raise kind(unreachable_message(what, exc), hint=hint) from None


#: Files a repo carries for the Hub, never for a reader: its git attributes and its dataset card
#: (the card's name is split in two so that it is not read as a docs pointer).
_HUB_FILES = {".gitattributes", "README" + ".md", "readme" + ".md"}


#: The folders of a LeRobot dataset that its reader reads.
_LEROBOT_DIRS = ("meta/", "data/", "videos/")


#: The metadata files of a TFDS dataset folder that the rlds reader reads.
_TFDS_META = (FEATURES_FILE, INFO_FILE)


def layout_format(where: HubPath, files: list[HubFile]) -> str | None:
    """The format the repo layout shows, when the files alone tell (else ``None``: sniffed later).

    Raises:
        SourceFormatError: The folder holds several RLDS/TFDS dataset folders (name one).
    """
    names = {local_name(where, f) for f in files}
    if "meta/info.json" in names:
        return "lerobot"
    return "rlds" if _tfds_folder(where, names) is not None else None


def dataset_folder(where: HubPath, files: list[HubFile], fmt: str | None) -> str:
    """The folder, relative to ``where.path``, that the reader of ``fmt`` is given: an RLDS
    dataset's TFDS folder (``name/version``, ``""`` when it is the folder named), else ``""``.

    Raises:
        SourceFormatError: The folder holds several RLDS/TFDS dataset folders (name one).
    """
    if fmt != "rlds":
        return ""
    return _tfds_folder(where, {local_name(where, f) for f in files}) or ""


def needed_files(
    where: HubPath, files: list[HubFile], fmt: str | None, options: dict[str, Any] | None = None
) -> list[HubFile]:
    """The files of ``files`` that a conversion in format ``fmt`` (with reader ``options``) reads."""
    if fmt == "lerobot":
        return [f for f in files if local_name(where, f).startswith(_LEROBOT_DIRS)]
    if fmt == "rlds" and _tfds_folder(where, {local_name(where, f) for f in files}) is not None:
        return _tfds_files(where, files, (options or {}).get("split"))
    return [f for f in files if local_name(where, f).rsplit("/", 1)[-1] not in _HUB_FILES]


def _split_dir(name: str) -> tuple[str, str]:
    folder, _, base = name.rpartition("/")
    return folder, base


def _tfds_folder(where: HubPath, names: set[str]) -> str | None:
    """The TFDS dataset folder among ``names`` (``""``: the folder named), ``None`` if none;
    several are refused (the user names one)."""
    base = f"hf://datasets/{where.repo}/" + (where.path.strip("/") + "/" if where.path.strip("/") else "")
    return one_tfds_folder(names, str(where), base)


def _tfds_files(where: HubPath, files: list[HubFile], split: object) -> list[HubFile]:
    """The TFDS folder's metadata and the shards of the split the reader reads: ``split`` when
    given, else ``train`` when present (the reader's default), else the only split.

    Raises:
        SourceFormatError: No shards of the split asked for, or several splits, none ``train``
            and none asked for (before anything is fetched).
    """
    root = _tfds_folder(where, {local_name(where, f) for f in files})
    mine = [(f, base) for f in files for d, base in [_split_dir(local_name(where, f))] if d == root]
    splits = sorted({shard_split(base) for _, base in mine if is_shard_name(base)})
    if isinstance(split, str) and split not in splits:
        raise SourceFormatError(
            f"{where}: {root or 'the folder'} has no shards of split {split!r} "
            f"(splits: {', '.join(map(repr, splits))})"
        )
    if not isinstance(split, str) and "train" not in splits and len(splits) > 1:
        raise SourceFormatError(
            f"{where}: {root or 'the folder'} holds the splits {', '.join(map(repr, splits))} "
            "and none is 'train'",
            hint=f"pick one: rlds download {where} --option split=NAME",
        )
    chosen = split if isinstance(split, str) else "train" if "train" in splits else None
    return [
        f for f, base in mine
        if base in _TFDS_META or (is_shard_name(base) and chosen in (None, shard_split(base)))
    ]  # fmt: skip


@dataclass(frozen=True)
class FolderListing:
    """The files of a Hub folder at one commit.

    Attributes:
        where: The repo, the folder and the revision asked for.
        commit: The commit sha the files' URLs name (``None`` for a stored listing without one:
            its URLs name the branch).
        files: The files, named relative to the folder, sorted.
    """

    where: HubPath
    commit: str | None
    files: list[RemoteFile]

    def provenance(self) -> dict[str, Any]:
        """The source record: ``url`` (``hf://...@<sha>``) and ``hub`` (repo, path, revision asked
        for, commit), as ``hf://`` downloads record them; ``{}`` without a commit."""
        if self.commit is None:
            return {}
        w = self.where
        tail = f"/{w.path}" if w.path else ""
        return {
            "url": f"hf://datasets/{w.repo}{tail}@{self.commit}",
            "hub": {"repo": w.repo, "path": w.path, "revision": w.revision, "commit": self.commit},
        }


def list_folder(repo: str, path: str, *, revision: str = "main", suffix: str = "") -> FolderListing:
    """The files under ``path`` of dataset repo ``repo`` whose names end in ``suffix``, at the
    commit ``revision`` points at now; LFS files carry the sha256 and size the Hub publishes.

    Raises:
        HTTPStatusError: No such repo, revision or folder (404), or a gated/private repo without
            a token that may read it (401/403).
        DownloadFailedError: The Hub kept failing or cannot be reached.
        RegistryFormatError: The folder holds no file ending in ``suffix``.
        MissingExtraError: huggingface_hub is not installed.
    """
    where = HubPath(repo, path.strip("/"), revision)
    sha, listed = resolve(where)
    files = []
    for f in listed:
        name = local_name(where, f)
        if name.endswith(suffix) and not is_reserved(name):  # never a name in the bookkeeping folder
            files.append(remote_file(where, sha, f))
    if not files:
        raise RegistryFormatError(
            f"the Hugging Face folder {repo}/{where.path} holds no file ending in {suffix!r}",
            hint="the repository layout may have changed; check the folder on the Hub",
        )
    return FolderListing(where, sha, sorted(files, key=lambda f: f.name))


def save_listing(folder: Path, listing: FolderListing) -> None:
    """Remember ``listing`` in ``folder``'s ``.rlds/listing.json``."""
    w = listing.where
    data = {
        "repo": w.repo,
        "path": w.path,
        "revision": w.revision,
        "commit": listing.commit,
        "files": [{**f.__dict__, "urls": list(f.urls)} for f in listing.files],
    }
    path = listing_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def read_listing(folder: Path, where: HubPath) -> FolderListing | None:
    """The listing kept in ``folder`` (``None`` if none); a stored plain JSON list of files has
    no commit.

    Raises:
        OfflineError: The kept listing cannot be read (its files are named by it alone).
    """
    known = stored_listing(folder)
    if known is None:
        return None
    try:
        data = json.loads(known.read_text(encoding="utf-8"))
        items, commit = (data, None) if isinstance(data, list) else (data["files"], data.get("commit"))
        files = [RemoteFile(**{**f, "urls": tuple(f["urls"])}) for f in items]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OfflineError(
            f"{known}: the file list kept by an earlier download is damaged ({type(exc).__name__})",
            hint="download it online again (without --offline): the Hub lists the files afresh",
        ) from None
    return FolderListing(where, commit, files)


def token_auth() -> OriginAuth | None:
    """The token the Hub client would send (``HF_TOKEN``, else its token file; none when
    ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set), bound to the Hub's origin, for rlds' own file
    requests; ``None`` without a token or without huggingface_hub."""
    try:
        from huggingface_hub.utils import build_hf_headers
    except ImportError:
        return None
    check_token()
    header = build_hf_headers().get("authorization")
    return OriginAuth(origin_of(endpoint()), header) if header else None


#: Staging folder of the client's downloads, inside the download folder's bookkeeping.
STAGING = "hub"


def file_url(where: HubPath, sha: str, path: str) -> str:
    """The ``resolve`` URL of one file at a commit (what provenance records; never a token)."""
    return f"{endpoint()}/datasets/{where.repo}/resolve/{sha}/{quote(path, safe='/')}"


def local_name(where: HubPath, file: HubFile) -> str:
    """A repo file's name in the download folder: its path below ``where.path``."""
    prefix = where.path.strip("/") + "/" if where.path.strip("/") else ""
    return file.path[len(prefix) :] if file.path.startswith(prefix) else file.path


def remote_file(where: HubPath, sha: str, file: HubFile) -> RemoteFile:
    """``file`` at commit ``sha`` as rlds's downloader fetches it: its ``resolve`` URL, named by its
    path below ``where.path``, verified against the size and sha256 the Hub lists."""
    url = file_url(where, sha, file.path)
    return RemoteFile(local_name(where, file), (url,), file.size, file.sha256, "hub")


def fetch_hub_files(
    where: HubPath,
    sha: str,
    files: list[HubFile],
    folder: Path,
    *,
    force: bool = False,
    offline: bool = False,
    progress: DownloadProgress | None = None,
) -> list[FetchResult]:
    """Make every file of ``files`` (at commit ``sha``) present and verified under ``folder``, in
    the order given. LFS files (the Hub lists their sha256) are fetched by
    :func:`rlds_cli.net.fetch.fetch_files` from their ``resolve`` URL (several at once, with
    ``progress``; a cut transfer keeps its ``.part`` and the next run resumes it); small git files
    by the Hub client, checked against their blob id.

    Raises:
        ChecksumMismatchError: The bytes served do not match the Hub's sha256 (or size).
        OfflineError: Offline, and a file is missing.
        HTTPStatusError: A gated/private repo without a token that may read it, or a missing file.
        DownloadFailedError: The Hub kept failing.
    """
    folder.mkdir(parents=True, exist_ok=True)
    lfs = [f for f in files if f.sha256 is not None]
    fetched = {}
    if lfs:
        fetched = {r.name: r for r in _fetch_lfs(where, sha, lfs, folder, force, offline, progress)}
    git = [f for f in files if f.sha256 is None]
    if git:
        staging = meta_dir(folder) / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        # one fetch at a time per staging folder: a waiting one then finds the files verified, and
        # any partial file found now is a killed run's
        with FileLock(staging.with_name(f"{STAGING}.lock")):
            _remove_partials(staging)
            fetched.update((r.name, r) for r in _fetch_git(where, sha, git, folder, staging, force, offline))
    return [fetched[local_name(where, f)] for f in files]


def _fetch_lfs(
    where: HubPath,
    sha: str,
    files: list[HubFile],
    folder: Path,
    force: bool,
    offline: bool,
    progress: DownloadProgress | None,
) -> list[FetchResult]:
    """``files`` (LFS files) fetched from their ``resolve`` URLs, the Hub's refusals said as the
    client's are."""
    remote = [remote_file(where, sha, f) for f in files]
    config = HttpConfig(auth=None if offline else token_auth())
    try:
        return fetch_files(remote, folder, force=force, offline=offline, progress=progress, config=config)
    except HTTPStatusError as exc:
        named = next((f.path for f in files if exc.url.endswith(quote(f.path, safe="/"))), "")
        refused = hub_refusal(f"{where}" + (f" file {named!r}" if named else ""), exc.status)
        if refused is not None:
            raise refused from None
        raise


def _remove_partials(staging: Path) -> None:
    """Delete the client's partial files (``*.incomplete``, named anew per transfer, so never
    resumed) that a killed fetch left in ``staging``."""
    for path in staging.rglob("*.incomplete"):
        path.unlink(missing_ok=True)


def _fetch_git(
    where: HubPath, sha: str, files: list[HubFile], folder: Path, staging: Path, force: bool, offline: bool
) -> list[FetchResult]:
    """``files`` (small git files, no sha256 listed) fetched by the Hub's client, checked against
    their size and blob id, recorded with the sha256 of the bytes that verified."""
    store = HashStore(folder)
    results: list[FetchResult] = []
    for file in files:
        name = local_name(where, file)
        target = folder / name
        url = file_url(where, sha, file.path)
        record = None if force else _verified(store, name, target, file)
        if record is not None:
            results.append(
                FetchResult(name, target, record.sha256, record.size, url, "cached", record.origin)
            )
            continue
        if offline:
            if target.is_file() and not force and store.get(name) is not None:  # recorded, not these bytes
                raise OfflineError(
                    f"{where} file {file.path!r}: the copy at {target} does not match its expected "
                    "size or sha256, and offline mode is on",
                    hint="download it online again (without --offline)",
                )
            raise OfflineError(f"{where} file {file.path!r} is not downloaded yet and offline mode is on")
        got = _download(where, sha, file, staging)
        digest = _check(where, file, got)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, target)  # only verified bytes reach the folder a conversion reads
        store.put(
            name,
            FileRecord(
                digest, file.size, "recorded", url, target.stat().st_mtime_ns,
                datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), pinned=False,
            ),
        )  # fmt: skip
        results.append(FetchResult(name, target, digest, file.size, url, "downloaded", "recorded"))
    return results


def _verified(store: HashStore, name: str, target: Path, file: HubFile) -> FileRecord | None:
    """The record of a copy already there, if it matches ``file``: unchanged since it verified, or
    touched since (its mtime alone: a copy, a backup restore) and hashed again to the same bytes."""
    record = store.get(name)
    if record is None or not target.is_file():
        return None
    stat = target.stat()
    if stat.st_size != file.size:
        return None
    if stat.st_mtime_ns != record.mtime_ns:
        if sha256_file(target) != record.sha256:
            return None
        record = replace(record, mtime_ns=stat.st_mtime_ns)
        store.put(name, record)
    return record


def _download(where: HubPath, sha: str, file: HubFile, staging: Path) -> Path:
    from huggingface_hub import hf_hub_download

    with translated(where, file.path):
        got = hf_hub_download(
            where.repo, file.path, repo_type="dataset", revision=sha, local_dir=staging, endpoint=endpoint()
        )
    path = Path(got)
    if not path.is_file():
        raise DownloadFailedError(f"the Hub client gave no file for {where} file {file.path!r}")
    return path


def _check(where: HubPath, file: HubFile, got: Path) -> str:
    """The sha256 of ``got``, after checking it against what the Hub lists (deleting it if not)."""
    size = got.stat().st_size
    digest = sha256_file(got)
    problem = ""
    if size != file.size:
        problem = f"{size} bytes, the Hub lists {file.size}"
    elif file.git_oid is not None and (oid := git_blob_id(got.read_bytes())) != file.git_oid:
        problem = f"git blob {oid}, the Hub lists {file.git_oid}"  # a small file, kept in git
    if problem:
        got.unlink(missing_ok=True)  # the next run downloads it again instead of trusting it
        raise ChecksumMismatchError(
            f"{where} file {file.path!r} arrived as {problem}; nothing was converted",
            hint="run the same command again (a transfer error); if it persists, the repo's file is corrupt",
        )
    return digest
