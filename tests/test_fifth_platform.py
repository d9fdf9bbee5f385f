"""The platform seam's proof: a test-only fifth platform is its own files, one per layer, under the platform folders
(`core/platforms/`, `aws/platforms/`, `stacks/platforms/`; its settings its description's sub-model), plus one line in
each registry (the `Platform` enum, `core.platforms.PLATFORMS`); and it works: a copy of the repository with it
decides and stops one of its jobs through the real runtime, reads its settings from the config, and synthesizes the
stack with its rule and grants, nothing else touched (docs/lambdas.md, "Adding a platform").
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layers import ROOT
from tests.test_platform_seam import branches

# The fifth platform's files, each where its layer keeps platforms.
FILES = {
    "lambdas/stallwatch/core/platforms/fifth.py": '''"""A test-only platform (tests/test_fifth_platform.py): jobs
`job-<n>`, hosts node-1..N, read from the agent."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from pydantic import Field

from stallwatch.core.platforms.interface import (
    MetricMath,
    PlatformDescription,
    PlatformSettings,
    SeriesReader,
    agent_metric,
)
from stallwatch.core.reading import HOST_AGENT_METRICS_READ
from stallwatch.core.signals import JobFacts, Platform, Series


class FifthSettings(PlatformSettings):
    """`platforms.fifth`: off until turned on; no log group of its own to subscribe."""

    monitor: bool = Field(False, description="Watch the fifth platform's jobs.")
    log_subscription: bool = Field(False, description="It has no log group.")


class FifthDescription(PlatformDescription):
    platform = Platform.FIFTH
    label = "Fifth"
    job_kind = "a fifth-platform job"
    job_name = re.compile(r"^job-[0-9]{1,6}\\Z")
    resource = "a fifth-platform job"
    settings = FifthSettings
    host_agent_metrics = HOST_AGENT_METRICS_READ

    def hosts(self, instance_count: int, instance_ids: Sequence[str]) -> list[str]:
        return [f"node-{i}" for i in range(1, instance_count + 1)]

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        return agent_metric(facts, host, "AcceleratorUtilization", "GPU utilization (the agent's)")

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        return agent_metric(facts, host, "AcceleratorMemoryUtilization", "GPU memory (the agent's)")

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        return None

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        return {"gpu_util": Series(), "gpu_mem_util": Series(), "cpu_util": Series()}


DESCRIPTION = FifthDescription()
''',
    "lambdas/stallwatch/aws/platforms/fifth_events.py": '''"""The test-only platform's state-change event."""

from __future__ import annotations

from typing import Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import Field

from stallwatch.aws.event_fields import EventFields


class FifthJobDetail(EventFields):
    job: str = Field(pattern=r"^job-[0-9]{1,6}$")


class FifthJobStateChange(EventBridgeModel):
    source: Literal["test.fifth"]
    detail_type: Literal["Fifth Job State Change"] = Field(alias="detail-type")
    detail: FifthJobDetail
