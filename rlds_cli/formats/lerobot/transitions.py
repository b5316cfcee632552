"""LeRobot rows -> TED transitions (docs/formats.md, "LeRobot"): row ``t`` is ``(frame t, action
t, next.reward[t]) -> frame t + 1``; an episode's last row is kept with its final observation
repeating the last frame (``last_step="keep"``) or dropped with its reward and success moved onto
the row before (``"drop"``); episodes end terminated where ``next.success`` is true on the last
frame, truncated otherwise."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlds_cli.formats.base import ConversionReport, StepBlock
from rlds_cli.formats.lerobot.features import FeaturePlan
from rlds_cli.formats.lerobot.tables import Episode


@dataclass
class Part:
    """A run of rows of one episode, ready to pack: step columns and observation columns (plus
    the final observation when ``last``), by LeRobot feature name."""

    episode: int
    steps: dict[str, np.ndarray]
    observations: dict[str, np.ndarray]
    last: bool
    success: bool

    @property
    def num_steps(self) -> int:
        """The number of transitions (rows kept) in the part."""
        return len(next(iter(self.steps.values())))


def split_part(
    ep: Episode,
    seg: dict[str, np.ndarray],
    last: bool,
    plan: FeaturePlan,
    last_step: str,
    report: ConversionReport,
) -> Part:
    """One segment split into step and observation columns, with the last-row rule applied."""
    steps = {f.name: seg[f.name] for f in plan.features if f.kind in ("action", "reward", "info")}
    obs = {f.name: seg[f.name] for f in plan.features if f.kind in ("observation", "video")}
    success = last and plan.success and bool(np.asarray(seg["next.success"][-1]).any())
    if last and last_step == "drop":
        # the last row has no next frame: drop its transition, frame L-1 is the real final
        # observation, and its reward and success move onto transition L-2 (the return is kept)
        if "next.reward" in steps:
            reward = steps["next.reward"].copy()
            reward[-2] += reward[-1]
            steps["next.reward"] = reward
        if plan.success:
            flag = steps["next.success"].copy()
            flag[-2] |= flag[-1]
            steps["next.success"] = flag
        steps = {k: v[:-1] for k, v in steps.items()}
        report.dropped_rows += 1
    elif last:  # the final observation is not recorded: repeat the last frame (final_known = false)
        obs = {k: np.concatenate([v, v[-1:]], axis=0) for k, v in obs.items()}
    return Part(ep.index, steps, obs, last, success)


def rule_notes(plan: FeaturePlan, last_step: str, report: ConversionReport) -> None:
    """The notes that depend only on the dataset's columns, written before any block (a
    conversion of ``--episodes A:B`` stops reading early, so nothing waits for the end)."""
    if last_step == "drop":
        report.notes.append(
            "last_step='drop': each episode's last frame has no next frame, so its transition is "
            "dropped (counted in dropped_rows); that frame is the real final observation, and its "
            "next.reward and next.success move onto the transition before"
        )
    else:
        report.notes.append(
            "LeRobot stores no observation after an episode's last frame: its last transition is kept "
            "and the final observation repeats the last frame (final_known = false)"
        )
    if not any(f.kind == "reward" for f in plan.features):
        report.notes.append("no next.reward column: next/reward = 0")
    report.notes.append(
        "episode ends: terminated where next.success is true on the last frame, else truncated"
        if plan.success
        else "episode ends: no next.success column, so every episode ends truncated"
    )


def pack(parts: list[Part], plan: FeaturePlan, last_step: str, report: ConversionReport) -> StepBlock:
    """Parts (whole episodes or runs of one) -> one TED block: the episode ends are marked
    terminated where ``next.success`` is true on the last frame, truncated otherwise."""
    n = sum(p.num_steps for p in parts)
    ends = np.cumsum([p.num_steps for p in parts]) - 1
    ends = ends[[p.last for p in parts]].astype(np.int64)
    success = np.array([p.success for p in parts if p.last], bool)
    steps: dict[str, np.ndarray] = {}
    observations: dict[str, np.ndarray] = {}
    for f in plan.features:
        if f.kind in ("observation", "video"):
            observations[f.key] = np.concatenate([p.observations[f.name] for p in parts], axis=0)
        elif f.kind in ("action", "reward", "info"):
            steps[f.key] = np.concatenate([p.steps[f.name] for p in parts], axis=0)
    if "next/reward" not in steps:
        steps["next/reward"] = np.zeros((n, 1), np.float32)
    term = np.zeros((n, 1), bool)
    trunc = np.zeros((n, 1), bool)
    term[ends, 0] = success
    trunc[ends, 0] = ~success
    steps["next/terminated"] = term
    steps["next/truncated"] = trunc
    if last_step == "keep":
        report.synthesized_final_observations += len(ends)
    return StepBlock(
        steps=steps,
        observations=observations,
        ends=ends,
        final_known=np.full(len(ends), last_step == "drop"),
        episode_ids=np.array([p.episode for p in parts if p.last], np.int64),
    )
