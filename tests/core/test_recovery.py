"""Recovery in place, EC2's way back, the pure rules: its tag and budget (every way back's, `core.way_back`), a node's
health report, SSM's invocation states, and what follows the checks."""

from __future__ import annotations

import json

import pytest

from stallwatch.core import command_answers, way_back
from stallwatch.core.command_answers import Invocation, NodeCheck, NodeState
from stallwatch.core.platforms import ec2_recovery as recovery
from stallwatch.core.platforms.ec2_recovery import FallBack, HealthOutputError, HealthReport, Restart, TakeOut, Wait
from stallwatch.core.resume import NoResume, StopRecord
from stallwatch.core.signals import Series
from stallwatch.core.way_back import TagError, WayBack

HEALTHY = {
    "stallwatch_health": 1,
    "nvidia_smi": "ok",
    "gpus": 8,
    "xid": [],
    "ecc_uncorrectable": 0,
    "retired_pages_pending": 0,
    "remapped_rows_pending": 0,
    "remapped_rows_failure": 0,
    "nvlink_inactive": 0,
    "efa": "present",
    "dcgm": "absent",
}


def _line(**changes: object) -> str:
    return json.dumps(HEALTHY | changes)


def _stop(diagnosis: str = "hang", step: float | None = 70.0) -> StopRecord:
    return StopRecord(at=1000.0, diagnosis=diagnosis, step=step, stall_onset=900.0, ok=None)


@pytest.mark.parametrize(
    ("tags", "expected"),
    [({}, False), ({"stallwatch:recover": "restart"}, True), ({"stallwatch:recover": " Restart "}, True)],
)
def test_recovery_in_place_is_opted_in_by_its_tag(tags: dict[str, str], expected: bool) -> None:
    assert way_back.recovers(tags, WayBack.RESTART) is expected


def test_stop_is_the_default_mode_and_another_value_is_an_error_naming_it() -> None:
    assert way_back.recovers({"stallwatch:recover": "stop"}, WayBack.RESTART) is False
    with pytest.raises(TagError, match=r"stallwatch:recover='reboot': expected restart or stop"):
        way_back.recovers({"stallwatch:recover": "reboot"}, WayBack.RESTART)


def test_min_nodes_is_a_whole_number_of_at_least_one() -> None:
    assert recovery.min_nodes({}) is None
    assert recovery.min_nodes({"stallwatch:min-nodes": "6"}) == 6
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(TagError, match="stallwatch:min-nodes"):
            recovery.min_nodes({"stallwatch:min-nodes": bad})


def test_the_budget_is_the_resume_tag_else_the_policy_else_three_restarts() -> None:
    # Given no resume tag and no policy default: three restarts in place
    assert way_back.plan({}, _stop(), 0, done=0, before=None) == (1, 3)
    assert way_back.plan({}, _stop(step=200.0), 0, done=2, before=150.0) == (3, 3)
    spent = way_back.plan({}, _stop(step=300.0), 0, done=3, before=200.0)
    assert spent == NoResume("gave up: restart budget spent (3 of 3 restarts)", alert=True)
    # ...the policy's default, then the job's tag, win over it
    assert way_back.plan({}, _stop(), 5, done=0, before=None) == (1, 5)
    assert way_back.plan({"stallwatch:resume": "1"}, _stop(), 5, done=0, before=None) == (1, 1)


def test_no_progress_since_the_last_restart_and_a_stall_no_restart_fixes_are_refused() -> None:
    assert way_back.plan({}, _stop(step=70.0), 0, done=1, before=70.0) == NoResume(
        "gave up: no progress after 1 restart", alert=True
    )
    idle = way_back.plan({}, _stop(diagnosis="idle"), 0, done=0, before=None)
    assert isinstance(idle, NoResume)
    assert "not a stall a restart fixes" in idle.reason


def test_efa_is_expected_on_multi_node_jobs_of_efa_types_only() -> None:
    assert recovery.efa_expected("p4d.24xlarge", 2)
    assert not recovery.efa_expected("p4d.24xlarge", 1)
    assert not recovery.efa_expected("g5.2xlarge", 4)


