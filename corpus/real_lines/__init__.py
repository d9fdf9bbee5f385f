"""Real training-log lines and sequences, quoted verbatim from public sources (README.md says how they were gathered).

    from corpus import real_lines
    fatal = real_lines.lines(label="fatal")                        # RealLine(text, label, kind, framework, ...)
    for seq in real_lines.sequences(kind="checkpoint"):            # Sequence(name, framework, lines, ...)
        long = seq.stretched(20 * 60)                              # its silent write made 20 minutes long
        events = long.at(t0)                                       # [(t0 + t, text), ...]

`lines.jsonl` holds one labelled line a record (fatal, benign, checkpoint_start, checkpoint_end); `sequences.jsonl`
holds crashes' last words and checkpoints' lines in their order, with the gaps the sources show (`times`: "source"),
derive ("derived") or, where a source shows none, plausible ones (documented in each `note`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
LABELS = ("fatal", "benign", "checkpoint_start", "checkpoint_end")


@dataclass(frozen=True)
class RealLine:
    """One quoted line: `incident` groups a crash's lines (None for the others); `source` is where it was quoted."""

    text: str
    label: str
    kind: str
    framework: str
    incident: str | None
    source: str


@dataclass(frozen=True)
class TimedLine:
    t: float  # seconds after the sequence's first line (or its write: negative for the lines before)
    text: str


@dataclass(frozen=True)
class Sequence:
    """A crash's last words or a checkpoint's lines, in order. A checkpoint's long write is the silence after
    `lines[write_after]`; `blocking`: the training loop waits for it (an async save's steps go on)."""

    name: str
    kind: str  # "crash" or "checkpoint"
    framework: str
    source: str
    times: str  # "source", "derived" or "plausible"
    note: str
    lines: tuple[TimedLine, ...]
    write_after: int | None = None
    blocking: bool = True

    @property
    def duration(self) -> float:
        return self.lines[-1].t - self.lines[0].t

    def stretched(self, write_s: float) -> Sequence:
        """This sequence with its silent write lasting `write_s` seconds (the lines after it shifted; a crash, or a
        write already longer, unchanged)."""
        if self.write_after is None or self.write_after + 1 >= len(self.lines):
            return self
        gap = self.lines[self.write_after + 1].t - self.lines[self.write_after].t
        shift = max(write_s - gap, 0.0)
        moved = [
            line if i <= self.write_after else replace(line, t=line.t + shift) for i, line in enumerate(self.lines)
        ]
        return replace(self, lines=tuple(moved))

    def at(self, t0: float) -> list[tuple[float, str]]:
        """The lines as events, the first at `t0`."""
        first = self.lines[0].t
        return [(t0 + line.t - first, line.text) for line in self.lines]


def lines(label: str | None = None, kind: str | None = None) -> tuple[RealLine, ...]:
    """The quoted lines, of one label and kind if given."""
    return tuple(r for r in _lines() if (label is None or r.label == label) and (kind is None or r.kind == kind))


def sequences(kind: str | None = None, framework: str | None = None) -> tuple[Sequence, ...]:
    """The sequences, of one kind ("crash", "checkpoint") and framework if given."""
    return tuple(
        s for s in _sequences() if (kind is None or s.kind == kind) and (framework is None or s.framework == framework)
    )


@cache
def _lines() -> tuple[RealLine, ...]:
    with (HERE / "lines.jsonl").open(encoding="utf-8") as f:
        return tuple(RealLine(**json.loads(row)) for row in f if row.strip())


@cache
def _sequences() -> tuple[Sequence, ...]:
    with (HERE / "sequences.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(row) for row in f if row.strip()]
    return tuple(Sequence(**(row | {"lines": tuple(TimedLine(**line) for line in row["lines"])})) for row in rows)
