"""The Slurm platform as pure rules: a job's facts from its events, its time limit, its nodes' metrics and streams,
what the controller's answers to a stop mean, and which hosts a requeue keeps the job off."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.core import contract, engine
from stallwatch.core.decision import Action, Decision, Diagnosis, JobState
from stallwatch.core.platforms import describe, job_name_error
from stallwatch.core.platforms.slurm import (
    HELD_RECHECK_S,
    SLURM,
    SlurmJob,
    SlurmNode,
    answer_outcome,
    end_state,
    slurm_job_name,
    stream_name,
    stream_prefix,
    this_attempt,
    time_limit_seconds,
)
from stallwatch.core.policy import Mode, Policy
from stallwatch.core.signals import Platform
from tests.core.signals_builder import SignalsBuilder

START = 1_796_000_060.0


def job(**changes: object) -> SlurmJob:
    base = SlurmJob(
        cluster="pc1",
        job_id="42",
        name="llm 7b",
        submit_time="2026-12-01T10:00:00",
        submit_epoch=1_796_000_000,
        start_epoch=START,
        state="RUNNING",
        nodes=(SlurmNode("node1", "10.0.0.11", 8), SlurmNode("node2", "10.0.0.12", 8)),
        settings={"stallwatch:mode": "enforce"},
        time_limit_s=3600.0,
        ssm_target="i-0123456789abcdef0",
        flavor="pcs",
    )
    return replace(base, **changes)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800.0),  # minutes
        ("1:00", 60.0),  # minutes:seconds
        ("1:00:00", 3600.0),
        ("2-5", 2 * 86400 + 5 * 3600.0),  # days-hours
        ("2-3:04", 2 * 86400 + 3 * 3600 + 4 * 60.0),
        ("365-00:00:00", 365 * 86400.0),
        ("UNLIMITED", None),
        ("Partition_Limit", None),
    ],
)
def test_a_time_limit_reads_as_squeue_prints_it(text: str, seconds: float | None) -> None:
    assert time_limit_seconds(text) == seconds


def test_a_time_limit_that_is_none_says_so() -> None:
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        time_limit_seconds("1:xx")


def test_a_started_job_is_its_nodes_and_settings_and_ends_by_its_time_limit() -> None:
    facts = job().facts(START + 60)
    assert facts.name == "pc1-42-llm-7b" == slurm_job_name("pc1", "42", "llm 7b")
    assert (facts.platform, facts.status, facts.secondary_status) == (Platform.SLURM, "InProgress", "RUNNING")
    assert SLURM.host_names(facts) == ["node1", "node2"]
    assert facts.tags == {"stallwatch:mode": "enforce"}
    assert facts.ends_by == START + 3600
    assert (facts.gpus_per_host, facts.instance_type) == (8, "")  # the nodes' Gres, where no instance tells
    assert facts.platform_ids["submit_time"] == "2026-12-01T10:00:00"
    assert facts.platform_ids["ssm_target"] == "i-0123456789abcdef0"
    assert job(time_limit_s=None).facts().ends_by is None


def test_nodes_that_are_instances_read_the_cloudwatch_agents_metrics_others_the_agents() -> None:
    mapped = job().with_instances({"10.0.0.11": ("i-0aaaaaaaaaaaaaaaa", "p5.48xlarge")})
    facts = mapped.facts()
    assert facts.host_instances == {"node1": "i-0aaaaaaaaaaaaaaaa"}
    math = SLURM.gpu_utilization(facts, "node1")
    assert [(ns, dims) for ns, _, dims in math.inputs.values()] == [
        (contract.CWAGENT_NAMESPACE, {contract.CWAGENT_DIM_INSTANCE: "i-0aaaaaaaaaaaaaaaa"})
    ]
    agents = SLURM.gpu_memory(facts, "node2")
    [(ns, metric, dims)] = agents.inputs.values()
    assert (ns, metric, dims) == (contract.NAMESPACE, "GPUMemoryUtilization", {"JobName": facts.name, "Host": "node2"})
    both = job().with_instances(
        {a: (f"i-0{i}aaaaaaaaaaaaaaa", "p5.48xlarge") for i, a in enumerate(["10.0.0.11", "10.0.0.12"])}
    )
    assert (both.facts().instance_type, both.facts().gpus_per_host) == ("p5.48xlarge", 8)


def test_a_decision_reads_the_agents_series_of_its_nodes_accelerators_and_both_where_no_type_is_known() -> None:
    # Given the same job on nodes of no known type (no EC2 instance of the account), on p5 and on trn1 instances
    unknown = job().facts()
    nodes = ["10.0.0.11", "10.0.0.12"]
    p5 = job().with_instances({a: (f"i-0{i}aaaaaaaaaaaaaaa", "p5.48xlarge") for i, a in enumerate(nodes)}).facts()
    trn1 = job().with_instances({a: (f"i-0{i}bbbbbbbbbbbbbbb", "trn1.32xlarge") for i, a in enumerate(nodes)}).facts()

    # Then a GPU job reads the GPU names, a Neuron job its NeuronCores' (no platform has them), an unknown one both
    assert "GPUPowerWatts" in SLURM.agent_metrics(p5)
    assert "AcceleratorPowerPercent" not in SLURM.agent_metrics(p5)
    assert set(SLURM.agent_metrics(trn1)) == {
        "AcceleratorUtilization", "AcceleratorMemoryUtilization", "AcceleratorPowerPercent", "StepTime",
    }  # fmt: skip
    assert set(SLURM.agent_metrics(unknown)) == set(SLURM.agent_metrics(p5)) | set(SLURM.agent_metrics(trn1))


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("CONFIGURING", "InProgress"),
        ("SUSPENDED", "Paused"),
        ("REQUEUED", "Paused"),
        ("PENDING", "Paused"),
        ("COMPLETED", "Completed"),
        ("NODE_FAIL", "Failed"),
        ("CANCELLED", "Stopped"),
        ("TIMEOUT", "Stopped"),
        ("PREEMPTED", "Stopped"),
    ],
)
def test_slurms_states_map_to_a_status_the_engine_never_stops_unless_running(state: str, status: str) -> None:
    assert job(state=state).status == status


def test_a_held_answer_pauses_the_job_until_it_lapses_and_its_time_is_held() -> None:
    held = job().held("SUSPENDED", START + 600)
    assert held.facts(START + 700).status == "Paused"
    assert held.facts(START + 700).secondary_status == "SUSPENDED"
    assert held.facts(START + 600 + HELD_RECHECK_S).status == "InProgress"  # asked again by the next stop
    assert held.held("SUSPENDED", START + 900).held_since == START + 600  # the same hold goes on
    assert held.held_spans(START + 1200) == ((START + 600, START + 1200, "SUSPENDED"),)
    timed_out = job().ended("TIMEOUT", START + 3700)
    assert timed_out.held_spans(START + 3700) == ((START + 3600, START + 3700, "TIMEOUT"),)


def test_a_nodes_stream_is_its_own_and_one_prefix_holds_the_jobs() -> None:
    name = "pc1-42-llm"
    stream = stream_name(name, "node2")
    assert stream == "slurm__var_log_stallwatch_slurm_pc1-42-llm.node2.log"
    assert stream.startswith(stream_prefix(name))
    assert SLURM.host_of_stream(stream, name, {"node1", "node2"}) == "node2"
    assert SLURM.host_of_stream(stream_name("pc1-42-llm2", "node2"), name, {"node2"}) is None  # another job
    assert SLURM.host_of_stream(stream_name(name, "node9"), name, {"node2"}) is None


def test_a_slurm_job_name_is_one_of_the_platforms() -> None:
    assert job_name_error("pc1-42-llm", Platform.SLURM) is None
    assert job_name_error("pc1.42", Platform.SLURM) is not None
    assert describe(Platform.SLURM) is SLURM


def answer(result: str, state: str = "", code: int = 0, drained: str = "") -> str:
    return (
        f'{{"stallwatch_slurm":1,"action":"cancel","job":"42","result":"{result}","state":"{state}",'
        f'"drained":"{drained}"}}\n'
    )


def test_the_controllers_answers_say_how_the_stop_went() -> None:
    def outcome(status: str, code: int, output: str) -> tuple[bool, bool, str, str]:
        found = answer_outcome(status, status, code, output)
        assert found is not None
        return found.ok, found.held, found.state, found.detail

    assert answer_outcome("InProgress", "InProgress", -1, "") is None  # not answered yet
    assert outcome("Success", 0, answer("cancelled", "CANCELLED"))[:3] == (True, False, "CANCELLED")
    requeued = outcome("Success", 0, answer("requeued", "PENDING", drained="node2"))
    assert requeued[:2] == (True, False)
    assert "node2 drained" in requeued[3]
    assert outcome("Failed", 4, answer("not_running", "SUSPENDED"))[:3] == (True, True, "SUSPENDED")
    assert outcome("Failed", 3, answer("other_job", "RUNNING"))[:2] == (True, False)  # the id is another job's now
    assert outcome("Failed", 1, answer("scancel_failed", "RUNNING"))[:2] == (False, False)
    lost = outcome("TimedOut", -1, "")
    assert lost[:2] == (False, False)
    assert "TimedOut" in lost[3]


def test_a_hung_job_past_its_time_limit_is_left_to_slurm_and_one_before_it_is_stopped() -> None:
    # Given a 2-node job whose steps stopped at 1 h while its GPUs stay busy, and enforce mode
    hour = 3600.0
    builder = (
        SignalsBuilder(hosts=2, platform=Platform.EC2)
        .progress(0, hour)
        .no_progress(hour, 3 * hour)
        .gpu(0, 3 * hour, 99.0)
        .power(0, hour, 350.0)
        .power(hour, 3 * hour, 110.0)
        .logs(0, 3 * hour, 30)
    )
    enforce = Policy(mode=Mode.ENFORCE).for_job({"stallwatch:mode": "enforce"})
    stopped_at = JobState(warned_at=hour + 16 * 60)

    def decide_at(now: float, ends_by: float) -> Decision:
        signals = builder.build(now)
        facts = replace(signals.facts, platform=Platform.SLURM, ends_by=ends_by)
        return engine.decide(replace(signals, facts=facts), enforce, stopped_at, now)

    # When the engine decides 40 minutes into the stall, before and after its --time limit
    before = decide_at(hour + 40 * 60, ends_by=2 * hour)
    after = decide_at(2 * hour + 60, ends_by=2 * hour)
    # Then it stops the job before its limit, and past it leaves Slurm to end it (not a stall)
    assert before.action is Action.STOP
    assert (after.action, after.diagnosis) == (Action.NONE, Diagnosis.FINISHED)
    assert after.reasons == ("past its time limit: the platform ends it",)


def test_a_requeued_attempt_is_read_from_its_own_start() -> None:
    # Given signals of a job whose earlier attempt stepped to 250 before the requeue at t=1000
    builder = SignalsBuilder(hosts=2, platform=Platform.EC2).progress(0, 900).gpu(0, 1200, 95.0).logs(0, 1200, 30)
    signals = builder.build(1200)
    facts = replace(signals.facts, platform=Platform.SLURM, start_time=1000.0)
    # When the attempt's signals are taken
    attempt = this_attempt(replace(signals, facts=facts))
    # Then nothing before its start is left: no step, GPU points and lines only since 1000
    assert all(not series.points for series in attempt.agent.values())
    assert all(t >= 1000 for host in attempt.hosts.values() for t, _ in host.gpu_util.points)
    assert all(line.t >= 1000 for host in attempt.hosts.values() for line in host.log_tail)
    assert all(host.log_last_t is None or host.log_last_t >= 1000 for host in attempt.hosts.values())


@pytest.mark.parametrize(
    ("job_state", "reason", "exit_code", "ended"),
    [
        ("CANCELLED", "None", "0:0", "CANCELLED"),  # read once the epilog returned
        ("REQUEUED", "None", "0:0", "REQUEUED"),
        ("COMPLETING", "TimeLimit", "0:0", "TIMEOUT"),  # read while it ran (no setsid)
        ("COMPLETING", "NonZeroExitCode", "1:0", "FAILED"),
        ("COMPLETING", "None", "0:0", "COMPLETED"),
        ("", "None", "", "COMPLETED"),
    ],
)
def test_an_end_event_says_how_the_attempt_ended(job_state: str, reason: str, exit_code: str, ended: str) -> None:
    assert end_state(job_state, reason, exit_code) == ended
