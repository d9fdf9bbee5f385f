"""A SageMaker HyperPod Slurm cluster's nodes through SageMaker's cluster-node APIs, and its health agent's lines.

HyperPod's instances are SageMaker's, not the account's EC2 instances: a Slurm node (``ip-10-1-4-190``) is found by
its instance's private host name (ListClusterNodes' ``PrivateDnsHostname``, ``ip-10-1-4-190.<region>.compute.
internal``); a node Stallwatch drained is replaced through BatchReplaceClusterNodes (at most 25 instance ids a call;
BatchRebootClusterNodes, its soft sibling, has the same limit and is not used: a node at fault is replaced); the
health-monitoring agent writes to ``SagemakerHealthMonitoringAgent/<group>/<instance-id>`` in the cluster's log group
``/aws/sagemaker/Clusters/<cluster name>/<cluster id>``.

    instances = node_instances(clients, "2hd31rmi9mde")            # node -> (instance id, instance type)
    done = replace_nodes(clients, "2hd31rmi9mde", ["i-0abc..."])   # NodeAction: the ids it took, the refusals
    found = agent_findings(clients, "2hd31rmi9mde", {"i-0abc..."}, since, now)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.api_errors import api_error
from stallwatch.core.platforms.hyperpod import (
    AGENT_MARK,
    AGENT_STREAM_PREFIX,
    HyperPodAction,
    agent_line,
    agent_stream_instance,
)

NODES_PER_CALL = 25  # BatchReplaceClusterNodes NodeIds: 1 to 25
LIST_PAGE = 100  # ListClusterNodes MaxResults
CLUSTER_LOG_GROUPS = "/aws/sagemaker/Clusters/"  # /aws/sagemaker/Clusters/<cluster name>/<cluster id>
ML_PREFIX = "ml."  # HyperPod's instance types are SageMaker's (ml.p5.48xlarge)
AGENT_EVENTS_READ = 1000  # of the agent's detections since an attempt began, at most this many (one page)


@dataclass(frozen=True)
class NodeAction:
    """What SageMaker took of a replacement: the instance ids it took, and those it refused with why."""

    done: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # "<instance id>: <code>: <message>", or the call's error

    @property
    def detail(self) -> str:
        said = [f"{len(self.done)} taken"] if self.done else []
        return "; ".join([*said, *self.failed]) or "nothing to do"


def node_instances(clients: Any, cluster_id: str) -> dict[str, tuple[str, str]]:
    """The cluster's Slurm nodes as SageMaker lists them: node name -> (instance id, instance type without "ml.")."""
    found: dict[str, tuple[str, str]] = {}
    request: dict[str, Any] = {"ClusterName": cluster_id, "MaxResults": LIST_PAGE}
    while True:
        page = clients.sagemaker.list_cluster_nodes(**request)
        for node in page.get("ClusterNodeSummaries", []):
            host = str(node.get("PrivateDnsHostname", "")).split(".", 1)[0]
            if host and node.get("InstanceId"):
                found[host] = (node["InstanceId"], str(node.get("InstanceType", "")).removeprefix(ML_PREFIX))
        if not page.get("NextToken"):
            return found
        request["NextToken"] = page["NextToken"]


def replace_nodes(clients: Any, cluster_id: str, instances: list[str]) -> NodeAction:
    """Replace `instances` of the cluster with new hardware, 25 a call; never raises (the refusals are returned)."""
    done: list[str] = []
    failed: list[str] = []
    for offset in range(0, len(instances), NODES_PER_CALL):
        chunk = instances[offset : offset + NODES_PER_CALL]
        try:
            answer = clients.sagemaker.batch_replace_cluster_nodes(ClusterName=cluster_id, NodeIds=chunk)
        except (ClientError, BotoCoreError) as exc:
            failed.append(f"BatchReplaceClusterNodes {','.join(chunk)}: {api_error(exc)}")
            continue
        done += answer.get("Successful", [])
        failed += [f"{f.get('NodeId')}: {f.get('ErrorCode')}: {f.get('Message', '')}" for f in answer.get("Failed", [])]
    return NodeAction(tuple(done), tuple(failed))


def agent_findings(
    clients: Any, cluster_id: str, instances: set[str], since: float, now: float
) -> list[HyperPodAction]:
    """The health-monitoring agent's detections on `instances` since `since`, oldest first (one page of the
    agent's streams, filtered for its mark); none where the cluster's log group is not found."""
    group = _cluster_group(clients, cluster_id)
    if group is None or not instances:
        return []
    try:
        page = clients.logs.filter_log_events(
            logGroupName=group,
            logStreamNamePrefix=AGENT_STREAM_PREFIX,
            filterPattern=f'"{AGENT_MARK}"',
            startTime=int(since * 1000),
            endTime=int(now * 1000),
            limit=AGENT_EVENTS_READ,
        )
    except clients.logs.exceptions.ResourceNotFoundException:
        return []
    found = []
    for event in page.get("events", []):
        instance = agent_stream_instance(event.get("logStreamName", ""))
        if instance in instances:
            finding = agent_line(event.get("message", ""), instance, event["timestamp"] / 1000)
            if finding is not None:
                found.append(finding)
    return found


def _cluster_group(clients: Any, cluster_id: str) -> str | None:
    paginator = clients.logs.get_paginator("describe_log_groups")
    for page in paginator.paginate(logGroupNamePrefix=CLUSTER_LOG_GROUPS):
        for group in page.get("logGroups", []):
            if group["logGroupName"].endswith(f"/{cluster_id}"):
                return str(group["logGroupName"])
    return None