def test_the_report_is_the_last_marked_json_line_of_the_output() -> None:
    output = "\n".join(["Running checks...", '{"other": 1}', _line(gpus=7), "----------ERROR-------", "warning: x"])
    assert recovery.parse_health(output) == HealthReport(nvidia_smi="ok", gpus=7)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("", "no stallwatch_health line"),
        ('{"stallwatch_health": 1, "gpus": "8"', "no stallwatch_health line"),
        (_line(gpus="8"), "gpus: expected a whole number"),
        (_line(ecc_uncorrectable=True), "ecc_uncorrectable: expected a whole number"),
        (_line(xid="79"), "xid: expected a list"),
        (_line(efa="<!channel> pwned"), "efa: expected one of missing, no_tool, present, timeout"),
    ],
)
def test_an_output_without_a_well_formed_report_is_an_error_naming_what_is_wrong(output: str, message: str) -> None:
    with pytest.raises(HealthOutputError, match=message):
        recovery.parse_health(output)


def test_a_nodes_own_words_never_reach_slack_only_the_fields_they_were_in() -> None:
    # Given a node whose output was tampered with: a state outside the document's, meant for Slack
    tampered = _line(nvidia_smi="ok <!channel> click http://evil.example")
    answers = {"i-1": Invocation("i-1", "Success", "Success", tampered, 0)}
    # When it is judged, Then it is unreadable, and what Slack would hear names the field alone
    [check] = recovery.check_nodes(answers, ("i-1",), {"i-1": "p4d.24xlarge"}, deadline_passed=False).values()
    assert check.failures == ("unreadable health report: nvidia_smi: expected one of absent, error, ok, timeout",)
    assert "evil" not in recovery.named_failures({"i-1": check.failures})


def test_a_healthy_node_fails_nothing() -> None:
    assert recovery.health_failures(recovery.parse_health(_line()), "p4d.24xlarge", efa_expected=True) == ()


@pytest.mark.parametrize(
    ("changes", "failure"),
    [
        ({"gpus": 7}, "7 of 8 GPUs visible"),
        ({"nvidia_smi": "timeout", "gpus": -1}, "nvidia-smi -q timed out (a GPU that stopped answering)"),
        ({"nvidia_smi": "absent", "gpus": -1}, "no nvidia-smi"),
        ({"xid": [13, 79]}, "Xid 79: GPU has fallen off the bus"),
        ({"xid": [48]}, "Xid 48: double-bit ECC error"),
        ({"ecc_uncorrectable": 2}, "2 uncorrectable ECC errors"),
        ({"ecc_uncorrectable": 1}, "1 uncorrectable ECC error"),
        ({"remapped_rows_failure": 1}, "1 row remapping failure"),
        ({"remapped_rows_pending": 2}, "2 row remappings pending (needs a GPU reset)"),
        ({"retired_pages_pending": 1}, "1 GPU with pages pending retirement"),
        ({"nvlink_inactive": 3}, "3 NVLink links down"),
        ({"efa": "missing"}, "EFA device missing (fi_info -p efa)"),
        ({"efa": "no_tool"}, "EFA device no tool (fi_info -p efa)"),
        ({"dcgm": "fail"}, "dcgmi diag -r 1 failed"),
        ({"dcgm": "timeout"}, "dcgmi diag -r 1 timed out"),
    ],
)
def test_each_check_names_its_failure(changes: dict[str, object], failure: str) -> None:
    report = recovery.parse_health(_line(**changes))
    assert recovery.health_failures(report, "p4d.24xlarge", efa_expected=True) == (failure,)


def test_application_xids_say_nothing_about_the_node_and_efa_is_checked_only_where_expected() -> None:
    report = recovery.parse_health(_line(xid=[13, 31, 43, 45], efa="missing"))
    assert recovery.health_failures(report, "p4d.24xlarge", efa_expected=False) == ()


