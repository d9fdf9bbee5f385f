"""End to end on moto: a stalled job's alarm reaches on_alarm, which decides, stops, alerts Slack and audits."""

from __future__ import annotations

import pytest

from handlers import on_alarm, on_job_state, sweeper
from localrun.moto_world import MINUTE, World, alarm_event, job_state_event, scheduled_event
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract

ENFORCE = {"stallwatch:mode": "enforce"}


def _alarm(rt, job: str, kind: str = alarms.PROGRESS, host: str | None = None) -> str:
    return alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, kind, host)


def seed_nccl_hang(world: World, job: str, tags: dict[str, str], checkpoint: str | None = None) -> None:
    """Steps stop 40 min ago; GPUs stay pinned at 100 % while power falls; logs go quiet."""
    world.create_job(job, hosts=2, tags=tags, checkpoint=checkpoint)
    seed_hang_signals(world, job)


def seed_hang_signals(world: World, job: str, start_min: float = 110) -> None:
    """A hang's signals on a job that exists: steps from `start_min` until 40 min ago (the last step is
    `start_min - 40`), GPUs pinned at 100 %, power falling, logs quiet."""
    world.steps_until(job, last_step_min=40, start_min=start_min)
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, 100.0))
        world.agent_host(job, host, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        world.progress_logs(job, host, until_min=40)


def audits(rt, job: str) -> list[dict]:
    return [r["record"] | {"outcome": r.get("outcome")} for r in rt.audit.records(job_key("sagemaker", job), "audit")]


def test_nccl_hang_is_warned_then_stopped_once(rt, world, slack, context) -> None:
    # Given an enforced job hung in a collective for 40 minutes
    seed_nccl_hang(world, "llama-70b-pretrain", ENFORCE)

    # When its progress alarm fires
    result = on_alarm.handler(alarm_event(_alarm(rt, "llama-70b-pretrain")), context)

    # Then the job is diagnosed as hung and warned, not yet stopped
    assert (result["diagnosis"], result["action"], result["posted"]) == ("hang", "warn", True)
    assert world.status("llama-70b-pretrain") == "InProgress"
    assert "will be stopped" in slack.texts()[0]

    # When the sweeper runs after the stop grace period
    rt.clock.advance(6 * MINUTE)
    summary = sweeper.handler(scheduled_event(), context)

    # Then the job is stopped, Slack says so with the evidence, and a second sweep does nothing more
    (outcome,) = summary["redecided"]
    assert (outcome["action"], outcome["stopped"], outcome["posted"]) == ("stop", True, True)
    assert world.status("llama-70b-pretrain") == "Stopping"
    stop_message = slack.posts[1]
    rendered = str(stop_message["blocks"])
    assert "Stopped stalled job" in stop_message["text"]
    assert "390 W before -&gt; 95 W now" in rendered  # as Slack takes it: its entities (slack_text.escape)
    assert "100% before -&gt; 100% now" in rendered
    assert "GPU-h" in rendered
    assert "$" in rendered

    rt.clock.advance(5 * MINUTE)
    sweeper.handler(scheduled_event(), context)
    assert len(slack.posts) == 2
    actions = [a["action"] for a in audits(rt, "llama-70b-pretrain")]
    assert actions[:2] == ["warn", "stop"]
    assert "stop" not in actions[2:]


def test_crashed_rank_names_the_host_and_its_error(rt, world, slack, context) -> None:
    # Given rank on algo-2 died with an illegal memory access 30 min ago while algo-1 spins
    job = "gpt-neox-20b"
    world.create_job(job, hosts=2, tags=ENFORCE)
    world.steps_until(job, last_step_min=30)
    world.host_gpu(job, "algo-1", world.every_minute(110, 100.0))
    world.host_gpu(job, "algo-2", world.every_minute(110, lambda m: 100.0 if m > 30 else 0.0))
    world.progress_logs(job, "algo-1", until_min=30)
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    world.progress_logs(job, "algo-2", until_min=31, extra=[(30, "Traceback (most recent call last):"), (30, crash)])

    # When the host's gpu-idle alarm fires
    result = on_alarm.handler(alarm_event(_alarm(rt, job, alarms.GPU_IDLE, "algo-2")), context)

    # Then the crashed rank is diagnosed, warned, and the message shows algo-2's error line
    assert (result["diagnosis"], result["action"]) == ("crashed_rank", "warn")
    blocks = str(slack.posts[0]["blocks"])
    assert "*algo-2*" in blocks
    assert f"! {crash}" in blocks


def test_idle_job_without_agent_is_diagnosed_idle(rt, world, slack, context) -> None:
    # Given a job without the agent whose GPUs went idle and logs went silent an hour ago
    job = "resnet-sweep-7"
    world.create_job(job, hosts=2, tags=ENFORCE)
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, lambda m: 95.0 if m > 60 else 0.0))
        world.progress_logs(job, host, until_min=60)

    # When a gpu-idle alarm fires
    result = on_alarm.handler(alarm_event(_alarm(rt, job, alarms.GPU_IDLE, "algo-1")), context)

    # Then it is diagnosed idle and warned
    assert (result["diagnosis"], result["action"]) == ("idle", "warn")
    assert "idle" in slack.texts()[0]


