"""TED invariant checks of a cached dataset (``rlds inspect NAME --check``).

Each check reads the dataset in bounded blocks (:mod:`rlds_cli.cache.blocks`), deriving TED keys
with the training code (:class:`~rlds_cli.cache.reader.TedReader`), so memory does not grow with
the dataset; each violation names the episode and the step inside it.

Checks:

* ``files``: every stored file (each ``.npy``, each zarr chunk) is there at its full size,
  checked without reading data. If one is missing, the data checks are not run.
* ``index``: episodes are contiguous, non-empty and cover every step.
* ``done``: ``next/done == next/terminated | next/truncated``, and it is true exactly at the
  last step of every episode.
* ``continuity``: inside an episode, ``next/<key>[t] == <key>[t + 1]`` for every
  observation-like key (NaN equal to NaN).
* ``counts``: steps and episodes match what the source declared (e.g. Minari's
  ``total_steps``), where recorded (``source.checks.expected``); for an ``--episodes A:B``
  conversion, the episode count is the selection's share of the declared total. Per-episode
  source arrays (``<format>/episode_<what>``) have one row per episode.
* ``nan``: every key has exactly as many NaN values as the source had at conversion
  (``source.checks.nan_counts``).
* ``digest``: every stored array, the episode index and ``source_metadata.npz`` match the digest
  recorded at write time, so any changed value is found and its file named
  (:mod:`rlds_cli.cache.digest`); a view's arrays are checked against its parent's digests.
  Skipped, never failed, for datasets without recorded digests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlds_cli._util.rows import rows_equal
from rlds_cli.cache import ted
from rlds_cli.cache.blocks import Budget, blocks, ted_blocks
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import is_episode_array
from rlds_cli.cache.reader import Episodes
from rlds_cli.errors import CorruptDatasetError, DatasetReplacedError, InvalidSelectionError
from rlds_cli.formats.select import parse_episodes


@dataclass(frozen=True)
class Violation:
    """One broken invariant.

    Attributes:
        check: Which check (``index``, ``done``, ``continuity``, ``counts``, ``nan``).
        message: What is wrong, in one line.
        episode: The episode (position in the dataset), when it concerns one.
        step: The step inside that episode, when it concerns one.
        key: The TED key concerned, if any.
    """

    check: str
    message: str
    episode: int | None = None
    step: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = []
        if self.episode is not None:
            where.append(f"episode {self.episode}")
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.key is not None:
            where.append(self.key)
        return f"[{self.check}] {', '.join(where) + ': ' if where else ''}{self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "episode": self.episode,
            "step": self.step,
            "key": self.key,
            "message": self.message,
        }


@dataclass
class CheckReport:
    """The result of :func:`check_dataset`.

    Attributes:
        violations: Every violation found (up to ``limit``).
        truncated: More violations existed than were kept.
        checks: The checks that ran.
        skipped: Checks that did not run, with the reason (e.g. ``digest`` where none is
            recorded).
    """

    violations: list[Violation] = field(default_factory=list)
    truncated: bool = False
    checks: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": self.checks,
            "skipped": self.skipped,
            "violations": [v.to_dict() for v in self.violations],
            "truncated": self.truncated,
        }


class _Collector:
    def __init__(self, ds: Dataset, limit: int) -> None:
        self.ds, self.limit = ds, limit
        self.report = CheckReport()

    def add(self, check: str, message: str, step: int | None = None, key: str | None = None) -> None:
        if len(self.report.violations) >= self.limit:
            self.report.truncated = True
            return
        episode = within = None
        if step is not None:
            episode = int(self.ds.episode_of(np.array([step]))[0])
            within = step - int(self.ds.episode_index["start"][episode])
        self.report.violations.append(Violation(check, message, episode, within, key))

    def add_episode(self, check: str, message: str, episode: int) -> None:
        if len(self.report.violations) >= self.limit:
            self.report.truncated = True
            return
        self.report.violations.append(Violation(check, message, episode))

    def add_steps(self, check: str, message: str, steps: np.ndarray, key: str | None = None) -> None:
        for s in steps[: max(0, self.limit - len(self.report.violations) + 1)]:
            self.add(check, message, int(s), key)


def check_dataset(ds: Dataset, limit: int = 1000, budget: Budget | None = None) -> CheckReport:
    """Check the TED invariants of ``ds``.

    Args:
        ds: An open dataset.
        limit: Violations kept at most (the report says when there were more).
        budget: The bytes of each block read (default
            :data:`~rlds_cli.cache.blocks.BLOCK_BYTES`); it records the largest block read.

    Returns:
        A :class:`CheckReport`; ``report.ok`` is true when nothing is wrong.

    A growing dataset's segments retired (evicted or merged away) while it is checked lose their
    files, which is no damage: their problems are dropped, and where a read met one, the view is
    refreshed and checked again.

    Raises:
        DatasetReplacedError: A growing dataset's segments were retired (evicted or merged away,
            with a grace period shorter than the check) during each of :data:`ATTEMPTS` checks of
            a refreshed view.
    """
    growing = hasattr(ds, "check_segments")  # what it reads may be retired under it
    for _ in range(ATTEMPTS if growing else 1):
        try:
            return _check_once(ds, limit, budget)
        except DatasetReplacedError:
            if not growing:
                raise
            ds.refresh()  # type: ignore[attr-defined]
    raise DatasetReplacedError(
        f"dataset {ds.name!r}: segments were evicted or merged away during each of {ATTEMPTS} checks",
        hint="check it while its writers pause, or give it a longer grace_seconds; or check a snapshot "
        f"('rlds export {ds.name} DIR --to torchrl', then 'rlds download DIR')",
    )


#: Checks of a growing dataset's refreshed view, when segments are retired under one.
ATTEMPTS = 3


def _check_once(ds: Dataset, limit: int, budget: Budget | None) -> CheckReport:
    c = _Collector(ds, limit)
    budget = budget if budget is not None else Budget()
    c.report.checks.append("files")
    for problem in ds.check_files():
        c.add("files", problem)
    if c.report.violations:
        return c.report  # the data checks would only fail on the same damage
    for name, fn in (
        ("index", _check_index),
        ("done", _check_done),
        ("continuity", _check_continuity),
        ("counts", _check_counts),
        ("nan", _check_nans),
    ):
        c.report.checks.append(name)
        fn(ds, c, budget)
    # last: the checks above locate broken invariants; this one finds any changed value
    _check_digests(ds, c, budget)
    return c.report


def _check_digests(ds: Dataset, c: _Collector, budget: Budget) -> None:
    """Recompute every content digest; one violation per array that differs, naming its file."""
    from rlds_cli.cache.digest import NOT_RECORDED, check_digests

    result = check_digests(ds, budget=budget)  # a growing dataset's: those of its segments
    if not result.recorded and not result.checked and not result.problems:
        c.report.skipped["digest"] = NOT_RECORDED
        return
    c.report.checks.append("digest")
    if not result.recorded:  # a view whose parent has no recorded digests
        c.report.skipped["digest of the parent's arrays"] = NOT_RECORDED
    for problem in result.problems:
        c.add("digest", f"{ds.location(problem.path)}: {problem.message}", key=problem.key)


def _check_index(ds: Dataset, c: _Collector, budget: Budget) -> None:
    starts, lengths = ds.episode_index["start"], ds.episode_index["length"]
    if len(starts) and starts[0] != 0:
        c.add("index", f"the first episode starts at step {int(starts[0])}, not 0")
    for e in np.flatnonzero(lengths < 1):
        c.add_episode("index", f"episode has length {int(lengths[e])}", int(e))
    for e in np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1]) + 1:
        end = int(starts[e - 1] + lengths[e - 1] - 1)
        c.add_episode("index", f"starts at step {int(starts[e])}, the previous episode ends at {end}", int(e))
    if int(lengths.sum()) != ds.num_steps:
        c.add("index", f"episodes cover {int(lengths.sum())} steps, the dataset has {ds.num_steps}")


def _check_done(ds: Dataset, c: _Collector, budget: Budget) -> None:
    ends = ds.episode_bounds.ends - 1  # each episode's last step
    for start, stop, b in ted_blocks(ds, ["next/done", "next/terminated", "next/truncated"], budget):
        done = np.asarray(b["next/done"]).reshape(-1)
        union = (np.asarray(b["next/terminated"]) | np.asarray(b["next/truncated"])).reshape(-1)
        c.add_steps(
            "done", "next/done != next/terminated | next/truncated", start + np.flatnonzero(done != union)
        )
        early, unended = ted.done_mismatches(done, ted.last_steps(ends, start, stop))
        c.add_steps("done", "next/done is true before the episode's last step", start + early)
        c.add_steps("done", "the episode's last step has next/done false", start + unended)


def _check_continuity(ds: Dataset, c: _Collector, budget: Budget) -> None:
    flat = [k for k, spec in ds.stored_fields.items() if spec.storage == "flat"]
    if not flat:
        return
    keys = [*flat, *(f"next/{k}" for k in flat)]
    ends = ds.episode_bounds.ends - 1  # each episode's last step
    # each block also holds the step after its own: the pair (t, t + 1) at its end is checked
    for start, stop, b in ted_blocks(ds, keys, budget, overlap=1):
        pairs = min(stop, ds.num_steps - 1) - start  # the dataset's last step has no t + 1
        inner = ~ted.last_steps(ends, start, start + pairs)
        for key in flat:
            same = rows_equal(b[f"next/{key}"][:pairs], b[key][1 : pairs + 1])
            bad = np.flatnonzero(~same & inner)
            c.add_steps("continuity", f"next/{key}[t] != {key}[t+1]", start + bad, key)


def _check_counts(ds: Dataset, c: _Collector, budget: Budget) -> None:
    expected = ds.manifest.source.get("checks", {}).get("expected", {})
    dropped = int(ds.manifest.conversion.get("dropped_episodes", 0))
    _check_episode_arrays(ds, c)
    selection = (ds.manifest.source.get("options") or {}).get("episodes")
    if selection is not None:
        _check_subset_counts(ds, c, selection, expected, dropped)
        return
    if "num_steps" in expected and expected["num_steps"] != ds.num_steps:
        c.add("counts", f"{ds.num_steps} steps, the source declares {expected['num_steps']}")
    if "num_episodes" in expected and expected["num_episodes"] != ds.num_episodes + dropped:
        c.add(
            "counts",
            f"{ds.num_episodes} episodes (+{dropped} dropped), "
            f"the source declares {expected['num_episodes']}",
        )


def _check_subset_counts(
    ds: Dataset, c: _Collector, selection: Any, expected: dict[str, int], dropped: int
) -> None:
    """Counts of an ``--episodes A:B`` conversion: episodes must be
    ``min(B, declared - dropped) - A`` (steps are not checked: not declared per episode)."""
    try:
        first, stop = parse_episodes(selection)
    except InvalidSelectionError:
        c.add("counts", f"the manifest's episode selection {selection!r} is not A:B")
        return
    if "num_episodes" not in expected:
        return
    available = int(expected["num_episodes"]) - dropped  # episodes a full conversion would keep
    want = max(0, min(available if stop is None else stop, available) - first)
    if ds.num_episodes != want:
        c.add(
            "counts",
            f"{ds.num_episodes} episodes, but episodes {first}:{'' if stop is None else stop} of a source "
            f"declaring {expected['num_episodes']} (-{dropped} dropped) are {want}",
        )


def _check_episode_arrays(ds: Dataset, c: _Collector) -> None:
    """Per-episode source arrays (``<format>/episode_<what>``) have one row per episode (and
    their file reads whole)."""
    try:
        arrays = ds.source_arrays
    except CorruptDatasetError as exc:
        c.add("files", str(exc))
        return
    for name, value in arrays.items():
        if is_episode_array(name) and len(value) != ds.num_episodes:
            c.add("counts", f"source array {name!r} has {len(value)} rows for {ds.num_episodes} episodes")


def _check_nans(ds: Dataset, c: _Collector, budget: Budget) -> None:
    recorded = ds.manifest.source.get("checks", {}).get("nan_counts")
    for key, spec in ds.stored_fields.items():
        if np.dtype(spec.dtype).kind not in "fc":
            continue
        count = 0
        positions: list[int] = []
        for start, part in blocks(ds.column(key), budget):
            nans = np.isnan(part, out=budget.pool.empty(part.shape, bool))
            found = int(np.count_nonzero(nans))
            count += found
            if found and len(positions) < 5:
                rows = np.flatnonzero(nans.reshape(len(part), -1).any(axis=1))
                positions += (start + rows)[: 5 - len(positions)].tolist()
        want = None if recorded is None else recorded.get(key)
        if want is None or count == want:
            continue
        message = f"{count} NaN values, the source had {want}"
        if not positions:
            c.add("nan", message, key=key)
        steps = np.asarray(positions, np.int64)
        if spec.storage == "flat":
            steps = Episodes.of(ds).steps_of_flat_rows(steps)
        for step in steps.tolist():
            c.add("nan", message, step, key)
