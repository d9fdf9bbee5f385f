"""No secret in any log at any level: every handler run with the root logger at DEBUG, its output searched."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from handlers import on_alarm, on_job_state, slack_interactions, sweeper
from localrun.moto_world import MINUTE, alarm_event, job_state_event, scheduled_event
from localrun.slack_presses import ALLOWED_USER, JOB, SIGNING_SECRET, press_payload, signed_request
from stallwatch.aws.buttons import OperatorAction
from stallwatch.aws.observability import SECRET_LOGGING_LIBRARIES, logger
from stallwatch.core.config import StallwatchConfig
from stallwatch.offline import cli
from stallwatch.runtime import interactions
from stallwatch.runtime.interactions import DEFERRED_EVENT_KEY, DeferredPress, Interactions
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, seed_nccl_hang

BOT_TOKEN = "xoxb-1234567890-abcdefghijklmnopqrstuvwx"
WEBHOOK_SECRET_PATH = "B0SECRET/Xq9vT2mPz8LkW4nR7sYc1dFh"


@pytest.fixture
def debug_everywhere(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The root logger and the control plane's logger at DEBUG, as an operator chasing a bug would set them."""
    caplog.set_level(logging.DEBUG)
    previous = logger.log_level
    logger.setLevel(logging.DEBUG)
    yield
    logger.setLevel(previous)


def test_no_handler_logs_a_secret_at_debug(
    rt, world, slack, context, debug_everywhere, caplog, capsys, monkeypatch
) -> None:
    # Given a Slack secret with a webhook URL, a bot token and a signing secret, and a hung enforced job
    webhook_url = f"{slack.base}/services/T000/{WEBHOOK_SECRET_PATH}"
    secret = {"webhook_url": webhook_url, "bot_token": BOT_TOKEN, "channel": "C0", "signing_secret": SIGNING_SECRET}
    rt.clients.secretsmanager.put_secret_value(SecretId=rt.notifier.secret_arn, SecretString=json.dumps(secret))
    rt.config = StallwatchConfig.model_validate({"slack": {"allowed_user_ids": [ALLOWED_USER]}})
    seed_nccl_hang(world, JOB, ENFORCE)
    deferred: list[DeferredPress] = []
    endpoint = Interactions(rt, defer=deferred.append)
    monkeypatch.setattr(interactions, "endpoint", lambda: endpoint)

    # When every handler runs: the job starts, its alarm fires (a warning posted), the sweeper runs, and an
    # operator snoozes it (the request, then the deferred work)
    on_job_state.handler(job_state_event(JOB, "InProgress"), context)
    assert on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)["posted"] is True
    rt.clock.advance(MINUTE)
    sweeper.handler(scheduled_event(), context)
    press = press_payload(SimpleNamespace(response_url=f"{slack.base}/actions/T0/1/x"), OperatorAction.SNOOZE_1H)
    assert slack_interactions.handler(signed_request(press, rt.clock()), context)["statusCode"] == 200
    applied = slack_interactions.handler({DEFERRED_EVENT_KEY: deferred.pop().model_dump()}, context)
    assert applied["status"] == "applied"

    # Then none of the secret's values appears anywhere in what was logged or printed
    out, err = capsys.readouterr()
    logged = "\n".join([caplog.text, out, err])
    assert logged
    for value in (WEBHOOK_SECRET_PATH, BOT_TOKEN, SIGNING_SECRET):
        assert value not in logged


def test_the_cli_caps_the_libraries_that_log_secrets(monkeypatch) -> None:
    # Given the libraries' loggers at DEBUG
    for name in SECRET_LOGGING_LIBRARIES:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.DEBUG)

    # When the stallwatch CLI starts
    with pytest.raises(SystemExit):
        cli.main(["--help"])

    # Then they log warnings and errors only
    assert {logging.getLogger(name).level for name in SECRET_LOGGING_LIBRARIES} == {logging.WARNING}
