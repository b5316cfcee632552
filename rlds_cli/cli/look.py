"""Looking at episodes: ``rlds show`` writes an episode viewer page (one HTML file that plays in
any browser); ``rlds audit`` flags idle, jerky, frozen-camera, broken, duplicate and outlying
episodes and keeps a view of the others."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from rlds_cli.cli import output
from rlds_cli.cli.output import (
    JsonOption,
    QuietOption,
    RootOption,
    VerboseOption,
    force_option,
    handle_errors,
)


@handle_errors
def show(
    name: Annotated[
        str,
        typer.Argument(
            help="The dataset (a cache name, an alias, or the URL of a zarr dataset pushed with rlds push)."
        ),
    ],
    episode: Annotated[
        list[int] | None,
        typer.Option(
            "--episode",
            "-e",
            help="An episode to show (repeatable; default 0; -1: the last).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="The HTML file to write (default: NAME-episode-I.html here).",
            show_default=False,
        ),
    ] = None,
    no_audit: Annotated[
        bool,
        typer.Option(
            "--no-audit",
            help="Leave out the audit's flags (skips its digest check and its pass over the dataset).",
        ),
    ] = False,
    fps: Annotated[
        float | None,
        typer.Option(
            "--fps",
            help="Playback rate in steps a second (default: the dataset's, else 30).",
            show_default=False,
        ),
    ] = None,
    rerun: Annotated[
        Path | None,
        typer.Option(
            "--rerun",
            metavar="FILE.rrd",
            help="Write a recording for the rerun viewer (extra: rerun); the HTML page too only with -o.",
            show_default=False,
        ),
    ] = None,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Write one self-contained HTML page that plays episodes: each camera's frames in sync with
    plots of actions, low-dim observations, rewards and end flags, a scrubber, per-episode
    statistics, and the audit's flags on the timeline. Open it from disk: no server, no network.

    Frames are embedded as stored (JPEG/PNG/WebP files, base64), so the page weighs about the
    episode's compressed frames; frames stored raw are encoded as JPEG (quality 90). --rerun
    writes the same as a recording for the rerun viewer.

    Example: rlds show my-robot-data --episode 3 -o episode3.html
    """
    from rlds_cli.catalog.registry import resolve_name
    from rlds_cli.inspection.viewer import write_episode_page
    from rlds_cli.loader.opening import open_dataset
    from rlds_cli.remote.reader import is_url

    dataset = open_dataset(name) if is_url(name) else open_dataset(resolve_name(name, root), root)
    n = dataset.num_episodes
    # each once, in the order given (-1 and the last are one); an index outside is refused below
    episodes = list(dict.fromkeys(e % n if n and -n <= e < n else e for e in episode or [0]))
    recording = None
    if rerun is not None:
        from rlds_cli.inspection.viewer import write_rerun

        recording = write_rerun(
            dataset, rerun, episodes=episodes, audit_flags=not no_audit, fps=fps, root=root
        )
    if out is None and rerun is None:
        out = Path(f"{dataset.name.replace('/', '-')}-episode-{episodes[0]}.html")
    summary = None
    if out is not None:
        summary = write_episode_page(
            dataset, out, episodes=episodes, audit_flags=not no_audit, fps=fps, root=root
        )
    if json:
        data: dict[str, Any] = {}
        if summary is not None:
            data.update({
                "path": str(summary.path), "bytes": summary.nbytes, "frame_bytes": summary.frame_bytes,
                "episodes": summary.episodes, "steps": summary.steps, "cameras": summary.cameras,
                "encoded_cameras": summary.encoded, "audited": summary.audited, "notes": summary.notes,
            })  # fmt: skip
        if recording is not None:
            data["rerun"] = {"path": str(recording.path), "bytes": recording.nbytes,
                             "episodes": recording.episodes, "steps": recording.steps}  # fmt: skip
        output.print_json(data)
        return
    written = [str(x.path) for x in (summary, recording) if x is not None]
    if quiet:
        for p in written:
            output.console.print(output.escape(p), soft_wrap=True)
        return
    if recording is not None:
        rrd = output.escape(str(recording.path))
        output.console.print(
            f"[green]{rrd}[/]: a rerun recording of {output.count(len(recording.episodes), 'episode')} "
            f"({recording.steps:,} steps), {output.human_bytes(recording.nbytes)}; "
            f"open it with 'rerun {rrd}'",
            soft_wrap=True,
        )
    if summary is None:
        return
    cameras = ", ".join(summary.cameras) or "no camera"
    output.console.print(
        f"[green]{output.escape(str(summary.path))}[/]: {output.count(len(summary.episodes), 'episode')} "
        f"({summary.steps:,} steps), {output.escape(cameras)}, {output.human_bytes(summary.nbytes)} "
        f"({output.human_bytes(summary.frame_bytes)} of frames)",
        soft_wrap=True,
    )
    for note in summary.notes:
        output.note(note)


