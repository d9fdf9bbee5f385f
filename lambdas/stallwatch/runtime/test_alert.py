"""A test alert (`stallwatch doctor --send-test-alert`): a synthetic alarm of a fake job, through on_alarm's own
rendering and Slack credentials, to a message marked as a test. Nothing is stopped and nothing is written.

    send_test_alert(rt, TestAlertRequest(requested_by="arn:aws:iam::123456789012:user/ops"))
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.events import TestAlertRequest
from stallwatch.aws.observability import logger
from stallwatch.aws.slack import AlertMessage, Evidence
from stallwatch.aws.slack_text import escape
from stallwatch.core.decision import Action, Decision, Diagnosis
from stallwatch.core.platforms import DEFAULT
from stallwatch.core.policy import Mode
from stallwatch.core.signals import JobFacts, JobSignals, JobStatus
from stallwatch.runtime.environment import Runtime

TEST_JOB = "stallwatch-test-alert"  # no job is stopped for it: the message carries no buttons and nothing acts
TEST_INSTANCE_TYPE = "ml.p4d.24xlarge"


def send_test_alert(rt: Runtime, request: TestAlertRequest) -> dict[str, Any]:
    """Render a notify-mode hang alert of `TEST_JOB` as on_alarm renders one, mark it as a test, and post it."""
    now = rt.clock()
    facts = JobFacts(
        name=TEST_JOB,
        platform=DEFAULT,
        status=JobStatus.RUNNING,
        secondary_status="Training",
        start_time=now - 3600,
        instance_type=TEST_INSTANCE_TYPE,
        instance_count=1,
        gpus_per_host=8,
        vcpus_per_host=96,
    )
    decision = Decision(
        job=TEST_JOB,
        at=now,
        diagnosis=Diagnosis.HANG,
        action=Action.ALERT,
        mode=Mode.NOTIFY,
        reasons=(f"a test alert requested by {request.requested_by} (stallwatch doctor --send-test-alert)",),
    )
    message = AlertMessage(decision, facts, Evidence.of(decision, JobSignals(facts=facts, now=now), None)).render()
    by = escape(request.requested_by)
    marker = f":test_tube: *TEST* from `stallwatch doctor`, requested by {by}: no job was stopped"
    message["text"] = f"[TEST] {message['text']}"
    message["blocks"] = [{"type": "section", "text": {"type": "mrkdwn", "text": marker}}, *message["blocks"]]
    post = rt.notifier.post(message)
    logger.info("test alert", extra={"requested_by": request.requested_by, "posted": post.ok, "detail": post.detail})
    return {"status": "test_alert", "job": TEST_JOB, "posted": post.ok, "detail": post.detail}
