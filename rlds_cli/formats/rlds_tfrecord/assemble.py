"""Assembling decoded pieces into episodes: the flag checks, the last-step rule, text tables,
per-episode values; the pieces go to :class:`~rlds_cli.formats.packing.BlockPacker`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.packing import Piece
from rlds_cli.formats.rlds_tfrecord.columns import _Column
from rlds_cli.formats.rlds_tfrecord.decode import _Decoded, _PieceRef
from rlds_cli.formats.untrusted import UnsafeSourceError, side_array_max_bytes


class _Assembly:
    """The assembling half of :class:`~rlds_cli.formats.rlds_tfrecord.reader.RldsTFRecordReader`:
    turns each decoded piece into the rows it adds and packs them into blocks. The reader sets
    the state below in its constructor (and ``_episode_values`` while it scans)."""

    report: ConversionReport
    last_step: str
    obs_keys: list[str]
    action_keys: list[str]
    episode_columns: list[_Column]
    _counts: dict[str, int]
    _rule_note: int
    _text_tables: dict[str, dict[str, int]]
    _episode_text: dict[str, dict[str, int]]
    _text_bytes: int
    _episode_values: dict[int, dict[str, Any]]
    _episode_arrays: dict[str, list[np.ndarray]]
    _shapes: dict[str, tuple[tuple[int, ...], str]]

    def _index(self, table: dict[str, int], text: str, where: str, key: str) -> int:
        index = table.get(text)
        if index is None:
            self._text_bytes += len(text.encode("utf-8", errors="replace")) + 8
            limit = side_array_max_bytes()
            if self._text_bytes > limit:
                raise UnsafeSourceError(
                    f"{where}: the distinct strings of {key!r} and the other text features take over "
                    f"{limit:,} bytes, the limit for tables kept in the manifest",
                    hint="if you trust the dataset, raise RLDS_SIDE_ARRAY_MAX_BYTES",
                )
            index = table[text] = len(table)
        return index

    def _check_flags(self, decoded: _Decoded) -> None:
        ref = decoded.ref
        rows = np.arange(ref.start, ref.stop)
        first = decoded.flags.get("is_first")
        if first is not None:
            late = rows[first & (rows > 0)]
            if len(late):
                raise SourceFormatError(
                    f"{ref.where}: is_first is set on step {int(late[0])} of {ref.steps}; rlds reads one "
                    "episode per record (is_first on step 0 only)"
                )
            if ref.start == 0 and not first[0]:
                self._counts["first"] += 1
        for name in ("is_last", "is_terminal"):
            flag = decoded.flags.get(name)
            if flag is None:
                continue
            early = rows[flag & (rows < ref.steps - 1)]
            if len(early):
                raise SourceFormatError(
                    f"{ref.where}: {name} is set on step {int(early[0])} of {ref.steps}, before the last step"
                )
        last = decoded.flags.get("is_last")
        if last is not None and ref.stop == ref.steps and not last[-1]:
            self._counts["last"] += 1

    def _check_shapes(self, columns: dict[str, np.ndarray], where: str) -> None:
        """Every piece's rows have the shape and dtype of the first piece's (sizes features.json
        leaves unknown are fixed by the first episode)."""
        for key, rows in columns.items():
            spec = (tuple(rows.shape[1:]), rows.dtype.str)
            first = self._shapes.setdefault(key, spec)
            if spec != first:
                raise SourceFormatError(
                    f"{where}: {key!r} has rows of shape {list(spec[0])}, earlier episodes {list(first[0])}"
                )

    def _last_is_observation(self, decoded: _Decoded) -> bool:
        """Whether the last step is the final observation only (the last-step rule)."""
        if self.last_step != "auto":
            return self.last_step == "observation"
        keys = [*self.action_keys, "next/reward"]
        return all(not np.any(decoded.columns[k][-1] != 0) for k in keys if k in decoded.columns)

    def _assemble(self, decoded: _Decoded) -> Piece | None:
        """A decoded piece as the rows it adds (the last-step rule applied on an episode's last
        piece); ``None`` when it adds none (an empty episode, or one step that is only a final
        observation)."""
        ref = decoded.ref
        if ref.steps == 0:
            self.report.dropped_episodes += 1
            self._episode_values.pop(ref.episode, None)
            return None
        if ref.start == 0:
            self.report.source_rows += ref.steps
        self._check_flags(decoded)
        columns = dict(decoded.columns)
        for key, texts in decoded.texts.items():
            table = self._text_tables[key]
            index = np.array([self._index(table, s, ref.where, key) for s in texts], np.int64)
            columns[key] = index.reshape(len(index), *(() if key in self.obs_keys else (1,)))
        self._check_shapes(columns, ref.where)
        obs = {k: columns[k] for k in self.obs_keys}
        steps = {k: v for k, v in columns.items() if k not in obs}
        if "next/reward" not in steps:
            steps["next/reward"] = np.zeros((len(next(iter(obs.values()))), 1), np.float32)
        if ref.stop < ref.steps:
            return Piece(ref.where, obs, steps, False, source_id=ref.episode, last=False)
        terminated = bool(decoded.flags["is_terminal"][-1]) if "is_terminal" in decoded.flags else False
        observation = self._last_is_observation(decoded)
        if observation:
            self._counts["observation"] += 1
            if any(np.any(steps[k][-1] != 0) for k in [*self.action_keys, "next/reward"] if k in steps):
                self.report.dropped_rows += 1  # a forced rule discarded a real action or reward
            if ref.steps == 1:
                self.report.dropped_episodes += 1
                self._counts["dropped"] += 1
                self._episode_values.pop(ref.episode, None)
                self._update_notes()
                return None
            steps = {k: v[:-1] for k, v in steps.items()}
        else:
            self._counts["transition"] += 1
            self.report.synthesized_final_observations += 1
            obs = {k: np.concatenate([v, v[-1:]], axis=0) for k, v in obs.items()}
        self._keep_episode_values(ref)
        self._update_notes()
        return Piece(ref.where, obs, steps, terminated, source_id=ref.episode, final_known=observation)

    def _keep_episode_values(self, ref: _PieceRef) -> None:
        values = self._episode_values.pop(ref.episode, {})
        for col in self.episode_columns:
            value = values[col.key]
            if col.text:
                value = np.int64(self._index(self._episode_text[col.key], value, ref.where, col.key))
            self._episode_arrays[col.key].append(np.asarray(value))

    def _update_notes(self) -> None:
        """The rule's notes, kept current episode by episode (a conversion of ``--episodes A:B``
        stops reading early)."""
        c = self._counts
        text = (
            f"last_step={self.last_step!r}: {c['observation']} episode(s) end with a step that is the "
            f"final observation only (final_known = true), {c['transition']} keep their last step as a "
            "transition whose next observation is unknown (final_known = false; the final observation "
            "repeats the last one)"
        )
        if c["dropped"]:
            text += f"; {c['dropped']} episode(s) of one step had no transition and were dropped"
        if c["first"]:
            text += f"; {c['first']} episode(s) do not set is_first on step 0"
        if c["last"]:
            text += f"; {c['last']} episode(s) do not set is_last on their last step"
        self.report.notes[self._rule_note] = text
