"""Recovery in place's resources and grants: Stallwatch's own SSM documents, SendCommand only with them and only on
instances opted in by tag, SetInstanceHealth only on groups opted in, and the documents' names in the functions'
environment."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks.documents import document_content
from stacks.platforms.ec2_recovery import HEALTH_CHECK_FILE, RESTART_FILE
from stallwatch.core.config import HEALTH_CHECK_DOCUMENT_ENV, RESTART_DOCUMENT_ENV

from .conftest import as_list, iam_statements
from .test_iam import _grants

OPTED_IN = {"StringEqualsIgnoreCase": {"aws:ResourceTag/stallwatch:recover": "restart"}}


def _documents(template: Template) -> dict[str, dict[str, Any]]:
    return template.find_resources("AWS::SSM::Document")


def _document_refs(statement: dict[str, Any]) -> set[str]:
    """The documents a statement's resources name (`document/<Ref>` ARNs), empty for other resources."""
    refs = set()
    for resource in as_list(statement["Resource"]):
        parts = resource.get("Fn::Join", ["", []])[1] if isinstance(resource, dict) else [resource]
        if any(isinstance(p, str) and p.endswith(":document/") for p in parts):
            refs |= {p["Ref"] for p in parts if isinstance(p, dict) and "Ref" in p and not p["Ref"].startswith("AWS::")}
    return refs


@pytest.mark.parametrize("watched", ["template", "slurm_template"])  # Slurm adds none: its runner pulls its commands
def test_the_stack_creates_its_command_documents_from_deploy_ssm(watched: str, request: pytest.FixtureRequest) -> None:
    documents = _documents(request.getfixturevalue(watched))
    files = (HEALTH_CHECK_FILE, RESTART_FILE)
    assert len(documents) == len(files)
    contents = [d["Properties"]["Content"] for d in documents.values()]
    assert {d["Properties"]["DocumentType"] for d in documents.values()} == {"Command"}
    assert sorted(contents, key=str) == sorted([document_content(f) for f in files], key=str)


def test_a_deploy_that_changes_a_document_gives_it_a_new_version_under_the_same_name(template: Template) -> None:
    # Then CloudFormation updates each document in place (a new default version) rather than replacing it with a
    # document of another name: a command sent before the deploy is still found under the name the functions know
    assert {d["Properties"].get("UpdateMethod") for d in _documents(template).values()} == {"NewVersion"}


def test_send_command_is_granted_only_with_stallwatchs_documents_and_only_on_opted_in_instances(
    template: Template,
) -> None:
    sends = [s for s in iam_statements(template) if _grants(s, "ssm:SendCommand")]
    assert sends
    documents = set(_documents(template))
    for statement in sends:
        resources = as_list(statement["Resource"])
        assert "*" not in resources, statement
        refs = _document_refs(statement)
        if refs:  # the documents: Stallwatch's own, by reference, never a wildcard
            assert refs <= documents, statement
            assert len(refs) == len(resources), statement
        else:  # the instances: only those tagged stallwatch:recover=restart
            [instances] = resources
            assert instances["Fn::Join"][1][-1] == ":instance/*", statement
            assert statement["Condition"] == OPTED_IN, statement


def test_on_alarm_may_send_the_health_check_only_and_the_sweeper_both(template: Template) -> None:
    policies = template.find_resources("AWS::IAM::Policy")
    health_check, restart = (
        next(k for k, d in _documents(template).items() if d["Properties"]["Content"] == document_content(f))
        for f in (HEALTH_CHECK_FILE, RESTART_FILE)
    )

    def documents_of(prefix: str) -> set[str]:
        statements = [
            s
            for k, p in policies.items()
            if k.startswith(prefix)
            for s in p["Properties"]["PolicyDocument"]["Statement"]
        ]
        assert statements, prefix
        return {ref for s in statements if _grants(s, "ssm:SendCommand") for ref in _document_refs(s)} & {
            health_check,
            restart,
        }

    assert documents_of("WatchdogOnAlarmRole") == {health_check}
    assert documents_of("WatchdogSweeperRole") == {health_check, restart}
    assert documents_of("WatchdogOnJobStateRole") == set()
    assert documents_of("SlackEndpoint") == set()


def test_set_instance_health_is_tag_conditioned_on_auto_scaling_groups(template: Template) -> None:
    [statement] = [s for s in iam_statements(template) if _grants(s, "autoscaling:SetInstanceHealth")]
    assert statement["Action"] == "autoscaling:SetInstanceHealth"
    assert statement["Resource"]["Fn::Join"][1][-1] == ":autoScalingGroup:*:autoScalingGroupName/*"
    assert statement["Condition"] == {
        "StringEqualsIgnoreCase": {"autoscaling:ResourceTag/stallwatch:recover": "restart"}
    }


def test_the_invocation_reads_are_the_only_ssm_actions_on_any_resource(template: Template) -> None:
    wide = [
        s
        for s in iam_statements(template)
        if "*" in as_list(s["Resource"]) and any(a.startswith("ssm:") for a in as_list(s["Action"]))
    ]
    assert [sorted(as_list(s["Action"])) for s in wide] == [["ssm:ListCommandInvocations", "ssm:ListCommands"]]
    assert wide[0]["Condition"] == {"StringEquals": {"aws:RequestedRegion": {"Ref": "AWS::Region"}}}


def _document_id(template: Template, path: Any) -> str:
    return next(k for k, d in _documents(template).items() if d["Properties"]["Content"] == document_content(path))


def test_the_deciding_functions_find_the_documents_in_their_environment(template: Template) -> None:
    functions = template.find_resources("AWS::Lambda::Function")
    documents = {_document_id(template, HEALTH_CHECK_FILE), _document_id(template, RESTART_FILE)}
    for logical_id, function in functions.items():
        env = function["Properties"]["Environment"]["Variables"]
        deciding = logical_id.startswith(("WatchdogOnAlarm", "WatchdogSweeper", "WatchdogOnLogLine"))
        names = {env.get(HEALTH_CHECK_DOCUMENT_ENV, {}).get("Ref"), env.get(RESTART_DOCUMENT_ENV, {}).get("Ref")}
        assert names == (documents if deciding else {None}), logical_id


# ---- Slurm: no document, no SendCommand to a controller ---------------------------------------------------------


def test_slurm_jobs_are_stopped_through_the_runner_never_by_a_command_sent_to_an_instance(
    slurm_template: Template,
) -> None:
    """The runner pulls its commands (the table): no function may send a command to any instance but those tagged
    stallwatch:recover=restart (recovery in place), Slurm watched or not."""
    statements = [s for s in iam_statements(slurm_template) if _grants(s, "ssm:SendCommand") and not _document_refs(s)]
    assert statements
    assert all(s["Condition"] == OPTED_IN for s in statements)
