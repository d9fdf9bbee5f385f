"""The instances behind a Slurm job's nodes, by node name (`SlurmPlatform.job_change`, at the job's start): on
HyperPod, SageMaker's list of the cluster's nodes; on ParallelCluster and PCS, the EC2 instances with the nodes'
addresses in the controller's own VPC (two clusters in VPCs of the same range never cross).

    found = node_instances(clients, job)     # {node: (instance id, instance type)}; {} where none is known
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.observability import logger
from stallwatch.aws.platforms import hyperpod_nodes
from stallwatch.core.platforms.slurm import HYPERPOD, SlurmJob, controller_instance, hyperpod_cluster

FILTER_VALUES_LIMIT = 200  # DescribeInstances: filter values of one call, all filters' together (FilterLimitExceeded)
MAPPED_STATES = ["pending", "running"]


def node_instances(clients: AwsClients, job: SlurmJob) -> dict[str, tuple[str, str]]:
    """The job's nodes' instances; none where neither is known, or the call is refused (the agent's metrics stand
    in)."""
    try:
        cluster = hyperpod_cluster(job.ssm_target)
        if job.flavor == HYPERPOD or cluster is not None:
            if cluster is None:
                return {}
            names = {n.name for n in job.nodes}
            return {n: found for n, found in hyperpod_nodes.node_instances(clients, cluster).items() if n in names}
        return _vpc_instances(clients, job)
    except (ClientError, BotoCoreError) as exc:
        logger.warning("could not map the Slurm nodes to instances", extra={"job": job.job_name, "error": str(exc)})
        return {}


def _vpc_instances(clients: AwsClients, job: SlurmJob) -> dict[str, tuple[str, str]]:
    controller = controller_instance(job.ssm_target)
    addrs = sorted({n.addr for n in job.nodes if n.addr})
    if controller is None or not addrs:
        return {}
    ec2 = clients.ec2
    reservations = ec2.describe_instances(InstanceIds=[controller])["Reservations"]
    vpc = next((i.get("VpcId") for r in reservations for i in r["Instances"] if i.get("VpcId")), None)
    if vpc is None:
        return {}
    by_addr: dict[str, tuple[str, str]] = {}
    chunk = FILTER_VALUES_LIMIT - len(MAPPED_STATES) - 1
    for offset in range(0, len(addrs), chunk):
        filters = [
            {"Name": "private-ip-address", "Values": addrs[offset : offset + chunk]},
            {"Name": "instance-state-name", "Values": MAPPED_STATES},
            {"Name": "vpc-id", "Values": [vpc]},
        ]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    address = instance.get("PrivateIpAddress", "")
                    by_addr[address] = (instance["InstanceId"], instance["InstanceType"])
    return {n.name: by_addr[n.addr] for n in job.nodes if n.addr in by_addr}
