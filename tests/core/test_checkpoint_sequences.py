"""Checkpoints as the frameworks write them (corpus/real_lines/sequences.jsonl), read through the evidence and the
engine: a long write after a real checkpoint's lines is a checkpoint, never idle GPUs after training; the framework's
own end line (or the next training line) ends it; a file saved inside the checkpoint is not its end."""

from __future__ import annotations

import pytest

from corpus import real_lines
from stallwatch.core import evidence, log_patterns
from stallwatch.core.decision import Diagnosis, JobState
from stallwatch.core.engine import decide
from stallwatch.core.measures import Limits
from stallwatch.core.policy import Mode, Policy
from tests.core.signals_builder import SignalsBuilder

MIN = 60.0
ONSET = 3600.0
WRITE_S = 20 * MIN  # long enough that idle GPUs with silent logs would be stopped as idle (10 min without the agent)
ENFORCE = Policy(mode=Mode.ENFORCE).for_job({"stallwatch:mode": "enforce"})
LIMITS = Limits.of(ENFORCE.thresholds, 1.0, None)
BLOCKING = [s for s in real_lines.sequences(kind="checkpoint") if s.blocking]


def _job(seq: real_lines.Sequence) -> tuple[SignalsBuilder, list[tuple[float, str]]]:
    """2 hosts without the agent train (a line a minute) until the sequence's first line at ONSET on host 1; GPUs go
    idle during the write, memory held; the sequence's lines follow with its write lasting WRITE_S."""
    events = seq.stretched(WRITE_S).at(ONSET)
    builder = SignalsBuilder(hosts=2).gpu_memory(0, 5 * 3600, 80.0).gpu(0, ONSET, 97.0)
    builder.gpu(ONSET, ONSET + WRITE_S, 1.0).gpu(ONSET + WRITE_S, 5 * 3600, 97.0)
    builder.logs(0, ONSET - 1, 60)
    for t, text in events:
        builder.log(t, text)
    return builder, events


def _first_start(events: list[tuple[float, str]]) -> float:
    return next(t for t, text in events if log_patterns.marker(text) == log_patterns.CHECKPOINT_START)


@pytest.mark.parametrize("seq", BLOCKING, ids=lambda s: s.name)
def test_a_long_write_after_a_real_checkpoints_lines_is_a_checkpoint_not_idle(seq: real_lines.Sequence) -> None:
    # Given a framework's real checkpoint lines with its silent write made 20 minutes long, GPUs idle, memory held
    builder, events = _job(seq)
    write_at = events[seq.write_after][0]
    now = write_at + WRITE_S - MIN  # a minute before the write ends
    # When the engine decides near the write's end / Then an undeclared checkpoint (a phase), since its first line
    decision = decide(builder.build(now), ENFORCE, JobState(), now)
    assert decision.diagnosis is Diagnosis.PHASE
    assert decision.evidence["checkpoint"]["since_t"] == pytest.approx(_first_start(events))


@pytest.mark.parametrize("seq", BLOCKING, ids=lambda s: s.name)
def test_a_real_checkpoint_ends_at_its_own_end_line_or_the_next_training_line(seq: real_lines.Sequence) -> None:
    builder, events = _job(seq)
    end = events[-1][0]
    signals = builder.build(end + 1)
    host = evidence.read_hosts(signals, end, ENFORCE.thresholds, LIMITS, end + 1)["algo-1"]
    # Then no checkpoint is being written any more once the sequence is over
    assert host.checkpoint_since is None
    end_lines = [t for t, text in events if log_patterns.marker(text) == log_patterns.CHECKPOINT_END]
    if end_lines:  # and the framework's own end line is when it ended
        assert host.checkpoint_ended == pytest.approx(end_lines[-1])


@pytest.mark.parametrize("seq", BLOCKING, ids=lambda s: s.name)
def test_a_file_saved_inside_the_checkpoint_is_not_its_end(seq: real_lines.Sequence) -> None:
    # Given the lines up to the write (the framework's per-file lines among them) / Then none of them ends it
    builder, events = _job(seq)
    write_at = events[seq.write_after][0]
    host = evidence.read_hosts(
        builder.build(write_at + 5 * MIN), write_at, ENFORCE.thresholds, LIMITS, write_at + 5 * MIN
    )["algo-1"]
    assert host.checkpoint_ended is None
    assert host.checkpoint_since == pytest.approx(_first_start(events))


def test_an_async_save_ends_at_its_finalize_line() -> None:
    # Given NeMo's async save: scheduled, training goes on, finalized 75 s later
    (seq,) = real_lines.sequences(kind="checkpoint", framework="nemo")
    events = seq.at(ONSET)
    builder = SignalsBuilder(hosts=1).gpu(0, 2 * ONSET, 97.0).gpu_memory(0, 2 * ONSET, 80.0).logs(0, ONSET - 1, 60)
    for t, text in events:
        builder.log(t, text)
    now = events[-1][0] + 1
    host = evidence.read_hosts(builder.build(now), now, ENFORCE.thresholds, LIMITS, now)
    # Then the finalize line is its end, not another start
    assert host["algo-1"].checkpoint_ended == pytest.approx(events[-1][0])
    assert host["algo-1"].checkpoint_since is None


def test_finalising_a_pending_async_save_is_a_checkpoint_being_written() -> None:
    # Given NeMo finalising its pending async saves synchronously at the end of training: the loop waits, GPUs idle,
    # the log silent for 20 minutes (NeMo's nemo_model_checkpoint writes this line, then nothing until done)
    line = (
        "[NeMo I 2026-01-05 10:11:12 nemo_model_checkpoint:303] Pending async checkpoint saves. "
        "Finalizing them synchronously now"
    )
    builder = SignalsBuilder(hosts=1).gpu_memory(0, 2 * ONSET, 80.0).gpu(0, ONSET, 97.0).gpu(ONSET, 2 * ONSET, 1.0)
    builder.logs(0, ONSET - 1, 60).log(ONSET, line)
    # When decided 19 minutes in / Then a checkpoint, not idle
    decision = decide(builder.build(ONSET + 19 * MIN), ENFORCE, JobState(), ONSET + 19 * MIN)
    assert decision.diagnosis is Diagnosis.PHASE
    assert decision.evidence["checkpoint"]["since_t"] == pytest.approx(ONSET)