''',
    "lambdas/stallwatch/aws/platforms/fifth.py": '''"""The test-only platform's adapter: its jobs' signals are what the
test puts in `JOBS` (a job's signals at a time), its stops are recorded in `STOPPED`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from stallwatch.aws.log_reads import HostLog
from stallwatch.aws.metric_reads import MetricQuery
from stallwatch.aws.platforms.fifth_events import FifthJobStateChange
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads
from stallwatch.core.goodput import JobSpan
from stallwatch.core.platforms.fifth import DESCRIPTION
from stallwatch.core.platforms.interface import (
    AuditTrail,
    Change,
    JobChange,
    JobHistory,
    Node,
    RestartHistory,
    ResumeResult,
    ResumeVerdict,
    StopResult,
)
from stallwatch.core.resume import NoResume, ResumePlan, StopRecord
from stallwatch.core.signals import JobFacts, JobSignals, Platform, Series

JOBS: dict[str, Callable[[float], JobSignals]] = {}
STOPPED: list[str] = []


class FifthPlatform(AwsSignalSource):
    platform = Platform.FIFTH
    description = DESCRIPTION
    state_event = FifthJobStateChange
    state_rule = "Fifth job states rule"

    def _signals(self, job: str, now: float) -> JobSignals:
        if job not in JOBS:
            raise JobNotFoundError(f"no fifth-platform job {job!r}")
        return JOBS[job](now)

    def facts(self, job_name: str) -> JobFacts:
        return self._signals(job_name, self.clock()).facts

    def job_signals(
        self, job_name: str, now: float, freshness: dict[str, float] | None = None, facts: JobFacts | None = None
    ) -> JobSignals:
        return self._signals(job_name, now)

    def many_job_signals(
        self,
        job_names: Iterable[str],
        now: float,
        freshness: dict[str, dict[str, float]] | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> dict[str, JobSignals]:
        return {job: self._signals(job, now) for job in job_names}

    def stop(self, facts: JobFacts) -> StopResult:
        STOPPED.append(facts.name)
        return StopResult(ok=True, detail=f"stopped {facts.name}")

    def running_jobs(self, now: float) -> dict[str, JobFacts | None]:
        return {job: None for job in JOBS}

    def newest_log_lines(self, jobs: dict[str, JobFacts | None], now: float) -> list[tuple[str, str, float]]:
        return []

    def job_change(self, event: FifthJobStateChange) -> JobChange:
        return JobChange(Change.STARTED, event.detail.job, "running")

    def plan_resume(self, name: str, stop: StopRecord, max_restarts: int, history: RestartHistory) -> ResumeVerdict:
        return ResumeVerdict(NoResume("a fifth-platform job is never resumed", alert=False))

    def start_attempt(self, plan: ResumePlan) -> ResumeResult:
        raise NotImplementedError

    def run_end(self, facts: JobFacts) -> float | None:
        return None

    def run_spans(self, store: AuditTrail | None, job: str, now: float, period: int) -> tuple[str, list[JobSpan]]:
        raise NotImplementedError

    def nodes(self, job: str) -> list[Node]:
        raise NotImplementedError

    def history(self, job: str) -> JobHistory:
        raise NotImplementedError

    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        return reads

    def _platform_series(
        self,
        facts: JobFacts,
        host: str,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        per_host: dict[MetricQuery, dict[str, Series]],
    ) -> dict[str, Series]:
        return {}

    def _host_logs(self, facts: JobFacts, hosts: list[str], *args: Any, **kwargs: Any) -> dict[str, HostLog]:
        return {}


ADAPTER = FifthPlatform
''',
    "stacks/platforms/fifth.py": '''"""The test-only platform's part of the stack: its events' rule, reading its
jobs."""

from __future__ import annotations

from aws_cdk import aws_iam as iam

from stacks.platforms.base import PlatformStack, StateRule, in_this_region, state_rule


class FifthStack(PlatformStack):
    name = "fifth"

    def read_jobs(self) -> list[iam.PolicyStatement]:
        return [in_this_region("ReadFifthJobs", ["ec2:DescribeTags"])]

    def state_rule(self) -> StateRule:
        return state_rule("FifthJobState", "test.fifth", "Fifth Job State Change", "Stallwatch: the fifth's jobs")


PART = FifthStack
''',
}
# One line in each registry: (the file, the line after which it goes, the line).
REGISTRY_LINES = (
    ("lambdas/stallwatch/core/signals.py", '    SLURM = "slurm"\n', '    FIFTH = "fifth"\n'),
    ("lambdas/stallwatch/core/platforms/__init__.py", '    "slurm",\n', '    "fifth",\n'),
)
PLATFORM_FOLDERS = ("lambdas/stallwatch/core/platforms/", "lambdas/stallwatch/aws/platforms/", "stacks/platforms/")
COPIED = ("lambdas", "stacks")  # the rest of the repository is read, never written: linked
LINKED = ("deploy", "trainer_agent", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "cdk.json", "localrun")

# The decision and the synth, run in the copy (its `stallwatch` and `stacks` first on the path).
SCRIPT = """
import json, os, sys, tempfile, warnings
from pathlib import Path
import boto3, moto
from localrun.resources import create_table
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.signals import Platform
from tests.core.signals_builder import SignalsBuilder

