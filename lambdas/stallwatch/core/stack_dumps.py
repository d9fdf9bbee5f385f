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
A line that is not a well-formed dump is ignored (it is log text: never trusted to raise).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stallwatch.core.contract import STACKS_MARKER
from stallwatch.core.signals import LogLine, Series

FILTER_PATTERN = f'"{STACKS_MARKER}"'  # FilterLogEvents: the dump lines alone (a quoted term matches as a substring)
SIGNATURE_FRAMES = 6  # a group's frames: innermost first, down to the innermost user frame, at most this many
COLLECTIVE_FILES = ("torch/distributed/", "deepspeed/comm/")  # a frame here: the rank waits in a collective
C10D_API = "torch/distributed/distributed_c10d.py"  # its functions name the collective (all_reduce, barrier, ...)
RANKS_NAMED = 8  # ranks a summary names in one place; the evidence counts them all
GROUPS_KEPT = 6  # groups the evidence keeps (the named ones first, then the largest)
FRAMES_KEPT = 8  # frames per group in the evidence
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
    """The dump in a log line (after any launcher prefix, ``[default0]:`` or ``0:``), or None."""
    at = line.message.find(f'"{STACKS_MARKER}"')
    start = line.message.rfind("{", 0, at) if at >= 0 else -1
    if start < 0:
        return None
    try:
        raw, _ = _DECODER.raw_decode(line.message, start)
        return _dump(raw, line.t)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _dump(raw: dict[str, Any], t: float) -> RankDump | None:
    rank, world_size = raw["Rank"], raw.get("WorldSize", 0)
    if type(rank) is not int or type(world_size) is not int or rank < 0:
        return None
    main = tuple(
        Frame(str(f["file"]), int(f["line"]), str(f["func"]), _text(f.get("code")), bool(f.get("lib")))
        for f in raw.get("Main") or []
    )
    collective = raw.get("Collective")
    return RankDump(
        rank=rank,
        host=str(raw.get("Host", "")),
        world_size=max(world_size, rank + 1),
        t=t,
        reason=str(raw.get("Reason", "")),
        stalled_s=float(raw["StalledSeconds"]) if isinstance(raw.get("StalledSeconds"), (int, float)) else None,
        main=main,
        collective=None if not collective or collective.get("seq") is None else _collective(collective),
    )


def _collective(raw: dict[str, Any]) -> Collective:
    return Collective(
        str(raw["group"]), int(raw["seq"]), str(raw.get("op", "")), str(raw.get("state", "")), bool(raw.get("p2p"))
    )


def _text(value: object) -> str | None:
    return str(value) if value else None


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
    missing: tuple[int, ...] = ()  # ranks of the world that wrote no dump
    ranks: int = 0

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
            "missing": list(self.missing[:RANKS_NAMED]),
            "missing_count": len(self.missing),
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
    missing = tuple(sorted(set(range(world)) - {dump.rank for dump in dumps}))
    rule, odd = _odd(list(by_place.values()), dumps)
    groups = tuple(
        Group(
            tuple(d.rank for d in members), tuple(sorted({d.host for d in members})), members[0], members[0].rank in odd
        )
        for members in sorted(by_place.values(), key=lambda m: (-len(m), m[0].rank))
    )
    if rule is None and len(groups) == 1 and 0 < len(missing) <= RANKS_NAMED:
        rule = MISSING
    return StackReport(_summary(groups, rule, missing, world), groups, rule, missing, len(dumps))


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


def _summary(groups: tuple[Group, ...], rule: str | None, missing: tuple[int, ...], world: int) -> str:
    majority = [g for g in groups if not g.odd]
    odd = [g for g in groups if g.odd]
    parts = [g.describe() for g in majority[:1]] + [g.describe() for g in odd[:2]]
    if len(odd) > 2:
        parts.append(f"{sum(len(g.ranks) for g in odd[2:])} more ranks elsewhere")
    if rule == MISSING:
        parts.append(f"no dump from {_ranks(missing)}")
    elif rule is None and len(groups) > 1:
        parts = ["no odd rank out: " + "; ".join(g.describe() for g in groups[:3])]
    read = f" ({world - len(missing)} of {world} ranks' dumps read)" if len(missing) > RANKS_NAMED else ""
    return "; ".join(parts) + read


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:RANKS_NAMED])
    more = f" and {len(ranks) - RANKS_NAMED} more" if len(ranks) > RANKS_NAMED else ""
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}{more}"


def _names(hosts: tuple[str, ...]) -> str:
    return ", ".join(hosts[:RANKS_NAMED]) + (
        f" and {len(hosts) - RANKS_NAMED} more" if len(hosts) > RANKS_NAMED else ""
    )
