"""The buttons on a Slack warning or alert (Block Kit), and what each carries back when pressed.

blocks.append(action_buttons(facts, incident_id))     # the alert builder adds them
ButtonValue.model_validate_json(press["value"])       # the endpoint reads them back
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stallwatch.core.signals import JobFacts, Platform

ACTIONS_BLOCK_ID = "stallwatch_actions"


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


class ButtonValue(BaseModel):
    """What every button carries: the job it acts on and the incident it answers."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job: str = Field(min_length=1, max_length=256)
    platform: Platform
    incident: str | None = Field(None, max_length=128)


def action_buttons(job: JobFacts, incident_id: str | None) -> dict[str, Any]:
    """The actions block appended to a warning or alert: Snooze 1 h, Snooze 4 h, Stop now, Not stalled."""
    value = ButtonValue(job=job.name, platform=job.platform, incident=incident_id).model_dump_json()
    elements = []
    for action, label in BUTTON_LABELS.items():
        button: dict[str, Any] = {
            "type": "button",
            "action_id": action.value,
            "text": {"type": "plain_text", "text": label},
            "value": value,
        }
        if action is OperatorAction.STOP_NOW:
            button["style"] = "danger"
            button["confirm"] = {
                "title": {"type": "plain_text", "text": "Stop this job?"},
                "text": {
                    "type": "mrkdwn",
                    "text": f"Stop `{job.name}` now? Its progress since the last checkpoint is lost.",
                },
                "confirm": {"type": "plain_text", "text": "Stop it"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            }
        elif action is OperatorAction.NOT_STALLED:
            button["style"] = "primary"
        elements.append(button)
    return {"type": "actions", "block_id": ACTIONS_BLOCK_ID, "elements": elements}
