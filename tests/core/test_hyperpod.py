"""SageMaker HyperPod's own words read as what HyperPod does about a node or a job: its health agent's lines (both
shapes), its node reasons, its auto-resume's lines and its node health events, from the corpus (quoted with their
sources) where a real one is known."""

from __future__ import annotations

import json
from pathlib import Path

from corpus import real_lines
from stallwatch.core.platforms import hyperpod

EVENTS = Path(__file__).resolve().parents[2] / "corpus" / "aws_events" / "hyperpod"
INSTANCE = "i-0123456789abcdef0"


def test_the_health_agents_real_line_says_hyperpod_reboots_the_node_for_its_hardware() -> None:
    # Given the agent's detection line as the AWS docs show it (its key "details: " ends with ': ')
    (line,) = real_lines.hyperpod(kind="health_monitoring_agent")
    # When it is read
    found = hyperpod.agent_line(line.text, INSTANCE, 100.0)
    # Then it is HyperPod's reboot of the node, for the hardware, in HyperPod's own words
    assert found is not None
    assert (found.action, found.verdict, found.instance, found.source) == (
        "Reboot",
        "hardware",
        INSTANCE,
        "health agent",
    )
    assert found.said.startswith("XidHardwareFailure: Node condition NvidiaErrorReboot is now: True")
    assert found.acting_at(100.0 + 60)
    assert not found.acting_at(100.0 + hyperpod.LEFT_TO_HYPERPOD_S)


def test_the_agents_other_shape_and_an_application_verdict_are_read_alike() -> None:
    # Given the same detection with plain keys, and one the agent blames on the application
    real = json.loads(real_lines.hyperpod(kind="health_monitoring_agent")[0].text)
    plain = {key.removesuffix(": "): value for key, value in real.items()}
    application = dict(plain, details=dict(plain["details"], reason="XidUserAppError"))
    # Then the plain shape reads as the docs' one, and the application's fault is no node action
    assert hyperpod.agent_line(json.dumps(plain), INSTANCE, 1.0) == hyperpod.agent_line(
        real_lines.hyperpod(kind="health_monitoring_agent")[0].text, INSTANCE, 1.0
    )
    user = hyperpod.agent_line(json.dumps(application), INSTANCE, 1.0)
    assert user is not None
    assert (user.action, user.verdict, user.acting) == ("None", "application", False)
    assert "the application" in user.note()


def test_lines_that_are_not_the_agents_are_none() -> None:
    for text in (
        "",
        "not json HealthMonitoringAgentDetectionEvent",
        '{"HealthMonitoringAgentDetectionEvent":"x"}',
        "[1]",
    ):
        assert hyperpod.agent_line(text, INSTANCE, 1.0) is None
    assert hyperpod.agent_line("HealthMonitoringAgentDetectionEvent" + "x" * hyperpod.LINE_MAX, INSTANCE, 1.0) is None


def test_auto_resumes_real_lines_say_it_retries_the_jobs_step_and_only_its_answer_counts() -> None:
    lines = [line.text for line in real_lines.hyperpod(kind="auto_resume")]
    found = [hyperpod.auto_resume(text, "82", 5.0) for text in lines]
    [retry] = [f for f in found if f is not None]
    assert (retry.action, retry.source) == ("RetryStep", "auto-resume")
    assert "ResumeAction=RETRYSTEP" in retry.said
    assert [hyperpod.auto_resume(text, "83", 5.0) for text in lines] == [None] * len(lines)  # another job's


def test_the_node_reason_hyperpod_acts_on_is_read_and_no_other() -> None:
    (reason,) = real_lines.hyperpod(kind="node_reason")
    found = hyperpod.node_reason("ip-10-1-16-50", reason.text + " : Not responding [slurm@2024-02-21T01:53:15]", 9.0)
    assert found is not None
    assert (found.action, found.node) == ("Replace", "ip-10-1-16-50")
    assert hyperpod.node_reason("n1", "Action:Reboot", 9.0).action == "Reboot"  # type: ignore[union-attr]
    for other in ("stallwatch: pc1-42-llm stalled on n1", "Not responding", "Action:Drain", ""):
        assert hyperpod.node_reason("n1", other, 9.0) is None


def test_the_docs_node_health_event_is_an_unhealthy_node_hyperpod_only_recommends_replacing() -> None:
    event = json.loads((EVENTS / "node-health-unhealthy.json").read_text())
    found = hyperpod.health_event(event["detail"], 7.0)
    assert found is not None
    assert (found.action, found.instance, found.acting) == ("None", "i-12345678abcdefghi", False)
    assert "NvidiaErrorTerminate" in found.said
    assert "Please Replace the Faulty Node." in found.said
    repaired = dict(event["detail"], HealthSummary=dict(event["detail"]["HealthSummary"], RepairAction="Replace"))
    assert hyperpod.health_event(repaired, 7.0).acting  # type: ignore[union-attr]
    healthy = dict(event["detail"], HealthSummary={"HealthStatus": "Healthy"})
    assert hyperpod.health_event(healthy, 7.0) is None
