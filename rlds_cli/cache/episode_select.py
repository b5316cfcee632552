"""Episode selection: an index list (``"0,5,9-20"``) or a predicate (``"length >= 50 and return > 100"``).

Both give ascending episode positions, for a view
(:func:`rlds_cli.cache.derive.create_selection`) or a loader. The predicate parser (no ``eval``)
accepts numbers, the columns of :attr:`Dataset.episodes <rlds_cli.cache.dataset.Dataset.episodes>`
and ``episode`` (the position), ``+ - * /``, ``< <= > >= == !=``, ``and``, ``or``, ``not`` and
parentheses, and evaluates on whole columns with numpy (milliseconds for a million episodes).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlds_cli.errors import InvalidSelectionError

__all__ = ["parse_episode_list", "parse_where", "select_where"]

_LIST_HINT = "episodes are a list of positions and ranges, e.g. 0,5,9-20 (or one range A:B)"
_WHERE_HINT = "e.g. --where \"length >= 50 and return > 100\" (columns: see 'rlds inspect')"


def parse_episode_list(spec: str | Sequence[int], num_episodes: int) -> np.ndarray:
    """``"0,5,9-20"`` (positions and inclusive ranges ``A-B``, negative positions counting from
    the end) or a sequence of ints -> the distinct positions, ascending (int64).

    Raises:
        InvalidSelectionError: A part is no number or range, a position is outside the dataset,
            a range runs backwards, or nothing is selected.
    """
    if isinstance(spec, str):
        # one flag per episode, not a list of every position: "0-999999,0-999999,..." stays bounded
        chosen = np.zeros(max(0, num_episodes), bool)
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            m = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", part)
            if m is not None:
                a, b = (_position(_integer(g, spec), num_episodes, spec) for g in m.groups())
                if b < a:
                    raise InvalidSelectionError(f"episode range {part!r} runs backwards", hint=_LIST_HINT)
                chosen[a : b + 1] = True
            elif re.fullmatch(r"-?\d+", part):
                chosen[_position(_integer(part, spec), num_episodes, spec)] = True
            else:
                raise InvalidSelectionError(
                    f"{part!r} in --episodes {spec!r} is no episode position or range", hint=_LIST_HINT
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
        raise InvalidSelectionError(f"--episodes {spec!r} selects no episode", hint=_LIST_HINT)
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


# ----------------------------------------------------------------------------- --where

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
            raise self.fail(f"unexpected {self.toks[self.i][1]!r} at token {self.i + 1}")
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
            number = float(value)
            return lambda get: number
        if kind == "name" and value not in _KEYWORDS:
            if value in ("true", "false"):
                flag = value == "true"
                return lambda get: flag
            if value not in self.columns:
                raise self.fail(f"no column {value!r}; the columns are {', '.join(sorted(self.columns))}")
            self.used.add(value)
            return lambda get: get(value)
        raise self.fail(f"unexpected {value!r} at token {self.i}")


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