#: Flagged episodes listed in the table (all of them are in --json).
SHOWN = 50


@handle_errors
def audit(
    name: Annotated[str, typer.Argument(help="The dataset to audit (or a registry alias).")],
    keep: Annotated[
        str | None,
        typer.Option(
            "--keep",
            help="Publish the episodes that pass (whole episodes) as a view of this name, e.g. NAME-clean.",
            show_default=False,
        ),
    ] = None,
    atol: Annotated[
        float,
        typer.Option(
            "--atol", help="A step is idle when its action and state are within this of the step before's."
        ),
    ] = 1e-5,
    max_idle: Annotated[
        float, typer.Option("--max-idle", help="Flag an episode with more than this fraction of idle steps.")
    ] = 0.2,
    spike_factor: Annotated[
        float,
        typer.Option(
            "--spike-factor",
            help="Flag an action change over this many times its typical change (median RMS).",
        ),
    ] = 8.0,
    jerk_factor: Annotated[
        float,
        typer.Option(
            "--jerk-factor", help="Flag a mean absolute jerk over this many times the median episode's."
        ),
    ] = 2.5,
    frozen_steps: Annotated[
        int,
        typer.Option(
            "--frozen-steps",
            help="Flag a camera showing the same frame this many steps in a row while not idle.",
        ),
    ] = 3,
    iqr_factor: Annotated[
        float,
        typer.Option("--iqr-factor", help="Length and return outliers: this many IQRs beyond the quartiles."),
    ] = 3.0,
    force: Annotated[bool, force_option("Replace an existing dataset of the --keep name.")] = False,
    root: RootOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = 0,
) -> None:
    """Audit every episode: idle steps, action spikes and jerk, frozen cameras, NaN/inf,
    duplicates, length and return outliers, empty language instructions.

    Checks the dataset's content digests first (a damaged column: exit 1), then reads every
    stored array once in bounded memory (camera frames compared as stored, never decoded). Exit
    code 0 whether or not episodes are flagged.

    Example: rlds audit my-robot-data --keep my-robot-data-clean
    """
    from rlds_cli.inspection.audit import AuditTolerances
    from rlds_cli.inspection.audit import audit as run_audit

    tolerances = AuditTolerances(
        atol=atol, max_idle=max_idle, spike_factor=spike_factor, jerk_factor=jerk_factor,
        frozen_steps=frozen_steps, iqr_factor=iqr_factor,
    )  # fmt: skip
    report = run_audit(name, tolerances=tolerances, root=root)
    kept = report.keep(keep, replace=force, root=root) if keep is not None else None
    if kept is not None and force:
        output.warn_stale_children(root, kept.name)
    if json:
        data = report.to_dict()
        if kept is not None:
            data["kept"] = {"name": kept.name, "num_episodes": kept.num_episodes, "num_steps": kept.num_steps}
        output.print_json(data)
        return
    flagged = report.flagged()
    if not quiet:
        counts = ", ".join(f"{f} {len(ids)}" for f, ids in report.flags.items() if len(ids)) or "none"
        output.console.print(
            f"[bold]{output.escape(report.dataset)}[/]: {output.count(report.num_episodes, 'episode')}, "
            f"{len(flagged):,} flagged ({output.escape(counts)}), {len(report.passing()):,} pass",
            soft_wrap=True,
        )
    if len(flagged) and not quiet:
        columns = [
            output.Column("episode", "right", kind="fixed"),
            output.Column("length", "right", kind="fixed"),
            output.Column("return", "right", kind="fixed"),
            output.Column("idle", "right", kind="fixed", optional=True),
            output.Column("spike", "right", kind="fixed", optional=True),
            output.Column("jerk", "right", kind="fixed", optional=True),
            output.Column("flags", kind="text"),
        ]
        rows = []
        for i in flagged[:SHOWN].tolist():
            e = report.episode(i)
            flags = ", ".join(e["flags"]) + (
                f" (of {e['duplicate_of']})" if e["duplicate_of"] is not None else ""
            )
            rows.append([
                str(i), str(e["length"]), _num(e["return"]), f"{e['idle_fraction']:.0%}",
                _num(e["spike_score"]), _num(e["jerk_score"]), flags,
            ])  # fmt: skip
        output.print_table(columns, rows, title="flagged episodes")
        if len(flagged) > SHOWN:
            output.note(f"{len(flagged) - SHOWN:,} more flagged episodes: see --json")
    if kept is not None and quiet:  # -q: the one name made
        output.console.print(Text(kept.name), soft_wrap=True)
    elif kept is not None:
        output.console.print(
            f"[green]{output.escape(kept.name)}[/]: the "
            f"{output.count(kept.num_episodes, 'episode')} that pass "
            f"({kept.num_steps:,} steps), a view of {output.escape(report.dataset)} sharing its arrays",
            soft_wrap=True,
        )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"
