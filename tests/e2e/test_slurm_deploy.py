"""deploy/slurm and the Slurm SSM documents against a real Slurm: the PrologSlurmctld/EpilogSlurmctld script posts one
event per job start and end, and moto's SSM runs the cancel and requeue documents on the controller, as the SSM agent
would; the scripts pass shellcheck as the shell that runs them (sh)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import moto  # imported before any boto3 client is created
import pytest
import yaml

from localrun import moto_ssm
from localrun.resources import DOCUMENTS_DIR, SLURM_CANCEL_DOCUMENT, SLURM_REQUEUE_DOCUMENT, create_documents
from localrun.slurm_daemons import ControllerNode, SlurmDaemons
from localrun.slurm_events import EVENTS_SCRIPT, EventSpool
from stallwatch.aws import ssm
from stallwatch.aws.clients import AwsClients
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms.slurm import slurm_job_name, stream_name
from tests.fixtures.slurm import DEADLINE_S

moto_ssm.install()
pytestmark = pytest.mark.slow
SLURM_DOCUMENTS = ("slurm-cancel.yaml", "slurm-requeue.yaml")
DEFAULTS = "stallwatch:mode=notify stallwatch:idle-minutes=9"
TASK = "sleep 300"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmDaemons, EventSpool]]:
    """A real Slurm whose PrologSlurmctld and EpilogSlurmctld are deploy/slurm's script."""
    root = Path(tmp_path_factory.mktemp("slurm-deploy"))
    events = EventSpool(root / "events", ssm_target="i-0123456789abcdef0", platform="pcs")
    script = events.install(root / "slurm" / "slurm.conf", defaults=DEFAULTS)
    with SlurmDaemons(root / "slurm", cluster="pc-test", prolog=script, epilog=script) as daemons:
        yield daemons, events


@pytest.fixture
def spool(deployed: tuple[SlurmDaemons, EventSpool]) -> tuple[SlurmDaemons, EventSpool]:
    """The module's cluster at rest, whatever the test before left on it (a job still pending, a node drained)."""
    deployed[0].reset(DEADLINE_S)
    return deployed


