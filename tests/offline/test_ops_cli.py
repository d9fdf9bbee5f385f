"""`stallwatch incidents`, `snooze` and `policy show` against a deployment on moto (table, stack, functions)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import moto  # imported before any boto3 client is created
import pytest

from localrun import moto_sagemaker
from localrun.moto_world import World
from localrun.resources import create_table
from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.job_states import JobStates, StoredState
from stallwatch.aws.store import Store, job_key
from stallwatch.core.config import CONFIG_ENV
from stallwatch.core.decision import JobState
from stallwatch.core.engine import decide
from stallwatch.offline import cli, ops
from tests.core.test_engine import ENFORCE, MIN, ONSET, hung

TABLE = "stallwatch-ops"
STACK = "stallwatch"  # the default deployment name, which the CLI looks up without --stack
HOUR = 3600.0
ENFORCE_45 = {"stallwatch:mode": "enforce", "stallwatch:stall-minutes": "45", "stallwatch:idle-minutes": "[/soon]"}
DEPLOYED = {"policy": {"mode": "observe", "thresholds": {"stop_grace_minutes": 10}}, "incident_ttl_days": 30}

moto_sagemaker.install()


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich tables without wrapped cells, and no table from the environment."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv(ops.TABLE_ENV, raising=False)
    monkeypatch.setattr(
        cli, "COMMANDS", [*cli.COMMANDS, ops.register] if ops.register not in cli.COMMANDS else cli.COMMANDS
    )


@pytest.fixture
def clients() -> Iterator[AwsClients]:
    with moto.mock_aws():
        yield AwsClients()


def _create_table(clients: AwsClients, name: str = TABLE) -> None:
    create_table(clients.dynamodb, name)


def _open_incident(store: JobStates, job: str, at: float, diagnosis: str, reason: str) -> None:
    """What the watchdog writes when it first sees a problem: the state and a new incident."""
    key = job_key("sagemaker", job)
    read = store.load(key)
    written = StoredState(JobState(stall_since=at), read.version, f"incident#{at:017.3f}")
    store.commit(key, read, written, {"at": at, "diagnosis": diagnosis, "reasons": [reason]}, at)


def _stallwatch(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# ---- incidents --------------------------------------------------------------------------------------------------


def test_incidents_lists_the_recent_ones_newest_first(clients, capsys) -> None:
    # Given two incidents in the last hours and one from three days ago
    _create_table(clients)
    store = JobStates(Store(clients.dynamodb, TABLE, 90))
    now = time.time()
    _open_incident(store, "gpt-small", now - 2 * HOUR, "hang", "no step for 32 min while GPUs stay busy")
    _open_incident(store, "bert-ft", now - 1 * HOUR, "idle", "all GPUs idle for 25 min")
    _open_incident(store, "old-job", now - 72 * HOUR, "crashed_rank", "NCCL timeout on algo-2")
    store.close_job(job_key("sagemaker", "gpt-small"), "job Stopped", now - HOUR)

    # When the operator lists the last 24 hours
    code, out, _ = _stallwatch(["incidents", "--since", "24h", "--table", TABLE], capsys)

    # Then both recent incidents show, newest first, with status, diagnosis and why; the old one does not
    assert code == 0
    assert "old-job" not in out
    assert out.index("bert-ft") < out.index("gpt-small")
    assert "all GPUs idle for 25 min" in out
    assert "closed" in out
    assert "job Stopped" in out
    assert "open" in out


def test_incidents_of_one_job(clients, capsys, monkeypatch) -> None:
    # Given incidents of two jobs, and the table named in the environment
    _create_table(clients)
    monkeypatch.setenv(ops.TABLE_ENV, TABLE)
    store = JobStates(Store(clients.dynamodb, TABLE, 90))
    now = time.time()
    _open_incident(store, "gpt-small", now - HOUR, "hang", "no step for 32 min")
    _open_incident(store, "bert-ft", now - HOUR, "idle", "all GPUs idle")

    # When the operator asks for one job
    code, out, _ = _stallwatch(["incidents", "--job", "gpt-small"], capsys)

    # Then only that job's incident shows
    assert code == 0
    assert "gpt-small" in out
    assert "bert-ft" not in out


# ---- status -----------------------------------------------------------------------------------------------------


def test_status_shows_the_latest_decision_why_and_where_each_rank_was(clients, capsys) -> None:
    # Given a job warned for a hang whose ranks' dumps put rank 1 in its loader (the engine's decision, audited as
    # the runtime audits it), then snoozed by an operator
    _create_table(clients)
    store = JobStates(Store(clients.dynamodb, TABLE, 90))
    lines = (Path(__file__).parents[1] / "core" / "stack_dumps" / "loader-stall.log").read_text().splitlines()
    signals = hung(hosts=1).stacks((ONSET + MIN, line) for line in lines).build(ONSET + 16 * MIN)
    decision = decide(signals, ENFORCE, JobState(), ONSET + 16 * MIN)
    key = job_key("sagemaker", "llama-8b")
    audit = {"at": decision.at, "job": "llama-8b", "diagnosis": decision.diagnosis.value}
    audit |= {"action": decision.action.value, "reasons": list(decision.reasons), "evidence": decision.evidence}
    store.commit(key, store.load(key), StoredState(JobState(stall_since=ONSET), None, "incident#1"), audit, decision.at)
    store.change_state(
        key, lambda s: s.snoozed(ONSET + HOUR), {"at": ONSET + 17 * MIN, "action": "snooze"}, ONSET + 17 * MIN, "cli#1"
    )

    # When the operator asks for its status
    code, out, _ = _stallwatch(["status", "llama-8b", "--table", TABLE], capsys)

    # Then the decision (not the snooze) shows, with its reasons and the ranks' places, rank 1 the odd one out
    assert code == 0
    assert "llama-8b (sagemaker): hang, warn" in out
    assert "rank 1 on vm in distributed_worker.py:135" in out
    assert "odd one out" in out
    assert "distributed_worker.py:135 __getitem__" in out
    assert "all_reduce seq 4" in out


def test_status_of_a_job_never_decided_says_so(clients, capsys) -> None:
    _create_table(clients)
    code, out, _ = _stallwatch(["status", "new-job", "--table", TABLE], capsys)
    assert code == 0
    assert "never decided" in out


# ---- snooze -----------------------------------------------------------------------------------------------------


def test_snooze_sets_the_jobs_snooze_and_audits_the_iam_caller(clients, capsys) -> None:
    # Given a running job with an open incident
    _create_table(clients)
    world = World(clients, now=time.time())
    world.create_job("gpt-small", tags={"stallwatch:mode": "enforce"})
    store = JobStates(Store(clients.dynamodb, TABLE, 90))
    _open_incident(store, "gpt-small", world.now - 600, "hang", "no step")

    # When the operator snoozes it for two hours
    code, out, _ = _stallwatch(["snooze", "gpt-small", "--for", "2h", "--table", TABLE], capsys)

    # Then the job's state carries the snooze (the incident and stall kept), audited with the caller's identity
    assert code == 0
    assert "snoozed until" in out
    stored = store.load(job_key("sagemaker", "gpt-small"))
    assert stored.state.snoozed_until == pytest.approx(world.now + 2 * HOUR, abs=60)
    assert stored.state.stall_since == pytest.approx(world.now - 600)
    assert stored.incident is not None
    audit = AuditTrail(store.store).records(job_key("sagemaker", "gpt-small"), "audit")[-1]["record"]
    assert (audit["trigger"], audit["action"]) == ("cli", "snooze")
    assert audit["operator"].startswith("arn:aws:")


def test_snooze_of_an_unknown_job_fails_and_writes_nothing(clients, capsys) -> None:
    # Given a deployment without a job called "gtp-small"
    _create_table(clients)

    # When the operator snoozes the typo
    code, _, err = _stallwatch(["snooze", "gtp-small", "--for", "1h", "--table", TABLE], capsys)

    # Then the command fails naming the job, and the table stays empty
    assert code == 2
    assert "gtp-small" in err
    assert clients.dynamodb.scan(TableName=TABLE)["Items"] == []


@pytest.mark.parametrize("duration", ["2 hours", "0h", "1w", "h"])
def test_snooze_rejects_a_bad_duration(capsys, duration: str) -> None:
    # When the duration is not like 30m, 2h or 7d; Then argparse refuses it, naming the value
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["snooze", "gpt-small", "--for", duration])
    assert exit_info.value.code == 2
    assert repr(duration) in capsys.readouterr().err


# ---- policy show ------------------------------------------------------------------------------------------------


def test_policy_show_applies_the_jobs_tags_on_the_config(clients, capsys, tmp_path: Path) -> None:
    # Given a config file and a job tagged for enforce, with 45-minute stalls and a bad idle-minutes tag
    config = tmp_path / "stallwatch.json"
    config.write_text(json.dumps(DEPLOYED))
    World(clients, now=0).create_job("gpt-small", tags=ENFORCE_45)

    # When the operator shows the job's effective policy
    effective, tags = ops.effective_policy(ops.Deployment(config_file=config), "gpt-small", ops.Platform.SAGEMAKER)
    rows = {setting: (value, source) for setting, value, source in ops.policy_rows(effective, tags)}
    code, out, _ = _stallwatch(["policy", "show", "gpt-small", "--config", str(config)], capsys)

    # Then each setting shows its value and where it comes from, and the bad tag is reported
    assert code == 0
    assert rows["mode"] == ("enforce", "tag")
    assert rows["may stop"] == ("true", "derived")
    assert rows["stall_minutes"] == ("45", "tag")
    assert rows["stop_grace_minutes"] == ("10", "config")
    assert rows["idle_minutes"] == ("15", "default")
    assert "tag ignored" in out
    assert "stallwatch:idle-minutes='[/soon]'" in out  # printed as written, never read as console markup


def test_policy_show_reads_the_deployed_config_and_table_from_the_stack(clients, capsys) -> None:
    # Given a deployed stack: its table and a function configured with STALLWATCH_CONFIG
    role = clients.session.client("iam").create_role(
        RoleName="stallwatch-fn", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    template = {
        "Resources": {
            "Table": {
                "Type": "AWS::DynamoDB::Table",
                "Properties": {
                    "TableName": TABLE,
                    "BillingMode": "PAY_PER_REQUEST",
                    "AttributeDefinitions": [
                        {"AttributeName": "pk", "AttributeType": "S"},
                        {"AttributeName": "sk", "AttributeType": "S"},
                    ],
                    "KeySchema": [
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                },
            },
            "OnAlarm": {
                "Type": "AWS::Lambda::Function",
                "Properties": {
                    "Runtime": "python3.12",
                    "Handler": "handlers.on_alarm.handler",
                    "Role": role,
                    "Code": {"ZipFile": "def handler(event, context):\n    return None\n"},
                    "Environment": {"Variables": {CONFIG_ENV: json.dumps(DEPLOYED), "TABLE_NAME": TABLE}},
                },
            },
        }
    }
    clients.session.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))

    # When the operator shows the deployed policy and the incidents without naming table or config
    policy_code, policy_out, _ = _stallwatch(["policy", "show"], capsys)
    incidents_code, incidents_out, _ = _stallwatch(["incidents"], capsys)

    # Then the stack's function gave the config, and its table the incidents
    assert (policy_code, incidents_code) == (0, 0)
    assert "observe" in policy_out
    assert "The policy deployed in stallwatch (no job tags)" in " ".join(policy_out.split())
    assert f"Incidents in {TABLE} (0)" in incidents_out


def test_policy_show_with_a_config_file_names_the_file_not_the_deployment(clients, capsys, tmp_path) -> None:
    # Given a config file on the laptop, and no stack at all
    config = tmp_path / "prod.json"
    config.write_text(json.dumps({"policy": {"mode": "observe"}}))

    # When the operator shows its policy
    code, out, _ = _stallwatch(["policy", "show", "--config", str(config)], capsys)

    # Then the table says whose policy it is: the file's, never "deployed"
    assert code == 0
    assert "".join(f"The policy of {config} (no job tags)".split()) in "".join(out.split())  # the title may wrap
    assert "deployed" not in out.lower()


@pytest.mark.parametrize("command", ["snooze", "incidents"])
def test_the_job_arguments_help_names_what_a_job_is_on_each_platform(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "with --platform ec2, an EC2 job's stallwatch:job tag" in text
    assert "EC2 instance id" not in text


def test_missing_stack_is_reported_in_one_line(clients, capsys) -> None:
    # Given no stack; When the operator lists incidents without --table
    code, _, err = _stallwatch(["incidents", "--stack", "NoSuchStack"], capsys)

    # Then the command fails naming the stack
    assert code == 2
    assert "NoSuchStack" in err


def test_profile_and_region_choose_the_account(clients, capsys, monkeypatch, tmp_path: Path) -> None:
    # Given the table only in eu-west-1, a default profile in us-east-1 and a profile "ml-prod" in eu-west-1
    _create_table(AwsClients(region="eu-west-1"))
    aws_config = tmp_path / "config"
    profile = "region = eu-west-1\naws_access_key_id = testing\naws_secret_access_key = testing\n"
    aws_config.write_text(f"[default]\nregion = us-east-1\n\n[profile ml-prod]\n{profile}")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(aws_config))
    monkeypatch.delenv("AWS_DEFAULT_REGION")  # it would override every profile's region

    # When the operator lists incidents with the profile, with the region, and with neither
    with_profile = _stallwatch(["incidents", "--table", TABLE, "--profile", "ml-prod"], capsys)[0]
    with_region = _stallwatch(["incidents", "--table", TABLE, "--region", "eu-west-1"], capsys)[0]
    default_code, _, err = _stallwatch(["incidents", "--table", TABLE], capsys)

    # Then the profile's and the region's calls find the table, and the default profile's do not
    assert (with_profile, with_region, default_code) == (0, 0, 2)
    assert "ResourceNotFoundException" in err
