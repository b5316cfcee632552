"""One tree of errors for the whole library.

Every error derives from :class:`RldsError` and also from the builtin that fits it
(``FileNotFoundError``, ``ValueError``, ...), so callers can catch either. Each carries
a one-line message that names the file, id or key involved, and a ``hint`` that says
what to do. The CLI turns them into one red line plus the hint and exit code 1.
"""

from __future__ import annotations

from typing import Any


class RldsError(Exception):
    """Base class of every error raised on purpose by rlds.

    Args:
        message: One line saying what went wrong, naming the file/id/key.
        hint: One line saying what the user can do about it.
    """

    default_hint = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return self.message

    @property
    def hint(self) -> str:
        """What the user can do (the CLI prints it under the message)."""
        return self._hint

    @hint.setter
    def hint(self, value: str) -> None:
        # also a note, which a traceback prints under the message: a library user sees it too
        self._hint = value
        notes = [n for n in getattr(self, "__notes__", []) if not n.startswith("hint: ")]
        self.__notes__ = [*notes, f"hint: {value}"] if value else notes


class SettingError(RldsError, ValueError):
    """An ``RLDS_*`` environment variable whose value cannot be used (read by
    :mod:`rlds_cli.settings`)."""


class UnknownLicenseError(RldsError, ValueError):
    """A ``--license`` that is no SPDX identifier rlds knows (see :mod:`rlds_cli.cache.card`)."""

    default_hint = "give an SPDX id, e.g. CC-BY-4.0, MIT, Apache-2.0 or CC-BY-NC-4.0 (spdx.org/licenses)"


# --------------------------------------------------------------------------- cache


class CacheError(RldsError):
    """Something is wrong with the local cache."""


class InvalidNameError(CacheError, ValueError):
    """A dataset name that cannot be used as a cache entry."""

    default_hint = (
        "use letters, digits, '.', '_' and '-', each '/'-separated part starting with a letter or a "
        "digit, and no '--' (e.g. 'hopper-medium-v2' or 'D4RL/door/human-v2')"
    )


class DatasetNotFoundError(CacheError, FileNotFoundError):
    """No converted dataset of that name in the cache."""

    default_hint = "run 'rlds list' to see the cached datasets, or 'rlds download' to add one"


class DatasetExistsError(CacheError, FileExistsError):
    """A dataset of that name exists and overwriting was not asked for."""

    default_hint = "pass --force to replace it, or --name to pick another name"


class CorruptDatasetError(CacheError, OSError):
    """A published dataset whose files do not match its manifest."""

    default_hint = "run 'rlds verify NAME' on it: it names every damaged file and how to make it again"


class DatasetReplacedError(CacheError, OSError):
    """An open dataset was replaced (``--force`` rebuild or removal) under its reader.

    Reads never mix the files of two versions: they raise this instead.
    """

    default_hint = "the dataset was rebuilt while it was open; open it again"


class DatasetInUseError(CacheError, PermissionError):
    """Removing a dataset that other datasets were derived from, without ``force``."""

    default_hint = "remove the derived datasets first, or pass --force to remove it anyway"


class InvalidSelectionError(CacheError, ValueError):
    """An episode range or split that does not fit the dataset."""

    default_hint = "episode ranges are A:B (Python slice rules), e.g. 0:500 or -100:"


class LockTimeoutError(CacheError, TimeoutError):
    """Another process holds the lock on a dataset for too long."""

    default_hint = "another rlds process is writing this dataset; wait for it or stop it"


class DiskFullError(CacheError, OSError):
    """The disk (or quota) holding the cache is too small for what is written there: a build, a
    preprocessing output, or a download (checked before it starts, or met while it runs)."""

    default_hint = (
        "free some space ('rlds gc', 'rlds rm', 'rlds du'), or point RLDS_HOME (or --root) at a larger disk"
    )


class CacheNotWritableError(CacheError, PermissionError):
    """The cache (or a file in it) cannot be written: read-only filesystem or no permission."""

    default_hint = "use a cache you can write to: --root DIR or RLDS_HOME=DIR"


