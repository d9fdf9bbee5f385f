"""Device-side values resolve late without synchronizing: CUDA step events, on an in-memory fake of torch.cuda."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from trainer_agent.pending import CudaStepEvents


class FakeEvent:
    """A CUDA event on a fake device timeline: complete once the test says the device got there."""

    timeline: list[FakeEvent] = []
    done_upto = 0
    created = 0

    def __init__(self, enable_timing: bool = False) -> None:
        FakeEvent.created += 1
        self.at = -1

    def record(self) -> None:
        self.at = len(FakeEvent.timeline)
        FakeEvent.timeline.append(self)

    def query(self) -> bool:
        return self.at < FakeEvent.done_upto

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time on an incomplete event: real CUDA would fail or synchronize")
        return 10.0 * (end.at - self.at)  # ms


def fake_torch() -> SimpleNamespace:
    FakeEvent.timeline, FakeEvent.done_upto, FakeEvent.created = [], 0, 0
    return SimpleNamespace(cuda=SimpleNamespace(Event=FakeEvent))


def test_steps_count_only_once_the_device_has_finished_them():
    # Given three steps the host has ended, of which the device finished one
    events = CudaStepEvents(fake_torch())
    for step in (1, 2, 3):
        events.start()
        events.end(step, ended_at=float(step), tokens=10, samples=1)
    FakeEvent.done_upto = 2

    # When the window rolls, then only the finished step counts, with its device time
    (first,) = events.completed()
    assert (first.step, first.duration_s, events.pending) == (1, 0.01, 2)

    # And the rest resolve in a later window, once the device gets there
    FakeEvent.done_upto = len(FakeEvent.timeline)
    assert [step.step for step in events.completed()] == [2, 3]


def test_events_are_reused_rather_than_created_per_step():
    events = CudaStepEvents(fake_torch())
    for step in range(100):
        events.start()
        events.end(step, ended_at=0.0, tokens=0, samples=0)
        FakeEvent.done_upto = len(FakeEvent.timeline)
        events.completed()
    assert FakeEvent.created == 2


def test_an_aborted_step_leaves_nothing_pending():
    events = CudaStepEvents(fake_torch())
    events.start()
    events.abort()
    events.end(1, ended_at=0.0, tokens=0, samples=0)
    assert events.pending == 0


def test_on_cuda_the_agent_counts_a_step_in_the_window_the_device_finishes_it(monkeypatch, make_agent, sink, clock):
    # Given an agent on a (fake) CUDA device, and two steps the host has ended
    fake = fake_torch()
    fake.distributed = SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    agent = make_agent(device="cuda")
    for _ in range(2):
        with agent.step(tokens=100):
            clock.advance(0.001)  # the host only queues the work

    # When the device has finished only the first step at the first window
    FakeEvent.done_upto = 2
    agent.flush()
    # And the second at the next
    FakeEvent.done_upto = len(FakeEvent.timeline)
    agent.flush()

    # Then each window counts the step the device finished, with device time as StepTime
    assert [(w.metrics["Steps"], w.metrics["Step"]) for w in sink.job] == [(1, 1), (1, 2)]
    assert sink.job[0].metrics["StepTime"] == 0.01


def test_on_cuda_a_step_hung_on_the_device_is_busy_time_not_data_wait(monkeypatch, make_agent, sink, clock):
    fake = fake_torch()
    fake.distributed = SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    agent = make_agent(device="cuda")
    agent.start_step()
    clock.advance(30.0)
    agent.flush()
    metrics = sink.job[0].metrics
    assert (metrics["Steps"], metrics["DataWaitFraction"]) == (0, 0)
