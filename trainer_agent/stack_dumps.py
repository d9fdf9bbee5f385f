"""Every thread's stack, once per stall: where this rank is when no step completes, and where it was at SIGTERM.

    agent = TrainerAgent(stall_dumps=StallDumps(steps=3.0, floor_s=60.0))   # the default; None turns dumps off

Every rank runs a watch thread (`StackWatch`) that reads the loop's count of ended steps once a second. When no
step has ended for max(`steps` x the step time it learned, `floor_s`) (before the first step: `first_step_s`, and
never before a declared phase's budget is spent), it reads every thread's frames (`sys._current_frames`: memory, no
I/O) and, where PyTorch's flight recorder is on, this rank's last collective, and writes one line through the sinks
that take stacks (`EmfStdoutSink`: the stdout line; `JsonlSink`), at most once per stall. SIGTERM while the loop is
blocked writes the line first (`StackWatch.on_sigterm`), so a stopped job leaves its last stacks.

The loop's only part is one integer increment per step; the dump never touches the device (the flight recorder's
dump copies its ring buffer and queries CUDA events without waiting, as its own watchdog does) and never raises.

The line, at most MAX_LINE_BYTES (one write that a pipe never interleaves with another rank's), its first key the
marker the control plane filters the logs for; frames innermost first, `lib` on library frames:

    {"StallwatchStacks": 1, "JobName": "llm", "Host": "algo-3", "Rank": 17, "WorldSize": 64, "LocalRank": 1,
     "Pid": 4242, "Steps": 8842, "Reason": "stall", "StalledSeconds": 61.0, "Time": 1767225600.5,
     "Main": [{"file": "loader.py", "line": 88, "func": "__next__", "code": "batch = next(it)"}, ...],
     "Threads": [{"name": "pt_autograd_0", "at": "threading.py:331 wait"}], "ThreadCount": 3,
     "Collective": {"group": "default_pg", "seq": 88420, "op": "all_reduce", "state": "completed"}}
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from types import FrameType
from typing import Any

from trainer_agent.contract import STACKS_MARKER, STACKS_READ_BYTES, STACKS_VERSION
from trainer_agent.identity import Identity
from trainer_agent.log import warn_once

POLL_S = 1.0
"""The watch thread reads the step count this often (a stall is dumped within a second of its threshold)."""
STEP_TIMES = 16
"""Step times the watch keeps; their median is the learned step time."""
SIGTERM_BLOCKED_STEPS = 2.0
"""At SIGTERM the loop is blocked when no step ended for this many step times..."""
SIGTERM_BLOCKED_S = 1.0
"""...and at least this long."""
SOURCE_TIMEOUT_S = 0.5
"""Source lines are read for at most this long (a script on a hung file system must not hold the dump)."""
MAIN_FRAMES = 16
"""The main thread's innermost frames a line starts from (fewer when the line would be too long)."""
THREADS_SHOWN = 8
"""Other threads named in a line; `ThreadCount` counts them all."""
TEXT_CHARS = 160
"""A file name, function or source line is cut to this many characters."""
MAX_LINE_BYTES = 4000
"""A line's bytes, newline included: below PIPE_BUF (4096 on Linux), so ranks sharing stdout never interleave."""
MIN_LINE_BYTES = 700
"""A large job's lines are shorter (STACKS_READ_BYTES over its ranks), never below this: the rank and a frame."""
AGENT_THREAD_PREFIX = "stallwatch-"
"""The agent's own threads (windows, sinks, SIGTERM, this watch) are left out of the dump."""
FLIGHT_RECORDER_ENV = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
# NCCL collectives are in ProcessGroupNCCL's recorder (CUDA builds), gloo's in the generic one: both are read.
FLIGHT_RECORDER_DUMPS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")
STALL, SIGTERM = "stall", "sigterm"

# Files under these directories are the Python installation's, its packages' and this agent's (`lib` frames, shown
# from there: "torch/distributed/distributed_c10d.py"); the rest is the user's code, which the control plane names.
_AGENT_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.join(os.path.realpath(p), "")
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(key))
        },
        key=len,
        reverse=True,
    )
)