class TooManyOpenFilesError(CacheError, OSError):
    """The process reached its limit of open files (a memmap build keeps one file open per key)."""

    default_hint = (
        "raise the limit of open files (ulimit -n 8192) and run it again, or convert with "
        "--storage zarr (its writer keeps no file open per key)"
    )


class InvalidKeyError(CacheError, ValueError):
    """An array key that cannot become a file path inside a dataset (``..``, an absolute path,
    characters outside the key grammar, too long): refused before any file is opened."""

    default_hint = (
        "a key is '/'-separated parts of A-Z a-z 0-9 _ . - (not '.' or '..', at most 200 characters "
        "each); if it comes from a manifest, the dataset was tampered with: convert it again"
    )


class EpisodeFormatError(CacheError, ValueError):
    """An episode or step given to :class:`rlds_cli.DatasetWriter` that breaks the TED rules
    (wrong shape or dtype, non-bool or NaN flags, no steps, no final observation, lengths that
    differ, a key given twice): nothing of it is written."""

    default_hint = (
        "pass TED keys (observation, action, next/observation, next/reward, next/terminated, "
        "next/truncated as bool) with one row per step; nothing of this episode was written"
    )


class SchemaMismatchError(CacheError, ValueError):
    """An episode, or a writer, whose keys, shapes or dtypes differ from the growing dataset's
    schema (fixed by its first episode), or a dataset that cannot be appended to."""

    default_hint = (
        "write the same keys, shapes and dtypes as the dataset's first episode ('rlds inspect NAME'), "
        "or write to a new dataset name"
    )


class CommitFailedError(CacheError, OSError):
    """A :class:`rlds_cli.DatasetWriter` commit that failed on its thread (the disk, a
    permission): raised by the writer's next call; it says which episodes were not written."""

    default_hint = "fix the cause (disk space, permissions) and add those episodes again"


class CacheLocationError(CacheError, NotADirectoryError):
    """The cache root is not a usable directory (e.g. ``RLDS_HOME`` names a file)."""

    default_hint = "point --root or RLDS_HOME at a directory (it is created when missing)"


# --------------------------------------------------------------------------- sources


class SourceError(RldsError):
    """A source file or id cannot be converted."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The given path does not exist."""

    default_hint = "check the path, or pass a registry id ('rlds list --remote')"


class SourceNotReadableError(SourceError, PermissionError):
    """A source file exists but this user may not read it."""

    default_hint = "check the file's permissions (e.g. chmod u+r FILE), or run as a user who can read it"


class UnknownFormatError(SourceError, ValueError):
    """No reader for the requested or detected format."""


class SourceFormatError(SourceError, ValueError):
    """The file exists but is not a valid instance of its format (corrupt, truncated,
    missing keys, inconsistent lengths)."""

    default_hint = "re-download the file; if it is your own file, fix the named key"


class ChecksumMismatchError(SourceError, ValueError):
    """A file's bytes do not match the sha256 or size it should have."""

    default_hint = "re-download it ('rlds download ID --force'); if the registry is wrong, report it"


class ConversionError(SourceError, RuntimeError):
    """A reader produced data that breaks the TED rules (a bug in a reader)."""

    default_hint = "please report this with the source file; RLDS_DEBUG=1 shows the traceback"


# --------------------------------------------------------------------------- registry


class RegistryError(RldsError):
    """A registry file is malformed or an id is unknown."""


class UnknownDatasetIdError(RegistryError, KeyError):
    """The id is not in any registry file."""

    default_hint = "'rlds list --remote PATTERN' searches the registry's ids, aliases and descriptions"

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class RegistryFormatError(RegistryError, ValueError):
    """A registry file does not follow the schema."""


class UnsupportedSourceError(RegistryError, ValueError):
    """A source that this version of rlds cannot fetch (e.g. a remote URL)."""


# --------------------------------------------------------------------------- downloads


class DownloadError(RldsError):
    """A remote file could not be fetched."""


