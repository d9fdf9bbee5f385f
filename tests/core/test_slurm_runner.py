"""What Stallwatch asks a Slurm cluster's runner, and what its answers mean: only the allow-listed commands, each
checked field by field as the runner checks it (deploy/slurm/stallwatch-runner), and a stop that is done only when
the controller says so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stallwatch.core.platforms import slurm_runner
from tests.fixtures.slurm import runner_script as runner

SUBMIT = "2026-12-01T10:00:00"


def test_the_runner_checks_what_the_control_plane_checks() -> None:
    script = runner()
    assert script.KINDS == slurm_runner.KINDS
    for name in ("CLUSTER", "JOB_ID", "SUBMIT_TIME", "NODE", "REASON_UNSAFE"):
        assert getattr(script, name).pattern == getattr(slurm_runner, name).pattern, name
    assert (script.REASON_CHARS, script.NODES_MAX, script.REPORT_JOBS_MAX, script.REASON_PREFIX) == (
        slurm_runner.REASON_CHARS,
        slurm_runner.NODES_MAX,
        slurm_runner.REPORT_JOBS_MAX,
        slurm_runner.REASON_PREFIX,
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"kind": "shell"},
        {"cluster": "pc1; reboot"},
        {"job_id": "42 43"},
        {"submit_time": "yesterday"},
        {"nodes": ["node[1-2]"]},
        {"nodes": ["n1", "-x"]},
        {"reason": "$(reboot)"},
        {"reason": "x" * 121},
        {"v": 2},
    ],
)
def test_a_command_outside_the_allow_list_is_refused_by_both_sides(changes: dict) -> None:
    # Given a cancel with one field changed to what neither side takes
    command = slurm_runner.cancel("pc1", "42", SUBMIT).as_json() | changes
    # Then the control plane refuses to make it, and the runner refuses to run it
    with pytest.raises(slurm_runner.CommandError):
        slurm_runner.check(command)
    with pytest.raises(runner().Refused):
        runner().check(command, "pc1")


def test_a_command_for_another_cluster_is_refused_by_the_runner() -> None:
    with pytest.raises(runner().Refused, match="for cluster 'pc2'"):
        runner().check(slurm_runner.cancel("pc2", "42", SUBMIT).as_json(), "pc1")


def test_a_requeues_reason_is_made_one_the_runner_takes() -> None:
    command = slurm_runner.requeue("pc1", "42", SUBMIT, ["node2"], "pc1-42-llm stalled on node2; `id` <x>")
    assert command.reason == "pc1-42-llm stalled on node2; -id- -x-"
    runner().check(command.as_json(), "pc1")


def test_a_stop_is_done_only_when_the_controller_says_so() -> None:
    def outcome(**answer: object) -> tuple[bool, bool]:
        found = slurm_runner.stop_outcome(answer)
        return found.ok, found.held

    assert outcome(result="cancelled", state="CANCELLED") == (True, False)
    assert outcome(result="requeued", state="PENDING", drained=["node2"]) == (True, False)
    assert "node2 drained" in slurm_runner.stop_outcome({"result": "requeued", "drained": ["node2"]}).detail
    assert outcome(result="gone") == (True, False)  # nothing left to stop
    assert outcome(result="other_job", state="RUNNING") == (True, False)
    assert outcome(result="not_running", state="SUSPENDED") == (True, True)  # left alone: not a stall
    # the controller still runs it, refused, or failed: not done (the engine's next decision tries again)
    for result in ("cancel_pending", "scancel_failed", "refused", "not_the_jobs_node", "requeue_failed", ""):
        assert outcome(result=result, state="RUNNING") == (False, False), result


def test_a_reports_answer_is_the_controllers_view() -> None:
    answer = {
        "result": "reported",
        "at": 50.0,
        "jobs": {
            "42": {"state": "SUSPENDED", "submit_time": SUBMIT, "submit_epoch": 1, "restarts": 0, "nodes": ["n1"]}
        },
        "nodes": {"n1": {"state": "ALLOCATED", "reason": ""}},
    }
    view = slurm_runner.View.of_answer(answer)
    assert (view.at, view.jobs["42"].state, view.jobs["42"].nodes, view.nodes["n1"].state) == (
        50.0,
        "SUSPENDED",
        ("n1",),
        "ALLOCATED",
    )
    assert not view.jobs.get("43", slurm_runner.JobView("43")).known
    with pytest.raises(ValueError, match="not a report"):
        slurm_runner.View.of_answer({"result": "pong"})


class _Stop(Exception):
    pass


def test_an_idle_runner_polls_less_often_and_answers_its_next_command_within_one_idle_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a runner asked a command as it starts and none for half an hour, then one more
    script = runner()
    clock, sleeps, waiting, answered = [0.0], [], [0.0, 1800.0], []

    def poll(table: str, cluster: str) -> int:
        if waiting and waiting[0] <= clock[0]:
            answered.append((waiting.pop(0), clock[0]))
            return 1
        return 0

    def sleep(seconds: float) -> None:
        sleeps.append((clock[0], seconds))
        clock[0] += seconds
        if clock[0] > 2400:
            raise _Stop

    monkeypatch.setattr(script, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
    monkeypatch.setattr(script, "settings", lambda: None)
    monkeypatch.setattr(script, "cluster_name", lambda: "c1")
    monkeypatch.setattr(script, "heartbeat", lambda table, cluster: None)
    monkeypatch.setattr(script, "poll", poll)
    monkeypatch.setenv("STALLWATCH_TABLE", "stallwatch-Table-1ABC")
    # When it runs
    with pytest.raises(_Stop):
        script.main([])
    # Then it polls every POLL_S until IDLE_AFTER_S without a command, every IDLE_POLL_S after, and every POLL_S again
    # from the poll that answered the next one, which waited no longer than one idle poll
    assert script.POLL_S < script.IDLE_POLL_S
    idle_from = script.IDLE_AFTER_S
    (_, first), (sent, second) = answered
    assert first == 0.0
    assert sent <= second < sent + script.IDLE_POLL_S
    assert {s for t, s in sleeps if t < idle_from} == {script.POLL_S}
    assert {s for t, s in sleeps if idle_from <= t < second} == {script.IDLE_POLL_S}
    assert {s for t, s in sleeps if t >= second} == {script.POLL_S}
