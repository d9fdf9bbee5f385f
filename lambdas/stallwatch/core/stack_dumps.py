"""Why it hung: the agent's stack dumps (one line per rank per stall), grouped, and the odd rank out named.

    dumps = stack_dumps.latest(signals.stacks, since=last_step_t)    # each rank's newest dump of this stall
    report = stack_dumps.explain(dumps, has_agent=True)
    report.summary  # "63 ranks in all_reduce (train.py:212, seq 88421); rank 17 on algo-3 in loader.py:88
                    #  `batch = next(it)`, seq 88420"

Ranks are grouped by their main thread's innermost frames (down to their innermost frame of the user's code) and
their last collective. The odd ranks are named by the first rule that tells them apart:
1. sequence: where the flight recorder is on, the ranks whose last collective in a process group is behind the
   others' there never entered the collective the others wait in;
2. collective: ranks in a collective (a frame of torch.distributed) wait for the ranks that are elsewhere;
3. minority: the ranks outside the largest group.
With every rank in one place, the ranks that wrote no dump (of `WorldSize`) are named, up to a host's worth: a dead
rank writes none (more missing than that is a read cut short, or ranks not yet due, and the summary counts them).
A line that is not a well-formed dump is ignored (it is log text: never trusted to raise). Every field is bounded
as the agent bounds it (`LINE_CHARS`, `TEXT_CHARS`, `FRAMES_READ`, `WORLD_SIZE_MAX`): a dump over a bound is read as
a dump cut short (`RankDump.cut`, counted in the report), never raised, so what the evidence keeps of any dump is a
few KB whatever a line holds.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stallwatch.core import json_prefix
from stallwatch.core.contract import STACKS_MARKER
from stallwatch.core.signals import LogLine, Series

FILTER_PATTERN = f'"{STACKS_MARKER}"'  # FilterLogEvents: the dump lines alone (a quoted term matches as a substring)
SIGNATURE_FRAMES = 6  # a group's frames: innermost first, down to the innermost user frame, at most this many
COLLECTIVE_FILES = ("torch/distributed/", "deepspeed/comm/")  # a frame here: the rank waits in a collective
C10D_API = "torch/distributed/distributed_c10d.py"  # its functions name the collective (all_reduce, barrier, ...)
RANKS_NAMED = 8  # ranks a summary names in one place; the evidence counts them all
GROUPS_KEPT = 6  # groups the evidence keeps (the named ones first, then the largest)
FRAMES_KEPT = 8  # frames per group in the evidence
# The bounds of a dump as read (trainer_agent.stack_dumps writes lines of at most 4,000 bytes, texts of at most 160
# characters and 16 frames): anything past them is read as cut short.
LINE_CHARS = 16_000  # a line is read this far from its dump's opening brace
TEXT_CHARS = 160  # a host, file, function, source line, reason or group name
FRAMES_READ = 16  # the main thread's innermost frames
WORLD_SIZE_MAX = 1 << 20  # a Rank at or past it is no training job's (the line is ignored); a WorldSize past it unknown
INT_MAX = 1 << 63  # a line number or sequence past it is not one
SEQUENCE, COLLECTIVE, MINORITY, MISSING = "sequence", "collective", "minority", "missing"
NO_AGENT = "no stack dumps: the trainer agent is not in this job (its stall watch writes every rank's stack)"
NO_DUMPS = "no stack dumps read for this stall (the agent writes them a minute into it; stall_dumps=None writes none)"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Frame:
    """One frame of a dump: file (relative to its import root), line, function, source line, library or user."""

    file: str
    line: int
    func: str
    code: str | None = None
    lib: bool = False

    @property
    def place(self) -> str:
        return f"{self.file}:{self.line}"

    def text(self, quoted: bool = True) -> str:
        """``train.py:212 step `loss.backward()```, as a line of text shows a frame; not `quoted`, as a code block
        does: ``train.py:212 step: loss.backward()``."""
        if not self.code:
            return f"{self.place} {self.func}"
        return f"{self.place} {self.func} `{self.code}`" if quoted else f"{self.place} {self.func}: {self.code}"


@dataclass(frozen=True)
class Collective:
    """A rank's last collective as the flight recorder has it."""

    group: str
    seq: int
    op: str
    state: str = ""
    p2p: bool = False