@dataclass(frozen=True)
class StallDumps:
    """When the agent writes every thread's stack: once per stall, after no step for max(steps x step time, floor_s)."""

    steps: float = 3.0
    """Learned step times without a step before a stall is dumped."""
    floor_s: float = 60.0
    """Never sooner than this many seconds without a step."""
    first_step_s: float = 600.0
    """Before the first step (loading, compiling, the first collective): this long after the agent started."""

    def __post_init__(self) -> None:
        for name in ("steps", "floor_s", "first_step_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and value < float("inf")):
                raise ValueError(f"StallDumps.{name} must be a positive number, not {value!r}")


@dataclass
class StepClock:
    """The loop's progress as the watch sees it: when the step count last moved, the learned step time, and whether
    this stall's dump is due or taken (one per stall). Times on the agent's clock."""

    dumps: StallDumps
    advanced_at: float
    """When the count last moved (the agent's start before the first step)."""
    count: int = 0
    stepped: bool = False
    claimed: bool = False
    """This stall's dump is written (or being written); the next step clears it."""
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_TIMES))

    def observe(self, count: int, now: float) -> None:
        if count == self.count:
            return
        if self.stepped:  # the first step's time includes the start-up: not learned
            self.step_times.append((now - self.advanced_at) / max(count - self.count, 1))
        self.count, self.advanced_at, self.stepped, self.claimed = count, now, True, False

    def step_time(self) -> float | None:
        return median(self.step_times) if self.step_times else None

    def threshold_s(self) -> float:
        """Seconds without a step that make a stall."""
        if not self.stepped:
            return self.dumps.first_step_s
        return max(self.dumps.steps * (self.step_time() or 0.0), self.dumps.floor_s)

    def stalled_s(self, now: float) -> float:
        return max(now - self.advanced_at, 0.0)

    def due(self, now: float, hold_until: float | None) -> bool:
        """The stall's dump is due: past the threshold and any declared phase's budget, and not yet taken."""
        held = hold_until is not None and now < hold_until
        return not self.claimed and not held and self.stalled_s(now) >= self.threshold_s()

    def blocked(self, count: int, now: float) -> bool:
        """At SIGTERM: no step since the last look, and none for a while (a healthy loop's stop dumps nothing)."""
        least = max(SIGTERM_BLOCKED_STEPS * (self.step_time() or 0.0), SIGTERM_BLOCKED_S)
        return count == self.count and self.stalled_s(now) >= least

    def claim(self) -> bool:
        """Take this stall's one dump; False when it is taken."""
        if self.claimed:
            return False
        self.claimed = True
        return True


@dataclass(frozen=True)
class StackDump:
    """One rank's stacks at a stall (or at SIGTERM), as the sinks that take stacks receive it."""

    job: str
    host: str
    rank: int
    world_size: int
    local_rank: int
    pid: int
    steps: int
    """Steps this process ended since the agent started."""
    reason: str
    """STALL or SIGTERM."""
    stalled_s: float
    t: float
    """Unix time of the dump."""
    main: list[dict[str, Any]]
    """The main thread's frames, innermost first."""
    threads: list[dict[str, str]]
    """Other threads: name and innermost frame."""
    thread_count: int
    collective: dict[str, Any] | None = None
    """This rank's last collective (the flight recorder's newest entry), when the recorder is on."""
    max_bytes: int = MAX_LINE_BYTES
    """The line's bytes at most, newline included (`line_bytes`)."""

    def as_record(self) -> dict[str, Any]:
        """The line's object: the marker first (the control plane's filter), then the rank and its stacks."""
        return {
            STACKS_MARKER: STACKS_VERSION,
            "JobName": self.job,
            "Host": self.host,
            "Rank": self.rank,
            "WorldSize": self.world_size,
            "LocalRank": self.local_rank,
            "Pid": self.pid,
            "Steps": self.steps,
            "Reason": self.reason,
            "StalledSeconds": round(self.stalled_s, 1),
            "Time": round(self.t, 3),
            "Main": self.main,
            "Threads": self.threads,
            "ThreadCount": self.thread_count,
            "Collective": self.collective,
        }

    def line(self) -> str:
        """The record as one JSON line (no newline) within `max_bytes`, shortened from the outside in."""
        record = self.as_record()
        for shorten in _SHORTENINGS:
            record = shorten(record)
            text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
            if len(text.encode()) < self.max_bytes:
                return text
        # Names beyond any bound the fields above have: the rank and why, still one valid line.
        least = {key: record[key] for key in (STACKS_MARKER, "Rank", "WorldSize", "Pid", "Reason", "Time")}
        return json.dumps(least, separators=(",", ":"))


def _without_library_code(record: dict[str, Any]) -> dict[str, Any]:
    return record | {"Main": [{k: v for k, v in f.items() if k != "code" or not f.get("lib")} for f in record["Main"]]}


def _without_threads(record: dict[str, Any]) -> dict[str, Any]:
    return record | {"Threads": []}


