"""Stallwatch's SSM Command documents (deploy/ssm), as the stack creates them (and the local run, from the same files).

document = command_document(scope, "RestartTraining", DOCUMENTS_DIR / "restart-training.yaml")
"""

from __future__ import annotations

from pathlib import Path

import yaml
from aws_cdk import aws_ssm as ssm
from constructs import Construct

DOCUMENTS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "ssm"


def command_document(scope: Construct, construct_id: str, path: Path) -> ssm.CfnDocument:
    """One of Stallwatch's Command documents, from its YAML file. NewVersion: a changed document keeps its name
    (CloudFormation's default, Replace, makes a new one), so a command sent before a deploy is still found by name
    (`aws.ssm.find_command`) and $LATEST is the new content."""
    return ssm.CfnDocument(
        scope,
        construct_id,
        content=document_content(path),
        document_type="Command",
        document_format="JSON",
        update_method="NewVersion",
    )


def document_content(path: Path) -> dict[str, object]:
    """An SSM document's content as the stack (and the local run) create it: the YAML file, as an object."""
    content = yaml.safe_load(path.read_text())
    if not isinstance(content, dict) or "mainSteps" not in content:
        raise ValueError(f"{path}: not an SSM Command document (no mainSteps)")
    return content
