"""deploy/slurm against a real Slurm: the PrologSlurmctld/EpilogSlurmctld script posts one event per job start and
end, each node's Prolog makes the job's log file the job's user's alone, and the cluster's runner
(deploy/slurm/stallwatch-runner, polling the table of a local AWS through the AWS CLI) runs only the commands meant
for this cluster and job, and answers once the controller says it is done; the scripts pass shellcheck as the shell
that runs them (sh)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.local_aws import LocalAws
from localrun.resources import create_table
from localrun.slurm_daemons import SlurmDaemons
from localrun.slurm_events import EVENTS_SCRIPT, EventSpool
from localrun.slurm_runner import POLL_S, RunnerProcess, aws_cli
from stallwatch.aws.platforms import slurm_doctor
from stallwatch.aws.platforms.slurm_runner import Runners
from stallwatch.aws.store import Store
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.doctor_checks import Status
from stallwatch.core.platforms import slurm_runner
from stallwatch.core.platforms.slurm import log_key, stream_name
from tests.fixtures.slurm import DEADLINE_S

pytestmark = pytest.mark.slow
CLUSTER = "pc-test"
DEFAULTS = "stallwatch:mode=notify stallwatch:idle-minutes=9"
TASK = "sleep 300"
TABLE = "stallwatch-slurm-test"
NOBODY = 65534
INSTANCE = "i-0123456789abcdef0"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmDaemons, EventSpool, Runners]]:
    """A real Slurm whose PrologSlurmctld and EpilogSlurmctld are deploy/slurm's events script and each node's Prolog
    its prolog (the log files in a folder of their own, under one all may enter), and its runner polling the table
    of a local AWS."""
    root = Path(tmp_path_factory.mktemp("slurm-deploy"))
    logs = Path(tempfile.mkdtemp(prefix="swlogs-")) / "slurm"
    logs.parent.chmod(0o755)
    events = EventSpool(root / "events", ssm_target=INSTANCE, platform="pcs", log_dir=logs)
    script = events.install(root / "slurm" / "slurm.conf", defaults=DEFAULTS)
    with LocalAws() as aws:
        create_table(aws.client("dynamodb"), TABLE)
        runners = Runners(Store(aws.client("dynamodb"), TABLE, 1))
        daemons = SlurmDaemons(
            root / "slurm", cluster=CLUSTER, prolog=script, epilog=script, node_prolog=events.node_prolog
        )
        with daemons, RunnerProcess(daemons, aws.env, TABLE):
            yield daemons, events, runners
    shutil.rmtree(logs.parent, ignore_errors=True)


@pytest.fixture
def spool(deployed: tuple[SlurmDaemons, EventSpool, Runners]) -> tuple[SlurmDaemons, EventSpool]:
    """The module's cluster at rest, whatever the test before left on it (a job still pending, a node drained)."""
    deployed[0].reset(DEADLINE_S)
    return deployed[0], deployed[1]


@pytest.fixture
def runners(deployed: tuple[SlurmDaemons, EventSpool, Runners]) -> Runners:
    return deployed[2]


def _ask(runners: Runners, command: slurm_runner.Command) -> dict[str, Any]:
    """The command queued for the runner (as the control plane queues it); its answer, once the runner gave it."""
    ref = runners.send(command, time.time())
    deadline = time.monotonic() + DEADLINE_S
    while (answer := runners.answer(ref)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert answer is not None, f"the runner did not answer {command.kind}"
    return answer


def _run(slurm: SlurmDaemons, *args: str) -> tuple[str, dict[str, str]]:
    """A 2-node job running with its task started on each node (one suspended or requeued while srun still launches
    them holds a node COMPLETING for a MessageTimeout)."""
    job = slurm.sbatch(["--nodes=2", *args, "--wrap", f"srun {TASK}"])
    fields = slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)
    slurm.wait_for_tasks(TASK, 2, DEADLINE_S)
    return job, fields


def _events(events: EventSpool, job: str, count: int) -> list[dict[str, Any]]:
    """The job's next `count` events (an earlier job's that come meanwhile are dropped)."""
    found = events.wait(count, DEADLINE_S, keep=lambda e: e["detail"]["job_id"] == job)
    assert len(found) == count, found
    return found