config = StallwatchConfig.model_validate({"platforms": {"fifth": {"monitor": True}}})
out = {"watches": config.watches("fifth"), "default": StallwatchConfig().watches("fifth")}
with moto.mock_aws():
    create_table(boto3.client("dynamodb"), "fifth-table")
    secret = boto3.client("secretsmanager").create_secret(
        Name="slack", SecretString=json.dumps({"webhook_url": "http://127.0.0.1:9/unreachable"})
    )
    os.environ.update(
        TABLE_NAME="fifth-table", SLACK_SECRET_ARN=secret["ARN"], STALLWATCH_CONFIG=config.model_dump_json()
    )
    from stallwatch.aws.platforms import fifth
    from stallwatch.runtime.decide import decide_and_act
    from stallwatch.runtime.environment import Runtime

    hour = 3600.0
    hung = (
        SignalsBuilder(hosts=2, platform=Platform.FIFTH, name="job-1", tags={"stallwatch:mode": "enforce"})
        .progress(0, hour).no_progress(hour, 3 * hour).gpu(0, 3 * hour, 99.0)
        .power(0, hour, 350.0).power(hour, 3 * hour, 110.0).logs(0, hour, 30)
    )
    fifth.JOBS["job-1"] = hung.build
    rt = Runtime.from_env()
    source = rt.source(Platform("fifth"))
    first = decide_and_act(source.job_signals("job-1", 2 * hour), rt, trigger="test")
    second = decide_and_act(source.job_signals("job-1", 2 * hour + 900), rt, trigger="test")
    out |= {"actions": [first.action, second.action], "stopped": fifth.STOPPED, "adapter": type(source).__name__}

from tests.stacks.conftest import build_app
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    app, [stack] = build_app(Path(tempfile.mkdtemp()), stallwatch={"platforms": {"fifth": {"monitor": True}}})
    template = app.synth().get_stack_by_name(stack.stack_name).template
rules = [r for r in template["Resources"].values() if r["Type"] == "AWS::Events::Rule"]
out["rule"] = [r["Properties"]["EventPattern"] for r in rules if "test.fifth" in json.dumps(r)]
statements = [
    s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
    for s in r["Properties"]["PolicyDocument"]["Statement"]
]
out["grants"] = sorted({s["Sid"] for s in statements if s.get("Sid") == "ReadFifthJobs"})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def repository_with_a_fifth_platform(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's code with the fifth platform: its files, and one line in each registry."""
    copy = tmp_path_factory.mktemp("fifth")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "cdk.out")
    for name in COPIED:
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    for name in LINKED:
        (copy / name).symlink_to(ROOT / name)
    (copy / "tests").symlink_to(ROOT / "tests")
    for name, text in FILES.items():
        (copy / name).write_text(text)
    for name, after, line in REGISTRY_LINES:
        path = copy / name
        source = path.read_text()
        assert source.count(after) == 1, name
        path.write_text(source.replace(after, after + line))
    return copy


def test_the_fifth_platform_touches_nothing_but_its_files_and_one_registry_line_each(
    repository_with_a_fifth_platform: Path,
) -> None:
    copy = repository_with_a_fifth_platform
    changed, added = [], []
    for name in COPIED:
        for path in sorted((copy / name).rglob("*.py")):
            relative = path.relative_to(copy).as_posix()
            original = ROOT / relative
            if not original.exists():
                added.append(relative)
                continue
            diff = [
                d
                for d in difflib.unified_diff(original.read_text().splitlines(), path.read_text().splitlines(), n=0)
                if d[:1] in "+-" and not d.startswith(("+++", "---"))
            ]
            if diff:
                changed.append((relative, diff))
    # Then the platform's own files are all under the platform folders, and the rest is one added line a registry
    assert sorted(added) == sorted(FILES)
    assert all(name.startswith(PLATFORM_FOLDERS) for name in added)
    assert changed == [(name, [f"+{line.rstrip()}"]) for name, _, line in sorted(REGISTRY_LINES)]
    # And nothing outside the platform folders names the new platform either
    assert branches(copy / "lambdas") == []
    assert branches(copy, ("stacks",)) == []


@pytest.mark.slow
def test_a_fifth_platforms_job_is_decided_and_stopped_through_the_runtime_and_its_part_of_the_stack_synthesized(
    repository_with_a_fifth_platform: Path,
) -> None:
    copy = repository_with_a_fifth_platform
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "PYTHONPATH": os.pathsep.join([str(copy / "lambdas"), str(copy), str(ROOT)]),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "POWERTOOLS_METRICS_DISABLED": "1",
    }
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=copy, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    # Then its settings are read from the config (off by default), its adapter is the registry's, and the hung job
    # was warned, then stopped through its adapter
    assert (out["watches"], out["default"], out["adapter"]) == (True, False, "FifthPlatform")
    assert out["actions"] == ["warn", "stop"]
    assert out["stopped"] == ["job-1"]
    # And the stack has its events' rule to on_job_state, and its grant
    assert out["rule"] == [{"source": ["test.fifth"], "detail-type": ["Fifth Job State Change"]}]
    assert out["grants"] == ["ReadFifthJobs"]
