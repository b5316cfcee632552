"""A background thread that prepares the next batches while training runs.

numpy gathers and torch copies release the GIL, so a producer thread overlaps reading,
converting, pinning and the host-to-device copy with the training step. Each produced batch
carries the sampler's state from before it was drawn, so a checkpoint taken while batches wait
in the queue rewinds the sampler to the first batch the training loop has not seen yet.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple


class Prepared(NamedTuple):
    """One produced batch and the sampler state from before it was drawn."""

    state: Any
    batch: Any
    end_of_epoch: bool


class _Failure(NamedTuple):
    error: BaseException


class Prefetcher:
    """Runs ``produce()`` in a daemon thread, keeping up to ``depth`` results ready.

    Args:
        produce: Makes one :class:`Prepared` item; called only from the thread.
        depth: Items kept ready.
    """

    def __init__(self, produce: Callable[[], Prepared], depth: int) -> None:
        self._produce = produce
        self._queue: queue.Queue[Prepared | _Failure] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._held: Prepared | None = None  # made but not queued when the thread was stopped
        self._thread = threading.Thread(target=self._run, name="rlds-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item: Prepared | _Failure = self._produce()
            except BaseException as exc:  # handed to the consumer, raised there
                item = _Failure(exc)
            while True:
                if self._stop.is_set():
                    self._held = item if isinstance(item, Prepared) else None
                    return
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return

    def get(self) -> Prepared:
        """The next batch (waits for it); re-raises an error of the producer."""
        item = self._queue.get()
        if isinstance(item, _Failure):
            self.stop()
            raise item.error
        return item

    def stop(self) -> list[Prepared]:
        """Stop the thread and return the batches it had made that were never taken, oldest
        first."""
        self._stop.set()
        self._thread.join()
        pending: list[Prepared] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return [*pending, self._held] if self._held is not None else pending
            if isinstance(item, Prepared):
                pending.append(item)
