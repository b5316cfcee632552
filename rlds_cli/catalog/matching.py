"""How a search pattern matches names and descriptions, and how well: ``rlds list PATTERN`` and
``rlds list --remote PATTERN``.

A pattern holding ``*``, ``?`` or ``[`` is a glob over the whole text; any other pattern is a
substring. Both ignore case. A registry search ranks what it finds, so that ``hopper`` lists
the Hopper datasets before ``atari_dqn/ChopperCommand/1``, whose id merely contains the letters:
see :func:`match_rank`.
"""

from __future__ import annotations

import fnmatch

__all__ = ["match_rank", "matches"]

#: Ranks of :func:`match_rank`, best first.
EXACT, PREFIX, WORD, INSIDE, DESCRIPTION_WORD, DESCRIPTION = range(6)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def matches(pattern: str, *texts: str) -> bool:
    """Whether any of ``texts`` matches ``pattern``, ignoring case: as a glob over the whole text
    when the pattern holds ``*``, ``?`` or ``[`` (``D4RL/door/*``), else as a substring."""
    needle = pattern.lower()
    if _is_glob(pattern):
        return any(fnmatch.fnmatchcase(t.lower(), needle) for t in texts)
    return any(needle in t.lower() for t in texts)


def _starts_word(text: str, at: int) -> bool:
    """Whether ``text[at:]`` begins a word: at the start, after a separator (``-``, ``/``,
    ``_``, a space, ...), or at a capital after a lower-case letter or a digit
    (``ChopperCommand``: ``Command`` starts a word, ``hopper`` does not)."""
    if at == 0:
        return True
    before, here = text[at - 1], text[at]
    if not before.isalnum():
        return True
    return here.isupper() and (before.islower() or before.isdigit())


def _word_match(needle: str, text: str) -> bool:
    """Whether ``needle`` (lower case) occurs in ``text`` at the start of a word."""
    lowered = text.lower()
    at = lowered.find(needle)
    while at >= 0:
        if _starts_word(text, at):
            return True
        at = lowered.find(needle, at + 1)
    return False


def match_rank(pattern: str, names: list[str], description: str = "") -> int | None:
    """How well an entry matches ``pattern`` (lower is better), or ``None`` when it does not.

    ``names`` are its id and aliases. For a substring pattern: :data:`EXACT` (a name is the
    pattern), :data:`PREFIX` (a name starts with it), :data:`WORD` (it starts a word of a name:
    ``bullet-hopper-medium-v0``), :data:`INSIDE` (it is inside a word of a name:
    ``ChopperCommand``), then the same two for the description alone. For a glob: :data:`EXACT`
    when a name matches, :data:`DESCRIPTION` when only the description does.
    """
    needle = pattern.lower()
    if _is_glob(pattern):
        if any(fnmatch.fnmatchcase(n.lower(), needle) for n in names):
            return EXACT
        return DESCRIPTION if description and fnmatch.fnmatchcase(description.lower(), needle) else None
    lowered = [n.lower() for n in names]
    if needle in lowered:
        return EXACT
    if any(n.startswith(needle) for n in lowered):
        return PREFIX
    if any(_word_match(needle, n) for n in names):
        return WORD
    if any(needle in n for n in lowered):
        return INSIDE
    if _word_match(needle, description):
        return DESCRIPTION_WORD
    return DESCRIPTION if needle in description.lower() else None
