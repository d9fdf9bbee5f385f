"""Where windows go. Every sink has `emit(window)` and `close(timeout_s)`; none may block the loop.

sinks = FanOutSink([EmfStdoutSink(), JsonlSink("metrics.jsonl")])
build_sinks("auto")   # CloudWatch (when boto3 and credentials are present) + the EMF stdout line
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from trainer_agent.cloudwatch import CloudWatchSink
from trainer_agent.emf import emf_document
from trainer_agent.log import logger, warn_once
from trainer_agent.window import Window

AUTO = "auto"


@runtime_checkable
class Sink(Protocol):
    """Receives windows from the agent's background thread (and the final one from close())."""

    def emit(self, window: Window) -> None: ...

    def close(self, timeout_s: float) -> None: ...


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

    def close(self, timeout_s: float) -> None:
        pass


class JsonlSink:
    """One JSON object per window appended to a file: the metrics plus t, job, host, rank, scope, phase."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def emit(self, window: Window) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(window.as_record()) + "\n")
        self._file.flush()

    def close(self, timeout_s: float) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class FanOutSink:
    """Sends each window to several sinks; a sink that raises is logged once and skipped for that window,
    and a sink still busy in another thread (blocked) is skipped rather than waited on."""

    def __init__(self, sinks: list[Sink]) -> None:
        for sink in sinks:
            if not isinstance(sink, Sink):
                raise TypeError(f"sink {sink!r} has no emit(window) and close(timeout_s)")
        self.sinks = list(sinks)
        self._busy = [threading.Lock() for _ in self.sinks]

    def emit(self, window: Window) -> None:
        for sink, busy in zip(self.sinks, self._busy, strict=True):
            if not busy.acquire(blocking=False):
                warn_once(f"blocked:{id(sink)}", "sink %s is blocked; skipping windows until it returns", sink)
                continue
            try:
                sink.emit(window)
            except Exception as error:  # the agent never raises into the loop
                warn_once(f"emit:{id(sink)}", "sink %s failed, its windows are dropped: %r", sink, error)
            finally:
                busy.release()

    def close(self, timeout_s: float) -> None:
        for sink, busy in zip(self.sinks, self._busy, strict=True):
            if not busy.acquire(blocking=False):
                logger.warning("sink %s is still blocked at close; not closing it", sink)
                continue
            try:
                sink.close(timeout_s)
            except Exception as error:
                logger.warning("sink %s failed to close: %r", sink, error)
            finally:
                busy.release()


def build_sinks(sinks: str | list[Sink]) -> FanOutSink:
    """The agent's sinks: "auto" (CloudWatch when boto3 is installed, plus the EMF stdout line) or a list."""
    if isinstance(sinks, str):
        if sinks != AUTO:
            raise ValueError(f"sinks must be {AUTO!r} or a list of sinks, not {sinks!r}")
        chosen: list[Sink] = [EmfStdoutSink()]
        if module_available("boto3"):
            # Credentials are checked on the sink's own thread: resolving them may take a while off AWS.
            chosen.append(CloudWatchSink(require_credentials=True))
        return FanOutSink(chosen)
    return FanOutSink(list(sinks))


def module_available(name: str) -> bool:
    """Whether `import name` would find the module (without importing it)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
