"""Progress bars for ``rlds download``: one bar per file (bytes, speed, ETA), then the
conversion bar. Drawn on stderr when it is a terminal; silent otherwise."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from rich.progress import DownloadColumn, TimeRemainingColumn, TransferSpeedColumn

from rlds_cli.cli import output


@contextmanager
def download_progress(
    enabled: bool,
) -> Iterator[tuple[Callable[[str, str, int], None], Callable[[str, int], None]]]:
    """Yield ``(download_callback, conversion_callback)``.

    The download bars close when conversion starts (Rich draws one live display at a time).
    """
    bars, show = output.progress_bar(enabled, DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    tasks: dict[str, Any] = {}
    lock = threading.Lock()

    def on_download(event: str, name: str, value: int) -> None:
        with lock:
            if name not in tasks:
                tasks[name] = bars.add_task(output.escape(name), total=None)
            task = tasks[name]
            if event == "start":
                bars.update(task, total=value or None)
            elif event == "resume":
                bars.update(task, completed=value)
            elif event == "advance":
                bars.advance(task, value)
            elif event == "reset":
                bars.reset(task)
            elif event == "wait" and show:
                # print, not log: Rich's log() adds this file's name and line number
                bars.print(f"{output.escape(name)}: another rlds process is downloading it; waiting")
            # "retry": the library logs each retry once, with its reason (no second line here)
            elif event == "verify":
                bars.update(task, description=f"{output.escape(name)} (verifying)")
            elif event in ("done", "cached"):
                bars.update(task, total=value, completed=value, description=output.escape(name))

    with ExitStack() as stack:
        stack.enter_context(bars)
        converting: list[Callable[[str, int], None]] = []

        def on_convert(event: str, amount: int) -> None:
            if not converting:
                stack.close()  # stop the download bars before the conversion bar starts
                cm = output.conversion_progress(enabled)
                converting.append(cm.__enter__())
                outer.callback(cm.__exit__, None, None, None)
            converting[0](event, amount)

        with ExitStack() as outer:
            yield on_download, on_convert
