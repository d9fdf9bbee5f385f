"""A stalled job's way back, whatever its platform's: one tag grammar, one budget, attempts counted from the audit
trail, and the hosts a way back drains or replaces blamed only by a hardware signal (`core.way_back`)."""

from __future__ import annotations

import ast

import pytest

from stallwatch.core import log_patterns
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.policy import RECOVER_TAG
from stallwatch.core.resume import NoResume, StopRecord
from stallwatch.core.signals import Platform
from stallwatch.core.way_back import (
    DEFAULT_RESTARTS,
    TagError,
    WayBack,
    attempts,
    blamed_hosts,
    plan,
    recovers,
)
from tests.test_layers import LAMBDAS

PERIOD, NOW = 60.0, 10_000.0


def _stop(step: float | None = 70.0, diagnosis: str = "crashed_rank", at: float = 1000.0) -> StopRecord:
    return StopRecord(at=at, diagnosis=diagnosis, step=step, stall_onset=at - 100, ok=None)


@pytest.mark.parametrize(("platform", "way"), [(Platform.EC2, "restart"), (Platform.SLURM, "requeue")])
def test_one_grammar_opts_each_platform_in_to_its_own_way_back_and_names_what_it_takes(
    platform: Platform, way: str
) -> None:
    offered = DESCRIPTIONS[platform].way_back
    assert offered == way
    assert recovers({"stallwatch:recover": f" {way.title()} "}, offered)
    assert not recovers({"stallwatch:recover": "stop"}, offered)
    assert not recovers({}, offered)
    other = "requeue" if way == "restart" else "restart"  # another platform's way is no way of this one
    with pytest.raises(TagError, match=f"stallwatch:recover='{other}': expected {way} or stop"):
        recovers({"stallwatch:recover": other}, offered)


def test_a_platform_without_a_way_back_in_place_takes_only_stop() -> None:
    offered = DESCRIPTIONS[Platform.SAGEMAKER].way_back  # resumed after its stop (stallwatch:resume), never in place
    assert offered == WayBack.RESUME
    assert not recovers({"stallwatch:recover": "stop"}, offered)
    with pytest.raises(TagError, match="expected stop"):
        recovers({"stallwatch:recover": "restart"}, offered)


def test_the_budget_is_resumes_and_no_progress_since_the_last_attempt_ends_the_loop() -> None:
    # Given a job that opted in by stallwatch:recover alone: DEFAULT_RESTARTS attempts
    assert plan({}, _stop(), 0, done=0, before=None) == (1, DEFAULT_RESTARTS)
    assert plan({"stallwatch:resume": "2"}, _stop(step=200.0), 5, done=1, before=100.0) == (2, 2)
    assert plan({"stallwatch:resume": "2"}, _stop(step=300.0), 0, done=2, before=200.0) == NoResume(
        "gave up: restart budget spent (2 of 2 restarts)", alert=True
    )
    # And a crash at the same step as the last attempt's: no progress, the loop ends
    assert plan({}, _stop(step=70.0), 0, done=1, before=70.0) == NoResume(
        "gave up: no progress after 1 restart", alert=True
    )


def _record(action: str, at: float, step: float | None, **fields: object) -> dict[str, object]:
    return {"action": action, "at": at, "diagnosis": "crashed_rank", "evidence": {"agent": {"step": step}}, **fields}


def test_attempts_count_the_restarts_and_the_requeues_of_every_platform_not_the_plain_stops() -> None:
    records = [
        {"record": _record("stop", 100.0, 10.0), "outcome": {"stop": {"ok": True}}},  # a plain stop: its step only
        {  # a requeue: the stop decision whose outcome says so
            "record": _record("stop", 200.0, 20.0),
            "outcome": {"stop": {"ok": True}, "recovery": {"status": "requeued", "attempt": 1}},
        },
        {  # a requeue that could not be sent: no attempt (its step counts, as any stop's)
            "record": _record("stop", 250.0, 25.0),
            "outcome": {"stop": {"ok": False}, "recovery": {"status": "requeued", "attempt": 2}},
        },
        {"record": {"action": "recover", "phase": "restarted", "at": 300.0, "stall_onset": 280.0, "step": 30.0}},
        {"record": {"action": "recover", "phase": "checking", "at": 290.0, "step": 30.0}},  # a step, no attempt
        {"record": _record("stop", 400.0, 40.0), "outcome": {"stop": {"ok": True}}},
    ]
    assert attempts(records) == (2, [10.0, 20.0, 25.0, 30.0, 40.0])
    assert attempts(records, until=400.0) == (2, [10.0, 20.0, 25.0, 30.0])


