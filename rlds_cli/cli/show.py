"""``rlds show``: write an episode viewer page (one HTML file that plays in any browser)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rlds_cli.cli import output
from rlds_cli.cli.options import JsonOption, QuietOption, RootOption, VerboseOption
from rlds_cli.cli.output import handle_errors


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
            "--episode", "-e", help="An episode to show (repeatable; default 0).", show_default=False
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
        typer.Option("--no-audit", help="Leave out the audit's flags (skips one pass over the dataset)."),
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
    from rlds_cli.catalog.names import resolve_name
    from rlds_cli.inspection.viewer import write_episode_page
    from rlds_cli.loader.opening import open_dataset
    from rlds_cli.remote.reader import is_url

    episodes = episode or [0]
    dataset = open_dataset(name) if is_url(name) else open_dataset(resolve_name(name, root), root)
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