def test_a_cpu_only_node_has_no_gpu_to_check_and_efa_is_expected_per_node_on_multi_node_jobs() -> None:
    # Given a heterogeneous 2-node job: a p4d node and a CPU-only data loader, neither with an EFA provider
    no_gpu = _line(nvidia_smi="absent", gpus=-1, efa="missing")
    answers = {node: Invocation(node, "Success", "Success", no_gpu, 0) for node in ("i-gpu", "i-cpu")}
    types = {"i-gpu": "p4d.24xlarge", "i-cpu": "c5.18xlarge"}
    # When their reports are judged
    checks = recovery.check_nodes(answers, ("i-gpu", "i-cpu"), types, deadline_passed=False)
    # Then the GPU node fails for its GPUs and its EFA device, the data loader for nothing
    assert checks["i-gpu"].failures == ("no nvidia-smi", "EFA device missing (fi_info -p efa)")
    assert checks["i-cpu"].healthy
    # ...and a one-node p4d job needs no EFA
    alone = recovery.check_nodes({"i-gpu": answers["i-gpu"]}, ("i-gpu",), types, deadline_passed=False)
    assert alone["i-gpu"].failures == ("no nvidia-smi",)


def test_the_gpu_count_is_checked_only_against_a_type_whose_count_is_known() -> None:
    report = recovery.parse_health(_line(gpus=3))
    assert recovery.health_failures(report, "p9x.96xlarge", efa_expected=False) == ()
    assert recovery.health_failures(report, "g5.48xlarge", efa_expected=False) == ("3 of 8 GPUs visible",)


@pytest.mark.parametrize(
    ("status", "details", "state"),
    [
        ("Success", "Success", NodeState.SUCCEEDED),
        ("Pending", "Pending", NodeState.WAITING),
        ("Delayed", "Delayed", NodeState.WAITING),
        ("InProgress", "InProgress", NodeState.RUNNING),
        ("Failed", "Failed", NodeState.FAILED),
        ("Failed", "Undeliverable", NodeState.UNDELIVERABLE),
        ("Failed", "Terminated", NodeState.UNDELIVERABLE),
        ("TimedOut", "Delivery Timed Out", NodeState.UNDELIVERABLE),
        ("TimedOut", "Execution Timed Out", NodeState.TIMED_OUT),
        ("Cancelled", "Cancelled", NodeState.UNDELIVERABLE),
    ],
)
def test_ssm_invocation_states_tell_delivery_from_execution(status: str, details: str, state: NodeState) -> None:
    assert command_answers.invocation_state(status, details) is state


def test_the_checks_wait_for_a_node_then_its_unfinished_check_is_its_failure() -> None:
    # Given one node that answered healthy, one still running its check, one not delivered yet, one not listed yet
    answers = {
        "i-1": Invocation("i-1", "Success", "Success", _line(), 0),
        "i-2": Invocation("i-2", "InProgress", "InProgress"),
        "i-3": Invocation("i-3", "Pending", "Pending"),
    }
    nodes = ("i-1", "i-2", "i-3", "i-4")
    types = dict.fromkeys(nodes, "p4d.24xlarge")
    # When the wait is not over, Then the unfinished ones are waited for
    before = recovery.check_nodes(answers, nodes, types, deadline_passed=False)
    waiting = [NodeState.SUCCEEDED, NodeState.RUNNING, NodeState.WAITING, NodeState.WAITING]
    assert [before[n].state for n in nodes] == waiting
    assert recovery.after_checks(before, {}, None, deadline_passed=False) == Wait()
    # When it is over: the running check timed out (the node's failure); the others were never delivered
    after = recovery.check_nodes(answers, nodes, types, deadline_passed=True)
    assert after["i-2"] == NodeCheck("i-2", NodeState.TIMED_OUT, ("timed out",), "InProgress: InProgress")
    assert after["i-3"].state is after["i-4"].state is NodeState.UNDELIVERABLE
    step = recovery.after_checks(after, {}, None, deadline_passed=True)
    assert isinstance(step, FallBack)
    assert "could not be delivered to i-3 (Pending: Pending, not delivered in time); i-4" in step.reason


