"""D4RL's reference scores, for scripts/gen_registry.py (the registry's ``ref_min_score`` and
``ref_max_score`` of D4RL entries).

Transcribed from Farama-Foundation/D4RL ``d4rl/infos.py`` at commit 61b0d257d375f9e1db07d0f474d9e7caf1df7347
(the same numbers at 0ace16de1795f9e99b0e413f3617f797a997b57e): ``REF_MIN_SCORE`` and
``REF_MAX_SCORE``, plus the two loops at the end of that file, which give the Gym-MuJoCo v1/v2
ids the scores of ``<env>-random-v0`` and the Adroit v1 ids those of ``<env>-human-v0``. An id
that file does not name gets no scores (e.g. ``ant-random-expert-v0``, the ``*-longhorizon``,
``antmaze-*-v1`` and ``antmaze-eval-*`` ids, ``maze2d-eval-*``): never guessed.
"""

from __future__ import annotations

SOURCE = "Farama-Foundation/D4RL d4rl/infos.py@61b0d257 (REF_MIN_SCORE, REF_MAX_SCORE)"

_MUJOCO = ("random", "medium", "expert", "medium-replay", "medium-expert")
_BULLET = ("random", "medium", "expert", "medium-expert", "medium-replay")
_ANTMAZE = ("umaze", "umaze-diverse", "medium-play", "medium-diverse", "large-play", "large-diverse")

#: (ids, ref_min_score, ref_max_score): ids that share both numbers in D4RL's tables.
_GROUPS: list[tuple[tuple[str, ...], float, float]] = [
    (("maze2d-open-v0",), 0.01, 20.66),
    (("maze2d-umaze-v1",), 23.85, 161.86),
    (("maze2d-medium-v1",), 13.13, 277.39),
    (("maze2d-large-v1",), 6.7, 273.99),
    (("maze2d-open-dense-v0",), 11.17817, 27.166538620695782),
    (("maze2d-umaze-dense-v1",), 68.537689, 193.66285642381482),
    (("maze2d-medium-dense-v1",), 44.264742, 297.4552547777125),
    (("maze2d-large-dense-v1",), 30.569041, 303.4857382709002),
    (("minigrid-fourrooms-v0", "minigrid-fourrooms-random-v0"), 0.01442, 2.89685),
    (("pen-human-v0", "pen-cloned-v0", "pen-expert-v0"), 96.262799, 3076.8331017826877),
    (("hammer-human-v0", "hammer-cloned-v0", "hammer-expert-v0"), -274.856578, 12794.134825156867),
    (("relocate-human-v0", "relocate-cloned-v0", "relocate-expert-v0"), -6.425911, 4233.877797728884),
    (("door-human-v0", "door-cloned-v0", "door-expert-v0"), -56.512833, 2880.5693087298737),
    (tuple(f"halfcheetah-{d}-v0" for d in _MUJOCO),
     -280.178953, 12135.0),
    (tuple(f"walker2d-{d}-v0" for d in _MUJOCO),
     1.629008, 4592.3),
    (tuple(f"hopper-{d}-v0" for d in _MUJOCO),
     -20.272305, 3234.3),
    (tuple(f"ant-{d}-v0" for d in _MUJOCO),
     -325.6, 3879.7),
    (tuple(f"antmaze-{m}-v{v}" for v in (0, 2) for m in _ANTMAZE),
     0.0, 1.0),
    (("kitchen-complete-v0", "kitchen-partial-v0", "kitchen-mixed-v0"), 0.0, 4.0),
    (("flow-ring-random-v0", "flow-ring-controller-v0"), -165.22, 24.42),
    (("flow-merge-random-v0", "flow-merge-controller-v0"), 118.67993, 330.03179),
    (("carla-lane-v0",), -0.8503839912088142, 1023.5784385429523),
    (("carla-town-v0",), -114.81579500772153, 2440.1772022247314),
    (tuple(f"bullet-halfcheetah-{d}-v0" for d in _BULLET),
     -1275.766996, 2381.6725),
    (tuple(f"bullet-hopper-{d}-v0" for d in _BULLET),
     20.058972, 1441.8059623430963),
    (tuple(f"bullet-ant-{d}-v0" for d in _BULLET),
     373.705955, 2650.495),
    (tuple(f"bullet-walker2d-{d}-v0" for d in _BULLET),
     16.523877, 1623.6476303317536),
    (("bullet-maze2d-open-v0",), 8.75, 64.15),
    (("bullet-maze2d-umaze-v0",), 32.46, 153.99),
    (("bullet-maze2d-medium-v0",), 14.87, 238.05),
    (("bullet-maze2d-large-v0",), 1.82, 285.92),
]  # fmt: skip


def reference_scores() -> dict[str, tuple[float, float]]:
    """D4RL id -> (ref_min_score, ref_max_score), after infos.py's own loops."""
    scores = {i: (lo, hi) for ids, lo, hi in _GROUPS for i in ids}
    # infos.py: Gym-MuJoCo v1 and v2 datasets use the scores of '<env>-random-v0'
    for env in ("halfcheetah", "hopper", "walker2d", "ant"):
        for d in ("random", "medium", "expert", "medium-replay", "full-replay", "medium-expert"):
            for v in (1, 2):
                scores[f"{env}-{d}-v{v}"] = scores[f"{env}-random-v0"]
    # infos.py: Adroit v1 datasets use the scores of '<env>-human-v0'
    for env in ("hammer", "pen", "relocate", "door"):
        for d in ("human", "expert", "cloned"):
            scores[f"{env}-{d}-v1"] = scores[f"{env}-human-v0"]
    return scores
