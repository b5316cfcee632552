"""Work done ahead of the training step: batches prepared in a background thread, remote blocks
fetched for the draws ahead.

:class:`Prefetcher`: numpy gathers and torch copies release the GIL, so a producer thread overlaps
reading, converting, pinning and the host-to-device copy with the training step. Each batch
carries the sampler's state from before it was drawn, so a checkpoint rewinds the sampler to the
first batch the training loop has not seen.

:class:`ReadAhead` stands in for the sampler of a remote dataset (``Loader(url, read_ahead=N)``):
it keeps ``N`` draws ahead, each with its prior sampler state (``state_dict()`` rewinds to the
first draw not returned; ``load_state_dict`` drops the draws ahead). It uses only the sampler's
public API, so every named sampler works. One background thread calls the dataset's
``prefetch(steps, keys)`` (:meth:`rlds_cli.remote.reader.RemoteDataset.prefetch`) per draw, in
draw order, one at a time, each holding at most the block cache's fetch window: bytes in flight
stay bounded. A gather needing a block being fetched waits for that fetch; dropped draws (a
rewind, :meth:`ReadAhead.close`) end their prefetch's wait. Local datasets are not wrapped.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy as np


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
        _LIVE.add(self)

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
        _LIVE.discard(self)
        pending: list[Prepared] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return [*pending, self._held] if self._held is not None else pending
            if isinstance(item, Prepared):
                pending.append(item)


#: Seconds the exit waits, in all, for prefetch threads to finish the batch they are making.
EXIT_WAIT_SECONDS = 10.0
#: The prefetchers whose thread may be running (a loader left open holds one).
_LIVE: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


@atexit.register
def stop_prefetchers(timeout: float = EXIT_WAIT_SECONDS) -> None:
    """Stop every live prefetcher's thread (at exit), waiting at most ``timeout`` seconds in all:
    a daemon thread still making a torch batch while the interpreter finalizes aborted the
    process ('terminate called without an active exception', exit 134) in 4 of 10 runs of a
    script that left its loaders open; a batch stuck on a read never holds the exit long."""
    live = list(_LIVE)
    for prefetcher in live:
        prefetcher._stop.set()
    deadline = time.monotonic() + timeout
    for prefetcher in live:
        prefetcher._thread.join(max(0.0, deadline - time.monotonic()))
        # a later get() (another exit handler drawing a batch) says so, never waits on no thread
        with contextlib.suppress(queue.Empty):
            while True:
                prefetcher._queue.get_nowait()
        prefetcher._queue.put_nowait(
            _Failure(RuntimeError("the loader's prefetch thread was stopped at exit"))
        )


def draw_steps(out: Any) -> np.ndarray:
    """The step indices of what a sampler's ``sample()`` returned (an array, a tensor, or a
    draw with ``indices``)."""
    indices = getattr(out, "indices", out)
    if hasattr(indices, "detach"):  # a torch tensor
        indices = indices.detach().cpu().numpy()
    return np.asarray(indices, np.int64).reshape(-1)


_Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class _InOrder:
    """Calls run one at a time, in submission order, on a daemon thread.

    Daemon, unlike a ``ThreadPoolExecutor``'s worker (joined at interpreter exit): a process that
    leaves its loader open exits at once, never after a prefetch's wait for room."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, call, args))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Cancel the calls not begun; return once the running one has finished."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        self._queue.put(None)
        self._thread.join()