def test_the_prolog_posts_the_jobs_start_and_the_epilog_its_end(spool: tuple[SlurmDaemons, EventSpool]) -> None:
    slurm, events = spool
    job, fields = _run(
        slurm, '--job-name=llm "7b"', "--comment=see ticket 12; stallwatch:mode=enforce,stallwatch:stall-minutes=20"
    )

    [started] = _events(events, job, 1)
    slurm.command("scancel", job)
    slurm.wait_for(job, {"CANCELLED"}, DEADLINE_S)
    [ended] = _events(events, job, 1)

    assert started["source"] == "stallwatch.slurm"
    assert started["detail-type"] == "Slurm Job State Change"
    detail = started["detail"]
    assert detail["state"] == "started"
    assert (detail["cluster"], detail["platform"], detail["ssm_target"]) == ("pc-test", "pcs", "i-0123456789abcdef0")
    assert (detail["name"], detail["user"], detail["partition"]) == ('llm "7b"', "root", "train")
    assert detail["submit_time"] == fields["SubmitTime"]
    assert detail["submit_epoch"] > 0
    assert [n["name"] for n in detail["nodes"]] == slurm.hostnames(fields["NodeList"])
    assert [n["addr"] for n in detail["nodes"]] == [slurm.address(n["name"]) for n in detail["nodes"]]
    # the job's words win over the cluster's defaults; other words of the comment are left alone
    assert detail["settings"] == {
        "stallwatch:mode": "enforce",
        "stallwatch:idle-minutes": "9",
        "stallwatch:stall-minutes": "20",
    }
    assert [n["gpus"] for n in detail["nodes"]] == [0, 0]  # no Gres here; gpu:h100:8 would say 8
    assert ended["detail"]["state"] == "ended"
    assert ended["detail"]["submit_time"] == detail["submit_time"]
    # read once the epilog has returned: while it runs, every job is COMPLETING
    assert ended["detail"]["job_state"] == "CANCELLED"


def test_the_end_event_says_how_the_job_ended(spool: tuple[SlurmDaemons, EventSpool]) -> None:
    slurm, events = spool
    jobs = {slurm.sbatch(["--wrap", command]): command for command in ("true", "false")}
    for job in jobs:
        slurm.wait_for(job, {"COMPLETED", "FAILED"}, DEADLINE_S)
    ends = events.wait(2, DEADLINE_S, keep=lambda e: e["detail"]["job_id"] in jobs and e["detail"]["state"] == "ended")
    ended = {e["detail"]["job_id"]: e["detail"] for e in ends}

    assert {jobs[job]: (d["job_state"], d["reason"], d["exit_code"]) for job, d in ended.items()} == {
        "true": ("COMPLETED", "None", "0:0"),
        "false": ("FAILED", "NonZeroExitCode", "1:0"),
    }


def test_each_nodes_log_file_is_the_jobs_users_alone_and_the_agent_sends_it_as_the_instances_stream(
    spool: tuple[SlurmDaemons, EventSpool],
) -> None:
    # Given a 2-node job whose tasks write through the log wrapper
    slurm, events = spool
    command = f"srun {events.log_wrapper} sh -c 'echo rank $SLURM_PROCID; echo oops >&2'"
    job = slurm.sbatch(["--nodes=2", "--wrap", command])
    assert slurm.wait_for(job, {"COMPLETED", "FAILED"}, DEADLINE_S)["JobState"] == "COMPLETED"

    # Then each node's Prolog made the job's file in a folder only root may write, the file the job user's alone
    key = log_key(CLUSTER, job)
    folder = events.log_dir
    assert (folder.stat().st_uid, stat.S_IMODE(folder.stat().st_mode)) == (0, 0o755)
    files = {p.name: p for p in folder.glob(f"{key}.*.log")}
    assert sorted(files) == [f"{key}.node1.log", f"{key}.node2.log"]
    for path in files.values():
        assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (os.getuid(), 0o640)  # the job's user
    assert sorted(files[f"{key}.node2.log"].read_text().splitlines()) == ["oops", "rank 1"]
    # And the agent sends each as the stream named by its instance, the one the control plane reads the node from
    config = json.loads((EVENTS_SCRIPT.parent / "cloudwatch-agent.json").read_text())
    [files_config] = config["logs"]["logs_collected"]["files"]["collect_list"]
    assert files_config["file_path"] == "/var/log/stallwatch/slurm/*.log"
    assert files_config["publish_multi_logs"] is True  # one stream per file: <log_stream_name>_<path, / as _>
    assert files_config["log_group_name"] == StallwatchConfig().log_group("slurm")  # under the EC2 group
    stream = files_config["log_stream_name"].replace("{instance_id}", INSTANCE)
    shipped = f"{stream}_{(Path(files_config['file_path']).parent / f'{key}.node2.log').as_posix().replace('/', '_')}"
    assert shipped == stream_name(INSTANCE, key, "node2")


