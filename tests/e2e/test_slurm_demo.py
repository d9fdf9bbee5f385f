"""The Slurm demo as an integration test: `python -m localrun --platform slurm` against the real daemons (`make slurm`),
a real sbatch'd 2-node torch job with the agent on each node, the real handlers on moto, and moto's SSM running
Stallwatch's documents on this Slurm."""

from __future__ import annotations

import pytest

from tests.e2e.test_demo import _assert_nothing_left, _demo

pytestmark = pytest.mark.slow
# Behaviour, not speed: a real Slurm, torch on each node and the handlers on a busy two-core CI machine take minutes
# (about 2 here, quiet); only a run gone wrong reaches this.
DEADLINE_S = 900


def test_a_hung_slurm_job_is_cancelled_on_the_controller_and_nothing_is_left_behind() -> None:
    # When the hang runs as a 2-node Slurm job
    code, result, log = _demo("--platform", "slurm", "--scenario", "hang", deadline_s=DEADLINE_S)
    # Then a decision sent the cancel document, and the job ended CANCELLED
    assert code == 0, log[-4000:]
    assert result["job_status"] == "CANCELLED"
    [stop] = [d for d in result["decisions"] if d["action"] == "stop"]
    assert stop["diagnosis"] == "hang"
    assert stop["details"]["stop"]["detail"].startswith("scancel of Slurm job ")
    assert "retired" in log  # the epilog's event retired its alarms
    assert result["taken_out"] == []  # no node drained
    assert len(result["training_pids"]) == 2  # one task per node
    _assert_nothing_left(result)


def test_requeue_runs_the_crashed_job_again_from_its_checkpoint_and_drains_no_node_for_its_error() -> None:
    # When rank 1 (node2) dies of a CUDA error while rank 0 spins, in a job tagged stallwatch:recover=requeue
    code, result, log = _demo(
        "--platform", "slurm", "--scenario", "crash", "--recover", "requeue", deadline_s=DEADLINE_S
    )
    # Then the job was requeued, run again from its checkpoint past it, and completed; no node was drained, for a
    # rank's application error blames no node; the controller's answer reached Slack
    assert code == 0, log[-4000:]
    assert result["job_status"] == "COMPLETED"
    assert result["taken_out"] == []
    [stop] = [d for d in result["decisions"] if d["action"] == "stop"]
    assert stop["diagnosis"] == "crashed_rank"
    assert "requeue of Slurm job" in stop["details"]["stop"]["detail"]
    assert stop["details"]["recovery"]["drained"] == []
    assert any("requeued" in text for text in result["follow_ups"])
    goodput = result["goodput"]
    assert goodput["restarts"] == 1
    assert goodput["stalls_caught"] == 1
    assert goodput["final_step"] >= 350
    assert len(result["training_pids"]) == 4  # two tasks, twice
    _assert_nothing_left(result)