def test_checkpoint_within_budget_is_not_a_stall(rt, world, slack, context) -> None:
    # Given a job that declared a 60 min checkpoint phase 25 min ago and has not stepped since
    job = "llama-ckpt"
    world.create_job(job, tags=ENFORCE)
    world.steps_until(job, last_step_min=25)
    world.agent_job(job, "PhaseBudgetRemaining", world.every_minute(25, lambda m: (60 - (25 - m)) * MINUTE))
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, lambda m: 95.0 if m > 25 else 2.0))

    # When the progress alarm fires anyway
    result = on_alarm.handler(alarm_event(_alarm(rt, job)), context)

    # Then nothing is stopped or posted, and the decision is audited
    assert (result["diagnosis"], result["action"]) == ("phase", "none")
    assert world.status(job) == "InProgress"
    assert slack.posts == []
    assert [a["diagnosis"] for a in audits(rt, job)] == ["phase"]


def test_a_checkpoint_one_agent_window_caught_is_not_read_as_overrun_once_the_job_hangs(rt, world, context) -> None:
    # Given an agent publishing 10 s windows (a minute's period holds six): 45 min ago one window caught a 12 s
    # checkpoint with 590 s of its budget left, steps went on a few seconds, then the job hung in a collective
    job = "ckpt-then-hang"
    world.create_job(job, hosts=2, tags=ENFORCE)
    phase_start = world.now - 45 * MINUTE + 5
    last_step = phase_start + 20
    windows = [world.now - 110 * MINUTE + 10 * k for k in range(110 * 6 + 1)]
    steps = [w for w in windows if w <= phase_start or phase_start + 12 < w <= last_step]

    def per_window(value) -> list[tuple[float, float]]:
        return [(w, float(value(w))) for w in windows]

    world.agent_job(job, "Steps", per_window(lambda w: w in steps))
    world.agent_job(job, "Step", per_window(lambda w: sum(s <= w for s in steps)))
    world.agent_job(job, "LastStepAge", per_window(lambda w: w - max(s for s in steps if s <= w)))
    world.agent_job(
        job, "PhaseBudgetRemaining", per_window(lambda w: phase_start + 600 - w if w - 10 < phase_start <= w else 0)
    )
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, 100.0))
        world.progress_logs(job, host, until_min=45)

    # When its progress alarm fires
    result = on_alarm.handler(alarm_event(_alarm(rt, job)), context)

    # Then it is the hang (the phase's budget is read as the most left in its minute, not that minute's average)
    assert (result["diagnosis"], result["action"]) == ("hang", "warn")


def test_hung_ec2_instance_is_warned_then_stopped(rt, world, slack, context) -> None:
    # Given a tagged GPU instance whose agent (JobName = the instance id) stopped stepping 40 min ago, GPUs pinned
    ec2 = rt.clients.ec2
    tags = [{"Key": "stallwatch:monitor", "Value": "true"}, {"Key": "stallwatch:mode", "Value": "enforce"}]
    instance = ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="p4d.24xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"][0]["InstanceId"]
    world.steps_until(instance, last_step_min=40)
    dims = {contract.CWAGENT_DIM_INSTANCE: instance}
    world.metric(contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_UTILIZATION, dims, world.every_minute(110, 100.0))
    world.metric(contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_USED, dims, world.every_minute(110, 30_000.0))
    world.metric(contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_TOTAL, dims, world.every_minute(110, 40_000.0))

    # When its progress alarm fires, and the sweeper runs after the grace period
    name = alarms.alarm_name(rt.config.alarm_prefix, "ec2", instance, alarms.PROGRESS)
    warned = on_alarm.handler(alarm_event(name), context)
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then it was diagnosed from the agent and the CloudWatch agent's metrics, warned, then stopped
    assert (warned["diagnosis"], warned["action"]) == ("hang", "warn")
    assert "100% before -&gt; 100% now" in str(slack.posts[0]["blocks"])
    assert (stopped["action"], stopped["stopped"]) == ("stop", True)
    state = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("stopping", "stopped")