def test_another_user_of_the_node_can_neither_write_a_jobs_log_nor_make_one(
    spool: tuple[SlurmDaemons, EventSpool],
) -> None:
    # Given a job's log file, made by the real Prolog
    slurm, events = spool
    job = slurm.sbatch(["--wrap", f"srun {events.log_wrapper} true"])
    slurm.wait_for(job, {"COMPLETED", "FAILED"}, DEADLINE_S)
    [own] = events.log_dir.glob(f"{log_key(CLUSTER, job)}.*.log")
    forged = events.log_dir / f"{log_key(CLUSTER, str(int(job) + 1))}.node1.log"

    # When another user of the node writes a line into it, and makes the next job's file ahead of its Prolog
    def as_nobody(script: str) -> int:
        return subprocess.run(["sh", "-c", script], user=NOBODY, capture_output=True, check=False).returncode

    wrote = as_nobody(f"echo 'RuntimeError: CUDA error: forged' >> {own}")
    made = as_nobody(f"echo forged > {forged}")

    # Then neither happened
    assert wrote != 0
    assert made != 0
    assert "forged" not in own.read_text()
    assert not forged.exists()


def test_the_prolog_gives_a_file_left_by_an_earlier_job_to_this_jobs_user_and_never_follows_a_link(
    spool: tuple[SlurmDaemons, EventSpool], tmp_path: Path
) -> None:
    # Given a file of this id left by an earlier job, and a link planted where another node's file goes
    _, events = spool
    events.log_dir.mkdir(parents=True, exist_ok=True)
    left = events.log_dir / f"{log_key(CLUSTER, '999')}.node1.log"
    left.write_text("an earlier job's line\n")
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = events.log_dir / f"{log_key(CLUSTER, '999')}.node2.log"
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    env = {
        "SLURM_JOB_ID": "999",
        "SLURM_JOB_UID": str(NOBODY),
        "SLURM_CLUSTER_NAME": CLUSTER,
        "PATH": "/usr/bin:/bin",
    }

    # When the Prolog runs for job 999 on both nodes (as slurmd runs it, as root)
    for node in ("node1", "node2"):
        done = subprocess.run([str(events.node_prolog)], env=env | {"SLURMD_NODENAME": node}, check=False)
        assert done.returncode == 0

    # Then both files are the job's user's (0640), the link replaced by a file and its target untouched
    for path in (left, link):
        assert not path.is_symlink()
        assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (NOBODY, 0o640)
    assert (target.stat().st_uid, target.read_text()) == (os.getuid(), "")


def test_the_script_never_fails_the_job_when_aws_is_unreachable(tmp_path: Path) -> None:
    events = EventSpool(tmp_path / "events", ssm_target="i-0123456789abcdef0", failing=True)
    script = events.install(tmp_path / "slurm" / "slurm.conf")
    with SlurmDaemons(tmp_path / "slurm", nodes=1, prolog=script, epilog=script) as slurm:
        job = slurm.sbatch(["--wrap", "true"])
        assert slurm.wait_for(job, {"COMPLETED", "FAILED"}, DEADLINE_S)["JobState"] == "COMPLETED"
    assert events.take() == []


def test_the_script_run_by_hand_posts_nothing_and_exits_0(tmp_path: Path) -> None:
    events = EventSpool(tmp_path / "events", ssm_target="i-0123456789abcdef0")
    script = events.install(tmp_path / "slurm.conf")
    for env in ({}, {"SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "SLURM_JOB_ID": "1;reboot"}):
        done = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0
    assert events.take() == []


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("pyenv", [True, False])
def test_the_local_runner_calls_the_aws_cli_past_pyenvs_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pyenv: bool
) -> None:
    real = _executable(tmp_path / "versions" / "3.11.7" / "bin" / "aws", "exit 0")
    shim = _executable(tmp_path / "shims" / "aws", 'exec pyenv exec aws "$@"')
    path = [shim.parent] + ([_executable(tmp_path / "bin" / "pyenv", f'echo "{real}"').parent] if pyenv else [])
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, path)))
    aws_cli.cache_clear()
    try:
        assert aws_cli() == (real if pyenv else shim)
    finally:
        aws_cli.cache_clear()


