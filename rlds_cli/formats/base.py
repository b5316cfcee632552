"""The reader kit: the :class:`Reader` ABC every format implements (the source reader plug
point), its :class:`ReaderOptions`, what a reader produces, its file rules, the key cleaner that
turns source names into TED keys, and the packer that turns pieces of episodes into blocks.

:class:`StepBlock`, :data:`REQUIRED_STEP_KEYS` and :func:`column` belong to the TED vocabulary
(:mod:`rlds_cli.cache.ted`) and are re-exported here for readers.

**File rules.** A format package keeps what its sources look like in one module (``layout.py`` or
``files.py``): ``sniff``, ``source_files`` and ``EXPECTED_FILES``. :func:`from_layout` sets them as
the reader's :attr:`~Reader.sniff`, :attr:`~Reader.source_files` and :attr:`~Reader.expected_files`.

**Keys** (:func:`clean_keys`). A TED key is ``/``-separated parts, each of ``A-Z a-z 0-9 _ . -``,
neither ``.`` nor ``..``, at most 200 characters a part and 32 parts (:func:`key_problem`; the
storage backends refuse any other key). Source names allow more (HDF5 ``infos/pos x``, any
``.npz`` member name, tensordict keys). The rules (also in ``docs/formats.md``, "Key names"):

* Each part is cleaned on its own: a character outside ``A-Z a-z 0-9 _ . -`` becomes ``_``; an
  empty part becomes ``_``, a part ``.``/``..`` becomes ``_``/``__``.
* Names are cleaned per group (the parts under one parent). When several clean to the same part,
  an already-clean name keeps it; the others, by source name (code point order), get the first
  suffix ``_2``, ``_3``, ... unused in that group. So two source names never share a key and a
  leaf never shares a name with a group, whatever the source's order.
* Every key that differs from its source name is listed in the conversion notes.

Text and other object values (variable-length HDF5 strings, fixed-width bytes/unicode, object
arrays) are dropped with a conversion note (:func:`is_text`); raw object pointers are never stored.

**Blocks.** A reader hands the :class:`BlockPacker`, in order, :class:`Piece` s (consecutive steps of one
episode: a whole episode or a segment) or blocks it built itself (:meth:`BlockPacker.add_block`).
The packer gathers them into blocks of about :data:`BLOCK_BYTES` (or ``block_rows`` steps), marks
each episode's end (``next/terminated``, ``next/truncated``, final observation known or filled
in, source id), and never copies a piece that fills a block on its own.
:func:`rows_per_block` is the same budget for readers that read a fixed number of rows at a time.

Episode-structured readers (Minari, Roboset, AMAGO, Gen-DGRL) hand over whole :class:`Episode` s
(observation-like columns ``T + 1`` rows, per-step columns ``T``) with an :class:`EpisodeSchema`
as ``admit``, so every episode must have the first one's schema (mixed shapes fail naming the
episode, not deep in the builder).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType, UnionType
from typing import Any, ClassVar, Literal, Self, TypeVar, Union, get_args, get_origin, get_type_hints

import numpy as np

from rlds_cli.cache.ted import MAX_KEY_PART_CHARS as MAX_KEY_PART_CHARS
from rlds_cli.cache.ted import MAX_KEY_PARTS as MAX_KEY_PARTS
from rlds_cli.cache.ted import REQUIRED_STEP_KEYS as REQUIRED_STEP_KEYS
from rlds_cli.cache.ted import StepBlock as StepBlock
from rlds_cli.cache.ted import column as column
from rlds_cli.cache.ted import is_valid_key as is_valid_key
from rlds_cli.cache.ted import key_problem as key_problem
from rlds_cli.errors import SourceError, SourceFormatError
from rlds_cli.formats.untrusted import files_inside
from rlds_cli.frames.codecs import join_rows


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
        folder's in sorted order; a symlink out of the folder is refused, see
        :func:`~rlds_cli.formats.untrusted.files_inside`)."""
        files: list[Path] = []
        for p in paths:
            files += files_inside(p) if p.is_dir() else [p]
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
            out[key] = got = _coerce(hints[key], value)
            if key in COUNT_OPTIONS and isinstance(got, int) and not isinstance(got, bool) and got < 1:
                raise ValueError
        except ValueError:
            words = "a whole number >= 1" if key in COUNT_OPTIONS else _type_words(hints[key])
            raise SourceFormatError(
                f"{key} is {value!r}; the {reader.format_name} format takes {words}",
                hint=f"options of this format: {options.describe()}",
            ) from None
    return out


