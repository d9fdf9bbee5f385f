"""The stall watch: one dump of every thread's stack per stall, bounded, never in the loop's way."""

from __future__ import annotations

import gc
import json
import logging
import sys
import threading
import time
import types

import pytest
import torch

from tests.agent.conftest import MemorySink
from trainer_agent import StallDumps, TrainerAgent
from trainer_agent import stack_dumps as stack_dumps_module
from trainer_agent.contract import STACKS_MARKER, STACKS_READ_BYTES
from trainer_agent.stack_dumps import (
    MAX_LINE_BYTES,
    MIN_LINE_BYTES,
    SIGTERM,
    STALL,
    StackDump,
    StepClock,
    capture,
    last_collective,
)

DUMPS = StallDumps(steps=3.0, floor_s=60.0, first_step_s=600.0)


class StacksSink(MemorySink):
    """Keeps windows and stack dumps."""

    def __init__(self) -> None:
        super().__init__()
        self.dumps: list[StackDump] = []

    def emit_stacks(self, dump: StackDump) -> None:
        self.dumps.append(dump)


@pytest.fixture
def stacks_sink() -> StacksSink:
    return StacksSink()


@pytest.fixture
def watched(make_agent, stacks_sink, clock):
    """An agent whose stall watch is driven by hand (its thread's look, `check()`), on the fake clock."""

    def make(**kwargs: object) -> TrainerAgent:
        agent = make_agent(sinks=[stacks_sink], **kwargs)
        agent._stacks.stop()  # the test looks for it, on the fake clock
        return agent

    return make


def dumped(agent: TrainerAgent, sink: StacksSink) -> list[StackDump]:
    """The dumps the sink has once the agent's sinks took what was queued (each sink runs on its own thread)."""
    assert agent.sinks.wait_idle(5.0)
    return sink.dumps


def steps(agent: TrainerAgent, clock, n: int, every_s: float) -> None:
    for _ in range(n):
        with agent.step():
            clock.advance(every_s)
        agent._stacks.check()


def test_the_step_clock_learns_the_step_time_and_dumps_once_per_stall() -> None:
    # Given a watch that saw the count move by 10 steps a second (1 s looks), then by one 30 s step
    clock = StepClock(DUMPS, advanced_at=0.0)
    for second in range(1, 6):
        clock.observe(10 * second, float(second))
    assert clock.step_time() == pytest.approx(0.1)

    # When no step ends: the floor holds until 60 s, then the dump is due, once
    assert not clock.due(5.0 + 59.0, None)
    assert clock.due(5.0 + 60.0, None)
    assert clock.claim()
    assert not clock.claim()
    assert not clock.due(5.0 + 600.0, None)

    # Then a step re-arms it; with slow steps (30 s) the threshold is 3 of them, past the floor
    for k in range(1, 7):
        clock.observe(50 + k, 65.0 + 30.0 * k)
    assert clock.threshold_s() == pytest.approx(90.0)
    assert not clock.due(245.0 + 89.0, None)
    assert clock.due(245.0 + 90.0, None)


def test_before_the_first_step_and_inside_a_phase_the_dump_waits() -> None:
    clock = StepClock(DUMPS, advanced_at=0.0)
    assert not clock.due(599.0, None)
    assert clock.due(600.0, None)
    clock.observe(1, 700.0)
    assert not clock.due(700.0 + 60.0, hold_until=700.0 + 900.0)  # a declared checkpoint's budget
    assert clock.due(700.0 + 900.0, hold_until=700.0 + 900.0)


def test_a_stalled_loop_gets_one_dump_of_its_stacks_through_the_sinks_that_take_them(watched, stacks_sink, clock):
    # Given a loop stepping every 2 s (its windows go to the same sinks)
    agent = watched()
    steps(agent, clock, 10, every_s=2.0)

    # When no step ends for 59 s, then 60 s (the floor: 3 x 2 s is less), then 10 minutes
    clock.advance(59.0)
    assert not agent._stacks.check()
    clock.advance(1.0)
    assert agent._stacks.check()
    clock.advance(600.0)
    assert not agent._stacks.check()

    # Then one dump went out: this rank, its step count, and the main thread inside this test
    (dump,) = dumped(agent, stacks_sink)
    assert (dump.rank, dump.world_size, dump.host, dump.job) == (0, 1, "algo-1", "test-job")
    assert (dump.reason, dump.steps, dump.stalled_s) == (STALL, 10, pytest.approx(60.0))
    assert dump.main[0]["func"] == "capture"
    assert any(
        f["func"] == "test_a_stalled_loop_gets_one_dump_of_its_stacks_through_the_sinks_that_take_them"
        for f in dump.main
    )
    this = next(f for f in dump.main if f["file"].endswith("test_stack_dumps.py"))
    assert "lib" not in this
    assert "agent._stacks.check()" in this["code"]

    # And a step re-arms the watch: the next stall is dumped again
    steps(agent, clock, 1, every_s=1.0)
    clock.advance(60.0)
    assert agent._stacks.check()
    assert len(dumped(agent, stacks_sink)) == 2


