"""The demo as an integration test: `python -m localrun` end to end, as a user runs it, and what it leaves behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.request_limits import recorded_requests

REPO_ROOT = Path(__file__).resolve().parents[2]
# Behaviour, not speed: a busy CI machine may take longer than the demo's own 160 s deadline.
DEMO_DEADLINE_S = 400
RUN_TIMEOUT_S = 480
INTERRUPT_WAIT_S = 60


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), str(REPO_ROOT / "lambdas"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _demo(*args: str, deadline_s: float = DEMO_DEADLINE_S) -> tuple[int, dict[str, Any], str]:
    """Run the demo (its own deadline `deadline_s`); every AWS request it made (the training processes' too) must be
    one AWS would accept."""
    with tempfile.TemporaryDirectory() as requests:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "localrun",
                "--json",
                "--deadline",
                str(deadline_s),
                "--record-requests",
                requests,
                *args,
            ],
            cwd=REPO_ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=deadline_s + RUN_TIMEOUT_S - DEMO_DEADLINE_S,
            check=False,
        )
        # The demo also plays the platforms, publishing their own metrics (AWS/EC2, which no customer may write to):
        # those requests stand for AWS's, not for ones Stallwatch or the agent makes.
        made = [r for r in recorded_requests(Path(requests)) if not r.params.get("Namespace", "").startswith("AWS/")]
    assert {r.operation for r in made} >= {"PutMetricData", "GetMetricData", "PutMetricAlarm"}, done.stderr[-2000:]
    assert sorted({v for r in made for v in r.violations()}) == []
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def _gone(pid: int) -> bool:
    """No process with this pid, and no process left in its group."""
    for probe in (os.kill, os.killpg):
        try:
            probe(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def _port_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _assert_nothing_left(result: dict[str, Any]) -> None:
    assert all(_gone(pid) for pid in result["training_pids"].values()), result["training_pids"]
    assert _port_closed(result["moto_port"])
    assert _port_closed(result["slack_port"])


@pytest.mark.slow
def test_hang_is_stopped_with_a_slack_message_and_nothing_left_behind() -> None:
    # When the default scenario runs (an NCCL-style hang with GPUs at 100 %)
    code, result, log = _demo("--scenario", "hang")
    # Then it passes: the job is Stopped in moto, Slack heard about it, the stop came from a decision; every alarm's
    # transition was read as Stallwatch names its alarms (an error of the run says otherwise)
    assert code == 0, log[-4000:]
    assert result["errors"] == []
    assert result["job_status"] == "Stopped"
    assert result["slack_messages"] >= 1
    assert any(d["action"] == "stop" and d["diagnosis"] == "hang" for d in result["decisions"])
    # ...the timeline showed the rank's stacks, and the stop said where it was
    stacks = r"algo-1: rank 0's stacks \(stall, [0-9.]+ s without a step\): train_gpt\.py:\d+ hang_forever"
    assert re.search(stacks, " ".join(log.split()))  # the view wraps its lines at 120 columns
    stop = next(d for d in result["decisions"] if d["action"] == "stop")
    assert any(re.match(r"1 rank in hang_forever \(train_gpt\.py:\d+\)$", reason) for reason in stop["reasons"])
    assert result["detection_latency_s"] > 0
    assert result["savings"]["saved_gpu_hours"] > 0
    # ...the training exited cleanly on SageMaker's SIGTERM, and no process or port remains
    assert result["training_exit_codes"] == {"algo-1": 0}
    _assert_nothing_left(result)


@pytest.mark.slow
def test_a_hung_2_instance_ec2_cluster_is_stopped_by_one_stop_instances_for_both() -> None:
    # When the hang runs on EC2: two instances tagged with one stallwatch:job, the agent's JobName that tag
    code, result, log = _demo("--scenario", "hang", "--platform", "ec2")
    # Then it passes: one decision stopped both instances with one StopInstances, Slack heard about it
    assert code == 0, log[-4000:]
    assert result["errors"] == []
    assert result["job_status"] == "Stopped"
    [stop] = [d for d in result["decisions"] if d["action"] == "stop"]
    assert (stop["diagnosis"], stop["stopped"]) == ("hang", True)
    assert stop["details"]["stop"]["detail"] == "StopInstances: 2 of 2 instances stopping"
    assert result["slack_messages"] >= 2
    # ...both nodes' training exited on the shutdown's SIGTERM, their alarms went with the job, nothing remains
    hosts = sorted(result["training_exit_codes"])
    assert len(hosts) == 2
    assert all(re.match(r"^i-[0-9a-f]{17}$", host) for host in hosts)
    assert set(result["training_exit_codes"].values()) == {0}
    assert "retired" in log
    _assert_nothing_left(result)


@pytest.mark.slow
def test_checkpoint_within_its_budget_is_not_stopped_and_training_completes() -> None:
    # When a checkpoint outlasts the stall threshold but stays within its declared budget
    code, result, log = _demo("--scenario", "checkpoint")
    # Then nothing is stopped and the training finishes on its own
    assert code == 0, log[-4000:]
    assert result["job_status"] == "Completed"
    assert result["stop_requested_at"] is None
    assert all(d["action"] != "stop" for d in result["decisions"])
    assert result["training_exit_codes"] == {"algo-1": 0}
    _assert_nothing_left(result)


@pytest.mark.slow
def test_resume_restarts_the_hung_job_from_its_checkpoint_and_reports_goodput() -> None:
    # When the hang runs with --resume (the job opts in to one restart and has a CheckpointConfig)
    code, result, log = _demo("--scenario", "hang", "--resume")
    # Then it is stopped, resumed as <job>-r1, which goes on from its checkpoint (step 200) past the hang's step
    assert code == 0, log[-4000:]
    job, resumed = result["job_name"], f"{result['job_name']}-r1"
    assert (result["job_status"], result["resumed_as"], result["resumed_status"]) == ("Stopped", resumed, "Completed")
    assert "algo-1: resumed from checkpoint at step 200" in log
    assert result["follow_ups"][0].endswith(f"`{job}` resumed as `{resumed}` (attempt 1 of 1)")
    passed = re.search(r"step (\d+) reached \d+ (s|min) after the restart", result["follow_ups"][1])
    assert passed is not None, result["follow_ups"]
    assert 250 < int(passed.group(1)) <= 350  # past the step the hang stopped at
    # ...and the report counts one run: the stall, the restart, the 50 steps trained again
    goodput = result["goodput"]
    assert (goodput["jobs"], goodput["stalls_caught"], goodput["restarts"]) == ([job, resumed], 1, 1)
    assert (goodput["final_step"], goodput["redone_steps"]) == (350, 50)
    assert goodput["categories"]["stalls"]["seconds"] > 0
    assert sum(c["seconds"] for c in goodput["categories"].values()) == pytest.approx(goodput["wall_s"])
    assert "Goodput of run" in log
    assert result["training_exit_codes"] == {f"{job}/algo-1": 0, f"{resumed}/algo-1": 0}
    _assert_nothing_left(result)


@pytest.mark.slow
def test_recover_restart_health_checks_the_hung_cluster_and_restarts_it_in_place_past_its_checkpoint() -> None:
    # When the hang runs on 2 EC2 nodes tagged stallwatch:recover=restart
    code, result, log = _demo("--platform", "ec2", "--scenario", "hang", "--recover", "restart")
    # Then it passes: the stop decision sent the health check instead of a StopInstances, both nodes passed, their
    # training restarted in place (systemctl, over SSM) from the checkpoint at step 200, past it, and completed
    assert code == 0, log[-4000:]
    assert result["job_status"] == "Completed"
    assert result["stop_requested_at"] is None
    assert result["taken_out"] == []
    assert result["restarted_in_place"] == sorted(result["training_exit_codes"])
    [stop] = [d for d in result["decisions"] if d["action"] == "stop"]
    assert stop["details"]["recovery"]["status"] == "checking"
    assert "stopped" not in stop
    assert "2 of 2 nodes passed the health check" in result["follow_ups"][1]
    first = re.search(r"training again after the restart in place: step (\d+) within", result["follow_ups"][2])
    assert first is not None, result["follow_ups"]
    assert 200 < int(first.group(1)) <= 350
    assert log.count("resumed from checkpoint at step 200") == 2
    # ...the goodput report counts the restart in place as the run's second attempt, without a gap
    goodput = result["goodput"]
    assert (goodput["restarts"], goodput["stalls_caught"], goodput["final_step"]) == (1, 1, 350)
    assert goodput["categories"]["restart_gaps"]["seconds"] == 0
    _assert_nothing_left(result)


@pytest.mark.slow
def test_recover_restart_takes_out_the_node_with_an_xid_and_restarts_on_the_others() -> None:
    # When the hang runs on 2 EC2 nodes that may train on 1, the second one's kernel having logged Xid 79
    code, result, log = _demo("--platform", "ec2", "--scenario", "xid", "--recover", "restart")
    # Then it passes: that node alone is stopped, Slack names it and its Xid, the other restarts in place
    assert code == 0, log[-4000:]
    [bad] = result["taken_out"]
    [restarted] = result["restarted_in_place"]
    assert restarted != bad
    assert result["stop_requested_at"] is None
    assert result["job_status"] == "Completed"
    taken_out = next(text for text in result["follow_ups"] if "failed its health check" in text)
    assert f"{bad} failed its health check (Xid 79: GPU has fallen off the bus)" in taken_out
    assert f"stopped {bad}" in taken_out
    assert f"{bad}: StopInstances seen: SIGTERM to its training (the job runs on)" in log
    _assert_nothing_left(result)


def _start_demo_until_training() -> tuple[subprocess.Popen[str], int, int, str]:
    """A running default demo, once its training process has started: (demo, training pid, moto port, output)."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "localrun", "--scenario", "hang"],
        cwd=REPO_ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    seen = ""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while "training started" not in seen and time.monotonic() < deadline:
        line = demo.stdout.readline()
        if not line:
            break
        seen += line
    moto_port = re.search(r"moto server on http://127\.0\.0\.1:(\d+)", seen)
    training = re.search(r"training started \(pid (\d+)\)", seen)
    assert moto_port is not None, seen
    assert training is not None, seen
    return demo, int(training.group(1)), int(moto_port.group(1)), seen


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _gone(pid)


@pytest.mark.slow
def test_ctrl_c_stops_everything_it_started() -> None:
    # Given a running demo whose training process has started
    demo, training_pid, moto_port, seen = _start_demo_until_training()
    # When the user presses Ctrl-C
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=INTERRUPT_WAIT_S)
    # Then it exits with 130 and leaves no process and no open port
    assert demo.returncode == 130, seen + rest
    assert _gone(training_pid)
    assert _port_closed(moto_port)


@pytest.mark.slow
def test_a_killed_demo_takes_its_training_with_it() -> None:
    # Given a running demo whose training process has started
    demo, training_pid, moto_port, _ = _start_demo_until_training()
    # When the demo is killed outright (no cleanup can run)
    demo.kill()
    demo.communicate(timeout=INTERRUPT_WAIT_S)
    # Then its training process dies with it, and the server's port is free
    assert _wait_gone(training_pid, INTERRUPT_WAIT_S)
    assert _port_closed(moto_port)