class HTTPStatusError(DownloadError, OSError):
    """A server answered with an error status that retrying will not fix (4xx other than 429).

    Attributes:
        url: The URL asked for.
        status: The HTTP status code.
    """

    default_hint = "check the URL; if a registry entry is wrong, report it (other mirrors were tried)"

    def __init__(self, message: str, hint: str | None = None, *, url: str = "", status: int = 0) -> None:
        super().__init__(message, hint)
        self.url = url
        self.status = status


class DownloadFailedError(DownloadError, ConnectionError):
    """Every mirror of a file failed after its retries (network errors, timeouts, 429, 5xx)."""

    default_hint = (
        "check your connection and run the same command again: it resumes where it stopped "
        "(RLDS_HTTP_RETRIES raises the number of retries; without a network, --offline uses the "
        "files already downloaded)"
    )


class OfflineError(DownloadError, ConnectionError):
    """Offline mode is on and a file is not in the local download folder."""

    default_hint = "run the command once without --offline (and with RLDS_OFFLINE unset) to fetch it"


class HostNotFoundError(DownloadFailedError):
    """A server's host name does not resolve (no network, no DNS, or a wrong name); not retried."""

    default_hint = (
        "check the network connection and the host name; without a network, --offline "
        "(or RLDS_OFFLINE=1) uses the files already downloaded"
    )


class DownloadTooSlowError(DownloadFailedError):
    """A transfer stayed below the minimum speed (``RLDS_HTTP_MIN_SPEED``) through every retry."""

    default_hint = (
        "run the same command again later: it resumes where it stopped; on a slow link lower "
        "RLDS_HTTP_MIN_SPEED (bytes/s, 0 turns the rule off) or raise RLDS_HTTP_SPEED_WINDOW"
    )


class RedirectError(DownloadError, ConnectionError):
    """A redirect loop, too many redirects, or a redirect to a non-HTTP URL (``file://``, ``ftp://``)."""

    default_hint = (
        "the server (or a proxy or captive portal) redirects wrongly; check the URL in a browser, "
        "or add a working mirror in your own registry file (RLDS_REGISTRY)"
    )


class ServerResponseError(DownloadError, OSError):
    """A server's answer cannot be used as it is (e.g. a ``206`` for other bytes than asked)."""

    default_hint = (
        "the server misbehaves; run the command again later, or add a working mirror in your own "
        "registry file (RLDS_REGISTRY)"
    )


# --------------------------------------------------------------------------- preprocessing


class PreprocessError(RldsError):
    """A preprocessing job (``rlds preprocess``) cannot run or stopped."""


class FunctionImportError(PreprocessError, ImportError):
    """The ``--fn`` reference does not name an importable callable (bad module, bad name, not
    callable, malformed reference)."""

    default_hint = "write it as 'package.module:function' or 'path/to/file.py:function'"


class UserFunctionError(PreprocessError, RuntimeError):
    """The user's function raised; names the function, the chunk and the step/episode range.

    Attributes:
        user_traceback: The traceback of the user's code, formatted (frames of rlds left out).
    """

    default_hint = "the traceback above is your function's; fix it and run the command again"

    def __init__(self, message: str, hint: str | None = None, *, user_traceback: str = "") -> None:
        super().__init__(message, hint)
        self.user_traceback = user_traceback


class OutputSchemaError(PreprocessError, ValueError):
    """The function's output breaks the TED rules or changes schema between chunks."""

    default_hint = "'rlds preprocess --help' says what the function must return"


class CacheNotVisibleError(PreprocessError, FileNotFoundError):
    """A Ray node cannot see the job's dataset or job directory at the coordinator's path: the
    cache is not on a filesystem shared by every node (checked before the chunk's work)."""

    default_hint = (
        "put the cache (RLDS_HOME or --root) on a shared filesystem mounted at the same path on "
        "every Ray node: the chunks read the dataset and write their results there"
    )


class WorkerLostError(PreprocessError, RuntimeError):
    """A chunk's Ray task failed for a system reason (its worker process or node died, an object
    was lost) more times than it is retried."""

    default_hint = "the finished chunks are kept: run the same command with --resume to continue"


# --------------------------------------------------------------------------- extras and export


class MissingExtraError(RldsError, ImportError):
    """An optional dependency (an extra of rlds-cli) is not installed."""


