"""Rows of the checkpoints -> transitions: zero padding dropped, episodes ended (terminated, or
truncated at the write cursor and the cuts), blocks packed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.formats.atari_dqn.plan import Rows
from rlds_cli.formats.base import StepBlock

if TYPE_CHECKING:  # the reader feeds the decider: imported for the annotation only
    from rlds_cli.formats.atari_dqn.reader import AtariDQNReader


def close_positioned(future: Any) -> None:
    """Close the files a background positioning opened, once it is done (whatever its outcome)."""
    if not future.cancelled() and future.exception() is None:
        for s in future.result():
            s.close()


class Decider:
    """Turns the chronological row stream into blocks, two rows behind what it has read (a row's fate
    depends on the next row, whose fate depends on the row after)."""

    def __init__(self, reader: AtariDQNReader) -> None:
        self.reader = reader
        self.pad_rows = reader.stack_size - 1
        self.carry: Rows | None = None
        self.index = 0  # stream index of the next row fed
        self.last_terminal = -1  # stream index of the last terminal row (-1: none since a cut)
        self.linked = False  # whether the last row fed links to the next
        self.steps = 0

    def feed(self, rows: Rows) -> StepBlock | None:
        self._mark_padding(rows)
        window = rows if self.carry is None else Rows.join(self.carry, rows)
        block, decided = self._decide(window, final=False)
        self.carry = window.cut(decided)
        return block

    def finish(self) -> StepBlock | None:
        if self.carry is None or not len(self.carry):
            return None
        block, _ = self._decide(self.carry, final=True)
        self.carry = None
        return block

    def _mark_padding(self, rows: Rows) -> None:
        """Padding rows: the ``stack_size - 1`` rows after a terminal, or with add index below
        ``stack_size - 1`` (``rows.pad`` holds the latter on entry), when all zero."""
        n = len(rows)
        index = self.index + np.arange(n)
        prior = self.last_terminal if self.linked else -1
        last = np.maximum.accumulate(np.concatenate([[prior], np.where(rows.term, index, -1)]))
        before = last[:-1]
        at_start = rows.pad
        expected = at_start | ((before >= 0) & (index - before <= self.pad_rows))
        rows.pad = np.zeros(n, bool)
        at = np.flatnonzero(expected)
        if len(at):
            zero = (
                ~rows.obs[at].reshape(len(at), -1).any(axis=1)
                & (rows.action[at] == 0)
                & (rows.reward[at] == 0)
                & ~rows.term[at]
            )
            rows.pad[at[zero]] = True
            data = at[~zero & ~rows.invalid[at]]
            self.reader.padding_with_data += int(np.count_nonzero(~at_start[data]))
            for i in np.unique(rows.ckpt[data[at_start[data]]]).tolist():
                self.reader.start_with_data.add(self.reader.checkpoints[i].number)
        self.last_terminal = int(last[-1])
        self.index += n
        self.linked = bool(rows.link[-1]) if n else self.linked

    def _decide(self, w: Rows, *, final: bool) -> tuple[StepBlock | None, int]:
        """Decide rows ``[0, d)`` of window ``w`` (all when ``final``, else all but the last two); returns
        their transitions' block and ``d``."""
        m = len(w)
        d = m if final else max(m - 2, 0)
        if d == 0:
            return None, 0
        real = ~w.pad
        has_next = np.zeros(m, bool)
        has_next[:-1] = w.link[:-1] & real[1:]
        step = real & ~w.invalid & (w.term | has_next)
        next_step = np.zeros(m, bool)
        next_step[:-1] = step[1:]
        end = step & (w.term | ~next_step)
        self._count(w, step, d)
        rows = np.flatnonzero(step[:d])
        if not len(rows):
            return None, d
        ends = rows[end[rows]]
        at = np.searchsorted(rows, ends)
        finals = np.where(w.term[ends], ends, ends + 1)
        flat = np.insert(rows, at + 1, finals)
        term = w.term[rows]
        for i in np.unique(w.ckpt[rows]).tolist():
            ck = self.reader.checkpoints[i]
            if ck.first_step < 0:
                ck.first_step = self.steps + int(np.argmax(w.ckpt[rows] == i))
        self.steps += len(rows)
        self.reader.report.synthesized_final_observations += int(np.count_nonzero(w.term[ends]))
        block = StepBlock(
            steps={
                "action": w.action[rows],
                "next/reward": w.reward[rows][:, None],
                "next/terminated": term[:, None],
                "next/truncated": (end[rows] & ~term)[:, None],
            },
            observations={"observation": w.obs[flat]},
            ends=at.astype(np.int64),
            final_known=~w.term[ends],
        )
        return block, d

    def _count(self, w: Rows, step: np.ndarray, d: int) -> None:
        """Add the fate of rows ``[0, d)`` to the reader's and each checkpoint's counters."""
        invalid = w.invalid[:d]
        fates = {
            "steps": step[:d],
            "invalid_range": invalid,
            "padding": w.pad[:d] & ~invalid,
            "no_next_frame": ~w.pad[:d] & ~invalid & ~step[:d],
        }
        ckpt = w.ckpt[:d]
        for fate, mask in fates.items():
            per = np.bincount(ckpt[mask], minlength=len(self.reader.checkpoints))
            for i in np.flatnonzero(per).tolist():
                self.reader.checkpoints[i].stats[fate] += int(per[i])
            if fate != "steps":
                self.reader.dropped[fate] += int(mask.sum())
                self.reader.report.dropped_rows += int(mask.sum())