def test_the_runner_cancels_only_the_running_job_of_its_cluster_it_names_and_answers_once_slurm_has(
    spool: tuple[SlurmDaemons, EventSpool], runners: Runners
) -> None:
    slurm, _ = spool
    job, fields = _run(slurm)

    other = _ask(runners, slurm_runner.cancel(CLUSTER, job, "2001-01-01T00:00:00"))
    assert (other["result"], slurm.job(job)["JobState"]) == ("other_job", "RUNNING")
    elsewhere = runners.send(slurm_runner.cancel("another-cluster", job, fields["SubmitTime"]), time.time())

    done = _ask(runners, slurm_runner.cancel(CLUSTER, job, fields["SubmitTime"]))
    assert done["result"] == "cancelled"
    assert done["state"] in ("CANCELLED", "COMPLETING")  # what the controller said when it answered: not RUNNING
    assert slurm.wait_for(job, {"CANCELLED"}, DEADLINE_S)["JobState"] == "CANCELLED"
    assert runners.answer(elsewhere) is None  # another cluster's command is never this runner's to answer


def test_the_doctor_passes_a_cluster_whose_runner_answers_and_fails_one_whose_runner_does_not(
    runners: Runners, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given this cluster's runner polling the table, and a cluster with a running job whose runner is down
    monkeypatch.setattr(slurm_doctor, "RUNNER_PING_WAIT_S", 2 * POLL_S + 5.0)  # two of the runner's polls, and its CLI
    monkeypatch.setattr(slurm_doctor, "RUNNER_PING_POLL_S", 0.2)
    deadline = time.monotonic() + DEADLINE_S  # a busy machine: the runner may first poll after the test began
    while CLUSTER not in {r.cluster for r in runners.runners()} and time.monotonic() < deadline:
        time.sleep(0.5)
    # When the doctor pings each cluster's runner through the table
    checks = {c.name: c for c in slurm_doctor.slurm_runners(runners, {"hp-down"})}
    # Then the real runner answered from this host, and the silent one fails the doctor: no job of it can be stopped
    assert checks[f"Slurm runner {CLUSTER}"].status is Status.OK
    assert checks[f"Slurm runner {CLUSTER}"].detail == f"answered from {socket.gethostname()}"
    assert checks["Slurm runner hp-down"].status is Status.FAIL
    assert "did not answer" in checks["Slurm runner hp-down"].detail


def test_the_runner_leaves_a_pending_or_suspended_job_alone(
    spool: tuple[SlurmDaemons, EventSpool], runners: Runners
) -> None:
    slurm, _ = spool
    running, fields = _run(slurm)
    slurm.scontrol("suspend", running)
    pending = slurm.sbatch(["--nodes=3", "--wrap", "srun sleep 300"])  # waits for the nodes the first holds
    try:
        suspended = _ask(runners, slurm_runner.cancel(CLUSTER, running, fields["SubmitTime"]))
        queued = _ask(runners, slurm_runner.cancel(CLUSTER, pending, slurm.job(pending)["SubmitTime"]))
        assert (suspended["result"], suspended["state"]) == ("not_running", "SUSPENDED")
        assert (queued["result"], queued["state"]) == ("not_running", "PENDING")
        assert slurm.job(running)["JobState"] == "SUSPENDED"
        view = _ask(runners, slurm_runner.report(CLUSTER, [(running, fields["SubmitTime"])]))
        assert view["jobs"][running]["state"] == "SUSPENDED"  # the controller's view the sweeper reconciles with
    finally:  # a suspended job cancelled as it is holds its nodes COMPLETING for minutes
        slurm.scontrol("resume", running)
        slurm.command("scancel", running, pending)


def test_the_runner_drains_the_bad_node_and_the_job_runs_again_on_the_others(
    spool: tuple[SlurmDaemons, EventSpool], runners: Runners
) -> None:
    """...and the epilog says the attempt ended (naming it by its own submit time), the prolog that the next started."""
    slurm, events = spool
    job, fields = _run(slurm)
    _events(events, job, 1)
    bad = slurm.hostnames(fields["NodeList"])[1]
    try:
        done = _ask(runners, slurm_runner.requeue(CLUSTER, job, fields["SubmitTime"], [bad], "hang"))
        again = slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)

        assert (done["result"], done["drained"]) == ("requeued", [bad])
        assert again["Restarts"] == "1"
        assert bad not in slurm.hostnames(again["NodeList"])
        assert "DRAIN" in slurm.node_state(bad)
        assert slurm.node(bad)["Reason"].startswith("stallwatch: hang")
        ended, started = _events(events, job, 2)
        assert (ended["detail"]["state"], started["detail"]["state"]) == ("ended", "started")
        assert ended["detail"]["job_state"] == "REQUEUED"
        assert ended["detail"]["submit_time"] == fields["SubmitTime"]  # the attempt that ended; the next has its own
        assert ended["detail"]["restarts"] == 0
        assert started["detail"]["restarts"] == 1
        assert started["detail"]["submit_time"] != fields["SubmitTime"]
        assert bad not in [n["name"] for n in started["detail"]["nodes"]]
        # And the runner puts back in service only the node Stallwatch drained
        back = _ask(runners, slurm_runner.Command(slurm_runner.RESUME, CLUSTER, nodes=(bad,)))
        assert (back["result"], back["resumed"]) == ("resumed", [bad])
    finally:
        slurm.command("scancel", job)
        slurm.command("scontrol", "update", f"nodename={bad}", "state=resume", check=False)