def test_sweeper_decides_an_alarm_whose_on_alarm_never_ran(rt, world, slack, context) -> None:
    # Given a hung job and a healthy one, each with an alarm in ALARM that no on_alarm invocation decided
    seed_nccl_hang(world, "hung-job", ENFORCE)
    world.create_job("fine-job", hosts=2, tags=ENFORCE)
    world.steps_until("fine-job", last_step_min=-15)
    for job in ("hung-job", "fine-job"):
        on_job_state.handler(job_state_event(job, "InProgress"), context)
        rt.clients.cloudwatch.set_alarm_state(AlarmName=_alarm(rt, job), StateValue="ALARM", StateReason="test")
    rt.clock.advance(MINUTE)

    # When the sweeper runs twice
    first = {o["job"]: o for o in sweeper.handler(scheduled_event(), context)["redecided"]}
    rt.clock.advance(MINUTE)
    second = {o["job"]: o for o in sweeper.handler(scheduled_event(), context)["redecided"]}

    # Then both were decided once: the hung job was warned; the healthy one is left alone afterwards
    assert (first["hung-job"]["diagnosis"], first["hung-job"]["action"]) == ("hang", "warn")
    assert first["fine-job"]["diagnosis"] == "healthy"
    assert "fine-job" not in second
    assert len(slack.posts) == 1


def test_the_sweepers_checkup_finds_a_straggler_and_alerts_it_once(rt, world, slack, context) -> None:
    # Given a healthy 4-host job (30 steps a minute) whose algo-3 runs 1.8x slower than the others from now on
    job, hosts = "bert-xl", ("algo-1", "algo-2", "algo-3", "algo-4")
    world.create_job(job, hosts=4, tags=ENFORCE)
    world.agent_job(job, "Steps", world.every_minute(110, 30.0, end_min=-45))
    world.agent_job(job, "Step", world.every_minute(110, lambda m: 30.0 * (110 - m), end_min=-45))
    world.agent_job(job, "LastStepAge", world.every_minute(110, 1.0, end_min=-45))
    for host in hosts:
        world.host_gpu(job, host, world.every_minute(110, 97.0, end_min=-45))
        lag = lambda m, slow=host == "algo-3": 3.6 if slow and m < 0 else 2.0  # noqa: E731 - per-host curve
        world.agent_host(job, host, "StepTime", world.every_minute(110, lag, end_min=-45))
    first = on_alarm.handler(alarm_event(_alarm(rt, job)), context)  # the progress alarm's first look: healthy

    # When the sweeper runs half an hour later (no alarm fired), and again 5 minutes after
    rt.clock.advance(31 * MINUTE)
    (checkup,) = sweeper.handler(scheduled_event(), context)["redecided"]
    rt.clock.advance(5 * MINUTE)
    again = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then the check-up found the straggler and alerted it once, naming the host and the spread; never a stop
    assert first["diagnosis"] == "healthy"
    assert (checkup["diagnosis"], checkup["action"], checkup["posted"]) == ("straggler", "alert", True)
    assert [o["action"] for o in again] == ["none"]
    (message,) = slack.posts
    rendered = str(message["blocks"])
    assert "*Straggler*: `algo-3` StepTime 3.6 s" in rendered
    assert all(host in rendered for host in hosts)
    assert world.status(job) == "InProgress"


def test_a_lone_signal_is_decided_again_by_the_sweeper_at_its_full_threshold(rt, world, slack, context) -> None:
    # Given steps stopped 11 minutes ago on busy GPUs that report no power (a lone signal)
    job = "t5-xxl"
    world.create_job(job, hosts=2, tags=ENFORCE)
    world.steps_until(job, last_step_min=11)
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, 99.0))

    # When the progress alarm fires at 2/3 of the stall threshold, and the sweeper runs 5 minutes later
    early = on_alarm.handler(alarm_event(_alarm(rt, job)), context)
    recheck_at = rt.states.load(job_key("sagemaker", job)).state.recheck_at
    asked_at = rt.clock()
    rt.clock.advance(5 * MINUTE)
    (late,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then the early look does nothing but asks for a recheck at 15 minutes (kept in DynamoDB); the sweeper warns
    assert (early["diagnosis"], early["action"]) == ("healthy", "none")
    assert recheck_at == pytest.approx(asked_at + 4 * MINUTE, abs=MINUTE)
    assert (late["diagnosis"], late["action"]) == ("hang", "warn")
    assert len(slack.posts) == 1


def test_a_hosts_gpu_memory_going_to_insufficient_data_is_decided_and_other_kinds_are_not(
    rt, world, slack, context
) -> None:
    # Given a hung job whose host's GPU metrics stopped: its gpu-memory alarm entered INSUFFICIENT_DATA (a lost host)
    job = "lost-host-job"
    seed_nccl_hang(world, job, ENFORCE)
    lost = alarm_event(_alarm(rt, job, alarms.GPU_MEMORY, "algo-2"), state="INSUFFICIENT_DATA")
    other = alarm_event(_alarm(rt, job, alarms.GPU_IDLE, "algo-2"), state="INSUFFICIENT_DATA")

    # When on_alarm gets it, Then the job is decided (its action is invoked on that state)
    assert on_alarm.handler(lost, context)["status"] == "decided"
    # And another kind's INSUFFICIENT_DATA (no action is set for it) is ignored before any read
    result = on_alarm.handler(other, context)
    assert (result["status"], result["details"]["reason"]) == ("ignored", "alarm state INSUFFICIENT_DATA")