def test_the_line_starts_with_the_marker_and_names_the_rank_the_threads_and_library_frames(stacks_sink):
    # Given a worker thread blocked in threading (a library frame) beside the main thread
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="pt_autograd_0", daemon=True)
    worker.start()
    try:
        dump = capture(_identity(), 7, STALL, 61.0)
    finally:
        release.set()

    # When it is written as a line
    line = dump.line()
    record = json.loads(line)

    # Then the marker is the first key, and the other thread is named by its innermost (library) frame
    assert line.startswith('{"' + STACKS_MARKER + '":1,')
    assert record["Rank"] == 0
    assert record["Steps"] == 7
    assert record["ThreadCount"] >= 1
    autograd = next(t for t in record["Threads"] if t["name"] == "pt_autograd_0")
    assert autograd["at"].startswith("threading.py:")
    assert not any(t["name"].startswith("stallwatch-") for t in record["Threads"])


def _identity():
    from trainer_agent.identity import Identity

    return Identity.detect()


def test_a_huge_stack_many_threads_and_long_names_still_make_one_valid_bounded_line():
    # Given a main thread 3,000 frames deep in a function with a 10,000-character name, beside 300 threads
    release = threading.Event()
    threads = [
        threading.Thread(target=release.wait, name=f"worker-{i:03d}" + "x" * 500, daemon=True) for i in range(300)
    ]
    for thread in threads:
        thread.start()
    name = "f" * 10_000
    namespace: dict = {}
    exec(f"def {name}(n, grab):\n    return grab() if n == 0 else {name}(n - 1, grab)", namespace)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        dump = namespace[name](3_000, lambda: capture(_identity(), 1, STALL, 99.0))
    finally:
        sys.setrecursionlimit(limit)
        release.set()

    # When it is written
    line = dump.line()

    # Then it is one JSON line below a pipe's atomic write, still with the innermost frames and the rank
    assert len(line.encode()) + 1 <= MAX_LINE_BYTES
    assert "\n" not in line
    record = json.loads(line)
    assert record["Rank"] == 0
    assert record["ThreadCount"] >= 300
    assert record["Main"][0]["func"] == "capture"
    assert record["Main"][2]["func"].startswith("fff")


def test_a_failing_sink_never_reaches_the_loop_and_the_others_still_get_the_dump(
    make_agent, stacks_sink, clock, caplog
):
    # Given a sink whose emit_stacks raises, beside one that works
    class Broken(StacksSink):
        def emit_stacks(self, dump: StackDump) -> None:
            raise OSError("disk full")

    agent = make_agent(sinks=[Broken(), stacks_sink])
    agent._stacks.stop()
    steps(agent, clock, 3, every_s=1.0)

    # When a stall is dumped, while the loop goes on stepping
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        clock.advance(60.0)
        assert agent._stacks.check()
        steps(agent, clock, 2, every_s=1.0)
        agent.flush()

    # Then the working sink has the dump and the windows, and the failure was logged, not raised
    assert len(dumped(agent, stacks_sink)) == 1
    assert stacks_sink.job[-1].metrics["Steps"] == 5
    assert any("disk full" in record.getMessage() for record in caplog.records)


def test_a_source_file_that_cannot_be_read_in_time_leaves_its_lines_out(watched, stacks_sink, clock, monkeypatch):
    # Given source files on a mount that hangs
    hung = threading.Event()
    monkeypatch.setattr(stack_dumps_module.linecache, "getline", lambda *_: hung.wait(30.0) and "")
    monkeypatch.setattr(stack_dumps_module, "SOURCE_TIMEOUT_S", 0.2)
    agent = watched()
    steps(agent, clock, 2, every_s=1.0)

    # When the stall is dumped
    clock.advance(60.0)
    started = time.monotonic()
    assert agent._stacks.check()
    hung.set()

    # Then the dump went out at once, with its frames and without source lines
    assert time.monotonic() - started < 5.0
    (dump,) = dumped(agent, stacks_sink)
    assert dump.main
    assert not any("code" in frame for frame in dump.main)


def test_sigterm_dumps_a_blocked_loop_once_and_a_stepping_one_not_at_all(watched, stacks_sink, clock):
    # Given a loop that has just stepped
    agent = watched()
    steps(agent, clock, 5, every_s=0.1)

    # When SIGTERM comes at once: no dump; when it comes with the loop blocked for 5 s: one
    agent._stacks.on_sigterm(2.0)
    assert dumped(agent, stacks_sink) == []
    clock.advance(5.0)
    agent._stacks.on_sigterm(2.0)
    agent._stacks.on_sigterm(2.0)

    # Then it is the SIGTERM's, and a stall dump after it is not written (one per stall)
    (dump,) = dumped(agent, stacks_sink)
    assert (dump.reason, dump.stalled_s) == (SIGTERM, pytest.approx(5.0))
    clock.advance(600.0)
    assert not agent._stacks.check()


