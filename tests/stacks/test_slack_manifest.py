"""deploy/slack/manifest.yaml is a valid Slack app manifest for both Slack modes, its Request URL filled from the
stack's `SlackInteractivityUrl` output the way docs/operators.md says.

The models below are Slack's app manifest schema (https://api.slack.com/reference/manifests: the fields, their
limits and the granular bot scopes), strict, so a misspelled or misplaced field fails here rather than in Slack.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from stallwatch.core.config import SlackConfig

from .conftest import REPO_ROOT

MANIFEST = REPO_ROOT / "deploy" / "slack" / "manifest.yaml"
OPERATORS_DOC = REPO_ROOT / "docs" / "operators.md"
PLACEHOLDER = "SLACK_INTERACTIVITY_URL"
# A Lambda Function URL, as the SlackInteractivityUrl output gives it.
FUNCTION_URL = "https://abcdefghijklmnopqrstuvwxyz012345.lambda-url.us-east-1.on.aws/"
# What the runtime calls with the app's credentials (stallwatch.aws.slack, stallwatch.runtime.interactions), and
# the scope each needs: chat.postMessage and chat.update, usergroups.users.list, and the incoming webhook.
NEEDED_BOT_SCOPES = {"chat:write", "usergroups:read", "incoming-webhook"}

BotScope = Literal[
    "app_mentions:read", "bookmarks:read", "bookmarks:write", "calls:read", "calls:write", "channels:history",
    "channels:join", "channels:manage", "channels:read", "channels:write.invites", "channels:write.topic",
    "chat:write", "chat:write.customize", "chat:write.public", "commands", "dnd:read", "emoji:read", "files:read",
    "files:write", "groups:history", "groups:read", "groups:write", "groups:write.invites", "groups:write.topic",
    "im:history", "im:read", "im:write", "incoming-webhook", "links.embed:write", "links:read", "links:write",
    "metadata.message:read", "mpim:history", "mpim:read", "mpim:write", "mpim:write.invites", "mpim:write.topic",
    "pins:read", "pins:write", "reactions:read", "reactions:write", "reminders:read", "reminders:write",
    "remote_files:read", "remote_files:share", "remote_files:write", "team:read", "usergroups:read",
    "usergroups:write", "users.profile:read", "users:read", "users:read.email", "users:write",
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(_Strict):
    major_version: Literal[1, 2] = 1
    minor_version: int | None = None


class DisplayInformation(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=35)]
    description: Annotated[str, Field(max_length=140)] | None = None
    long_description: Annotated[str, Field(max_length=4000)] | None = None
    background_color: Annotated[str, Field(pattern=r"^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")] | None = None


class BotUser(_Strict):
    display_name: Annotated[str, Field(pattern=r"^[a-z0-9._-]{1,80}$")]
    always_online: bool = False


class AppHome(_Strict):
    home_tab_enabled: bool = False
    messages_tab_enabled: bool = False
    messages_tab_read_only_enabled: bool = False


class Features(_Strict):
    app_home: AppHome | None = None
    bot_user: BotUser | None = None
    shortcuts: Annotated[list[dict[str, str]], Field(max_length=10)] | None = None
    slash_commands: Annotated[list[dict[str, object]], Field(max_length=50)] | None = None
    unfurl_domains: Annotated[list[str], Field(max_length=5)] | None = None


class Scopes(_Strict):
    bot: Annotated[list[BotScope], Field(max_length=255)] = []
    user: Annotated[list[str], Field(max_length=255)] = []


class OAuthConfig(_Strict):
    redirect_urls: Annotated[list[HttpUrl], Field(max_length=1000)] | None = None
    scopes: Scopes | None = None
    token_management_enabled: bool | None = None


class IncomingWebhooks(_Strict):
    incoming_webhooks_enabled: bool = False


class Interactivity(_Strict):
    is_enabled: bool
    request_url: HttpUrl | None = None
    message_menu_options_url: HttpUrl | None = None


class EventSubscriptions(_Strict):
    request_url: HttpUrl | None = None
    bot_events: list[str] = []
    user_events: list[str] = []


class Settings(_Strict):
    allowed_ip_address_ranges: Annotated[list[str], Field(max_length=50)] | None = None
    event_subscriptions: EventSubscriptions | None = None
    incoming_webhooks: IncomingWebhooks | None = None
    interactivity: Interactivity | None = None
    org_deploy_enabled: bool = False
    socket_mode_enabled: bool = False
    token_rotation_enabled: bool = False
    function_runtime: str | None = None


class Manifest(_Strict):
    metadata: Metadata | None = Field(None, alias="_metadata")
    display_information: DisplayInformation
    features: Features | None = None
    oauth_config: OAuthConfig | None = None
    settings: Settings | None = None


def _rendered(request_url: str = FUNCTION_URL) -> dict[str, object]:
    """The manifest with its placeholder replaced, as the documented `sed` does."""
    return yaml.safe_load(MANIFEST.read_text(encoding="utf-8").replace(PLACEHOLDER, request_url))


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return Manifest.model_validate(_rendered())


def test_the_manifest_follows_slacks_schema(manifest: Manifest) -> None:
    assert manifest.display_information.name == "Stallwatch"
    assert manifest.features
    assert manifest.features.bot_user


def test_the_manifest_serves_both_slack_modes_with_the_scopes_the_runtime_uses_and_no_more(
    manifest: Manifest,
) -> None:
    assert manifest.oauth_config
    assert manifest.oauth_config.scopes
    assert set(manifest.oauth_config.scopes.bot) == NEEDED_BOT_SCOPES
    assert manifest.oauth_config.scopes.user == []
    assert manifest.settings
    assert manifest.settings.incoming_webhooks
    assert manifest.settings.incoming_webhooks.incoming_webhooks_enabled is True


def test_interactivity_posts_to_the_function_url_over_http_not_socket_mode(manifest: Manifest) -> None:
    assert manifest.settings
    assert manifest.settings.interactivity
    assert manifest.settings.interactivity.is_enabled is True
    assert str(manifest.settings.interactivity.request_url) == FUNCTION_URL
    assert manifest.settings.socket_mode_enabled is False
    assert manifest.settings.event_subscriptions is None  # the app receives no events, only button presses


def test_the_request_url_is_a_placeholder_the_documented_command_fills() -> None:
    raw = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    assert raw["settings"]["interactivity"]["request_url"] == PLACEHOLDER
    assert MANIFEST.read_text(encoding="utf-8").count(PLACEHOLDER) == 2  # the field, and the comment that says so
    guide = OPERATORS_DOC.read_text(encoding="utf-8")
    [command] = re.findall(rf"sed \"s#{PLACEHOLDER}#\$\{{?\w+\}}?#\" deploy/slack/manifest.yaml", guide)
    assert command
    # Slack refuses the manifest until it is filled: the placeholder is not a URL
    with pytest.raises(ValueError, match="request_url"):
        Manifest.model_validate(_rendered(PLACEHOLDER))


def test_a_misspelled_field_fails_the_schema() -> None:
    rendered = _rendered()
    rendered["settings"]["interactivity"]["request_ur"] = FUNCTION_URL  # type: ignore[index]
    with pytest.raises(ValueError, match="request_ur"):
        Manifest.model_validate(rendered)


def test_the_settings_the_manifest_names_are_ones_the_config_accepts() -> None:
    # Given the config settings the manifest's comments name (slack.<setting>)
    named = set(re.findall(r"(?<![\w./])slack\.([a-z_]+)(?![\w./])", MANIFEST.read_text(encoding="utf-8")))

    # Then each is a setting of the config's slack section (the mode is not: the secret's fields choose it)
    assert named <= set(SlackConfig.model_fields)
