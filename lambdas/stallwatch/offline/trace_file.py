"""Trace files on disk: read one, write one (the format itself lives in `stallwatch.core.trace`).

trace = load_trace("corpus/traces/sm-hang-8host.jsonl")
write_trace(header, events, "my-job.jsonl")
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from stallwatch.core.trace import Event, Trace, TraceHeader, read_trace, trace_text


def load_trace(path: str | Path) -> Trace:
    """Read a trace file."""
    with open(path, encoding="utf-8") as f:
        return read_trace(f, source=str(path))


def write_trace(header: TraceHeader, events: Iterable[Event], out: str | Path | TextIO) -> None:
    """Write a trace to a path or an open text stream."""
    text = trace_text(header, events)
    if isinstance(out, str | Path):
        Path(out).write_text(text, encoding="utf-8")
    else:
        out.write(text)