def import_extra(module: str, needed_by: str, hint: str, package: str | None = None) -> Any:
    """The module ``module`` (dotted names import their packages too), or :class:`MissingExtraError`
    "``needed_by`` needs ``package``, which is not installed" (``package``: the name to install, by
    default the module's top-level name) with ``hint``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(
            f"{needed_by} needs {package or module.split('.')[0]}, which is not installed", hint=hint
        ) from None


#: How to install gymnasium (the ``record`` extra), named in the messages of the errors that need it.
GYMNASIUM_INSTALL = "pip install 'rlds-cli[record]' (from a checkout: pip install -e '.[record]')"


class NoEnvSpecError(RldsError, LookupError):
    """A dataset records no environment (``Dataset.recover_environment()`` has nothing to make)."""

    default_hint = (
        "only datasets whose source names its environment have one (Minari's env_spec, a D4RL "
        "registry id); make the environment yourself with gymnasium.make(ID)"
    )


class EnvironmentUnavailableError(RldsError, RuntimeError):
    """The environment a dataset records cannot be made here (its id is not registered with
    gymnasium, or its spec cannot be read)."""


class NoReferenceScoresError(RldsError, LookupError):
    """No reference scores (D4RL's ``REF_MIN_SCORE``/``REF_MAX_SCORE``, Minari's
    ``ref_min_score``/``ref_max_score``) are known for a dataset."""

    default_hint = (
        "normalized scores exist only for D4RL ids with reference scores in the registry and "
        "Minari datasets whose metadata has ref_min_score and ref_max_score"
    )


class ExportError(RldsError, ValueError):
    """An export cannot be written (the target exists, or the data has no place in the format)."""

    default_hint = "pass --force to replace the target, or pick another format"


# --------------------------------------------------------------------------- remote (push, pull)


class RemoteError(RldsError):
    """A dataset cannot be pushed to, or pulled from, object storage (``rlds push``/``pull``)."""


class RemoteAccessError(RemoteError, OSError):
    """The store behind a URL cannot be used: unknown protocol, missing bucket, no credentials,
    access denied, no connection to the endpoint."""

    default_hint = "check the URL, the endpoint (--endpoint-url, AWS_ENDPOINT_URL) and the credentials"


class RemoteDatasetNotFoundError(RemoteError, FileNotFoundError):
    """A URL without ``manifest.json``: no rlds dataset, or a push to it still in progress."""

    default_hint = (
        "check the URL (the dataset's own folder, e.g. s3://bucket/prefix/NAME); if a push to it "
        "was interrupted, run that push again"
    )


class RemoteExistsError(RemoteError, FileExistsError):
    """Another version of a dataset is already at the URL a push targets."""

    default_hint = "pass --force to replace it (readers never see a mix: its manifest goes first)"


class RemoteCorruptError(RemoteError, ValueError):
    """A remote file does not match what the push recorded (size, sha256 or content digest), or
    the remote index and manifest belong to different pushes."""

    default_hint = "push the dataset again from a good copy: rlds push NAME URL --force"


class RemoteCacheFullError(RemoteError, OSError):
    """The bounded remote cache (``cache_limit``) cannot hold what one read needs: the limit is
    below one read's blocks, or other readers keep every block in use past the wait."""

    default_hint = "raise cache_limit (RLDS_REMOTE_CACHE_LIMIT) to several batches' worth of blocks"


class RemoteCacheDamagedError(RemoteError, OSError):
    """The bounded remote cache's folder cannot be used: its ledger (``blocks.db``) is damaged
    or replaced, one of its files is not what it should be, or its lock stays held."""

    default_hint = "remove the cache folder (it holds only copies: reads fetch what they need again)"


class NotPushableError(RemoteError, ValueError):
    """A dataset that cannot be pushed as it is (a view: it holds no arrays of its own)."""


# --------------------------------------------------------------------------- loader


class LoaderStateError(RldsError, ValueError):
    """A sampler or loader state (``load_state_dict``) from another dataset, rank or world size,
    or with a missing or malformed field (named in the message)."""

    default_hint = "give each rank the state it saved itself, on the same dataset"


