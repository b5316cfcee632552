"""Each episode of a dataset as one row of a table (:attr:`Dataset.episodes`), and episode
selection by index list or by a predicate over that table.

:class:`EpisodeTable` has, for every kind of dataset (converted, view, growing, remote):

* ``start``, ``length``, ``source_id``, ``final_known``: the episode index (no read);
* ``return``: sum of ``next/reward``, one bounded pass (:func:`episode_returns`);
* ``seed``, ``seed_present``: recorded by rlds per step (``reset_seed``,
  :func:`recorded_seeds`) or kept by a conversion per episode (``<format>/episode_seed``,
  :func:`source_seeds`);
* plus the dataset's ``env_spec``.

Computed columns are made on first use and kept. A table belongs to one view: after a growing
dataset's ``refresh()`` changes the view, a column not yet made raises
:class:`~rlds_cli.errors.DatasetReplacedError`, never one of the new view.

Selection gives ascending episode positions, for a view
(:func:`rlds_cli.cache.derive.create_selection`) or a loader: :func:`parse_episode_list` an index
list (``"0,5,9-20"``), :func:`select_where` a predicate (``"length >= 50 and return > 100"``). The
predicate parser (no ``eval``) accepts numbers, the table's columns and ``episode`` (the
position), ``+ - * /``, ``< <= > >= == !=``, ``and``, ``or``, ``not`` and parentheses, and
evaluates on whole columns with numpy (milliseconds for a million episodes).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rlds_cli._util.numbers import parse_range
from rlds_cli.cache.blocks import Budget, blocks
from rlds_cli.cache.integrity import damage_hint
from rlds_cli.errors import CorruptDatasetError, DatasetReplacedError, InvalidSelectionError

if TYPE_CHECKING:
    from rlds_cli.cache.dataset import Dataset
    from rlds_cli.cache.env_spec import RecordedEnvSpec


#: Per-step columns of a recording: the episode's reset seed (uint64) and whether it had one
#: (bool), on every step.
SEED_KEY = "reset_seed"


SEED_PRESENT_KEY = "reset_seed_present"


#: The step keys the table's computed columns read (``return``, ``seed``): what a selection by
#: them must find undamaged (:func:`rlds_cli.cache.compose.verify_parent`).
STEP_KEYS_READ = ("next/reward", SEED_KEY, SEED_PRESENT_KEY)

#: Per-episode source arrays holding a reset seed, as readers name them (``<format>/episode_seed``
#: with ``<format>/episode_seed_present``; see :mod:`rlds_cli.formats.select`).
SEED_ARRAY_SUFFIX = "/episode_seed"


T = TypeVar("T")


#: The columns a table makes from the data (on first use), after the index's fields.
RETURN = "return"


SEED = "seed"


SEED_PRESENT = "seed_present"


def episode_returns(ds: Dataset, budget: Budget | None = None) -> np.ndarray:
    """Sum of ``next/reward`` per episode (float64), read in bounded blocks."""
    budget = budget if budget is not None else Budget()
    returns = np.zeros(ds.num_episodes, np.float64)
    bounds = ds.episode_bounds
    for start, chunk in blocks(ds.column("next/reward"), budget, itemsize=8):
        rewards = budget.pool.empty((len(chunk), chunk[0].size), np.float64)
        np.copyto(rewards, chunk.reshape(rewards.shape), casting="unsafe")
        per_step = rewards.sum(axis=1, out=budget.pool.empty((len(chunk),), np.float64))
        e0, e1 = (int(e) for e in bounds.episode_of(np.array([start, start + len(chunk) - 1])))
        # each episode's first step in the block (the first one may have begun before it)
        firsts = np.maximum(bounds.starts[e0 : e1 + 1], start) - start
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf is NaN, as the data say: no warning
            returns[e0 : e1 + 1] += np.add.reduceat(per_step, firsts)
    return returns


def recorded_seeds(ds: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """Per episode: the reset seed (uint64; 0 where none) and whether it had one (bool), read
    at its first step; ``None`` without a ``reset_seed`` key."""
    if SEED_KEY not in ds.fields:
        return None
    rows = ds.gather(ds.episode_index["start"], [SEED_KEY, SEED_PRESENT_KEY])
    return np.asarray(rows[SEED_KEY]).reshape(-1), np.asarray(rows[SEED_PRESENT_KEY]).reshape(-1)


def source_seeds(ds: Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-episode reset seeds and presence flags from the source arrays (a view: its parent's
    rows), or ``None`` where there are none.

    Raises:
        CorruptDatasetError: The seed arrays do not hold one row per episode.
    """
    rows, owner = np.arange(ds.num_episodes), ds
    parent = ds.view_parent()
    if parent is not None:
        owner, rows = parent
    arrays = owner.source_arrays
    for key, seeds in arrays.items():
        present = arrays.get(key + "_present")
        if not key.endswith(SEED_ARRAY_SUFFIX) or present is None:
            continue
        if not len(seeds) == len(present) == owner.num_episodes:
            raise CorruptDatasetError(
                f"dataset {owner.name!r}: source arrays {key!r} and {key + '_present'!r} hold "
                f"{len(seeds)} and {len(present)} rows for {owner.num_episodes} episodes",
                hint=damage_hint(owner.name),
            )
        return np.asarray(seeds)[rows], np.asarray(present)[rows]
    return None


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False  # kept and shared by every caller: none may change it
    return values