def test_a_rank_that_reports_nothing_still_dumps_its_stacks_and_logs_nothing(
    monkeypatch, watched, stacks_sink, clock, caplog
):
    # Given rank 3 of 4 (local rank 1): no windows
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with caplog.at_level(logging.DEBUG, logger="trainer_agent"):
        agent = watched()
        steps(agent, clock, 3, every_s=1.0)
        clock.advance(60.0)
        agent._stacks.check()
        agent.close()

    # Then no window, one dump naming rank 3, and not a line of log
    assert stacks_sink.windows == []
    assert [(d.rank, d.world_size, d.local_rank) for d in stacks_sink.dumps] == [(3, 4, 1)]
    assert caplog.records == []


def test_stall_dumps_none_turns_the_watch_off_and_a_sink_without_stacks_never_starts_it(make_agent, stacks_sink, sink):
    assert make_agent(sinks=[stacks_sink], stall_dumps=None)._stacks is None
    assert make_agent(sinks=[sink])._stacks is None  # MemorySink takes windows only


@pytest.mark.parametrize("field", ["steps", "floor_s", "first_step_s"])
def test_bad_settings_are_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=f"StallDumps.{field}"):
        StallDumps(**{field: 0})


def test_the_step_path_makes_no_call_for_the_watch(make_agent, stacks_sink, clock):
    """On CPU: the calls step() makes are the same with the stall watch on and off (the watch reads a counter)."""

    def calls_of_one_step(agent: TrainerAgent) -> list[str]:
        seen: list[str] = []

        def profile(frame, event, arg):
            if event in ("call", "c_call"):
                seen.append(getattr(arg, "__qualname__", None) or frame.f_code.co_qualname)

        gc.collect()
        gc.disable()  # a collection's weakref callbacks are no call of step()'s
        sys.setprofile(profile)
        try:
            with agent.step(tokens=8, samples=1):
                pass
        finally:
            sys.setprofile(None)
            gc.enable()
        return seen

    watching = make_agent(sinks=[stacks_sink])
    quiet = make_agent(sinks=[stacks_sink], stall_dumps=None)
    assert watching._stacks is not None
    assert quiet._stacks is None
    calls = calls_of_one_step(watching)
    assert calls == calls_of_one_step(quiet)
    assert not any("StackWatch" in call or "StepClock" in call for call in calls)
    assert watching._ended == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: on CPU the step-path test stands in")
def test_on_cuda_a_dump_never_synchronizes(stacks_sink):
    # Given a CUDA loop under sync-debug mode "error": any synchronization raises
    agent = TrainerAgent(interval_s=3600, sinks=[stacks_sink], handle_sigterm=False, device="cuda")
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            with agent.step():
                x = x @ x
        # When the watch dumps while kernels are queued; then the dump went out and nothing raised
        agent._stacks.steps.advanced_at -= 3600.0
        assert agent._stacks.check()
        assert len(dumped(agent, stacks_sink)) == 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
        agent.close()


def test_the_flight_recorders_newest_entry_is_the_ranks_last_collective(monkeypatch):
    # Given the recorder on, and torch.distributed as the gloo recorder reads after a completed all_reduce (seq 3)
    # and an all_reduce the rank waits in (seq 4, not retired), in torch 2.13's JSON
    entry = {
        "collective_seq_id": 3, "p2p_seq_id": 0, "is_p2p": False, "op_id": 3, "pg_id": 0,
        "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce", "record_id": 2,
        "retired": True, "state": "scheduled", "time_created_ns": 100,
    }  # fmt: skip
    waiting = entry | {"collective_seq_id": 4, "retired": False, "time_created_ns": 200}
    dumped = json.dumps({"version": "2.7", "entries": [entry, waiting]}).encode()
    c10d = types.SimpleNamespace(_dump_fr_trace_json=lambda collectives, active: dumped)
    fake = types.SimpleNamespace(
        _C=types.SimpleNamespace(_distributed_c10d=c10d),
        distributed=types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")

    # When it is read; then the waiting all_reduce is the last collective; with the recorder off, none is read
    assert last_collective() == {"group": "default_pg", "seq": 4, "op": "all_reduce", "state": "scheduled"}
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")
    assert last_collective() is None


def test_a_large_jobs_lines_are_short_enough_that_one_read_holds_every_ranks(monkeypatch):
    # Given rank 4,000 of a 4,096-rank job (512 hosts x 8)
    monkeypatch.setenv("RANK", "4000")
    monkeypatch.setenv("WORLD_SIZE", "4096")
    monkeypatch.setenv("LOCAL_RANK", "0")

    # When it dumps
    line = capture(_identity(), 3, STALL, 61.0).line()

    # Then its line is within the job's share of the control plane's read, with the rank and the innermost frame
    assert len(line.encode()) + 1 <= max(STACKS_READ_BYTES // 4096, MIN_LINE_BYTES)
    record = json.loads(line)
    assert (record["Rank"], record["WorldSize"]) == (4000, 4096)
    assert record["Main"][0]["func"] == "capture"
