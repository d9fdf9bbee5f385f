"""Which starts of an EC2 group make one run: the latest start, and before it the attempts Stallwatch's resumes
restarted (their audit records), while they link up."""

from __future__ import annotations

from stallwatch.aws.platforms.ec2_goodput import RESUME_LAUNCH_SLACK_S, Resume, attempt_starts, resumes_of


def resume_record(at: float, launched: float | None, ok: bool | None = True) -> dict:
    record = {"at": at, "job": "llm-70b", "action": "resume", "resumed_as": "llm-70b", "attempt": 1}
    if launched is not None:
        record["launched"] = launched
    return {"record": record, "outcome": {"resume": {"ok": ok}} if ok is not None else None}


def test_resumes_are_read_from_the_audit_trail_without_the_failed_ones() -> None:
    records = [
        {"record": {"at": 50.0, "action": "stop", "diagnosis": "hang"}},
        resume_record(300.0, 10.0, ok=False),  # StartInstances failed: no attempt began
        resume_record(100.0, 0.0),
        resume_record(900.0, 400.0, ok=None),  # outcome not recorded yet: the start was called
    ]
    assert resumes_of(records) == [Resume(100.0, 0.0), Resume(900.0, 400.0)]


def test_resumes_link_the_attempts_back_to_the_runs_first_start() -> None:
    # attempt 0 from 0, resumed at 1000 (LaunchTime 1002), attempt 2 resumed at 5000 (LaunchTime 5001)
    resumes = [Resume(1000.0, 0.0), Resume(5000.0, 1002.0)]
    assert attempt_starts(5001.0, resumes) == [0.0, 1002.0, 5001.0]


def test_a_start_by_someone_else_begins_a_new_run() -> None:
    # a human started the group long after Stallwatch's last resume: that start is the run's first
    latest = 1000.0 + RESUME_LAUNCH_SLACK_S + 3600
    assert attempt_starts(latest, [Resume(1000.0, 0.0)]) == [latest]


def test_a_resume_recorded_without_its_launch_time_ends_the_chain() -> None:
    assert attempt_starts(5001.0, [Resume(1000.0, 0.0), Resume(5000.0, None)]) == [5001.0]
