"""One status vocabulary (`core.signals.JobStatus`): each adapter maps its platform's words to it; a job that is
stopping has not ended (its final status follows), but a replay decides it no more."""

from __future__ import annotations

import pytest

from stallwatch.core.signals import JobFacts, JobStatus, Platform


def _facts(status: str) -> JobFacts:
    return JobFacts("llm", Platform.SAGEMAKER, status, None, 0.0, "ml.p4d.24xlarge", 1, 8, 96)


def test_only_a_final_status_has_ended() -> None:
    # Given every status, When asked whether each has ended, Then only the platform's final words have
    assert {s for s in JobStatus if s.ended} == {JobStatus.STOPPED, JobStatus.COMPLETED, JobStatus.FAILED}


def test_a_stopping_job_has_not_ended_but_is_winding_down() -> None:
    # Given a job asked to stop, Then it has not ended (Stopped, Completed or Failed follows) yet is decided no more
    assert not JobStatus.STOPPING.ended
    assert JobStatus.STOPPING.winding_down
    assert not JobStatus.RUNNING.winding_down
    assert not JobStatus.PAUSED.winding_down


def test_facts_carry_the_status_the_traces_and_records_always_wrote() -> None:
    # Given facts built from a trace's word, Then they carry the JobStatus, which reads and writes as that word
    facts = _facts("InProgress")
    assert facts.status is JobStatus.RUNNING
    assert f"job is {_facts('Stopped').status}" == "job is Stopped"


def test_an_unknown_status_word_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'Cancelling'"):
        _facts("Cancelling")
