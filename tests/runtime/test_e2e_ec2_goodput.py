"""End to end on moto: the goodput of an EC2 job whose split of time is known by construction. A heterogeneous group
(2 x p4d.24xlarge, 1 x p5.48xlarge) hangs, Stallwatch stops it, StartInstances resumes it, it trains again from its
checkpoint (redoing 20 steps) and is stopped at the end: the end-of-run summary and `stallwatch report` measure it."""

from __future__ import annotations

import json

import pytest

from handlers import on_alarm, on_job_state, sweeper
from localrun import moto_ec2
from localrun.moto_world import MINUTE, TABLE, World, alarm_event, instance_state_event, scheduled_event
from stallwatch.aws.fleet_runs import FleetRuns
from stallwatch.core import alarms
from stallwatch.core.pricing import instance_spec
from stallwatch.offline import cli
from tests.runtime.test_e2e_ec2_clusters import JOB, _seed_ec2_hang

TAGS = {
    "stallwatch:job": JOB,
    "stallwatch:mode": "enforce",
    "stallwatch:resume": "1",
    "stallwatch:checkpoint": "s3://bucket/runs/llm-70b/ckpt/",
    "stallwatch:summary": "true",
}
# The known split (minutes): the first attempt starts 120 min before the hang's alarm (c0), steps from -110 to -40
# (steps 0 -> 70), hangs from -40 to Stallwatch's stop at +6; the group stops, and the resume starts it at +8; 5 min
# startup, steps from +13 to +43 from the checkpoint at step 50 (51..70 redone, 71..80 new); stopped at +45.
EXPECTED_MINUTES = {
    "productive": 70 + 10,
    "redone": 20,
    "startup": 10 + 5,
    "phases": 0,
    "stalls": 46,
    "restart_gaps": 2,
    "other": 2,
}
WALL_MINUTES = 165


pytestmark = pytest.mark.slow


def stop_states(rt, context, instances: list[str]) -> list[dict]:
    return [on_job_state.handler(instance_state_event(i, "stopped"), context) for i in instances]


def run_known_ec2_run(rt, context) -> tuple[list[str], list[dict]]:
    """The run above, through the functions; the results of the last stop's events."""
    rt.clock.now = c0 = float(int(rt.clock() // MINUTE) * MINUTE)  # metric periods fall on whole minutes
    world = World(rt.clients, now=c0)
    instances = world.launch(2, TAGS) + world.launch(1, TAGS, instance_type="p5.48xlarge")
    moto_ec2.set_instance_times(instances, launched=c0 - 120 * MINUTE)
    for instance in instances:
        on_job_state.handler(instance_state_event(instance, "running"), context)
    _seed_ec2_hang(world, instances)  # one step a minute from -110 to -40, then none
    world.agent_job(JOB, "TFLOPsPerGPU", world.every_minute(110, 150.0, end_min=41))

    # the hang: the progress alarm warns, the sweeper stops the group 6 min later; it stops, and is resumed at +8
    on_alarm.handler(alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "ec2", JOB, alarms.PROGRESS)), context)
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]
    assert (stopped["diagnosis"], stopped["action"], stopped["stopped"]) == ("hang", "stop", True)
    rt.clock.advance(2 * MINUTE)
    stopped_events = stop_states(rt, context, instances)
    assert stopped_events[0]["resume"]["status"] == "resumed"
    assert not any("summary" in r for r in stopped_events)  # the run goes on: no summary yet
    moto_ec2.set_instance_times(instances, launched=rt.clock())  # EC2's LaunchTime of that StartInstances

    # from the checkpoint at step 50, one step a minute from +13 to +43; stopped by its launch script at +45
    restarted = [c0 + (13 + k) * MINUTE for k in range(30)]
    world.agent_job(JOB, "Steps", [(t, 1.0) for t in restarted])
    world.agent_job(JOB, "Step", [(t, 51.0 + k) for k, t in enumerate(restarted)])
    world.agent_job(JOB, "TFLOPsPerAccelerator", [(t, 160.0) for t in restarted])  # the new agent's name
    rt.clock.now = c0 + 45 * MINUTE
    rt.clients.ec2.stop_instances(InstanceIds=instances)
    moto_ec2.set_instance_times(instances, stopped=rt.clock())
    return instances, stop_states(rt, context, instances)


