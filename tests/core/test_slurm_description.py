"""The Slurm platform as pure rules: a job's facts from its events, its time limit, its nodes' metrics and streams,
and what HyperPod says of its nodes (left to HyperPod while it acts; its hardware verdict a fault a requeue drains)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.core import contract, engine
from stallwatch.core.decision import Action, Decision, Diagnosis, JobState
from stallwatch.core.platforms import describe, job_name_error
from stallwatch.core.platforms.hyperpod import REPLACE, HyperPodAction
from stallwatch.core.platforms.slurm import (
    HELD_RECHECK_S,
    LEFT_TO_HYPERPOD,
    SLURM,
    SlurmJob,
    SlurmNode,
    controller_instance,
    end_state,
    hyperpod_cluster,
    job_streams,
    log_key,
    node_of_stream,
    slurm_job_name,
    stream_name,
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
    mapped = job().with_instances({"node1": ("i-0aaaaaaaaaaaaaaaa", "p5.48xlarge")})
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
        {a: (f"i-0{i}aaaaaaaaaaaaaaa", "p5.48xlarge") for i, a in enumerate(["node1", "node2"])}
    )
    assert (both.facts().instance_type, both.facts().gpus_per_host) == ("p5.48xlarge", 8)


def test_a_decision_reads_the_agents_series_of_its_nodes_accelerators_and_both_where_no_type_is_known() -> None:
    # Given the same job on nodes of no known type (no EC2 instance of the account), on p5 and on trn1 instances
    unknown = job().facts()
    nodes = ["node1", "node2"]
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


NODE1, NODE2 = "i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb"


def test_a_nodes_stream_is_named_by_its_instance_and_taken_only_from_that_node_of_the_job() -> None:
    # Given a job whose nodes were mapped to their instances when it started
    facts = job().with_instances({"node1": (NODE1, "p5.48xlarge"), "node2": (NODE2, "p5.48xlarge")}).facts()
    key = log_key("pc1", "42")
    own = stream_name(NODE2, key, "node2")
    # Then each node's stream is its instance's, and only a node's own instance's stream is taken as the node's
    assert own == "i-0bbbbbbbbbbbbbbbb__var_log_stallwatch_slurm_pc1-42.node2.log"
    assert job_streams(facts) == [stream_name(NODE1, key, "node1"), own]
    assert node_of_stream(facts, own) == "node2"
    assert node_of_stream(facts, stream_name(NODE1, key, "node2")) is None  # node1's role writing node2's name
    assert node_of_stream(facts, stream_name(NODE2, key, "node9")) is None  # a node that is not the job's
    assert node_of_stream(facts, stream_name(NODE2, log_key("pc1", "43"), "node2")) is None  # another job's
    assert node_of_stream(facts, stream_name(NODE2, log_key("pc2", "42"), "node2")) is None  # another cluster's
    assert node_of_stream(facts, "slurm__var_log_stallwatch_slurm_pc1-42.node2.log") is None  # the old, unsigned name
    # And a node whose instance is not known has no stream the job takes
    assert node_of_stream(job().facts(), own) is None
    assert SLURM.host_of_stream(own, facts.name, {"node2"}) == "node2"  # a trace's reading: the node it names


def test_a_job_name_is_unique_by_construction_for_its_cluster_and_id() -> None:
    # Given names whose plain joins would be one, and a 60-character cluster whose ids would be cut away
    pairs = [(("a-1", "2", "x"), ("a", "1", "2-x")), (("c" * 60, "123", ""), ("c" * 60, "124", ""))]
    for first, second in pairs:
        # Then they are two names, each one a job name can be
        assert slurm_job_name(*first) != slurm_job_name(*second)
        assert all(SLURM.names_job(slurm_job_name(*names)) for names in (first, second))
    # And a plain cluster's name reads as it always did, its name cleaned
    assert slurm_job_name("pc1", "42", "llm 7b") == "pc1-42-llm-7b"
    assert log_key("pc1", "42") == "pc1-42"
    assert len(slurm_job_name("c" * 60, "123", "")) <= 63
    assert "--" in slurm_job_name("a-1", "2", "x")  # a hashed name never reads as a plain one


def test_the_controllers_target_names_its_instance_or_its_hyperpod_cluster() -> None:
    target = "sagemaker-cluster:2hd31rmi9mde_controller-machine-i-09e7576cbc230c181"
    assert (hyperpod_cluster(target), controller_instance(target)) == ("2hd31rmi9mde", None)
    assert (hyperpod_cluster("i-0123456789abcdef0"), controller_instance("i-0123456789abcdef0")) == (
        None,
        "i-0123456789abcdef0",
    )


def test_a_node_hyperpod_acts_on_leaves_the_job_to_hyperpod_for_a_while_and_its_verdict_is_noted() -> None:
    # Given HyperPod said it replaces node2 (its health agent: the hardware) ten minutes into the attempt
    replacing = HyperPodAction(REPLACE, "hardware", "node reason", START + 600, node="node2", said="Action:Replace")
    held = job().with_hyperpod(replacing)
    # Then the job is HyperPod's meanwhile (never judged, so never acted on twice), and says so
    facts = held.facts(START + 700)
    assert (facts.status, facts.secondary_status) == ("Paused", LEFT_TO_HYPERPOD)
    assert any("HyperPod replaces node2" in note and "the hardware" in note for note in facts.notes)
    # And once HyperPod has had its time, the job is watched again
    assert held.facts(START + 600 + 3600).status == "InProgress"
    # And the same word again is kept once
    assert held.with_hyperpod(replacing).hyperpod == (replacing,)


def test_hyperpods_hardware_verdict_on_a_node_blames_it_and_its_application_verdict_blames_none() -> None:
    # Given HyperPod's health agent blaming node1's hardware without acting on it, and node2's application
    hardware = HyperPodAction("None", "hardware", "health event", START + 600, node="node1", said="NVLink errors")
    application = HyperPodAction("None", "application", "health agent", START + 600, node="node2", said="user app")
    facts = job().with_hyperpod(hardware).with_hyperpod(application).facts(START + 700)
    # Then the job is still judged, and only node1 is a hardware fault a requeue drains, in HyperPod's words
    assert facts.status == "InProgress"
    assert list(facts.hardware_faults) == ["node1"]
    assert "NVLink errors" in facts.hardware_faults["node1"]


def test_a_held_job_the_controller_says_runs_again_is_judged_again_and_its_hold_counted_until_then() -> None:
    held = job().held("SUSPENDED", START + 600)
    released = held.released(START + 900)
    assert released.facts(START + 1000).status == "InProgress"
    assert released.held_spans(START + 2000) == ((START + 600, START + 900, "SUSPENDED"),)
    assert released.held("SUSPENDED", START + 1200).held_since == START + 1200  # a new hold


def test_a_slurm_job_name_is_one_of_the_platforms() -> None:
    assert job_name_error("pc1-42-llm", Platform.SLURM) is None
    assert job_name_error("pc1.42", Platform.SLURM) is not None
    assert describe(Platform.SLURM) is SLURM


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
