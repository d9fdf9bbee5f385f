"""Device-side values resolve late without synchronizing: CUDA step events, on an in-memory fake of torch.cuda."""

from __future__ import annotations

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
        assert self.query() and end.query(), "elapsed_time on incomplete events would synchronize"
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