@dataclass(frozen=True)
class RankDump:
    """One rank's dump, as its line says (`t`: the log event's time)."""

    rank: int
    host: str
    world_size: int
    t: float
    reason: str
    main: tuple[Frame, ...]
    collective: Collective | None = None
    stalled_s: float | None = None  # how long its loop had been without a step
    cut: bool = False  # read cut short: the line, a text, its frames or its world size past a bound

    def describe(self, frames: int = 3) -> str:
        """``rank 1's stacks (stall, 61 s without a step): loader.py:88 __next__ `next(it)` <- train.py:198 train``:
        the innermost user frame and its callers'."""
        shown = [f for f in self.main[self._user_index() :] if not f.lib][:frames] or list(self.main[:1])
        after = f", {self.stalled_s:g} s without a step" if self.stalled_s is not None else ""
        inside = f"in {self.op}, " if self.op else ""
        return f"rank {self.rank}'s stacks ({self.reason}{after}): {inside}" + " <- ".join(f.text() for f in shown)

    @property
    def signature(self) -> tuple[tuple[str, ...], tuple[str, int, bool] | None]:
        """What groups ranks: the places of the innermost frames (to the innermost user frame) and the collective."""
        shown = self.main[: self._user_index() + 1][:SIGNATURE_FRAMES]
        where = self.collective
        return tuple(f"{f.place} {f.func}" for f in shown), None if where is None else (
            where.group,
            where.seq,
            where.p2p,
        )

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the user's code (else the innermost frame)."""
        return self.main[self._user_index()] if self.main else None

    @property
    def waiting(self) -> bool:
        """In a collective: a torch.distributed (or DeepSpeed comm) frame among the innermost ones."""
        return bool(self._collective_frames())

    @property
    def op(self) -> str | None:
        """The collective it waits in: its torch.distributed function (the outermost: all_reduce rather than the
        wrapper around it), else the flight recorder's op, else the function of its outermost collective frame."""
        frames = self._collective_frames()
        api = [f for f in frames if f.file.endswith(C10D_API)]
        if api:
            return api[-1].func
        if frames and self.collective is not None:
            return self.collective.op
        return frames[-1].func if frames else None

    def _user_index(self) -> int:
        return next((i for i, frame in enumerate(self.main) if not frame.lib), 0)

    def _collective_frames(self) -> list[Frame]:
        inner = self.main[: self._user_index() + 1][:SIGNATURE_FRAMES]
        return [f for f in inner if f.lib and f.file.startswith(COLLECTIVE_FILES)]


def parse(line: LogLine) -> RankDump | None:
    """The dump in a log line (after any launcher prefix, ``[default0]:`` or ``0:``), or None; a line longer than
    `LINE_CHARS` is read that far, as a dump cut short."""
    at = line.message.find(f'"{STACKS_MARKER}"')
    start = line.message.rfind("{", 0, at) if at >= 0 else -1
    if start < 0:
        return None
    try:
        if len(line.message) - start <= LINE_CHARS:
            raw, _ = _DECODER.raw_decode(line.message, start)
            return _dump(raw, line.t, cut=False)
        raw, whole = json_prefix.read(line.message[start : start + LINE_CHARS])
        return _dump(raw, line.t, cut=not whole)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def _dump(raw: dict[str, Any], t: float, cut: bool) -> RankDump | None:
    rank, world_size = raw["Rank"], raw.get("WorldSize", 0)
    if type(rank) is not int or type(world_size) is not int or not 0 <= rank < WORLD_SIZE_MAX:
        return None
    known = 0 <= world_size <= WORLD_SIZE_MAX  # past the bound: a world no job has, its size unknown
    bounded = _Bounded(cut or not known)
    frames = raw.get("Main") or []
    if not isinstance(frames, list):
        return None
    bounded.cut |= len(frames) > FRAMES_READ
    main = tuple(map(bounded.frame, frames[:FRAMES_READ]))
    stalled = raw.get("StalledSeconds")
    return RankDump(
        rank=rank,
        host=bounded.text(raw.get("Host")),
        world_size=max(world_size if known else 0, rank + 1),
        t=t,
        reason=bounded.text(raw.get("Reason")),
        stalled_s=float(stalled) if type(stalled) in (int, float) and 0 <= stalled < INT_MAX else None,
        main=main,
        collective=bounded.collective(raw.get("Collective")),
        cut=bounded.cut,
    )