def test_the_runner_drains_no_node_outside_the_job_and_names_nodes_only_as_they_are(
    spool: tuple[SlurmDaemons, EventSpool], runners: Runners
) -> None:
    slurm, _ = spool
    job, fields = _run(slurm)
    [spare] = sorted(set(slurm.nodes) - set(slurm.hostnames(fields["NodeList"])))
    try:
        outside = _ask(runners, slurm_runner.requeue(CLUSTER, job, fields["SubmitTime"], [spare], "x"))
        assert (outside["result"], outside["detail"]) == ("not_the_jobs_node", spare)
        pattern = _ask(runners, slurm_runner.requeue(CLUSTER, job, fields["SubmitTime"], ["node."], "x"))
        assert pattern["result"] == "not_the_jobs_node"  # a node name is a string, never a pattern (grep: node1)
        assert not any(word in slurm.node_state(n) for n in slurm.nodes for word in ("DRAIN", "FAIL"))
        assert slurm.job(job)["JobState"] == "RUNNING"
        someone = "someone else's maintenance"
        slurm.scontrol("update", f"nodename={spare}", "state=drain", f"reason={someone}")
        kept = _ask(runners, slurm_runner.Command(slurm_runner.RESUME, CLUSTER, nodes=(spare,)))
        assert (kept["result"], kept["resumed"]) == ("resumed", [])  # not Stallwatch's to put back
        assert "DRAIN" in slurm.node_state(spare)
    finally:
        slurm.command("scancel", job)
        slurm.command("scontrol", "update", f"nodename={spare}", "state=resume", check=False)


def test_a_job_requeued_after_its_node_failed_is_ended_by_its_own_submit_time_and_started_again(
    spool: tuple[SlurmDaemons, EventSpool],
) -> None:
    # Given a running job whose events were heard
    slurm, events = spool
    job, fields = _run(slurm)
    [started] = _events(events, job, 1)
    node = slurm.hostnames(fields["NodeList"])[1]
    try:
        # When one of its nodes fails (Slurm requeues the job: NODE_FAIL) and comes back
        slurm.scontrol("update", f"nodename={node}", "state=down", "reason=failed")
        again = slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)
        ended, restarted = _events(events, job, 2)
        # Then the end names the attempt that ran (its own submit time, its restart count), not the next one (which
        # the control plane would then refuse to start as a duplicate), and the next start is its own attempt
        assert (ended["detail"]["state"], ended["detail"]["job_state"]) == ("ended", "REQUEUED")
        assert ended["detail"]["submit_time"] == started["detail"]["submit_time"]
        assert ended["detail"]["restarts"] == 0
        assert (restarted["detail"]["state"], restarted["detail"]["restarts"]) == ("started", 1)
        assert restarted["detail"]["submit_time"] == again["SubmitTime"] != fields["SubmitTime"]
    finally:
        slurm.command("scancel", job)
        slurm.command("scontrol", "update", f"nodename={node}", "state=resume", check=False)


@pytest.mark.parametrize("script", sorted(EVENTS_SCRIPT.parent.glob("*.sh")), ids=lambda p: p.name)
def test_deploy_slurms_scripts_pass_shellcheck_as_sh(script: Path) -> None:
    _shellcheck(script)


def _shellcheck(path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found: `make slurm` installs it"
    done = subprocess.run([shellcheck, "-s", "sh", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
