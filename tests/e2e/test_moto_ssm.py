"""The moto extensions recovery in place relies on: SSM Run Command running Stallwatch's documents on simulated GPU
nodes (the documents' own scripts, the nodes' tools answering as real ones), ListCommandInvocations, and an Auto
Scaling group replacing an instance marked unhealthy; and the SSM adapter's requests, as SSM takes them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import moto  # imported before any boto3 client is created
import pytest
from botocore.exceptions import ClientError

from localrun import moto_autoscaling, moto_ssm
from localrun.gpu_node import Agent, GpuNode, NodeFault, NodeState, xid_line
from localrun.resources import HEALTH_CHECK_DOCUMENT, RESTART_DOCUMENT, create_documents
from stallwatch.aws import ssm
from stallwatch.aws.clients import AwsClients
from stallwatch.core import command_answers
from stallwatch.core.platforms import ec2_recovery as recovery

moto_ssm.install()
moto_autoscaling.install()
AMI = "ami-12c6146b"


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto for every test; the credentials and region are tests/conftest.py's."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        create_documents(boto3.client("ssm"))
        yield
        moto_ssm.reset()


def _instances(count: int, tags: dict[str, str] | None = None, instance_type: str = "p4d.24xlarge") -> list[str]:
    response = boto3.client("ec2").run_instances(
        ImageId=AMI,
        InstanceType=instance_type,
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in (tags or {"a": "b"}).items()]}
        ],
    )
    return sorted(i["InstanceId"] for i in response["Instances"])


def _managed(tmp_path: Path, faults: list[NodeFault] | None = None, **state: Any) -> dict[str, GpuNode]:
    """Managed nodes, one per fault (or one node in `state`), by instance id."""
    states = [NodeState(**state)] if state else [NodeState.with_fault(f) for f in faults or [NodeFault.NONE]]
    nodes = {}
    for instance, node_state in zip(_instances(len(states)), states, strict=True):
        nodes[instance] = GpuNode(tmp_path / instance, state=node_state)
        moto_ssm.manage(instance, nodes[instance])
    return nodes


def _health(nodes: dict[str, GpuNode], instance_type: str = "p4d.24xlarge") -> dict[str, command_answers.NodeCheck]:
    """The health check sent through the adapter, read back, and judged by the rules, as the control plane does."""
    clients = AwsClients()
    sent = ssm.send(clients, HEALTH_CHECK_DOCUMENT, tuple(nodes), "stallwatch check j 1", timeout_s=120)
    assert sent.error == ""
    answers = ssm.invocations(clients, sent.command_ids)
    types = dict.fromkeys(nodes, instance_type)
    return recovery.check_nodes(answers, tuple(nodes), types, deadline_passed=False)


@pytest.mark.parametrize(
    ("fault", "failures"),
    [
        (NodeFault.NONE, ()),
        (NodeFault.XID, ("Xid 79: GPU has fallen off the bus",)),
        (NodeFault.ECC, ("2 uncorrectable ECC errors",)),
        (NodeFault.REMAP_FAILURE, ("1 row remapping failure",)),
        (NodeFault.NVLINK, ("2 NVLink links down",)),
        (NodeFault.NO_EFA, ("EFA device missing (fi_info -p efa)",)),
        (NodeFault.GPU_MISSING, ("7 of 8 GPUs visible",)),
        (NodeFault.SMI_TIMEOUT, ("nvidia-smi -q timed out (a GPU that stopped answering)",)),
        (NodeFault.DCGM_FAIL, ("dcgmi diag -r 1 failed",)),
    ],
)
def test_the_health_check_document_finds_each_fault_on_a_node(
    tmp_path: Path, fault: NodeFault, failures: tuple[str, ...]
) -> None:
    # Given a managed node with `fault` in a 2-node job (EFA expected), When Stallwatch's health-check document runs
    # on the nodes through SSM
    nodes = _managed(tmp_path, [fault, NodeFault.NONE])
    checks = _health(nodes)
    check = checks[next(iter(nodes))]
    # Then its one JSON line says exactly what the node failed, and the healthy node's nothing
    assert check.state is command_answers.NodeState.SUCCEEDED
    assert check.failures == failures
    assert list(checks.values())[1].healthy


def test_an_older_drivers_nvidia_smi_and_application_xids_are_read_right(tmp_path: Path) -> None:
    # Given a node of an older driver (ECC as Single/Double Bit totals) with 3 uncorrectable errors, whose kernel
    # logged only an application's Xid 13, with DCGM installed and passing
    kernel = (xid_line(13, "10:1c", "Graphics SM Warp Exception"),)
    nodes = _managed(tmp_path, legacy_driver=True, ecc_uncorrectable=3, xid_lines=kernel, dcgm="pass")
    [check] = _health(nodes).values()
    # Then the errors are counted once (the volatile ones), and Xid 13 says nothing about the node
    assert check.failures == ("3 uncorrectable ECC errors",)


@pytest.mark.parametrize(("devices", "failures"), [(16, ()), (15, ("15 of 16 Neuron devices visible",))])
def test_a_trainium_node_is_checked_with_the_neuron_tools(
    tmp_path: Path, devices: int, failures: tuple[str, ...]
) -> None:
    # Given a trn1.32xlarge node of a 2-node job: neuron-ls lists `devices` of its 16 Trainium devices, no nvidia-smi
    [instance] = _instances(1, instance_type="trn1.32xlarge")
    node = GpuNode(tmp_path / instance, state=NodeState.trn1(devices))
    moto_ssm.manage(instance, node)

    # When Stallwatch's health-check document runs on it through SSM
    [check] = _health({instance: node}, "trn1.32xlarge").values()

    # Then it was checked as a Neuron node (not failed for having no nvidia-smi), and failed what its devices did
    assert check.state is command_answers.NodeState.SUCCEEDED
    assert check.failures == failures


def test_the_restart_document_restarts_the_unit_and_reports_a_unit_that_does_not_come_back(tmp_path: Path) -> None:
    # Given two nodes, the first one's unit failing to come back
    (failing, failed), (working, works) = _managed(tmp_path, [NodeFault.NONE, NodeFault.NONE]).items()
    failed = GpuNode(failed.root, state=NodeState(restart_fails=True))
    moto_ssm.manage(failing, failed)
    # When the restart document runs on both
    clients = AwsClients()
    sent = ssm.send(clients, RESTART_DOCUMENT, (failing, working), "stallwatch restart j 1", timeout_s=120)
    answers = ssm.invocations(clients, sent.command_ids)
    # Then both ran systemctl restart once; the unit that stayed failed makes its invocation fail
    assert (failed.restarts, works.restarts) == (1, 1)
    assert (answers[failing].status, answers[failing].code) == ("Failed", 1)
    assert '"state":"failed"' in answers[failing].output
    assert (answers[working].status, answers[working].code) == ("Success", 0)


def test_an_instance_ssm_does_not_manage_is_refused_and_an_unknown_document_too(tmp_path: Path) -> None:
    managed = list(_managed(tmp_path))
    unmanaged = _instances(1)
    sent = ssm.send(AwsClients(), HEALTH_CHECK_DOCUMENT, (*managed, *unmanaged), "c", timeout_s=30)
    assert sent.command_ids == ()
    assert sent.error.startswith(f"SendCommand {HEALTH_CHECK_DOCUMENT} to")
    assert "InvalidInstanceId" in sent.error
    with pytest.raises(ClientError, match="InvalidDocument"):
        boto3.client("ssm").send_command(DocumentName="no-such-document", InstanceIds=managed)


def test_agents_that_do_not_answer_are_undeliverable_or_in_progress(tmp_path: Path) -> None:
    nodes = _managed(tmp_path, [NodeFault.NONE, NodeFault.NONE])
    offline, stuck = nodes.values()
    offline.agent, stuck.agent = Agent.OFFLINE, Agent.UNRESPONSIVE
    checks = _health(nodes)
    assert [c.state for c in checks.values()] == [
        command_answers.NodeState.UNDELIVERABLE,
        command_answers.NodeState.RUNNING,
    ]
    assert [n.restarts for n in nodes.values()] == [0, 0]


def test_a_command_goes_to_the_instances_asked_only_and_invocations_page(tmp_path: Path) -> None:
    # Given 5 managed nodes (and another instance), When the restart goes to 3 of them
    nodes = _managed(tmp_path, [NodeFault.NONE] * 5)
    _instances(1)
    chosen = tuple(sorted(nodes)[:3])
    ssm_client = boto3.client("ssm")
    command = ssm_client.send_command(DocumentName=RESTART_DOCUMENT, InstanceIds=list(chosen))["Command"]
    # Then only those 3 ran it, and ListCommandInvocations pages them 2 at a time, with the plugin's details
    pages = ssm_client.get_paginator("list_command_invocations").paginate(
        CommandId=command["CommandId"], Details=True, PaginationConfig={"PageSize": 2}
    )
    listed = [page["CommandInvocations"] for page in pages]
    assert [len(page) for page in listed] == [2, 1]
    assert sorted(i["InstanceId"] for page in listed for i in page) == list(chosen)
    assert all(i["CommandPlugins"][0]["Name"] == "restartTraining" for page in listed for i in page)
    assert [nodes[i].restarts for i in sorted(nodes)] == [1, 1, 1, 0, 0]


def test_the_adapter_sends_50_nodes_a_command_and_finds_a_command_by_its_comment(tmp_path: Path) -> None:
    # Given 51 managed nodes
    nodes = _managed(tmp_path, [NodeFault.NONE] * 51)
    clients = AwsClients()
    # When the restart goes to all of them
    sent = ssm.send(clients, RESTART_DOCUMENT, tuple(nodes), "stallwatch restart llm-70b 1764496800", timeout_s=120)
    # Then it is two commands (SendCommand takes 50 instances), every node answered, and the send can be found again
    assert len(sent.command_ids) == 2
    assert len(ssm.invocations(clients, sent.command_ids)) == 51
    found = ssm.find_command(clients, RESTART_DOCUMENT, "stallwatch restart llm-70b 1764496800", since=0.0)
    assert found in sent.command_ids
    assert ssm.find_command(clients, RESTART_DOCUMENT, "stallwatch restart other 1", since=0.0) is None


def test_comments_past_ssms_limit_that_share_their_start_stay_two_commands_found_apart(tmp_path: Path) -> None:
    # Given two sends whose comments share their first 100 characters (SendCommand takes 100), to one node
    nodes = tuple(_managed(tmp_path, [NodeFault.NONE]))
    clients = AwsClients()
    first, second = (f"stallwatch restart {'j' * 90} {stall}" for stall in (1764496800, 1764500400))
    sent = [ssm.send(clients, RESTART_DOCUMENT, nodes, comment, timeout_s=120) for comment in (first, second)]

    # When each is looked for by its comment (a send whose Lambda died before it recorded the id)
    found = [ssm.find_command(clients, RESTART_DOCUMENT, comment, since=0.0) for comment in (first, second)]

    # Then each finds its own: the comments were cut with a hash of the whole, within SSM's limit
    assert found == [s.command_ids[0] for s in sent]
    comments = [c["Comment"] for c in boto3.client("ssm").list_commands()["Commands"]]
    assert len(set(comments)) == 2
    assert all(len(c) <= ssm.COMMENT_LIMIT for c in comments)


def test_an_instance_marked_unhealthy_is_replaced_by_its_group_with_the_tags_it_propagates() -> None:
    # Given a group of 2 that propagates the job's tags
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    ec2.create_launch_template(
        LaunchTemplateName="train", LaunchTemplateData={"ImageId": AMI, "InstanceType": "p4d.24xlarge"}
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="g",
        LaunchTemplate={"LaunchTemplateName": "train", "Version": "$Latest"},
        MinSize=2,
        MaxSize=2,
        DesiredCapacity=2,
        AvailabilityZones=["us-east-1a"],
        Tags=[
            {
                "Key": "stallwatch:job",
                "Value": "j",
                "PropagateAtLaunch": True,
                "ResourceId": "g",
                "ResourceType": "auto-scaling-group",
            }
        ],
    )
    before = sorted(
        i["InstanceId"] for i in autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]
    )
    # When one is marked unhealthy
    autoscaling.set_instance_health(InstanceId=before[0], HealthStatus="Unhealthy", ShouldRespectGracePeriod=False)
    # Then it is terminated and a new instance, tagged with the job and the group, takes its place
    after = sorted(
        i["InstanceId"] for i in autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]
    )
    (new,) = set(after) - set(before)
    assert before[1] in after
    assert before[0] not in after
    described = {
        i["InstanceId"]: i
        for r in ec2.describe_instances(InstanceIds=[before[0], new])["Reservations"]
        for i in r["Instances"]
    }
    assert described[before[0]]["State"]["Name"] == "terminated"
    tags = {t["Key"]: t["Value"] for t in described[new]["Tags"]}
    assert tags["stallwatch:job"] == "j"
    assert tags["aws:autoscaling:groupName"] == "g"
    # ...and an instance no group holds is refused, as Auto Scaling refuses it
    with pytest.raises(ClientError, match="ValidationError"):
        autoscaling.set_instance_health(InstanceId=_instances(1)[0], HealthStatus="Unhealthy")