@dataclass
class _Bounded:
    """Reads a dump's fields within their bounds, and remembers whether any was past one (`cut`)."""

    cut: bool = False

    def text(self, value: object) -> str:
        """A text within `TEXT_CHARS` (marked where cut); a missing one, or one that is not text, is empty."""
        text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
        if len(text) <= TEXT_CHARS:
            return text
        self.cut = True
        return text[: TEXT_CHARS - 1] + "…"

    def frame(self, raw: object) -> Frame:
        """A frame; ValueError for one that is not (the line is then no dump)."""
        if not isinstance(raw, dict) or not _count(raw.get("line")) or "file" not in raw or "func" not in raw:
            raise ValueError(f"not a frame: {str(raw)[:80]}")
        code = self.text(raw.get("code"))
        return Frame(
            self.text(raw.get("file")), raw["line"], self.text(raw.get("func")), code or None, bool(raw.get("lib"))
        )

    def collective(self, raw: object) -> Collective | None:
        if not isinstance(raw, dict) or not _count(raw.get("seq")):
            return None
        group, op, state = (self.text(raw.get(name)) for name in ("group", "op", "state"))
        return Collective(group, raw["seq"], op, state, bool(raw.get("p2p")))


def _count(value: object) -> bool:
    """A line number or sequence number: an int in [0, INT_MAX)."""
    return type(value) is int and 0 <= value < INT_MAX


def latest(lines: Iterable[LogLine], since: float | None = None) -> list[RankDump]:
    """Each rank's newest dump written at or after `since` (this stall's: the last step), by rank."""
    newest: dict[int, RankDump] = {}
    for line in lines:
        dump = parse(line)
        if dump is None or (since is not None and dump.t < since):
            continue
        if dump.rank not in newest or dump.t >= newest[dump.rank].t:
            newest[dump.rank] = dump
    return [newest[rank] for rank in sorted(newest)]


def dumps_since(agent: dict[str, Series], lookback_start: float) -> float | None:
    """Where a decision's read of the dumps starts: the agent's last window with a step (its period's start), else
    `lookback_start`; None when its newest window has steps (no stall: nothing to read) or there is no agent."""
    steps = agent.get("Steps", Series())
    if not steps.points:
        return None
    if steps.points[-1][1] > 0:
        return None
    stepped = [t for t, value in steps.points if value > 0]
    return stepped[-1] if stepped else lookback_start


@dataclass(frozen=True)
class Group:
    """Ranks in one place."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]  # sorted, each once
    sample: RankDump  # the lowest rank's dump
    odd: bool = False

    def describe(self) -> str:
        """``63 ranks in all_reduce (train.py:212, seq 88421)`` or ``rank 17 on algo-3 in loader.py:88 `next(it)```."""
        sample, frame = self.sample, self.sample.user_frame
        where = "nowhere (no frames)" if frame is None else frame.place
        seq = f", seq {sample.collective.seq}" if sample.collective is not None else ""
        if self.odd:
            code = f" `{frame.code}`" if frame is not None and frame.code else ""
            return f"{_ranks(self.ranks)} on {_names(self.hosts)} in {where}{code}{seq}"
        what = f"in {sample.op}" if sample.op else f"in {frame.func}" if frame is not None else "in"
        count = f"{len(self.ranks)} rank{'s' if len(self.ranks) != 1 else ''}"
        return f"{count} {what} ({where}{seq})"

    def evidence(self) -> dict[str, Any]:
        sample = self.sample
        found: dict[str, Any] = {
            "count": len(self.ranks),
            "ranks": list(self.ranks[:RANKS_NAMED]),
            "hosts": list(self.hosts[:RANKS_NAMED]),
            "odd": self.odd,
            "op": sample.op,
            "frames": [frame.text(quoted=False) for frame in sample.main[:FRAMES_KEPT]],  # shown in code blocks
        }
        if sample.collective is not None:
            c = sample.collective
            found["collective"] = {"group": c.group, "seq": c.seq, "op": c.op, "state": c.state}
        return found


@dataclass(frozen=True)
class StackReport:
    """The dumps of one stall, grouped: the summary line (the alert's, the audit's) and the evidence."""

    summary: str
    groups: tuple[Group, ...] = ()
    rule: str | None = None  # which rule named the odd ranks; None when none could be named
    missing: tuple[int, ...] = ()  # the first ranks of the world that wrote no dump (at most RANKS_NAMED)
    ranks: int = 0
    missing_count: int = 0  # how many wrote none
    cut: int = 0  # dumps read cut short (a line, text, frames or world size past its bound)

    @property
    def named(self) -> list[int]:
        """The ranks named as the odd ones out."""
        named = [rank for group in self.groups if group.odd for rank in group.ranks]
        return named + list(self.missing if self.rule == MISSING else ())

    def evidence(self) -> dict[str, Any]:
        """What the decision's evidence keeps (bounded: a few KB whatever the world size)."""
        kept = sorted(self.groups, key=lambda g: (not g.odd, -len(g.ranks)))[:GROUPS_KEPT]
        return {
            "summary": self.summary,
            "rule": self.rule,
            "ranks": self.ranks,
            "named": self.named[:RANKS_NAMED],
            "missing": list(self.missing),
            "missing_count": self.missing_count,
            "cut": self.cut,
            "groups": [group.evidence() for group in kept],
        }


