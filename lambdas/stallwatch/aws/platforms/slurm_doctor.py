"""The Slurm platform's doctor checks (`SlurmPlatform.doctor`): each cluster's runner answers a ping through the table
(the one command path of every flavor), its log group exists, and its clusters' prologs are heard (a running Slurm
job is known).

    for check in slurm_checks(clients, runners, jobs, log_group): print(check)

IAM needed (the doctor's caller): logs:DescribeLogGroups, and dynamodb:Query, PutItem, GetItem and DeleteItem of the
table (the runners' ping).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs
from stallwatch.aws.platforms.slurm_runner import Runners
from stallwatch.core.doctor_checks import Check, Status
from stallwatch.core.platforms import slurm_runner

RUNNER_PING_WAIT_S = 45.0  # a runner polls every 5 s, 20 s while idle; one that has not answered by then is down
RUNNER_PING_POLL_S = 1.0


def slurm_checks(clients: AwsClients, runners: Runners, jobs: SlurmJobs, log_group: str) -> Iterator[Check]:
    """The runners, the log group, and a running job heard of."""
    running = jobs.running()
    yield from slurm_runners(runners, {job.cluster for job in running.values()})
    groups = clients.logs.describe_log_groups(logGroupNamePrefix=log_group)["logGroups"]
    if any(g["logGroupName"] == log_group for g in groups):
        yield Check("Slurm log group", Status.OK, log_group)
    else:
        fix = "deploy the stack again (it creates the group; the nodes' CloudWatch agent never does)"
        yield Check("Slurm log group", Status.FAIL, f"{log_group} does not exist", fix)
    if running:
        yield Check("Slurm job events", Status.OK, f"{len(running)} running job(s) heard of, e.g. {min(running)}")
    else:
        fix = (
            'if jobs run: on the controller, `scontrol show config | grep -E "(Prolog|Epilog)Slurmctld"` names '
            'deploy/slurm/stallwatch-events.sh, and `journalctl -t stallwatch-slurm` holds no "PutEvents failed"'
        )
        yield Check("Slurm job events", Status.WARN, "no running Slurm job was heard of", fix)


def slurm_runners(runners: Runners, running_clusters: set[str]) -> Iterator[Check]:
    """Every cluster known (its runner polled the table, or a job of it runs) is pinged: its runner must answer
    within `RUNNER_PING_WAIT_S`, or no job of it can be stopped."""
    clusters = sorted({r.cluster for r in runners.runners()} | running_clusters)
    fix = (
        "on the cluster's controller or login node: `systemctl status stallwatch-runner` and `journalctl -u "
        "stallwatch-runner` (deploy/slurm/install.sh installs it; its role needs the stack's SlurmControllerPolicyArn)"
    )
    if not clusters:
        yield Check(
            "Slurm runners", Status.WARN, "no cluster's runner ever polled this deployment: no job can be stopped", fix
        )
        return
    for cluster in clusters:
        ref = runners.send(slurm_runner.ping(cluster), time.time())
        deadline = time.monotonic() + RUNNER_PING_WAIT_S
        answer = runners.answer(ref)
        while answer is None and time.monotonic() < deadline:
            time.sleep(RUNNER_PING_POLL_S)
            answer = runners.answer(ref)
        runners.forget(ref)
        if answer is not None and answer.get("result") == slurm_runner.PONG:
            yield Check(f"Slurm runner {cluster}", Status.OK, f"answered from {answer.get('host', '?')}")
        else:
            said = f"answered {answer.get('result')}: {answer.get('detail', '')}" if answer else "did not answer"
            yield Check(
                f"Slurm runner {cluster}",
                Status.FAIL,
                f"{said} within {RUNNER_PING_WAIT_S:.0f} s: no job of it can be stopped",
                fix,
            )
