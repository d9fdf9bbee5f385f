"""A small moto extension: a SageMaker HyperPod cluster's nodes as SageMaker lists them, and their replacement.

moto 5.2.5 lists cluster nodes without ``PrivateDnsHostname`` and has no BatchReplaceClusterNodes. After
`install()`, `add_node` puts a node (its instance id and private host name) in a cluster by id, ListClusterNodes
lists those nodes (100 a page at most, as SageMaker), and BatchReplaceClusterNodes keeps what it was asked (`calls`),
refusing more than 25 ids as SageMaker does, and answers each id taken.

    from localrun import moto_hyperpod
    moto_hyperpod.install()
    moto_hyperpod.add_node("2hd31rmi9mde", "workers", "i-0abc...", "ip-10-1-4-190", "ml.p5.48xlarge")
    moto_hyperpod.calls     # [("Replace", "2hd31rmi9mde", ["i-0abc..."])]
"""

from __future__ import annotations

import json
from typing import Any

from moto.core.common_types import TYPE_RESPONSE
from moto.sagemaker.exceptions import ValidationError
from moto.sagemaker.responses import SageMakerResponse

NODES_PER_CALL = 25  # BatchReplaceClusterNodes NodeIds
PAGE_MAX = 100  # ListClusterNodes MaxResults
REGION_DOMAIN = "us-east-1.compute.internal"

nodes: dict[str, list[dict[str, Any]]] = {}  # cluster id -> its nodes' summaries
calls: list[tuple[str, str, list[str]]] = []  # (action, cluster, instance ids), in order


def add_node(cluster: str, group: str, instance: str, host: str, instance_type: str = "ml.p5.48xlarge") -> None:
    """A node of `cluster` (its id): its instance, and its private host name (``ip-10-1-4-190``, the Slurm node)."""
    nodes.setdefault(cluster, []).append(
        {
            "InstanceGroupName": group,
            "InstanceId": instance,
            "InstanceType": instance_type,
            "InstanceStatus": {"Status": "Running"},
            "PrivateDnsHostname": f"{host}.{REGION_DOMAIN}",
        }
    )


def reset() -> None:
    nodes.clear()
    calls.clear()


def _list_cluster_nodes(self: SageMakerResponse) -> TYPE_RESPONSE:
    cluster = self._get_param("ClusterName")
    size = min(int(self._get_param("MaxResults") or PAGE_MAX), PAGE_MAX)
    start = int(self._get_param("NextToken") or 0)
    found = nodes.get(cluster, [])
    page = found[start : start + size]
    token = str(start + size) if start + size < len(found) else None
    body = {"ClusterNodeSummaries": page} | ({"NextToken": token} if token else {})
    return 200, {}, json.dumps(body)


def _batch_replace(self: SageMakerResponse) -> TYPE_RESPONSE:
    cluster = self._get_param("ClusterName")
    ids = list(self._get_param("NodeIds") or [])
    if not 1 <= len(ids) <= NODES_PER_CALL:
        raise ValidationError(message=f"NodeIds: between 1 and {NODES_PER_CALL} instance ids")
    calls.append(("Replace", cluster, ids))
    known = {n["InstanceId"] for n in nodes.get(cluster, [])}
    failed = [
        {"NodeId": i, "ErrorCode": "InstanceIdNotFound", "Message": "no such node"} for i in ids if i not in known
    ]
    return 200, {}, json.dumps({"Successful": [i for i in ids if i in known], "Failed": failed})


def install() -> None:
    """Patch moto (idempotent)."""
    SageMakerResponse.list_cluster_nodes = _list_cluster_nodes  # type: ignore[method-assign,assignment]
    SageMakerResponse.batch_replace_cluster_nodes = _batch_replace  # type: ignore[attr-defined]