def explain(dumps: list[RankDump], has_agent: bool = True) -> StackReport:
    """Group the ranks' dumps and name the odd ones out (module docstring); one line when there are none."""
    if not dumps:
        return StackReport(NO_DUMPS if has_agent else NO_AGENT)
    by_place: dict[Any, list[RankDump]] = defaultdict(list)
    for dump in dumps:
        by_place[dump.signature].append(dump)
    world = max(dump.world_size for dump in dumps)
    ranks = {dump.rank for dump in dumps}  # each below `world`: a dump's world holds its rank
    missing = tuple(itertools.islice((r for r in range(world) if r not in ranks), RANKS_NAMED))  # never range(world)
    missing_count = world - len(ranks)
    rule, odd = _odd(list(by_place.values()), dumps)
    groups = tuple(
        Group(
            tuple(d.rank for d in members), tuple(sorted({d.host for d in members})), members[0], members[0].rank in odd
        )
        for members in sorted(by_place.values(), key=lambda m: (-len(m), m[0].rank))
    )
    if rule is None and len(groups) == 1 and 0 < missing_count <= RANKS_NAMED:
        rule = MISSING
    cut = sum(dump.cut for dump in dumps)
    summary = _summary(groups, rule, missing, missing_count, world) + (f"; {cut} of the dumps cut short" if cut else "")
    return StackReport(summary, groups, rule, missing, len(dumps), missing_count, cut)


def _odd(groups: list[list[RankDump]], dumps: list[RankDump]) -> tuple[str | None, set[int]]:
    """The rule that tells some ranks apart, and their ranks (module docstring)."""
    behind = _behind(dumps)
    if behind:
        return SEQUENCE, behind
    waiting = {d.rank for d in dumps if d.waiting}
    if waiting and len(waiting) < len(dumps):
        return COLLECTIVE, {d.rank for d in dumps} - waiting
    sizes = sorted((len(g) for g in groups), reverse=True)
    if len(sizes) > 1 and sizes[0] > sizes[1]:
        largest = max(groups, key=len)
        return MINORITY, {d.rank for d in dumps} - {d.rank for d in largest}
    return None, set()


def _behind(dumps: list[RankDump]) -> set[int]:
    """Ranks whose last collective in a process group is behind the most advanced rank's there."""
    by_group: dict[tuple[str, bool], list[RankDump]] = defaultdict(list)
    for dump in dumps:
        if dump.collective is not None:
            by_group[(dump.collective.group, dump.collective.p2p)].append(dump)
    behind: set[int] = set()
    for members in by_group.values():
        ahead = max(d.collective.seq for d in members if d.collective is not None)
        behind |= {d.rank for d in members if d.collective is not None and d.collective.seq < ahead}
    return behind


def _summary(
    groups: tuple[Group, ...], rule: str | None, missing: tuple[int, ...], missing_count: int, world: int
) -> str:
    majority = [g for g in groups if not g.odd]
    odd = [g for g in groups if g.odd]
    parts = [g.describe() for g in majority[:1]] + [g.describe() for g in odd[:2]]
    if len(odd) > 2:
        parts.append(f"{sum(len(g.ranks) for g in odd[2:])} more ranks elsewhere")
    if rule == MISSING:
        parts.append(f"no dump from {_ranks(missing)}")
    elif rule is None and len(groups) > 1:
        parts = ["no odd rank out: " + "; ".join(g.describe() for g in groups[:3])]
    read = f" ({world - missing_count} of {world} ranks' dumps read)" if missing_count > RANKS_NAMED else ""
    return "; ".join(parts) + read


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:RANKS_NAMED])
    more = f" and {len(ranks) - RANKS_NAMED} more" if len(ranks) > RANKS_NAMED else ""
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}{more}"


def _names(hosts: tuple[str, ...]) -> str:
    return ", ".join(hosts[:RANKS_NAMED]) + (
        f" and {len(hosts) - RANKS_NAMED} more" if len(hosts) > RANKS_NAMED else ""
    )