def test_an_ec2_run_with_a_hang_and_a_resume_is_measured_by_the_summary_and_the_report(
    rt, slack, context, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the known run, ended by its launch script's stop (three stopped events)
    _, ended = run_known_ec2_run(rt, context)

    # Then the run's end posts its summary once, and no second resume (the budget of one is spent)
    assert [r["summary"]["status"] for r in ended] == ["posted", "duplicate", "duplicate"]
    # and records it for the fleet once, its split as the summary's (`stallwatch report --fleet`)
    assert [r["goodput"]["status"] for r in ended] == ["recorded", "duplicate", "duplicate"]
    [run] = FleetRuns(rt.store).since(0.0)
    assert (run.run, run.platform, run.instance_type) == (JOB, "ec2", "p4d.24xlarge+p5.48xlarge")
    assert run.wall_s == pytest.approx(165 * MINUTE)
    assert {r["resume"]["status"] for r in ended} == {"duplicate"}
    (summary,) = [p for p in slack.posts if p["text"].startswith(":bar_chart: Run summary")]
    assert summary["text"] == f":bar_chart: Run summary: {JOB}: goodput {80 / 165:.1%}"
    assert "1 stalls caught" in str(summary["blocks"])

    # When `stallwatch report` reads it back from EC2, CloudWatch and the audit trail
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()  # what the functions printed before it (their metrics) set aside
    assert cli.main(["report", JOB, "--table", TABLE, "--json", "--period", "60"]) == 0
    report = json.loads(capsys.readouterr().out)

    # Then the split is the one the run was made of
    assert {c: round(t["seconds"]) for c, t in report["categories"].items()} == {
        c: m * 60 for c, m in EXPECTED_MINUTES.items()
    }
    assert report["wall_s"] == WALL_MINUTES * 60
    assert report["goodput"] == pytest.approx(80 / 165)
    assert report["jobs"] == [JOB, f"{JOB} (restart 1)"]
    assert (report["restarts"], report["stalls_caught"], report["redone_steps"], report["final_step"]) == (1, 1, 20, 80)
    assert report["mean_tflops_per_gpu"] == pytest.approx((70 * 150 + 30 * 160) / 100)
    # billed while the group ran: not the 2 min between Stallwatch's stop and the StartInstances
    billed_h = (WALL_MINUTES - 2) / 60
    per_hour = 2 * instance_spec("p4d.24xlarge").usd_per_hour + instance_spec("p5.48xlarge").usd_per_hour
    assert report["gpu_hours"] == pytest.approx(billed_h * 24)
    assert report["dollars"] == pytest.approx(billed_h * per_hour)
    assert report["categories"]["restart_gaps"]["gpu_hours"] == 0

    # And the table names the attempts
    assert cli.main(["report", JOB, "--platform", "ec2", "--table", TABLE]) == 0
    table = capsys.readouterr().out
    assert f"Goodput of run {JOB} ({JOB}, {JOB} (restart 1))" in table
    assert f"goodput {80 / 165:.1%}" in table


def test_a_job_on_neither_platform_is_a_clear_error(rt, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "no-such-job", "--table", TABLE]) == cli.EXIT_USAGE
    error = capsys.readouterr().err
    assert "'no-such-job' is neither a SageMaker training job nor an EC2 job" in error
    assert "no EC2 instance is tagged stallwatch:job='no-such-job'" in error

    assert cli.main(["report", "i-0123456789abcdef0", "--platform", "ec2", "--table", TABLE]) == cli.EXIT_USAGE
    assert "i-0123456789abcdef0" in capsys.readouterr().err
