"""The buttons on a Slack warning or alert (Block Kit), and what each carries back when pressed.

blocks.append(action_buttons(facts, incident_id, rt.deployment_id))   # an ActionsBlock: the alert builder adds it
ButtonValue.model_validate_json(press["value"])                       # the endpoint reads them back

Every value names its deployment, so an endpoint refuses the buttons of another Stallwatch's alerts (another
account, region or table sharing the Slack app) instead of acting on a job of the same name.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator
from slack_sdk.models.blocks import ActionsBlock, ButtonElement, ConfirmObject, MarkdownTextObject, PlainTextObject

from stallwatch.aws.slack_text import escape
from stallwatch.core.platforms import describe
from stallwatch.core.signals import JobFacts, Platform

ACTIONS_BLOCK_ID = "stallwatch_actions"
DEPLOYMENT_ID_CHARS = 16


class OperatorAction(StrEnum):
    """The buttons, by their Slack `action_id`."""

    SNOOZE_1H = "stallwatch_snooze_1h"
    SNOOZE_4H = "stallwatch_snooze_4h"
    STOP_NOW = "stallwatch_stop_now"
    NOT_STALLED = "stallwatch_not_stalled"


SNOOZE_SECONDS = {OperatorAction.SNOOZE_1H: 3600, OperatorAction.SNOOZE_4H: 4 * 3600}
BUTTON_LABELS = {
    OperatorAction.SNOOZE_1H: "Snooze 1 h",
    OperatorAction.SNOOZE_4H: "Snooze 4 h",
    OperatorAction.STOP_NOW: "Stop now",
    OperatorAction.NOT_STALLED: "Not stalled",
}


def deployment_id(region: str, table: str) -> str:
    """One Stallwatch deployment: its region and table (CloudFormation names tables uniquely)."""
    return hashlib.sha256(f"{region}/{table}".encode()).hexdigest()[:DEPLOYMENT_ID_CHARS]


class ButtonValue(BaseModel):
    """What every button carries: the deployment that posted it, the job it acts on and the incident it answers."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    deployment: str = Field(pattern=rf"^[0-9a-f]{{{DEPLOYMENT_ID_CHARS}}}$")
    job: str = Field(min_length=1, max_length=64)
    platform: Platform
    incident: str | None = Field(None, pattern=r"^incident#[0-9.]{1,24}$")

    @model_validator(mode="after")
    def _job_name(self) -> ButtonValue:
        # A SageMaker job name, an EC2 job tag or an instance id: never an ARN, a path or another account's resource
        if not describe(self.platform).job_name.fullmatch(self.job):
            raise ValueError(f"job {self.job[:64]!r} is not a {self.platform.value} job name")
        return self


def action_buttons(job: JobFacts, incident_id: str | None, deployment: str) -> ActionsBlock:
    """The actions block appended to a warning or alert: Snooze 1 h, Snooze 4 h, Stop now, Not stalled."""
    value = ButtonValue(
        deployment=deployment, job=job.name, platform=job.platform, incident=incident_id
    ).model_dump_json()
    confirm_stop = ConfirmObject(
        title=PlainTextObject(text="Stop this job?"),
        text=MarkdownTextObject(text=f"Stop `{escape(job.name)}` now? Its progress since the last checkpoint is lost."),
        confirm=PlainTextObject(text="Stop it"),
        deny=PlainTextObject(text="Cancel"),
    )
    styles = {OperatorAction.STOP_NOW: "danger", OperatorAction.NOT_STALLED: "primary"}
    elements = [
        ButtonElement(
            text=PlainTextObject(text=label),
            action_id=action.value,
            value=value,
            style=styles.get(action),
            confirm=confirm_stop if action is OperatorAction.STOP_NOW else None,
        )
        for action, label in BUTTON_LABELS.items()
    ]
    return ActionsBlock(block_id=ACTIONS_BLOCK_ID, elements=elements)
