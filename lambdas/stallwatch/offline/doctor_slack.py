"""The doctor's Slack checks (`offline.doctor`): the secret holds what its mode needs, the buttons' signing secret and
allow-list are set, and Slack answers the credentials (``auth.test`` for a bot token; the webhook, sent an empty
payload, which Slack refuses without posting).

    check, secret = read_secret(clients.secretsmanager, arn)
    checks = [check, *check_secret_fields(secret, config), check_slack(secret, SLACK_API_URL)]
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from stallwatch.core.config import SlackMode, StallwatchConfig, slack_mode_of
from stallwatch.core.doctor_checks import Check, Status

SLACK_SECRET_ENV = "SLACK_SECRET_ARN"
SLACK_API_URL = "https://slack.com/api/"
SLACK_TIMEOUT_S = 10
# An empty payload to a live incoming webhook is refused without a post; these answers say the webhook is gone.
DEAD_WEBHOOK = ("no_service", "invalid_token", "channel_not_found", "channel_is_archived", "no_team", "team_disabled")


def read_secret(secretsmanager: Any, arn: str | None) -> tuple[Check, dict[str, Any] | None]:
    """The Slack secret's fields, as the functions read them (`arn`: the functions' `SLACK_SECRET_ARN`)."""
    fix = "put the Slack app's JSON into the secret (docs/operators.md, step 6)"
    if not arn:
        return Check("Slack secret", Status.FAIL, f"the functions have no {SLACK_SECRET_ENV}", "deploy again"), None
    try:
        raw = secretsmanager.get_secret_value(SecretId=arn)["SecretString"]
        secret = json.loads(raw)
    except ValueError:
        return Check("Slack secret", Status.FAIL, f"{arn} does not hold JSON", fix), None
    if not isinstance(secret, dict):
        return Check("Slack secret", Status.FAIL, f"{arn} does not hold a JSON object", fix), None
    return Check("Slack secret", Status.OK, arn), secret


def check_secret_fields(secret: dict[str, Any], config: StallwatchConfig) -> Iterator[Check]:
    """The fields the secret's mode needs, the signing secret the buttons need, and the allow-list."""
    mode = slack_mode_of(secret)
    if mode is None:
        fix = '{"webhook_url": ..., "signing_secret": ...} or {"bot_token": "xoxb-...", "channel": "C...", ...}'
        yield Check("Slack mode", Status.FAIL, "the secret has neither webhook_url, nor bot_token and channel", fix)
        return
    both = mode is SlackMode.WEBHOOK and secret.get("bot_token")
    detail = f"{mode.value} (webhook_url set: alerts cannot be edited in place)" if both else mode.value
    fix = "remove webhook_url from the secret for bot mode" if both else ""
    yield Check("Slack mode", Status.WARN if both else Status.OK, detail, fix)
    if not secret.get("signing_secret"):
        fix = "add the app's signing_secret (Basic Information → Signing Secret) to the secret"
        yield Check("Slack signing secret", Status.FAIL, "missing: every button press is refused (401)", fix)
    else:
        yield Check("Slack signing secret", Status.OK, "set")
    allowed = config.slack
    if allowed.allowed_group_ids and mode is not SlackMode.BOT:
        fix = "groups need bot mode (usergroups.users.list): use a bot_token, or list the users"
        yield Check("Slack allow-list", Status.FAIL, "allowed_group_ids set in webhook mode", fix)
    elif not (allowed.allowed_user_ids or allowed.allowed_group_ids):
        fix = "set slack.allowed_user_ids (or allowed_group_ids) in the config and deploy again"
        yield Check("Slack allow-list", Status.WARN, "empty: every button answers 'not allowed'", fix)
    else:
        count = len(allowed.allowed_user_ids) + len(allowed.allowed_group_ids)
        yield Check("Slack allow-list", Status.OK, f"{count} users and groups")


def check_slack(secret: dict[str, Any], api_url: str) -> Check:
    """Slack answers the secret's credentials: auth.test for a bot token, the webhook for an empty payload."""
    mode = slack_mode_of(secret)
    if mode is SlackMode.BOT:
        from slack_sdk import WebClient  # imported here: only this check talks to Slack
        from slack_sdk.errors import SlackApiError

        try:
            reply = WebClient(token=secret["bot_token"], base_url=api_url, timeout=SLACK_TIMEOUT_S).auth_test()
        except SlackApiError as exc:
            fix = "a token of the app that posts (OAuth & Permissions → Bot User OAuth Token)"
            return Check("Slack answers", Status.FAIL, f"auth.test: {exc.response.get('error')}", fix)
        except OSError as exc:
            return Check("Slack answers", Status.FAIL, f"auth.test: {exc}", "check the network path to Slack")
        return Check("Slack answers", Status.OK, f"auth.test: bot {reply.get('user')} in team {reply.get('team')}")
    request = urllib.request.Request(
        secret["webhook_url"], data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=SLACK_TIMEOUT_S) as response:
            status, body = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return Check("Slack answers", Status.FAIL, f"webhook: {exc}", "check the network path to Slack")
    if status >= 500 or body.strip() in DEAD_WEBHOOK or status in (403, 404, 410):
        fix = "the webhook was removed or revoked: install the app again and put the new webhook_url"
        return Check("Slack answers", Status.FAIL, f"webhook: HTTP {status} {body[:80]}", fix)
    return Check("Slack answers", Status.OK, f"webhook answers (HTTP {status} to an empty payload, nothing posted)")