#: Options that count steps, rows or processes: 0 or less is a mistake (block_rows=-3 was blamed
#: on the data file, block_rows=0 and max_episode_steps=-5 accepted).
COUNT_OPTIONS = frozenset({"block_rows", "max_episode_steps", "workers"})


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


_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.-]")


def clean_part(name: str) -> str:
    """One part of a source name made valid (not yet disambiguated from its siblings)."""
    cleaned = _BAD_CHAR.sub("_", name)
    if cleaned in ("", ".", ".."):
        # '.' and '..' would be directory links on disk; '' an empty path part
        return "_" * max(1, len(cleaned))
    return cleaned


def clean_keys(wanted: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Valid, distinct TED keys for the names of one source.

    Args:
        wanted: Per source name (any unique label, e.g. an HDF5 path), the parts of the key before
            cleaning (``("info", "pos x")``).

    Returns:
        Per source name, its TED key. Distinct names get distinct keys, no key is a group
        (``/``-prefix) of another, and the result does not depend on ``wanted``'s order.
    """
    out: dict[str, str] = {}
    items = [(label, tuple(parts)) for label, parts in wanted.items()]
    empty = [label for label, parts in items if not parts]
    if empty:
        raise ValueError(f"source name {empty[0]!r} maps to an empty key")
    _assign(items, (), out)
    return out


def _assign(items: list[tuple[str, tuple[str, ...]]], prefix: tuple[str, ...], out: dict[str, str]) -> None:
    """Name the entries of one group (its leaves and its subgroups), then recurse."""
    groups: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    # an entry: (raw name, kind 0 leaf / 1 group, label of a leaf or the raw name of a group)
    entries: list[tuple[str, int, str]] = []
    for label, parts in items:
        if len(parts) == 1:
            entries.append((parts[0], 0, label))
        else:
            if parts[0] not in groups:
                entries.append((parts[0], 1, parts[0]))
            groups.setdefault(parts[0], []).append((label, parts[1:]))
    # already-clean names first, so a clean name is never taken by another's suffix
    entries.sort(key=lambda e: (clean_part(e[0]) != e[0], e[0], e[1], e[2]))
    names: dict[tuple[str, int, str], str] = {}
    taken: set[str] = set()
    for entry in entries:
        cleaned = clean_part(entry[0])
        if cleaned not in taken:
            taken.add(cleaned)
            names[entry] = cleaned
    for entry in entries:
        if entry in names:
            continue
        cleaned, k = clean_part(entry[0]), 2
        while f"{cleaned}_{k}" in taken:
            k += 1
        names[entry] = f"{cleaned}_{k}"
        taken.add(names[entry])
    for entry in entries:
        raw, kind, label = entry
        if kind == 0:
            out[label] = "/".join((*prefix, names[entry]))
        else:
            _assign(groups[raw], (*prefix, names[entry]), out)


def renamed_note(keys: Mapping[str, str], wanted: Mapping[str, Sequence[str]]) -> str | None:
    """A conversion note listing the keys that differ from their source names (``None``: none).
    ``keys`` is :func:`clean_keys`'s result for ``wanted``.
    """
    changed = sorted((label, key) for label, key in keys.items() if key != "/".join(wanted[label]))
    if not changed:
        return None
    shown = ", ".join(f"{label!r} -> {key!r}" for label, key in changed)
    return (
        f"source names cleaned into TED keys (only A-Z a-z 0-9 _ . - per part; clashes get _2, _3...): "
        f"{shown}"
    )


def is_text(dtype: np.dtype) -> bool:
    """Whether values of ``dtype`` are text or Python objects (variable-length HDF5 strings, ``object``
    arrays, fixed-width ``bytes``/``str``): not storable in the cache."""
    return np.dtype(dtype).kind in "OSU"


def text_note(key: str, dtype: np.dtype) -> str:
    """The conversion note for a dropped text/object column."""
    dtype = np.dtype(dtype)
    if dtype.kind != "O":
        what = "text values"
    elif dtype.metadata and dtype.metadata.get("vlen") in (str, bytes):  # how h5py marks its string dtypes
        what = "variable-length strings"
    else:
        what = "variable-length (object) values"
    return f"{key}: {what} are not stored (the cache holds numeric arrays only); column dropped"


#: Source bytes gathered before a block is emitted (every reader's budget).
BLOCK_BYTES = 8 * 1024 * 1024


def rows_per_block(row_bytes: int, lo: int = 1, hi: int = 1 << 18) -> int:
    """Rows of ``row_bytes`` bytes in about :data:`BLOCK_BYTES`, clipped to ``[lo, hi]``."""
    return int(np.clip(BLOCK_BYTES // max(row_bytes, 1), lo, hi))


@dataclass
class Piece:
    """A run of consecutive steps of one episode, as a reader read it.

    Attributes:
        label: Where it came from, for error messages (``file.h5:episode_3``).
        observations: Observation-like columns, one row a step, plus the final observation when
            ``last`` (``T + 1`` rows for a whole episode).
        steps: Per-step columns, ``T`` rows each; ``action`` and ``next/reward`` at least
            (``next/terminated``/``next/truncated`` are the packer's).
        terminated: Whether the episode's last step terminated it (otherwise it was truncated);
            read only when ``last``.
        source_id: The source's own number for the episode.
        final_known: Whether the final observation is the real one.
        truncated: Truncation flag of the last step (default: ``not terminated``); a step may
            carry both flags when the source says so.
        last: Whether the episode ends with this piece (a whole episode does).
    """

    label: str
    observations: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    terminated: bool
    source_id: int = -1
    final_known: bool = True
    truncated: bool | None = None
    last: bool = True

    @property
    def length(self) -> int:
        """The number of steps."""
        return int(next(iter(self.steps.values())).shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of its columns."""
        return sum(v.nbytes for v in self.steps.values()) + sum(v.nbytes for v in self.observations.values())


def piece_block(piece: Piece) -> StepBlock:
    """One piece as a block of its own (its end marked when it is the episode's last piece)."""
    n = piece.length
    term = np.zeros((n, 1), bool)
    trunc = np.zeros((n, 1), bool)
    if piece.last:
        term[-1, 0] = piece.terminated
        trunc[-1, 0] = (not piece.terminated) if piece.truncated is None else piece.truncated
    ends = 1 if piece.last else 0
    return StepBlock(
        steps={**piece.steps, "next/terminated": term, "next/truncated": trunc},
        observations=piece.observations,
        ends=np.array([n - 1] * ends, np.int64),
        final_known=np.array([piece.final_known] * ends, bool),
        episode_ids=np.array([piece.source_id] * ends, np.int64),
    )


def _block_bytes(block: StepBlock) -> int:
    return sum(v.nbytes for v in (*block.steps.values(), *block.observations.values()))


class BlockPacker:
    """Gathers pieces of episodes (or blocks) into blocks of about ``block_bytes`` bytes, or
    ``block_rows`` steps when given; a piece that would overflow the pending ones sends them out
    first, so a piece that fills a block alone passes without a copy.

    Args:
        block_rows: Steps per block at most (``None``: bytes only).
        admit: Asked for each piece before it is queued; ``False`` leaves it out (an episode without
            a transition), raising stops the conversion (a schema that differs).
        block_bytes: Target bytes per block.
    """

    def __init__(
        self,
        block_rows: int | None = None,
        *,
        admit: Callable[[Piece], bool] | None = None,
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        self.block_rows = block_rows
        self.block_bytes = block_bytes
        self._admit = admit
        self._pending: list[StepBlock] = []
        self._bytes = 0
        self._steps = 0

    def _full(self, nbytes: int, steps: int, *, over: bool = False) -> bool:
        """Whether ``nbytes``/``steps`` reach the budget (``over``: go past it)."""
        rows = self.block_rows if self.block_rows is not None else steps + 1
        if over:
            return nbytes > self.block_bytes or steps > rows
        return nbytes >= self.block_bytes or steps >= rows

    def add(self, piece: Piece) -> Iterator[StepBlock]:
        """Queue one piece of an episode; yields the blocks that fill up."""
        if self._admit is not None and not self._admit(piece):
            return
        if piece.length == 0:
            if piece.last:
                raise ValueError(f"{piece.label}: an episode's last piece has no step (readers drop those)")
            return
        yield from self.add_block(piece_block(piece))

    def add_block(self, block: StepBlock) -> Iterator[StepBlock]:
        """Queue a block the reader built (consecutive steps, episode ends marked)."""
        nbytes = _block_bytes(block)
        if self._pending and self._full(self._bytes + nbytes, self._steps + block.num_steps, over=True):
            yield self._flush()
        self._pending.append(block)
        self._bytes += nbytes
        self._steps += block.num_steps
        if self._full(self._bytes, self._steps):
            yield self._flush()

    def finish(self) -> Iterator[StepBlock]:
        """Emit what is left."""
        if self._pending:
            yield self._flush()

    def _flush(self) -> StepBlock:
        blocks, self._pending, self._bytes, self._steps = self._pending, [], 0, 0
        if len(blocks) == 1:
            return blocks[0]
        offsets = np.cumsum([0, *(b.num_steps for b in blocks[:-1])])
        first = blocks[0]
        return StepBlock(
            steps={k: np.concatenate([b.steps[k] for b in blocks]) for k in first.steps},
            observations={k: join_rows([b.observations[k] for b in blocks]) for k in first.observations},
            ends=np.concatenate([b.ends + o for b, o in zip(blocks, offsets, strict=True)]).astype(np.int64),
            final_known=_per_end([b.final_known for b in blocks], blocks, True),
            episode_ids=_per_end([b.episode_ids for b in blocks], blocks, -1),
        )


def _per_end(values: list[Any], blocks: list[StepBlock], default: bool | int) -> np.ndarray | None:
    """One per-end array for several blocks (``None`` when no block has one; a block without one gets
    ``default`` per end)."""
    if all(v is None for v in values):
        return None
    filled = [np.full(len(b.ends), default) if v is None else v for v, b in zip(values, blocks, strict=True)]
    return np.concatenate(filled)


#: A whole episode: a piece that is its episode's last (``T + 1`` observation rows).
Episode = Piece


def _schema(columns: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (tuple(v.shape[1:]), v.dtype.str) for k, v in columns.items()}


class EpisodeSchema:
    """Admits whole episodes that have the first one's keys, shapes and dtypes.

    Args:
        report: The reader's report (episodes without a transition are counted as dropped).
    """

    def __init__(self, report: ConversionReport) -> None:
        self.report = report
        self._obs_schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self._step_schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self._first_label = ""

    def __call__(self, ep: Episode) -> bool:
        """Whether to pack ``ep`` (an episode without a transition is dropped and counted).

        Raises:
            SourceFormatError: Ragged columns, or keys, shapes or dtypes unlike the first episode's.
        """
        if ep.length == 0:
            self.report.dropped_episodes += 1
            return False
        self._check(ep)
        return True

    def _check(self, ep: Episode) -> None:
        t = ep.length
        for key, rows in ep.steps.items():
            if rows.shape[0] != t:
                raise SourceFormatError(
                    f"{ep.label}: {key!r} has {rows.shape[0]} rows, expected {t} (ragged episode)"
                )
        for key, rows in ep.observations.items():
            if rows.shape[0] != t + 1:
                raise SourceFormatError(
                    f"{ep.label}: {key!r} has {rows.shape[0]} rows, expected {t + 1} "
                    f"({t} steps + the final observation; ragged episode)"
                )
        obs, steps = _schema(ep.observations), _schema(ep.steps)
        if self._obs_schema is None:
            self._obs_schema, self._step_schema, self._first_label = obs, steps, ep.label
            return
        for mine, first, kind in ((obs, self._obs_schema, "observation"), (steps, self._step_schema, "step")):
            assert first is not None
            if set(mine) != set(first):
                extra = sorted(set(mine) - set(first))
                missing = sorted(set(first) - set(mine))
                raise SourceFormatError(
                    f"{ep.label}: {kind} keys differ from {self._first_label}"
                    + (f"; unknown keys {extra}" if extra else "")
                    + (f"; missing keys {missing}" if missing else "")
                )
            for key, spec in mine.items():
                if spec != first[key]:
                    raise SourceFormatError(
                        f"{ep.label}: {key!r} has shape {spec[0]} dtype {np.dtype(spec[1])} per step, "
                        f"but {first[key][0]} {np.dtype(first[key][1])} in {self._first_label} "
                        "(mixed shapes across episodes)"
                    )