def _innermost(frames: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda record: record | {"Main": record["Main"][:frames]}


def _without_code(record: dict[str, Any]) -> dict[str, Any]:
    return record | {"Main": [{k: v for k, v in f.items() if k != "code"} for f in record["Main"]]}


# Each makes the line shorter, least informative first (the first keeps it whole).
_SHORTENINGS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (
    lambda record: record,
    _without_library_code,
    _without_threads,
    _innermost(8),
    _innermost(4),
    _without_code,
    _innermost(1),
)


# -- reading the frames --------------------------------------------------------------------------------------------


def line_bytes(world_size: int) -> int:
    """A rank's line at most: a pipe's atomic write, or less in a job so large that the control plane's read of
    every rank's line (STACKS_READ_BYTES) would not hold them."""
    return max(MIN_LINE_BYTES, min(MAX_LINE_BYTES, STACKS_READ_BYTES // max(world_size, 1)))


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


def _display(filename: str) -> tuple[str, bool]:
    """A frame's file as shown (relative to the import root that holds it), and whether it is library code."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return filename, True
    path = os.path.realpath(filename)
    for root in _LIBRARY_DIRS:
        if path.startswith(root):
            return path[len(root) :], True
    if path.startswith(os.path.join(_AGENT_ROOT, "trainer_agent", "")):  # the agent run from a checkout
        return path[len(_AGENT_ROOT) :], True
    roots = [os.path.join(os.path.realpath(p or os.curdir), "") for p in sys.path if isinstance(p, str)]
    inside = [root for root in roots if path.startswith(root)]
    return (path[len(max(inside, key=len)) :] if inside else path), False


def _frames(frame: FrameType | None, limit: int) -> list[tuple[str, int, str]]:
    """(file, line, function) of `frame` and its callers, innermost first, at most `limit` (a deep recursion is
    never walked whole)."""
    found = []
    while frame is not None and len(found) < limit:
        found.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    return found


def _sources(keys: list[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], str]:
    """The source lines of (file, line) pairs, read on a thread of their own for at most `timeout_s`: what is read by
    then (a file on a hung mount leaves its lines out, and the thread behind)."""
    found: dict[tuple[str, int], str] = {}

    def read() -> None:
        for filename, lineno in keys:
            found[(filename, lineno)] = linecache.getline(filename, lineno).strip()

    reader = threading.Thread(target=read, name=f"{AGENT_THREAD_PREFIX}source", daemon=True)
    reader.start()
    reader.join(timeout_s)
    return dict(found)


def _frame_records(frames: list[tuple[str, int, str]], sources: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    records = []
    for filename, lineno, function in frames:
        shown, library = _display(filename)
        record: dict[str, Any] = {"file": _cut(shown), "line": lineno, "func": _cut(function)}
        if code := sources.get((filename, lineno)):
            record["code"] = _cut(code)
        if library:
            record["lib"] = True
        records.append(record)
    return records


def _other_threads(frames: dict[int, FrameType], main_id: int | None) -> tuple[list[dict[str, str]], int]:
    """The threads other than the main one and the agent's: their names and innermost frames, and how many."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    shown = []
    for ident, frame in frames.items():
        name = names.get(ident, f"thread-{ident}")
        if ident == main_id or name.startswith(AGENT_THREAD_PREFIX):
            continue
        (filename, lineno, function), *_ = _frames(frame, 1)
        shown.append({"name": _cut(name), "at": _cut(f"{_display(filename)[0]}:{lineno} {function}")})
    shown.sort(key=lambda thread: thread["name"])
    return shown[:THREADS_SHOWN], len(shown)


def last_collective() -> dict[str, Any] | None:
    """This rank's newest flight-recorder entry (group, sequence number, op, state), or None when the recorder is
    off, torch.distributed is not initialized, or this torch has no recorder dump."""
    if not any(_positive(os.environ.get(name)) for name in FLIGHT_RECORDER_ENV):
        return None
    torch = sys.modules.get("torch")
    distributed = getattr(torch, "distributed", None)
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    c10d = torch._C._distributed_c10d  # type: ignore[union-attr]
    entries: list[dict[str, Any]] = []
    for name in FLIGHT_RECORDER_DUMPS:
        dump = getattr(c10d, name, None)
        if dump is not None:
            entries += json.loads(dump(True, False)).get("entries") or []  # collectives, not only the active ones
    if not entries:
        return None
    newest = max(entries, key=lambda entry: entry.get("time_created_ns") or 0)
    p2p = bool(newest.get("is_p2p"))
    group = newest.get("process_group") or ["", ""]
    done = newest.get("retired") or newest.get("state") == "completed"
    return {
        "group": str(group[-1] or group[0]),
        "seq": newest.get("p2p_seq_id" if p2p else "collective_seq_id"),
        "op": str(newest.get("profiling_name", "")).rpartition(":")[2],
        "state": "completed" if done else str(newest.get("state", "")),
    } | ({"p2p": True} if p2p else {})


def _positive(value: str | None) -> bool:
    try:
        return int(value or 0) > 0
    except ValueError:
        return False


def current_rank(identity: Identity) -> tuple[int, int, int]:
    """(rank, world size, local rank): torch.distributed's once it is initialized (Lightning starts it after the
    agent), else the launcher's as the identity read them."""
    torch = sys.modules.get("torch")
    distributed = getattr(torch, "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size(), identity.local_rank
    return identity.rank, identity.world_size, identity.local_rank


def capture(
    identity: Identity, steps: int, reason: str, stalled_s: float, source_timeout_s: float = SOURCE_TIMEOUT_S
) -> StackDump:
    """This process's stacks now: the main thread's innermost frames (with source lines read within
    `source_timeout_s`), the other threads' innermost frames, and the last collective."""
    frames = sys._current_frames()
    main_id = threading.main_thread().ident
    main = _frames(frames.get(main_id) if main_id is not None else None, MAIN_FRAMES)
    others, count = _other_threads(frames, main_id)
    del frames  # frames hold their locals: let them go before the slower work below
    sources = _sources([(filename, lineno) for filename, lineno, _ in main], source_timeout_s)
    rank, world_size, local_rank = current_rank(identity)
    try:
        collective = last_collective()
    except Exception as error:  # a recorder this torch spells differently: the stacks still go out
        warn_once("stacks:collective", "trainer_agent: reading the flight recorder failed: %r", error)
        collective = None
    return StackDump(
        job=identity.job,
        host=identity.host,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        pid=os.getpid(),
        steps=steps,
        reason=reason,
        stalled_s=stalled_s,
        t=time.time(),
        main=_frame_records(main, sources),
        threads=others,
        thread_count=count,
        collective=collective,
        max_bytes=line_bytes(world_size),
    )


class StackWatch:
    """The stall watch of one process: a thread reading the loop's step count, writing a dump once per stall."""

    def __init__(
        self,
        dumps: StallDumps,
        identity: Identity,
        write: Callable[[StackDump], None],
        progress: Callable[[], int],
        hold_until: Callable[[], float | None],
        clock: Callable[[], float],
    ) -> None:
        """`write` hands a dump to the sinks; `progress` reads the loop's count of ended steps; `hold_until` the end
        of the declared phases' budgets (no stall dump before it); `clock` the agent's."""
        self.identity = identity
        self._write = write
        self._progress = progress
        self._hold_until = hold_until
        self._clock = clock
        self._lock = threading.Lock()
        self.steps = StepClock(dumps, advanced_at=clock())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{AGENT_THREAD_PREFIX}stacks", daemon=True)

    def start(self) -> StackWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """One look at the loop (the thread's, every POLL_S): dump the stall when it is due; whether it did."""
        now = self._clock()
        with self._lock:
            self.steps.observe(self._progress(), now)
            due = self.steps.due(now, self._hold_until()) and self.steps.claim()
            stalled_s = self.steps.stalled_s(now)
        if due:
            self._dump(STALL, stalled_s, SOURCE_TIMEOUT_S)
        return due

    def on_sigterm(self, timeout_s: float) -> None:
        """SIGTERM: dump now if the loop is blocked and this stall has no dump yet (source lines within
        `timeout_s`)."""
        now = self._clock()
        with self._lock:
            due = self.steps.blocked(self._progress(), now) and self.steps.claim()
            stalled_s = self.steps.stalled_s(now)
        if due:
            self._dump(SIGTERM, stalled_s, min(timeout_s, SOURCE_TIMEOUT_S))

    def _dump(self, reason: str, stalled_s: float, source_timeout_s: float) -> None:
        try:
            self._write(capture(self.identity, self.steps.count, reason, stalled_s, source_timeout_s))
        except Exception as error:  # never into the loop; the next stall tries again
            warn_once("stacks:dump", "trainer_agent: writing the stack dump failed: %r", error)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.check()
            except Exception as error:  # keep watching whatever one look does
                warn_once("stacks:watch", "trainer_agent: the stall watch failed: %r", error)