def _host(errors: list[str] = (), newest: float | None = NOW - 30) -> dict[str, object]:
    found = [{"t": NOW - 200, "pattern": log_patterns.match(e), "message": e} for e in errors]
    return {"errors": found, "newest_data_t": newest}


def test_an_application_error_blames_no_host_and_a_hardware_signal_blames_its_own() -> None:
    hosts = ("node1", "node2", "node3")
    # Given a rank's device-side assert (the same crash every attempt), and an OOM: application errors
    crash = "RuntimeError: CUDA error: device-side assert triggered"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    evidence = {"hosts": {"node1": _host([crash]), "node2": _host([oom]), "node3": _host()}}
    # Then no node is blamed: none is drained or replaced for them
    assert blamed_hosts(evidence, hosts, PERIOD, NOW) == {}
    # When node2's kernel logged a hardware Xid, and node3's metrics vanished while the others report
    xid = "NVRM: Xid (PCI:0000:10:1c): 79, pid=1234, GPU has fallen off the bus."
    evidence["hosts"]["node2"] = _host([oom, xid])
    evidence["hosts"]["node3"] = _host(newest=NOW - 20 * PERIOD)
    blamed = blamed_hosts(evidence, hosts, PERIOD, NOW)
    # Then those two are blamed, each with why
    assert list(blamed) == ["node2", "node3"]
    assert "Xid" in blamed["node2"][0]
    assert blamed["node3"] == ("no metric for 20 min while the others report",)


def test_an_application_xid_blames_nobody_and_a_job_wide_outage_is_no_vanished_host() -> None:
    app_xid = "NVRM: Xid (PCI:0000:10:1c): 13, pid=1234, Graphics SM Warp Exception"
    evidence = {"hosts": {"node1": _host([app_xid]), "node2": _host()}}
    assert blamed_hosts(evidence, ("node1", "node2"), PERIOD, NOW) == {}
    old = NOW - 20 * PERIOD  # every host's metrics old: CloudWatch's delay, not a lost host
    outage = {"hosts": {"node1": _host(newest=old), "node2": _host(newest=old)}}
    assert blamed_hosts(outage, ("node1", "node2"), PERIOD, NOW) == {}


def test_the_platforms_own_hardware_verdict_blames_its_node_among_the_others() -> None:
    # Given node1's rank erring on its own (no blame), and HyperPod's health agent blaming node2's hardware
    crash = "RuntimeError: CUDA error: device-side assert triggered"
    evidence = {"hosts": {"node1": _host([crash]), "node2": _host()}}
    faults = {"node2": "HyperPod replaces node2 (health agent: the hardware; XidHardwareFailure)", "node9": "gone"}
    # When the hosts are blamed
    blamed = blamed_hosts(evidence, ("node1", "node2"), PERIOD, NOW, faults)
    # Then node2 is, in HyperPod's words; a node not the job's is not
    assert blamed == {"node2": (faults["node2"],)}


def _calls(tree: ast.AST, owner: str, method: str) -> bool:
    """Whether the module calls `<...>.<owner>.<method>(...)` (`rt.resume_tries.claims(key)`)."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == owner
        for node in ast.walk(tree)
    )


def _reads_recover_tag(tree: ast.AST) -> bool:
    """Whether the module reads `stallwatch:recover` from a job's tags (`tags.get(RECOVER_TAG)`, `tags[...]`)."""
    for node in ast.walk(tree):
        key = node.args[0] if isinstance(node, ast.Call) and node.args else getattr(node, "slice", None)
        is_read = isinstance(node, ast.Subscript) or (
            isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get"
        )
        named = (isinstance(key, ast.Name) and key.id == "RECOVER_TAG") or (
            isinstance(key, ast.Constant) and key.value == RECOVER_TAG
        )
        if is_read and named:
            return True
    return False


def test_one_parser_reads_the_recover_tag_and_one_history_counts_every_way_back() -> None:
    # Given every module of the Lambda asset
    trees = {p.relative_to(LAMBDAS).as_posix(): ast.parse(p.read_text()) for p in sorted(LAMBDAS.rglob("*.py"))}
    # Then one module parses `stallwatch:recover`, for every platform's way back (its grammar is one)
    assert [m for m, tree in trees.items() if _reads_recover_tag(tree)] == ["stallwatch/core/way_back.py"]
    # And one history counts a run's attempts for the budget, whichever way back made them (resume's too)
    assert [m for m, tree in trees.items() if _calls(tree, "resume_tries", "claims")] == [
        "stallwatch/runtime/way_back.py"
    ]