@pytest.fixture
def controller(spool: tuple[SlurmDaemons, EventSpool], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto, Stallwatch's documents, and the cluster's controller as a managed node; its instance id."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        create_documents(boto3.client("ssm"))
        [instance] = boto3.client("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"]
        moto_ssm.manage(instance["InstanceId"], ControllerNode(spool[0]))
        yield instance["InstanceId"]
        moto_ssm.reset()


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


def _send(controller: str, document: str, **parameters: str) -> dict[str, Any]:
    """The document sent through the control plane's SSM adapter; its one JSON line and exit code."""
    clients = AwsClients()
    sent = ssm.send(clients, document, (controller,), "stallwatch test", 60, parameters)
    assert sent.error == ""
    [answer] = ssm.invocations(clients, sent.command_ids).values()
    return {**json.loads(answer.output.splitlines()[0]), "code": answer.code}


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


def test_the_log_wrapper_writes_one_file_per_job_per_node_which_the_agent_sends_as_one_stream_each(
    spool: tuple[SlurmDaemons, EventSpool], tmp_path: Path
) -> None:
    slurm, _ = spool
    wrapper = EVENTS_SCRIPT.parent / "stallwatch-log.sh"
    env = {"STALLWATCH_SLURM_LOG_DIR": str(tmp_path)}
    job = slurm.sbatch(
        ["--nodes=2", "--wrap", f"srun {wrapper} sh -c 'echo rank $SLURM_PROCID; echo oops >&2'"], env=env
    )
    assert slurm.wait_for(job, {"COMPLETED", "FAILED"}, DEADLINE_S)["JobState"] == "COMPLETED"

    files = {p.name: sorted(p.read_text().splitlines()) for p in tmp_path.glob("*.log")}
    name = slurm_job_name("pc-test", job, "wrap")  # as the agent and the control plane name the job
    assert files == {f"{name}.node1.log": ["oops", "rank 0"], f"{name}.node2.log": ["oops", "rank 1"]}
    config = json.loads((EVENTS_SCRIPT.parent / "cloudwatch-agent.json").read_text())
    [files_config] = config["logs"]["logs_collected"]["files"]["collect_list"]
    assert files_config["file_path"] == "/var/log/stallwatch/slurm/*.log"
    assert files_config["publish_multi_logs"] is True  # one stream per file: <log_stream_name>_<path, / as _>
    assert files_config["log_group_name"] == StallwatchConfig().log_group(
        "slurm"
    )  # under the EC2 group the functions read
    # one prefix for each job's streams, which the control plane reads them by
    streams = {
        f"{files_config['log_stream_name']}_{path.as_posix().replace('/', '_')}"
        for path in [Path(files_config["file_path"]).parent / name for name in files]
    }
    assert streams == {stream_name(name, "node1"), stream_name(name, "node2")}


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


def test_the_cancel_document_cancels_only_the_running_job_it_names(
    spool: tuple[SlurmDaemons, EventSpool], controller: str
) -> None:
    slurm, _ = spool
    job, fields = _run(slurm)

    other = _send(controller, SLURM_CANCEL_DOCUMENT, jobId=job, submitTime="2001-01-01T00:00:00")
    assert (other["result"], other["code"], slurm.job(job)["JobState"]) == ("other_job", 3, "RUNNING")

    done = _send(controller, SLURM_CANCEL_DOCUMENT, jobId=job, submitTime=fields["SubmitTime"])
    assert (done["result"], done["code"]) == ("cancelled", 0)
    assert slurm.wait_for(job, {"CANCELLED"}, DEADLINE_S)["JobState"] == "CANCELLED"


def test_the_cancel_document_leaves_a_pending_or_suspended_job_alone(
    spool: tuple[SlurmDaemons, EventSpool], controller: str
) -> None:
    slurm, _ = spool
    running, fields = _run(slurm)
    slurm.scontrol("suspend", running)
    pending = slurm.sbatch(["--nodes=3", "--wrap", "srun sleep 300"])  # waits for the nodes the first holds
    try:
        suspended = _send(controller, SLURM_CANCEL_DOCUMENT, jobId=running, submitTime=fields["SubmitTime"])
        queued = _send(controller, SLURM_CANCEL_DOCUMENT, jobId=pending, submitTime=slurm.job(pending)["SubmitTime"])
        assert (suspended["result"], suspended["state"], suspended["code"]) == ("not_running", "SUSPENDED", 4)
        assert (queued["result"], queued["state"]) == ("not_running", "PENDING")
        assert slurm.job(running)["JobState"] == "SUSPENDED"
    finally:  # a suspended job cancelled as it is holds its nodes COMPLETING for minutes
        slurm.scontrol("resume", running)
        slurm.command("scancel", running, pending)


def test_the_requeue_document_drains_the_bad_node_and_the_job_runs_again_on_the_others(
    spool: tuple[SlurmDaemons, EventSpool], controller: str
) -> None:
    """...and the epilog says the job ended, the prolog that it started again, its restart counted."""
    slurm, events = spool
    job, fields = _run(slurm)
    _events(events, job, 1)
    bad = slurm.hostnames(fields["NodeList"])[1]
    try:
        done = _send(
            controller, SLURM_REQUEUE_DOCUMENT, jobId=job, submitTime=fields["SubmitTime"], nodes=bad, reason="hang"
        )
        again = slurm.wait_for(job, {"RUNNING"}, DEADLINE_S)

        assert (done["result"], done["drained"], done["code"]) == ("requeued", bad, 0)
        assert again["Restarts"] == "1"
        assert bad not in slurm.hostnames(again["NodeList"])
        assert "DRAIN" in slurm.node_state(bad)
        assert slurm.node(bad)["Reason"].startswith("stallwatch: hang")
        ended, started = _events(events, job, 2)
        assert (ended["detail"]["state"], started["detail"]["state"]) == ("ended", "started")
        assert ended["detail"]["job_state"] == "REQUEUED"
        assert ended["detail"]["submit_time"] == fields["SubmitTime"]  # the attempt that ended; the next has its own
        assert started["detail"]["restarts"] == 1
        assert bad not in [n["name"] for n in started["detail"]["nodes"]]
    finally:
        slurm.command("scancel", job)
        slurm.scontrol("update", f"nodename={bad}", "state=resume")


def test_the_requeue_document_drains_no_node_outside_the_job_and_fails_on_hyperpod_with_its_action(
    spool: tuple[SlurmDaemons, EventSpool], controller: str
) -> None:
    slurm, _ = spool
    job, fields = _run(slurm)
    [spare] = sorted(set(slurm.nodes) - set(slurm.hostnames(fields["NodeList"])))
    bad = slurm.hostnames(fields["NodeList"])[0]
    try:
        outside = _send(
            controller, SLURM_REQUEUE_DOCUMENT, jobId=job, submitTime=fields["SubmitTime"], nodes=spare, reason="x"
        )
        assert (outside["result"], outside["code"]) == ("not_the_jobs_node", 5)
        assert "DRAIN" not in slurm.node_state(spare)

        hyperpod = _send(
            controller,
            SLURM_REQUEUE_DOCUMENT,
            jobId=job,
            submitTime=fields["SubmitTime"],
            nodes=bad,
            reason="hang",
            hyperpodAction="Replace",
        )
        assert hyperpod["result"] == "requeued"
        assert "FAIL" in slurm.node_state(bad)
        assert slurm.node(bad)["Reason"].startswith("Action:Replace")
    finally:
        slurm.command("scancel", job)
        slurm.scontrol("update", f"nodename={bad}", "state=resume")


@pytest.mark.parametrize("filename", SLURM_DOCUMENTS)
def test_the_documents_are_schema_2_2_command_documents_whose_values_cannot_leave_their_quotes(filename: str) -> None:
    document = yaml.safe_load((DOCUMENTS_DIR / filename).read_text())
    assert document["schemaVersion"] == "2.2"
    assert document["description"].startswith("Stallwatch: ")
    [step] = document["mainSteps"]
    assert step["action"] == "aws:runShellScript"
    assert re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", step["name"])
    assert step["precondition"] == {"StringEquals": ["platformType", "Linux"]}
    assert 0 < int(step["inputs"]["timeoutSeconds"]) <= 600
    script = "\n".join(step["inputs"]["runCommand"])
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", script))
    parameters = document["parameters"]
    assert used == set(parameters)
    for name, parameter in parameters.items():
        assert parameter["type"] == "String"
        assert "allowedPattern" in parameter or "allowedValues" in parameter, name
        # SSM writes each value into the script as it is: only inside double quotes, where none may end them
        assert len(re.findall(r"\{\{\s*" + name + r"\s*\}\}", script)) == len(
            re.findall(r'="[^"$`\\]*\{\{\s*' + name + r'\s*\}\}"', script)
        ), name
        for value in ("$(reboot)", "`id`", 'a"b', "a\\b", "a\nb"):
            assert value not in parameter.get("allowedValues", []), (name, value)
            assert not re.search(parameter.get("allowedPattern", "(?!)"), value), (name, value)


@pytest.mark.parametrize("filename", SLURM_DOCUMENTS)
def test_the_documents_scripts_pass_shellcheck_as_sh(filename: str, tmp_path: Path) -> None:
    document = yaml.safe_load((DOCUMENTS_DIR / filename).read_text())
    script = tmp_path / "script.sh"
    script.write_text("\n".join(document["mainSteps"][0]["inputs"]["runCommand"]))
    _shellcheck(script)


@pytest.mark.parametrize("script", sorted(EVENTS_SCRIPT.parent.glob("*.sh")), ids=lambda p: p.name)
def test_deploy_slurms_scripts_pass_shellcheck_as_sh(script: Path) -> None:
    _shellcheck(script)


def _shellcheck(path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found: `make slurm` installs it"
    done = subprocess.run([shellcheck, "-s", "sh", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