class SeedError(RldsError, ValueError):
    """A bad seed, or ``seed=None`` where the ranks of a run cannot agree on a fresh one."""

    default_hint = "pass seed= (the same on every rank), or set RLDS_SEED"


class MixtureError(RldsError, ValueError):
    """A mixture of datasets that cannot be made: a key whose shapes or dtypes cannot be mixed
    (or padded), weights that do not fit the sources, or transforms given per source that do
    not fit them (named in the message)."""

    default_hint = "help(rlds_cli.loader.MixtureSource) lists what a mixture pads, promotes and refuses"


# --------------------------------------------------------------------------- recording


class RecordingError(RldsError, ValueError):
    """Bad input to recording from an environment: a space rlds cannot store, a value outside its
    space, an info key that comes and goes, or bad arguments to ``record``."""

    default_hint = "fix the named space, value or argument; help(rlds_cli.record) lists what it accepts"


# --------------------------------------------------------------------------- frames


class FrameError(RldsError, ValueError):
    """A camera frame that cannot be encoded or decoded as its column says: another codec, size
    or channel count, or damaged bytes. Reads turn it into a
    :class:`CorruptDatasetError` naming the dataset, key and row."""


class FramesModeError(RldsError, ValueError):
    """A ``--frames`` / ``frames=`` setting that is none of the modes."""

    default_hint = "use keep (the default), raw, jpeg, jpeg:QUALITY (1-100), png or webp"


# --------------------------------------------------------------------------- viewer


class ViewerError(RldsError, ValueError):
    """An episode viewer page (``rlds show``) that cannot be made: where it would be written is
    no file in an existing folder, or a camera's frames cannot be shown."""

    default_hint = "see 'rlds show --help'"


# --------------------------------------------------------------------------- OS errors

#: errno -> (error class, what happened), for the operating-system errors a user can fix.
_OS_ERRORS: dict[int, tuple[type[RldsError], str]] = {}


def _os_errors() -> dict[int, tuple[type[RldsError], str]]:
    import errno

    if not _OS_ERRORS:
        _OS_ERRORS.update(
            {
                errno.ENOSPC: (DiskFullError, "no space left on the device"),
                errno.EDQUOT: (DiskFullError, "disk quota exceeded"),
                errno.EROFS: (CacheNotWritableError, "read-only filesystem"),
                errno.EACCES: (CacheNotWritableError, "permission denied"),
                errno.EPERM: (CacheNotWritableError, "operation not permitted"),
                errno.ENAMETOOLONG: (InvalidNameError, "file name too long"),
                errno.EMFILE: (TooManyOpenFilesError, "too many open files (the process's limit) at"),
                errno.ENFILE: (TooManyOpenFilesError, "too many open files (the system's limit) at"),
            }
        )
    return _OS_ERRORS


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` reports a full disk or quota: an OS error's errno (``ENOSPC``, ``EDQUOT``),
    or that errno in the text of h5py's errors (HDF5's failed writes raise a ``RuntimeError``, or an
    ``OSError`` without an errno)."""
    import errno
    import re

    full = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, OSError) and exc.errno in full:
        return True
    found = re.search(r"\berrno = (\d+)", str(exc))
    return found is not None and int(found.group(1)) in full


def from_os_error(exc: OSError, where: str | None = None) -> RldsError | None:
    """The rlds error for an OS error a user can act on (full disk, read-only or unwritable
    cache, name too long), naming the file (``where``: the name to give it, default the
    error's); ``None`` for any other."""
    found = _os_errors().get(exc.errno or 0)
    if found is None:
        return None
    cls, what = found
    if where is None:
        where = str(exc.filename) if exc.filename is not None else "(unknown file)"
    hint = None
    if cls is CacheNotWritableError:
        hint = (
            "check the permissions of that path; if it is in the cache, use a cache you can write "
            "to (--root DIR or RLDS_HOME=DIR)"
        )
    elif cls is InvalidNameError:
        hint = "use a shorter dataset name or a shorter cache path (--root, RLDS_HOME)"
    return cls(f"{what}: {where}", hint)
