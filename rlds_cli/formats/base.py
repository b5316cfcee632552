"""The source reader plug point: the :class:`Reader` ABC every format implements, its
:class:`ReaderOptions`, what a reader produces, and its file rules.

:class:`StepBlock`, :data:`REQUIRED_STEP_KEYS` and :func:`column` belong to the TED vocabulary
(:mod:`rlds_cli.cache.ted`) and are re-exported here for readers.

**File rules.** A format package keeps what its sources look like in one module (``layout.py`` or
``files.py``): ``sniff``, ``source_files`` and ``EXPECTED_FILES``. :func:`from_layout` sets them as
the reader's :attr:`~Reader.sniff`, :attr:`~Reader.source_files` and :attr:`~Reader.expected_files`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType, UnionType
from typing import Any, ClassVar, Literal, Self, TypeVar, Union, get_args, get_origin, get_type_hints

import numpy as np

from rlds_cli.cache.ted import REQUIRED_STEP_KEYS as REQUIRED_STEP_KEYS
from rlds_cli.cache.ted import StepBlock as StepBlock
from rlds_cli.cache.ted import column as column
from rlds_cli.errors import SourceError, SourceFormatError


@dataclass
class ConversionReport:
    """What a reader decided while converting; stored in the manifest under ``conversion``."""

    rules: str = ""
    source_rows: int = 0
    dropped_rows: int = 0
    dropped_episodes: int = 0
    synthesized_final_observations: int = 0
    inferred_boundaries: int = 0
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Counts the source itself declares (e.g. Minari's ``total_steps``), checked by
    #: ``rlds inspect --check``: keys ``num_steps`` and ``num_episodes`` (episodes counted
    #: before any were dropped).
    expected: dict[str, int] = field(default_factory=dict)
    #: NaN values per stored key, counted while converting (``rlds inspect --check`` compares).
    nan_counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": self.rules,
            "source_rows": self.source_rows,
            "dropped_rows": self.dropped_rows,
            "dropped_episodes": self.dropped_episodes,
            "synthesized_final_observations": self.synthesized_final_observations,
            "inferred_boundaries": self.inferred_boundaries,
            "notes": list(self.notes),
        }

    def checks(self) -> dict[str, Any]:
        """What ``rlds inspect --check`` compares against (the manifest's ``source.checks``): the source's
        declared counts and the NaN count per key."""
        return {"expected": dict(self.expected), "nan_counts": dict(self.nan_counts)}


@dataclass(frozen=True)
class ReaderOptions:
    """A reader's options: subclass as a frozen dataclass with one field per keyword argument of the
    reader's ``__init__`` (same name, type and default; the reader contract test checks they agree).
    :func:`parse_options` checks names and values against it (a string, as ``--option key=value``
    gives it, becomes the field's type)."""

    @classmethod
    def names(cls) -> list[str]:
        """The option names, in declaration order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def describe(cls) -> str:
        """``name (type)`` per option, for hints."""
        hints = get_type_hints(cls)
        return ", ".join(f"{f.name} ({_type_words(hints[f.name])})" for f in fields(cls)) or "none"


class Reader(ABC):
    """A reader of one source format, streaming it as :class:`StepBlock` s with bounded memory.

    A subclass names its format (:attr:`format_name`), recognises its files (:meth:`sniff`), lists
    the files it reads (:meth:`source_files`), declares its options (:attr:`Options`) and streams
    blocks (:meth:`blocks`). Built as ``Reader(path, **options)`` (``path``: a file, a folder or a
    list of files) and used as a context manager; :meth:`close` releases its files. Registered in
    :data:`rlds_cli.formats.READERS`, or by another package under the ``rlds_cli.readers``
    entry-point group (docs/formats.md, "A reader of your own").
    """

    #: The name ``--format`` takes.
    format_name: ClassVar[str]
    #: What a source of this format looks like, said in hints.
    expected_files: ClassVar[str] = "a file or folder of that format"
    #: The reader's options (keyword arguments of ``__init__``).
    Options: ClassVar[type[ReaderOptions]] = ReaderOptions
    #: Whether the reader takes exactly one file: ``convert`` hands it a folder's only file and
    #: refuses a folder of several.
    reads_one_file: ClassVar[bool] = False

    path: Path
    report: ConversionReport

    @abstractmethod
    def __init__(self, path: Any, **options: Any) -> None:
        """Open ``path`` (a file, a folder, or a list of files) with :attr:`Options` as keyword arguments,
        and plan the conversion, failing early on bad input."""

    @staticmethod
    def sniff(path: Path) -> bool:
        """Whether ``path`` (a file or a folder) is of this format. Cheap; never raises on a path of another
        format (default: ``False``)."""
        return False

    @staticmethod
    def source_files(paths: Sequence[Path]) -> list[Path]:
        """The files a conversion of ``paths`` reads, in reading order (default: every file, a
        folder's in sorted order)."""
        files: list[Path] = []
        for p in paths:
            files += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
        return files

    @staticmethod
    def plan_files(names: Sequence[str]) -> list[str] | None:
        """Of a source folder's files (``/``-separated relative paths, as a Hub repo lists them), those to
        fetch first when only some episodes are wanted: the metadata :meth:`episode_files` needs.
        ``None`` (default): every file is fetched."""
        return None

    def select_episodes(self, first: int, stop: int | None) -> int:
        """Read only the episodes at positions ``[first, stop)`` of the source's episode stream (``stop``
        ``None``: to the end); files holding none of them need not be on disk. Called before
        :meth:`total_rows` and :meth:`blocks`.

        Returns the stream position of the first episode :meth:`blocks` yields, so ``--episodes A:B``
        names the same episodes whether the whole source or only those episodes' files are on disk.
        Per-episode :meth:`source_arrays` keep one row per episode of the whole stream.

        Default: the whole source is read (returns 0).
        """
        return 0

    def episode_files(self) -> list[str] | None:
        """After :meth:`select_episodes`, the files (``/``-separated, relative to the source folder)
        :meth:`blocks` reads besides those of :meth:`plan_files`. ``None`` (default): every file is needed."""
        return None

    @abstractmethod
    def total_rows(self) -> int:
        """Rows the source holds (for progress bars)."""

    @abstractmethod
    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the whole source as blocks; ``progress`` gets the source rows consumed."""

    @abstractmethod
    def source_metadata(self) -> dict[str, Any]:
        """Small JSON-serialisable facts from the source (stored in the manifest)."""

    @abstractmethod
    def source_arrays(self) -> dict[str, np.ndarray]:
        """Larger non-step arrays from the source (stored in ``source_metadata.npz``)."""

    def close(self) -> None:  # noqa: B027 (optional: a reader that opens files per block has none)
        """Release open files (default: nothing)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------- options


def parse_options(reader: type[Reader], given: Mapping[str, object]) -> dict[str, object]:
    """``given`` checked against ``reader.Options``, each value converted to the field's type (a string
    from ``--option key=value`` is parsed). :data:`GENERIC_OPTIONS` the reader does not take are
    dropped.

    Raises:
        SourceError: An option the format does not take (a :class:`SourceFormatError` for a value of
            the wrong type); the message names the option and the format, the hint lists its options.
    """
    options = reader.Options
    hints = get_type_hints(options)
    out: dict[str, object] = {}
    for key, value in given.items():
        if key not in hints:
            if key in GENERIC_OPTIONS:
                continue
            raise SourceError(
                f"option {key!r} does not apply to the {reader.format_name} format",
                hint=f"options of this format: {options.describe()}",
            )
        try:
            out[key] = _coerce(hints[key], value)
        except ValueError:
            raise SourceFormatError(
                f"{key} is {value!r}; the {reader.format_name} format takes {_type_words(hints[key])}",
                hint=f"options of this format: {options.describe()}",
            ) from None
    return out


#: Options any caller may pass whatever the format (the CLI's --workers, --allow-pickle,
#: --max-episode-steps); a reader that does not take one does not get it.
GENERIC_OPTIONS = frozenset({"workers", "allow_pickle", "max_episode_steps", "block_rows"})

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _members(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, UnionType) else (tp,)


def _coerce(tp: Any, value: object) -> object:
    """``value`` as type ``tp`` (a string parsed), or ValueError. For a union a string tries ``None``
    first, then the string-like members, so ``checkpoints=3`` stays text where the option takes text."""
    members = _members(tp)
    if len(members) > 1:
        rank = {type(None): 0, str: 1}
        order = sorted(members, key=lambda m: rank.get(m, 1 if get_origin(m) is Literal else 2))
        for member in order:
            try:
                return _coerce(member, value)
            except ValueError:
                continue
        raise ValueError(value)
    if tp is Any:
        return value
    if tp is type(None):
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
    elif get_origin(tp) is Literal:
        for choice in get_args(tp):  # the spelling the reader takes, whatever the case given
            if value == choice or (isinstance(value, str) and str(choice).lower() == value.lower()):
                return choice
    elif tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            return int(value)
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif get_origin(tp) in (Sequence, list, tuple) and isinstance(value, list | tuple):
        (item,) = get_args(tp)[:1] or (Any,)
        return [_coerce(item, v) for v in value]
    raise ValueError(value)


def _type_words(tp: Any) -> str:
    """A type as a hint says it: ``an integer or none``, ``'keep' or 'drop'``."""
    words = []
    for member in _members(tp):
        if get_origin(member) is Literal:
            words += [repr(c) for c in get_args(member)]
        elif get_origin(member) in (Sequence, list, tuple):
            words.append("a list")
        else:
            words.append(
                {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
                    member, "none" if member is type(None) else getattr(member, "__name__", str(member))
                )
            )
    return " or ".join(words)


R = TypeVar("R", bound=type[Reader])

#: The functions a layout module provides, set on the reader as static methods.
RULES = ("sniff", "source_files")


def from_layout(layout: ModuleType) -> Callable[[R], R]:
    """Class decorator: sets the reader's ``sniff``, ``source_files`` and ``expected_files`` from
    ``layout``'s ``sniff``, ``source_files`` and ``EXPECTED_FILES``."""

    def apply(cls: R) -> R:
        for name in RULES:
            setattr(cls, name, staticmethod(getattr(layout, name)))
        cls.expected_files = layout.EXPECTED_FILES
        return cls

    return apply
