"""The Slurm platform's doctor checks (`SlurmPlatform.doctor`): its documents exist, its controllers (tagged
`stallwatch:slurm=controller`) are online in SSM, its log group exists, and its clusters' prologs are heard (a running
Slurm job is known).

    for check in slurm_checks(clients, found, jobs, log_group): print(check)

IAM needed (the doctor's caller): ssm:ListDocuments, ssm:DescribeInstanceInformation, ec2:DescribeInstances,
logs:DescribeLogGroups and dynamodb:Query of the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs
from stallwatch.core.config import SLURM_CANCEL_DOCUMENT_ENV, SLURM_REQUEUE_DOCUMENT_ENV
from stallwatch.core.doctor_checks import Check, StackFound, Status
from stallwatch.core.policy import SLURM_CONTROLLER_TAG, SLURM_CONTROLLER_VALUE

SSM_FILTER_VALUES = 50  # DescribeInstanceInformation: values of its InstanceIds filter


def slurm_checks(clients: AwsClients, found: StackFound, jobs: SlurmJobs, log_group: str) -> Iterator[Check]:
    """The documents, the controllers, the log group, and a running job heard of."""
    yield from _documents(clients, found)
    yield _controllers(clients)
    groups = clients.logs.describe_log_groups(logGroupNamePrefix=log_group)["logGroups"]
    if any(g["logGroupName"] == log_group for g in groups):
        yield Check("Slurm log group", Status.OK, log_group)
    else:
        fix = "deploy the stack again (it creates the group; the nodes' CloudWatch agent never does)"
        yield Check("Slurm log group", Status.FAIL, f"{log_group} does not exist", fix)
    running = jobs.running()
    if running:
        yield Check("Slurm job events", Status.OK, f"{len(running)} running job(s) heard of, e.g. {min(running)}")
    else:
        fix = (
            'if jobs run: on the controller, `scontrol show config | grep -E "(Prolog|Epilog)Slurmctld"` names '
            'deploy/slurm/stallwatch-events.sh, and `journalctl -t stallwatch-slurm` holds no "PutEvents failed"'
        )
        yield Check("Slurm job events", Status.WARN, "no running Slurm job was heard of", fix)


def _documents(clients: AwsClients, found: StackFound) -> Iterator[Check]:
    for variable in (SLURM_CANCEL_DOCUMENT_ENV, SLURM_REQUEUE_DOCUMENT_ENV):
        name = found.env(variable)
        if not name:
            yield Check(f"Slurm document {variable}", Status.FAIL, "the functions name none", found.redeploy)
            continue
        listed = clients.ssm.list_documents(Filters=[{"Key": "Name", "Values": [name]}])["DocumentIdentifiers"]
        if any(d["Name"] == name for d in listed):
            yield Check(f"Slurm document {variable}", Status.OK, name)
        else:
            yield Check(f"Slurm document {variable}", Status.FAIL, f"{name} does not exist", found.redeploy)


def _controllers(clients: Any) -> Check:
    """The instances tagged as Slurm controllers, and whether SSM can reach each (its agent online)."""
    tag = {"Name": f"tag:{SLURM_CONTROLLER_TAG}", "Values": [SLURM_CONTROLLER_VALUE]}
    pages = clients.ec2.get_paginator("describe_instances").paginate(Filters=[tag])
    controllers = sorted(i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"])
    if not controllers:
        fix = f"tag each cluster's controller (or login node) {SLURM_CONTROLLER_TAG}={SLURM_CONTROLLER_VALUE}"
        return Check("Slurm controllers", Status.WARN, "no instance is tagged as one: no job can be stopped", fix)
    online = {
        item["InstanceId"]
        for offset in range(0, len(controllers), SSM_FILTER_VALUES)
        for item in clients.ssm.describe_instance_information(
            Filters=[{"Key": "InstanceIds", "Values": controllers[offset : offset + SSM_FILTER_VALUES]}]
        )["InstanceInformationList"]
        if item.get("PingStatus") == "Online"
    }
    offline = [c for c in controllers if c not in online]
    if offline:
        fix = "start the SSM agent there, and give the instance role AmazonSSMManagedInstanceCore"
        return Check("Slurm controllers", Status.FAIL, f"not online in SSM: {', '.join(offline)}", fix)
    return Check("Slurm controllers", Status.OK, f"{len(controllers)} online in SSM")