def test_a_report_that_cannot_be_read_and_a_script_that_failed_are_the_nodes_failures() -> None:
    answers = {
        "i-1": Invocation("i-1", "Success", "Success", "nvidia-smi: not found", 0),
        "i-2": Invocation("i-2", "Failed", "Failed", "", 2),
    }
    checks = recovery.check_nodes(answers, ("i-1", "i-2"), {}, deadline_passed=False)
    assert checks["i-1"].failures[0].startswith("unreadable health report: no stallwatch_health line")
    assert checks["i-2"].failures == ("exited 2",)


def _checks(bad: dict[str, tuple[str, ...]], nodes: int = 4) -> dict[str, NodeCheck]:
    return {f"i-{n}": NodeCheck(f"i-{n}", NodeState.SUCCEEDED, bad.get(f"i-{n}", ())) for n in range(1, nodes + 1)}


def test_healthy_nodes_are_restarted_all_of_them() -> None:
    assert recovery.after_checks(_checks({}), {}, None, False) == Restart(("i-1", "i-2", "i-3", "i-4"))


def test_a_bad_node_in_a_group_is_replaced_and_one_outside_is_stopped_only_when_the_floor_allows() -> None:
    bad = {"i-2": ("Xid 79: GPU has fallen off the bus",)}
    # In an Auto Scaling group: replaced, whatever the floor
    replaced = recovery.after_checks(_checks(bad), {"i-2": "asg"}, None, False)
    assert replaced == TakeOut(bad=bad, replace={"i-2": "asg"}, keep=("i-1", "i-3", "i-4"))
    # Outside one: stopped if the job can train on the 3 left
    assert recovery.after_checks(_checks(bad), {}, 3, False) == TakeOut(
        bad=bad, stop=("i-2",), keep=("i-1", "i-3", "i-4")
    )
    # ...and otherwise the job is stopped as without recovery, the node and its failure named
    refused = recovery.after_checks(_checks(bad), {}, None, False)
    assert refused == FallBack(
        "i-2 failed its health check (Xid 79: GPU has fallen off the bus); not in an Auto Scaling group, and the job "
        "does not allow fewer nodes (no stallwatch:min-nodes tag)"
    )
    below = recovery.after_checks(_checks(bad), {}, 4, False)
    assert isinstance(below, FallBack)
    assert below.reason.endswith("3 nodes would be left, fewer than stallwatch:min-nodes=4")


def test_a_job_with_every_node_bad_outside_a_group_cannot_restart_on_none() -> None:
    bad = {f"i-{n}": ("2 NVLink links down",) for n in (1, 2)}
    assert isinstance(recovery.after_checks(_checks(bad, nodes=2), {}, 1, False), FallBack)


def test_nodes_in_and_out_of_groups_are_taken_out_each_their_way() -> None:
    bad = {"i-1": ("1 row remapping failure",), "i-3": ("EFA device missing (fi_info -p efa)",)}
    step = recovery.after_checks(_checks(bad), {"i-1": "asg", "i-3": None}, 2, False)
    assert step == TakeOut(bad=bad, stop=("i-3",), replace={"i-1": "asg"}, keep=("i-2", "i-4"))


def test_a_restart_that_did_not_go_through_everywhere_is_named() -> None:
    answers = {"i-1": Invocation("i-1", "Success", "Success"), "i-2": Invocation("i-2", "Failed", "Failed", "", 1)}
    states = command_answers.command_states(answers, ("i-1", "i-2"), deadline_passed=False)
    assert recovery.restart_failures(states) == "the restart failed on i-2 (exited 1)"
    assert recovery.restart_failures({"i-1": states["i-1"]}) is None


