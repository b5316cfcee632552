"""LeRobot rows -> TED transitions (docs/formats.md, "LeRobot"): row ``t`` is ``(frame t, action
t, next.reward[t]) -> frame t + 1``; an episode's last row is kept with its final observation
repeating the last frame (``last_step="keep"``) or dropped with its reward and success moved onto
the row before (``"drop"``); episodes end terminated where ``next.success`` is true on the last
frame, truncated otherwise."""

from __future__ import annotations

import numpy as np

from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.lerobot.features import FeaturePlan
from rlds_cli.formats.lerobot.tables import Episode
from rlds_cli.formats.packing import Piece
from rlds_cli.frames.encoded import join_rows


def split_part(
    ep: Episode,
    seg: dict[str, np.ndarray],
    last: bool,
    plan: FeaturePlan,
    last_step: str,
    report: ConversionReport,
) -> Piece:
    """One segment as a piece of its episode for the packer: step and observation columns by TED
    key, the last-row rule applied, the episode's end terminated where ``next.success`` is true on
    the last frame, truncated otherwise."""
    steps = {f.name: seg[f.name] for f in plan.features if f.kind in ("action", "reward", "info")}
    obs = {f.name: seg[f.name] for f in plan.features if f.kind in ("observation", "video", "image")}
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
        obs = {k: join_rows([v, v[-1:]]) for k, v in obs.items()}
    keyed_steps = {f.key: steps[f.name] for f in plan.features if f.kind in ("action", "reward", "info")}
    if "next/reward" not in keyed_steps:
        keyed_steps["next/reward"] = np.zeros((len(next(iter(steps.values()))), 1), np.float32)
    if last and last_step == "keep":
        report.synthesized_final_observations += 1
    return Piece(
        f"episode {ep.index}",
        {f.key: obs[f.name] for f in plan.features if f.kind in ("observation", "video", "image")},
        keyed_steps,
        success,
        source_id=ep.index,
        final_known=last_step == "drop",
        last=last,
    )


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