def _release_when_done(future: Future[Any]) -> None:
    """Release what the prefetch of ``future`` pinned, now or when it finishes."""

    def release(done: Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        hold = done.result()
        if hasattr(hold, "release"):
            hold.release()

    future.add_done_callback(release)


class ReadAhead:
    """A sampler that draws ``depth`` batches ahead of the one returned and prefetches them.

    Args:
        sampler: The loader's sampler.
        depth: Draws kept ahead (>= 1).
        prefetch: Called in the background with each draw's step indices and a
            ``threading.Event`` set once the draw is dropped (e.g. ``lambda steps, stop:
            dataset.prefetch(steps, keys, stop=stop)``); a returned object with ``release()`` is
            released once the draw's batch has been gathered.

    Any attribute it does not define is the sampler's own (``batch_size``,
    ``batches_per_epoch``...). ``epoch_done``, ``state_dict``, ``load_state_dict``,
    ``stream_state`` and ``load_stream_state`` exist only when the sampler has them.
    """

    def __init__(
        self, sampler: Any, depth: int, prefetch: Callable[[np.ndarray, threading.Event], Any]
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"read_ahead must be a whole number of batches >= 1, got {depth!r}")
        self.sampler = sampler
        self.depth = depth
        self._prefetch = prefetch
        #: Draws ahead, oldest first: (sampler state before it, its output, epoch_done after it).
        self._ahead: deque[tuple[Any, Any, bool]] = deque()
        self._futures: deque[Future[Any]] = deque()
        #: The prefetch of the draw returned last: released at the next draw (its batch gathered).
        self._current: Future[Any] | None = None
        #: Set when the draws ahead are dropped: ends the waits of their prefetches.
        self._stop = threading.Event()
        self._pool: _InOrder | None = None
        self._pool_pid = 0
        self._done = False
        self._mutex = threading.Lock()
        self._has_done = callable(getattr(sampler, "epoch_done", None))
        self._stream = callable(getattr(sampler, "stream_state", None))
        # runtime-protocol methods, present exactly when the sampler has them
        if self._has_done:
            self.epoch_done = self._epoch_done
        if callable(getattr(sampler, "state_dict", None)):
            self.state_dict = self._state_dict
            self.load_state_dict = self._load_state_dict
        if self._stream:
            self.stream_state = self._stream_state
            self.load_stream_state = self._load_stream_state

    def __getattr__(self, name: str) -> Any:
        if name == "sampler":  # before __init__ set it (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.sampler, name)

    # ------------------------------------------------------------------ drawing

    def _state(self) -> Any:
        if self._stream:
            return self.sampler.stream_state()
        state = getattr(self.sampler, "state_dict", None)
        return state() if callable(state) else None

    def _executor(self) -> _InOrder:
        import os

        if self._pool is None or self._pool_pid != os.getpid():  # a forked worker makes its own
            self._pool = _InOrder("rlds-read-ahead")  # prefetches in draw order
            self._pool_pid = os.getpid()
        return self._pool

    def _fill(self) -> None:
        while len(self._ahead) < self.depth + 1:
            state = self._state()
            out = self.sampler.sample()
            done = bool(self.sampler.epoch_done()) if self._has_done else False
            self._ahead.append((state, out, done))
            self._futures.append(self._executor().submit(self._prefetch, draw_steps(out), self._stop))

    def sample(self) -> Any:
        """The next draw (its blocks fetched or being fetched), topping up the draws ahead;
        raises a finished prefetch's error."""
        with self._mutex:
            self._fill()
            _, out, self._done = self._ahead.popleft()
            future = self._futures.popleft()
            if self._current is not None:
                _release_when_done(self._current)
            self._current = future
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
            self._fill()
            return out

    def _epoch_done(self) -> bool:
        return self._done

    # ------------------------------------------------------------------ state

    def _end_waits(self) -> None:
        """End the waits of the prefetches submitted so far; the next ones get a fresh event."""
        self._stop.set()
        self._stop = threading.Event()

    def _drop_ahead(self) -> None:
        self._ahead.clear()
        self._end_waits()
        for future in self._futures:
            future.cancel()
            _release_when_done(future)
        self._futures.clear()
        if self._current is not None:
            _release_when_done(self._current)
            self._current = None

    def _state_dict(self) -> Any:
        """The sampler's state before the first draw not yet returned."""
        with self._mutex:
            if self._ahead and self._stream:  # rewound to it: the draws ahead are made again
                self.sampler.load_stream_state(self._ahead[0][0])
                self._drop_ahead()
            return self._ahead[0][0] if self._ahead else self.sampler.state_dict()

    def _load_state_dict(self, state: Any) -> None:
        with self._mutex:
            self._drop_ahead()
            self.sampler.load_state_dict(state)

    def _stream_state(self) -> Any:
        with self._mutex:
            return self._ahead[0][0] if self._ahead else self.sampler.stream_state()

    def _load_stream_state(self, state: Any) -> None:
        with self._mutex:
            self._drop_ahead()
            self.sampler.load_stream_state(state)

    def close(self) -> None:
        """Rewind the sampler to the first draw not returned, drop the draws ahead (blocks
        unpinned) and stop the background thread (a running prefetch finishes first). A sampler
        without state keeps its draws ahead."""
        with self._mutex:
            if self._ahead and (self._stream or callable(getattr(self.sampler, "load_state_dict", None))):
                state = self._ahead[0][0]
                if self._stream:
                    self.sampler.load_stream_state(state)
                else:
                    self.sampler.load_state_dict(state)
                self._drop_ahead()
            elif not self._ahead and self._current is not None:
                _release_when_done(self._current)
                self._current = None
            self._end_waits()  # the loader may go on: its next draws wait again
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pool=None, _pool_pid=0, _futures=deque(), _mutex=None, _current=None, _stop=None)
        for name in ("epoch_done", "state_dict", "load_state_dict", "stream_state", "load_stream_state"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        prefetch = state.pop("_prefetch")
        self.__init__(state["sampler"], state["depth"], prefetch)  # type: ignore[misc]
