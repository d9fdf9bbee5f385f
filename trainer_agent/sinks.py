"""Where windows go. Every sink has `emit(window)` and `close(timeout_s)`; each runs on its own thread.

sinks = FanOutSink([EmfStdoutSink(), JsonlSink("metrics.jsonl")])
build_sinks("auto")   # CloudWatch (when boto3 and credentials are present) + the EMF stdout line

A sink that also has `emit_stacks(dump)` takes the stall's stack dumps (trainer_agent.stack_dumps): the stdout line and
JSONL do; CloudWatch metrics do not.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from trainer_agent.cloudwatch import CloudWatchSink
from trainer_agent.emf import emf_document
from trainer_agent.log import cause_key, logger, warn_once
from trainer_agent.stack_dumps import StackDump
from trainer_agent.window import Window

AUTO = "auto"
SINK_QUEUE_WINDOWS = 64
"""Windows a sink may fall behind by before its newer windows are dropped (each sink has its own)."""
STACKS_SCOPE = "stacks"
"""A stack dump's `scope` in a JSONL file."""

Item = Window | StackDump


@runtime_checkable
class Sink(Protocol):
    """Receives windows from the agent's background thread (and the final one from close())."""

    def emit(self, window: Window) -> None: ...

    def close(self, timeout_s: float) -> None: ...


@runtime_checkable
class StacksSink(Protocol):
    """A sink that also takes stack dumps (from the agent's stall watch, and at SIGTERM)."""

    def emit_stacks(self, dump: StackDump) -> None: ...


def takes_stacks(sink: object) -> bool:
    return isinstance(sink, StacksSink)


class NullSink:
    """Drops every window."""

    def emit(self, window: Window) -> None:
        pass

    def close(self, timeout_s: float) -> None:
        pass


class EmfStdoutSink:
    """One CloudWatch EMF JSON line per window on stdout, flushed: the training log's progress line."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream

    def emit(self, window: Window) -> None:
        stream = self._stream or sys.stdout  # looked up per window so redirections apply
        stream.write(json.dumps(emf_document(window)) + "\n")
        stream.flush()

    def emit_stacks(self, dump: StackDump) -> None:
        """The dump's line, in one write (the line fits a pipe's atomic write: ranks sharing stdout never mix)."""
        stream = self._stream or sys.stdout
        stream.write(dump.line() + "\n")
        stream.flush()

    def close(self, timeout_s: float) -> None:
        pass


class JsonlSink:
    """One JSON object per window appended to a file: the metrics plus t, job, host, rank, scope, phase."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def emit(self, window: Window) -> None:
        self._append(json.dumps(window.as_record()))

    def emit_stacks(self, dump: StackDump) -> None:
        """The dump's line, with `scope` "stacks" (a window's is "job" or "host")."""
        self._append(json.dumps({"scope": STACKS_SCOPE} | json.loads(dump.line())))

    def _append(self, line: str) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(line + "\n")
        self._file.flush()

    def close(self, timeout_s: float) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class FanOutSink:
    """Hands each window to several sinks, each on its own thread with its own queue: a slow, blocked or
    failing sink delays no other sink and never the caller. A sink that raises is logged once."""

    def __init__(self, sinks: list[Sink]) -> None:
        for sink in sinks:
            if not isinstance(sink, Sink):
                raise TypeError(f"sink {sink!r} has no emit(window) and close(timeout_s)")
        self.sinks = list(sinks)
        self._workers = [SinkWorker(sink) for sink in self.sinks]

    @property
    def takes_stacks(self) -> bool:
        """Whether any sink takes stack dumps."""
        return any(takes_stacks(sink) for sink in self.sinks)

    def emit(self, window: Window) -> None:
        """Queue the window for every sink; never waits."""
        for worker in self._workers:
            worker.put(window)

    def emit_stacks(self, dump: StackDump) -> None:
        """Queue the dump for the sinks that take stacks; never waits."""
        for worker in self._workers:
            if takes_stacks(worker.sink):
                worker.put(dump)

    def close(self, timeout_s: float) -> None:
        """Each sink sends what it holds and closes, all at once; returns within timeout_s whatever they do."""
        deadline = time.monotonic() + timeout_s
        for worker in self._workers:
            worker.start_closing(deadline)
        for worker in self._workers:
            worker.join(deadline)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every window queued so far has been emitted (or dropped); False on timeout."""
        deadline = time.monotonic() + timeout_s
        return all([worker.wait_idle(deadline) for worker in self._workers])


class SinkWorker:
    """One sink fed from a bounded queue by its own thread (started with the first window)."""

    def __init__(self, sink: Sink, max_windows: int = SINK_QUEUE_WINDOWS) -> None:
        self.sink = sink
        self.max_windows = max_windows
        self.dropped = 0
        """Windows dropped because the sink fell max_windows behind."""
        self._windows: deque[Item] = deque()
        self._changed = threading.Condition()
        self._busy = False
        self._close_by: float | None = None
        self._thread: threading.Thread | None = None
        self._behind_key, self._failed_key = cause_key("behind"), cause_key("emit")

    def put(self, window: Item) -> None:
        with self._changed:
            if self._close_by is not None:
                return
            if len(self._windows) >= self.max_windows:
                self.dropped += 1
                warn_once(self._behind_key, "sink %s is %d windows behind; dropping", self.sink, self.max_windows)
                return
            self._windows.append(window)
            self._start()
            self._changed.notify_all()

    def start_closing(self, deadline: float) -> None:
        """Emit what is queued, then close the sink with what is left of the time until deadline."""
        with self._changed:
            if self._close_by is None:
                self._close_by = deadline
                self._start()
                self._changed.notify_all()

    def join(self, deadline: float) -> None:
        if self._thread is None:
            return
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            logger.warning(
                "sink %s did not finish in time; %d windows unsent (it carries on in the background)",
                self.sink,
                len(self._windows) + self._busy,
            )

    def wait_idle(self, deadline: float) -> bool:
        with self._changed:
            while self._windows or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stallwatch-sink", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._windows and self._close_by is None:
                    self._changed.wait()
                if not self._windows and self._close_by is not None:
                    close_by = self._close_by
                    break
                window = self._windows.popleft()
                self._busy = True
            try:
                if isinstance(window, StackDump):
                    self.sink.emit_stacks(window)  # type: ignore[attr-defined]
                else:
                    self.sink.emit(window)
            except Exception as error:  # the agent never raises into the loop
                warn_once(self._failed_key, "sink %s failed, its windows are dropped: %r", self.sink, error)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
        try:
            self.sink.close(max(close_by - time.monotonic(), 0.0))
        except Exception as error:
            logger.warning("sink %s failed to close: %r", self.sink, error)


def build_sinks(sinks: str | list[Sink], stacks_only: bool = False) -> FanOutSink:
    """The agent's sinks: "auto" (CloudWatch when boto3 is installed, plus the EMF stdout line) or a list;
    `stacks_only` (a rank that reports no windows): only those that take stack dumps."""
    if isinstance(sinks, str):
        if sinks != AUTO:
            raise ValueError(f"sinks must be {AUTO!r} or a list of sinks, not {sinks!r}")
        chosen: list[Sink] = [EmfStdoutSink()]
        if module_available("boto3") and not stacks_only:
            # Credentials are checked on the sink's own thread: resolving them may take a while off AWS.
            chosen.append(CloudWatchSink(require_credentials=True))
        return FanOutSink(chosen)
    return FanOutSink([sink for sink in sinks if takes_stacks(sink) or not stacks_only])


def module_available(name: str) -> bool:
    """Whether `import name` would find the module (without importing it)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