class EpisodeTable:
    """One row per episode of a dataset, in its order (row ``i`` is ``ds.episode(i)``).

    ``table["length"]``: a column; ``table[["start", "length"]]``: a structured array;
    ``table[i]``: episode ``i`` as a dict; ``"seed" in table``: whether the column exists;
    ``np.asarray(table)``: all columns as one structured array. Columns are read-only.

    Attributes:
        starts: Each episode's first step (int64): its transitions are ``ds[starts[i] :
            starts[i] + lengths[i]]``.
        lengths: Its steps (int64).
        returns: The sum of its ``next/reward`` (float64).
        source_ids: The source's own id of the episode (int64; its position where the source
            has none).
        seeds: Its reset seed (uint64; 0 where it had none), or ``None`` where the dataset
            records no seeds.
        seed_present: Whether it had a reset seed (bool), or ``None`` with ``seeds``.
        env_spec: The environment every episode was recorded in, or ``None`` where the
            dataset records none.
    """

    def __init__(self, dataset: Dataset) -> None:
        self._ds = dataset
        self._index = dataset.episode_index  # the view this table is of (see _check_view)
        self._columns: dict[str, np.ndarray] = {}
        self._seeds_found: bool | None = None
        self._env_spec: RecordedEnvSpec | None = None
        self._env_spec_read = False

    # ------------------------------------------------------------------ columns

    @property
    def names(self) -> tuple[str, ...]:
        """The column names: the index's fields, ``return``, and ``seed``/``seed_present``
        where seeds are recorded (finding out reads them)."""
        index_fields = tuple(self._index.dtype.names or ())
        return (*index_fields, RETURN, *((SEED, SEED_PRESENT) if self.seeds is not None else ()))

    def column(self, name: str) -> np.ndarray:
        """The column ``name`` (read-only; made on first use and kept).

        Raises:
            KeyError: The table has no such column.
            DatasetReplacedError: A column not yet made, after a growing dataset's
                ``refresh()`` changed its view.
        """
        values = self._columns.get(name)
        if values is not None:
            return values
        if name in (self._index.dtype.names or ()):
            values = np.array(self._index[name])  # a copy: the index itself is never handed out
        elif name == RETURN:
            values = self._made(episode_returns)
        elif name in (SEED, SEED_PRESENT) and self.seeds is not None:
            return self._columns[name]
        else:
            raise KeyError(
                f"the episodes of dataset {self._ds.name!r} have no column {name!r} "
                f"(they have {', '.join(self.names)})"
            )
        self._columns[name] = _read_only(values)
        return values

    def _made(self, make: Callable[[Dataset], T]) -> T:
        """``make(dataset)``, checked to be of this table's view."""
        self._check_view()
        out = make(self._ds)
        self._check_view()  # a refresh on another thread while it read
        return out

    def _check_view(self) -> None:
        if self._ds.episode_index is not self._index:
            raise DatasetReplacedError(
                f"growing dataset {self._ds.name!r} was refreshed to a new view after this "
                "episode table was taken: its columns would be of another set of episodes",
                hint="take ds.episodes again after refresh()",
            )

    @property
    def starts(self) -> np.ndarray:
        return self.column("start")

    @property
    def lengths(self) -> np.ndarray:
        return self.column("length")

    @property
    def source_ids(self) -> np.ndarray:
        return self.column("source_id")

    @property
    def returns(self) -> np.ndarray:
        return self.column(RETURN)

    @property
    def seeds(self) -> np.ndarray | None:
        if self._seeds_found is None:
            found = self._made(recorded_seeds)
            if found is None:
                found = self._made(source_seeds)
            if found is not None:
                self._columns[SEED] = _read_only(np.asarray(found[0], np.uint64))
                self._columns[SEED_PRESENT] = _read_only(np.asarray(found[1], bool))
            self._seeds_found = found is not None
        return self._columns[SEED] if self._seeds_found else None

    @property
    def seed_present(self) -> np.ndarray | None:
        return self._columns[SEED_PRESENT] if self.seeds is not None else None

    @property
    def env_spec(self) -> RecordedEnvSpec | None:
        if not self._env_spec_read:
            self._env_spec, self._env_spec_read = self._ds.env_spec, True
        return self._env_spec

    def columns(self) -> dict[str, np.ndarray]:
        """Every column by name (:attr:`names`), e.g. for ``pandas.DataFrame(table.columns())``."""
        return {name: self.column(name) for name in self.names}

    # ------------------------------------------------------------------ container

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names

    def __getitem__(self, key: Any) -> Any:
        """A column by name, a structured array of a list of names, or one episode (an int,
        negative from the end) as a dict of its values by column name."""
        if isinstance(key, str):
            return self.column(key)
        if isinstance(key, list) and all(isinstance(k, str) for k in key):
            return self._structured(key)
        try:
            i = operator.index(key)
        except TypeError:
            raise TypeError(
                f"an episode table is indexed by a column name ('length'), a list of names or an "
                f"episode number, not {type(key).__name__}; select rows of a column instead "
                f"(table['length'][a:b])"
            ) from None
        if not -len(self) <= i < len(self):
            raise IndexError(
                f"episode {i} out of range for dataset {self._ds.name!r} with {len(self)} episodes"
            )
        return {name: self.column(name)[i] for name in self.names}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Each episode as a dict (see :meth:`__getitem__`)."""
        columns = self.columns()
        for i in range(len(self)):
            yield {name: values[i] for name, values in columns.items()}

    def _structured(self, names: list[str]) -> np.ndarray:
        columns = [self.column(name) for name in names]
        out = np.empty(len(self), [(name, values.dtype) for name, values in zip(names, columns, strict=True)])
        for name, values in zip(names, columns, strict=True):
            out[name] = values
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:  # numpy's contract: refuse where a copy cannot be avoided
            raise ValueError("an episode table becomes an array only as a copy (np.array(table))")
        out = self._structured(list(self.names))
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"EpisodeTable(dataset={self._ds.name!r}, episodes={len(self)})"


__all__ = ["parse_episode_list", "parse_where", "select_where"]


_LIST_HINT = "episodes are a list of positions and ranges, e.g. 0,5,9-20 (or one range A:B)"


_WHERE_HINT = "e.g. --where \"length >= 50 and return > 100\" (columns: see 'rlds inspect')"


def parse_episode_list(
    spec: str | Sequence[int], num_episodes: int, *, option: str = "--episodes"
) -> np.ndarray:
    """``"0,5,9-20"`` (positions and inclusive ranges ``A-B``, negative positions counting from
    the end), one range ``"A:B"`` (Python slice rules, as ``rlds view`` takes it) or a sequence of
    ints -> the distinct positions, ascending (int64). ``option`` names the flag in errors.

    Raises:
        InvalidSelectionError: A part is no number or range, a position is outside the dataset,
            a range runs backwards, or nothing is selected.
    """
    if isinstance(spec, str) and ":" in spec:
        try:
            bounds = parse_range(spec, negative=True)
        except InvalidSelectionError as exc:  # its hint names the range alone
            raise InvalidSelectionError(str(exc), hint=_LIST_HINT) from None
        ids = np.arange(*slice(*bounds).indices(max(0, num_episodes))[:2], dtype=np.int64)
    elif isinstance(spec, str):
        # one flag per episode, not a list of every position: "0-999999,0-999999,..." stays bounded
        chosen = np.zeros(max(0, num_episodes), bool)
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            m = re.fullmatch(r"(-?[0-9]+)\s*-\s*(-?[0-9]+)", part)  # ASCII digits: int() takes others
            if m is not None:
                a, b = (_position(_integer(g, spec), num_episodes, spec) for g in m.groups())
                if b < a:
                    raise InvalidSelectionError(f"episode range {part!r} runs backwards", hint=_LIST_HINT)
                chosen[a : b + 1] = True
            elif re.fullmatch(r"-?[0-9]+", part):
                chosen[_position(_integer(part, spec), num_episodes, spec)] = True
            else:
                raise InvalidSelectionError(
                    f"{part!r} in {option} {spec!r} is no episode position or range", hint=_LIST_HINT
                )
        ids = np.flatnonzero(chosen).astype(np.int64)
    elif isinstance(spec, range):  # range(0, 10**12): checked at its ends, never listed
        if len(spec):
            for end in (spec[0], spec[-1]):
                _position(end, num_episodes, spec)
        ids = np.arange(spec.start, spec.stop, spec.step, dtype=np.int64)
        ids = ids + np.where(ids < 0, num_episodes, 0)
    else:
        try:
            raw = np.asarray(list(spec))
        except ValueError:  # a ragged nesting: [[0, 1], [2]]
            raise InvalidSelectionError(
                f"episode positions must be a flat list of integers, got {str(spec)[:60]}", hint=_LIST_HINT
            ) from None
        if raw.size and raw.dtype.kind not in "iu":
            raise InvalidSelectionError(
                f"episode positions must be integers, got {raw.dtype}", hint=_LIST_HINT
            )
        ids = np.array([_position(int(i), num_episodes, "episodes") for i in raw.reshape(-1)], np.int64)
    ids = np.unique(ids)
    if len(ids) == 0:
        raise InvalidSelectionError(f"{option} {spec!r} selects no episode", hint=_LIST_HINT)
    return ids


def _integer(text: str, spec: object) -> int:
    """``text`` (signed digits) as an int; one too long for ``int()`` raises
    :class:`InvalidSelectionError` (outside the dataset)."""
    try:
        return int(text)
    except ValueError:
        raise InvalidSelectionError(
            f"episode {text[:20]}... ({len(text.lstrip('-'))} digits) in {str(spec)[:40]!r}... "
            "is outside the dataset",
            hint=_LIST_HINT,
        ) from None


def _position(i: int, num_episodes: int, spec: object) -> int:
    """Position ``i`` (negative: from the end), checked against the dataset."""
    p = i + num_episodes if i < 0 else i
    if not 0 <= p < num_episodes:
        raise InvalidSelectionError(
            f"episode {i} in {spec!r} is outside the dataset's {num_episodes} episodes "
            f"(positions 0 to {num_episodes - 1})",
            hint=_LIST_HINT,
        )
    return p


_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|==|!=|<|>|\+|-|\*|/|\(|\)))"
)


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
    "!=": operator.ne,
}  # fmt: skip


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}  # fmt: skip


_KEYWORDS = {"and", "or", "not"}


#: A parsed predicate: a function of a column getter returning a bool (or number) array.
Node = Callable[[Callable[[str], np.ndarray]], Any]


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise InvalidSelectionError(
                f"--where {text!r}: cannot read {text[pos:].strip()[:20]!r} (at character {pos + 1})",
                hint=_WHERE_HINT,
            )
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    """Recursive descent over the tokens: or > and > not > comparison > sum > product > atom."""

    def __init__(self, text: str, columns: Sequence[str]) -> None:
        self.text, self.columns = text, set(columns)
        self.toks, self.i = _tokens(text), 0
        self.used: set[str] = set()

    def fail(self, what: str) -> InvalidSelectionError:
        return InvalidSelectionError(f"--where {self.text!r}: {what}", hint=_WHERE_HINT)

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise self.fail("it ends too early")
        self.i += 1
        return self.toks[self.i - 1]

    def parse(self) -> Node:
        if not self.toks:
            raise self.fail("the predicate is empty")
        node = self.or_()
        if self.i < len(self.toks):
            raise self.fail(f"{self.toks[self.i][1]!r} at token {self.i + 1} does not belong there")
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.peek() == "or":
            self.take()
            left, right = node, self.and_()
            node = _binary(_logical_or, left, right)
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.peek() == "and":
            self.take()
            left, right = node, self.not_()
            node = _binary(_logical_and, left, right)
        return node

    def not_(self) -> Node:
        if self.peek() == "not":
            self.take()
            inner = self.not_()
            return lambda get: np.logical_not(_bool(inner(get)))
        return self.compare()

    def compare(self) -> Node:
        node = self.sum_()
        op = self.peek()
        if op in _COMPARE:
            self.take()
            left, right, fn = node, self.sum_(), _COMPARE[op]
            node = _binary(fn, left, right)
            if self.peek() in _COMPARE:
                raise self.fail("chained comparisons need 'and' (a < x and x < b)")
        return node

    def sum_(self) -> Node:
        node = self.product()
        while self.peek() in ("+", "-"):
            fn = _ARITH[self.take()[1]]
            left, right = node, self.product()
            node = _binary(_arithmetic(fn), left, right)
        return node

    def product(self) -> Node:
        node = self.atom()
        while self.peek() in ("*", "/"):
            fn = _ARITH[self.take()[1]]
            left, right = node, self.atom()
            node = _binary(_arithmetic(fn), left, right)
        return node

    def atom(self) -> Node:
        kind, value = self.take()
        if value == "(":
            node = self.or_()
            if self.i >= len(self.toks) or self.take()[1] != ")":
                raise self.fail("a '(' is not closed")
            return node
        if value == "-":
            inner = self.atom()
            return lambda get: -_number(inner(get))
        if kind == "num":
            number = np.float64(value)  # numpy arithmetic: 1/0 is inf under errstate, not an error
            return lambda get: number
        if kind == "name" and value not in _KEYWORDS:
            if value in ("true", "false"):
                flag = value == "true"
                return lambda get: flag
            if value not in self.columns:
                raise self.fail(f"no column {value!r}; the columns are {', '.join(sorted(self.columns))}")
            self.used.add(value)
            return lambda get: get(value)
        raise self.fail(f"{value!r} at token {self.i} is no number, column or '('")


def _number(values: Any) -> Any:
    """``values`` as numbers: a condition counts 1 where it holds (numpy has no ``-`` of bools)."""
    array = np.asarray(values)
    return array.astype(np.int64) if array.dtype == np.bool_ else values


def _arithmetic(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda a, b: fn(_number(a), _number(b))


def _bool(values: Any) -> np.ndarray:
    return np.asarray(values).astype(bool)


def _logical_or(a: Any, b: Any) -> Any:
    return np.logical_or(_bool(a), _bool(b))


def _logical_and(a: Any, b: Any) -> Any:
    return np.logical_and(_bool(a), _bool(b))


def _binary(fn: Callable[[Any, Any], Any], left: Node, right: Node) -> Node:
    """The node ``fn(left, right)``, both evaluated on the same columns."""

    def node(get: Callable[[str], np.ndarray]) -> Any:
        return fn(left(get), right(get))

    return node


def parse_where(text: str, columns: Sequence[str]) -> tuple[Node, set[str]]:
    """Parse predicate ``text`` over ``columns`` -> (the predicate, the columns it reads).

    Raises:
        InvalidSelectionError: A syntax error or an unknown column (one line, naming it).
    """
    try:
        parser = _Parser(text, columns)
        node = parser.parse()
    except RecursionError:  # each "(", "not" or "-" is a level of the descent
        raise _too_deep(text) from None
    return node, parser.used


def _too_deep(text: str) -> InvalidSelectionError:
    return InvalidSelectionError(
        f"--where {text[:40]!r}... ({len(text)} characters) is nested or chained too deeply to read",
        hint="write a shorter predicate (for a list of episodes use --episodes 0,5,9-20)",
    )


def select_where(text: str, table: Any) -> np.ndarray:
    """The positions (ascending, int64) of the episodes of ``table`` (an
    :class:`~rlds_cli.cache.episode_table.EpisodeTable`) for which ``text`` holds; only the
    columns it names are computed.

    Raises:
        InvalidSelectionError: A bad predicate, or one that is not true or false per episode.
    """
    n = len(table)
    names = [*table.names, "episode"]
    node, _ = parse_where(text, names)

    def get(name: str) -> np.ndarray:
        if name == "episode":
            return np.arange(n, dtype=np.int64)
        values = np.asarray(table[name])
        if values.ndim != 1:
            values = values.reshape(n, -1)[:, 0]
        return values

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        try:
            result = np.asarray(node(get))
        except RecursionError:  # a chain "a + a + ... + a" is evaluated one level per operator
            raise _too_deep(text) from None
    if result.dtype != np.bool_:
        raise InvalidSelectionError(
            f"--where {text!r} is a number, not a condition (compare it: ... > 0)", hint=_WHERE_HINT
        )
    return np.flatnonzero(np.broadcast_to(result, (n,))).astype(np.int64)