def test_first_progress_is_the_first_period_with_steps_that_ends_after_the_restart() -> None:
    # Given steps before the stall, none during it, and steps again from 2 periods after the restart at t=1000
    steps = Series(((600.0, 5.0), (660.0, 0.0), (960.0, 0.0), (1020.0, 0.0), (1080.0, 3.0), (1140.0, 6.0)))
    step = Series(((600.0, 70.0), (1080.0, 63.0), (1140.0, 69.0)))
    # Then it came within the period [1080, 1140): by 1140, at step 63
    assert recovery.first_progress(steps, step, None, restarted_at=1000.0, period=60) == (1140.0, 63.0)
    # ...a period that began before the restart and ends after it counts (the job made no step while it stalled)
    assert recovery.first_progress(Series(((960.0, 2.0),)), Series(), None, 1000.0, 60) == (1020.0, None)
    # ...and none yet is None, with or without logs (the agent reports: its steps decide)
    assert recovery.first_progress(Series(((1080.0, 0.0),)), Series(), 1100.0, 1000.0, 60) is None


def test_without_the_agent_the_first_log_line_after_the_restart_is_the_progress() -> None:
    assert recovery.first_progress(Series(), Series(), 1100.0, restarted_at=1000.0, period=60) == (1100.0, None)
    assert recovery.first_progress(Series(), Series(), 900.0, restarted_at=1000.0, period=60) is None


def test_a_restart_record_is_an_attempt_and_other_records_are_not() -> None:
    restarted = {"action": "recover", "phase": "restarted", "at": 1100.0, "stall_onset": 500.0, "step": 70.0}
    assert way_back.attempt_of(restarted, None) == way_back.Attempt(1100.0, 500.0, 70.0)
    assert way_back.attempt_of(restarted | {"phase": "checking"}, None) is None
    assert way_back.attempt_of({"action": "stop", "at": 1.0}, None) is None
    assert way_back.attempt_of(restarted, {"restart": {"ok": False}}) is None


def test_slack_hears_how_long_the_first_step_took() -> None:
    assert recovery.progress_text("j", 201.0, 42.4).endswith("step 201 within 42 s of the restart")
    assert recovery.progress_text("j", None, 600.0).endswith("its logs resumed within 10 min of the restart")


# A healthy trn1.32xlarge's line, as the health-check document writes it on a Neuron node (nvidia-smi is never run).
TRN1_HEALTHY = HEALTHY | {
    "nvidia_smi": "absent",
    "gpus": -1,
    "accelerator": "neuron",
    "neuron_ls": "ok",
    "neuron_devices": 16,
    "neuron_ecc_uncorrectable": 0,
}


def test_a_healthy_trainium_node_passes_without_nvidia_smi() -> None:
    report = recovery.parse_health(json.dumps(TRN1_HEALTHY))
    assert recovery.health_failures(report, "trn1.32xlarge", efa_expected=True) == ()


@pytest.mark.parametrize(
    ("changes", "failure"),
    [
        ({"neuron_devices": 15}, "15 of 16 Neuron devices visible"),
        (
            {"neuron_ls": "timeout", "neuron_devices": -1},
            "neuron-ls timed out (a Neuron device that stopped answering)",
        ),
        ({"neuron_ls": "absent", "neuron_devices": -1}, "no neuron-ls (aws-neuronx-tools)"),
        ({"neuron_ecc_uncorrectable": 2}, "2 uncorrectable Neuron ECC errors"),
        ({"accelerator": "nvidia"}, "no Neuron device or tools (no Neuron driver sysfs, no neuron-ls)"),
    ],
)
def test_each_neuron_check_names_its_failure(changes: dict[str, object], failure: str) -> None:
    report = recovery.parse_health(json.dumps(TRN1_HEALTHY | changes))
    assert recovery.health_failures(report, "trn1.32xlarge", efa_expected=True) == (failure,)


def test_an_older_documents_line_reads_as_a_gpu_nodes_and_a_bad_accelerator_is_refused() -> None:
    assert recovery.parse_health(_line()).accelerator == "nvidia"
    with pytest.raises(HealthOutputError, match="accelerator: expected one of neuron, nvidia"):
        recovery.parse_health(_line(accelerator="tpu"))
