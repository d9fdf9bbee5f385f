"""The README and docs/ run as written: every fenced block marked for it is run (or, for a config, validated), and a
block that breaks fails here; the defaults the docs quote are the code's.

A marker is an HTML comment on the line before the fence (Markdown renders nothing of it):

    <!-- offline -->                      a ```bash or ```python block, run as it is
    <!-- offline with training-loop -->   a ```python block, run after the named preamble (`PREAMBLES`)
    <!-- offline: config -->             a ```json block: a StallwatchConfig, or a cdk.json whose context holds one
    <!-- output: <command> (...) -->     a block quoting what `command` prints: it is run, and its lines must be the
                                          block's, each … in them standing for any text (an id)

Bash blocks run with `bash -euo pipefail` in one folder shared by the module (the repository's corpus, examples and
deploy linked in, the CLI's virtualenv first on PATH, no AWS credentials); Python blocks in a fresh interpreter there.
Unmarked blocks are not run: they need an account, a GPU or minutes (the tests named beside them cover those).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stacks.constants import INSTANCE_STREAMS
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.policy import Policy, Thresholds
from stallwatch.core.signals import Platform

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"^\s*<!--\s*offline(?:\s+with\s+(?P<preamble>[a-z-]+)|:\s*(?P<config>config))?\s*-->\s*$")
FENCE = re.compile(r"^\s*```(?P<lang>\w*)\s*$")
OUTPUT_MARKER = re.compile(r"^\s*<!--\s*output:\s*(?P<command>[^(]+?)\s*(?:\(.*\))?\s*-->\s*$")
ELIDED = "…"  # in a quoted output: any text
OUTPUT_TIMEOUT_S = 600
OUTPUT_COLUMNS = "1000"  # rich wraps at the terminal's width: none here
LINKED = ("corpus", "examples", "deploy", "trainer_agent")  # what the blocks read, by relative path
JSII_PACKAGE_CACHE = Path(".cache", "aws", "jsii", "package-cache")  # under the home (jsii's default on Linux)
BLOCK_TIMEOUT_S = 120

# Names a snippet uses without defining them, as a training script would have them.
PREAMBLES = {
    "training-loop": """
class Tokens(list):
    def numel(self):
        return sum(len(row) for row in self)
flops_per_token = 6 * 1_000_000
loader = [{"input_ids": Tokens([[1] * 16, [2] * 16])} for _ in range(3)]
def train_step(batch):
    return 2.5
def save_checkpoint():
    pass
""",
    "gpt-model": """
import sys, torch
sys.path.insert(0, "examples")
from gpt import GPT, GPTConfig
model = GPT(GPTConfig())
input_ids = torch.randint(0, 256, (2, 64))
labels = torch.randint(0, 256, (2, 64))
""",
}


@dataclass(frozen=True)
class Block:
    """A marked fenced block: where it is, its language, its text, and its marker's preamble or config kind."""

    document: Path
    line: int
    lang: str
    text: str
    preamble: str | None = None
    config: bool = False

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def marked_blocks(path: Path, marker: re.Pattern[str] = MARKER) -> list[tuple[re.Match[str], Block]]:
    """Every block of `path` that `marker` marks, with the marker's match; a marker not followed by a fence is an
    error, never a silent skip."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for index, line in enumerate(lines):
        found = marker.match(line)
        if found is None:
            continue
        fence = FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if fence is None:
            raise AssertionError(f"{path.name}:{index + 1}: a marker must be right before a fence")
        end = next(i for i in range(index + 2, len(lines)) if lines[i].strip().startswith("```"))
        indent = len(lines[index + 1]) - len(lines[index + 1].lstrip())
        body = "\n".join(text[indent:] for text in lines[index + 2 : end])
        preamble = found.groupdict().get("preamble")
        blocks.append(
            (found, Block(path, index + 2, fence["lang"], body, preamble, bool(found.groupdict().get("config"))))
        )
    return blocks


BLOCKS = [block for document in DOCUMENTS for _, block in marked_blocks(document)]
OUTPUTS = [
    (found["command"], block) for document in DOCUMENTS for found, block in marked_blocks(document, OUTPUT_MARKER)
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every block: the repository's inputs linked in, outputs written there."""
    folder = tmp_path_factory.mktemp("docs")
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    return folder


def _environment(workdir: Path) -> dict[str, str]:
    """This interpreter's virtualenv first on PATH; no AWS account reachable; plots drawn off screen; a home of its
    own, with the user's jsii package cache (CDK's node runtime unpacks aws-cdk-lib there once, not per command)."""
    jsii_cache = {"JSII_RUNTIME_PACKAGE_CACHE_ROOT": str(Path.home() / JSII_PACKAGE_CACHE)}
    keep = jsii_cache | {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return keep | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(workdir),
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",  # torch on a shared machine
        "COLUMNS": "200",
    }


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.config], ids=lambda b: b.name)
def test_a_marked_command_or_snippet_runs_as_written(block: Block, workdir: Path) -> None:
    if block.lang == "bash":
        command = ["bash", "-euo", "pipefail", "-c", block.text]
    elif block.lang == "python":
        command = [sys.executable, "-c", PREAMBLES[block.preamble] + block.text if block.preamble else block.text]
    else:
        raise AssertionError(f"{block.name}: only bash and python blocks run, not {block.lang!r}")
    ran = subprocess.run(
        command, cwd=workdir, env=_environment(workdir), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    assert ran.returncode == 0, (
        f"{block.name} failed ({ran.returncode}):\n{block.text}\n{ran.stdout[-2000:]}\n{ran.stderr[-3000:]}"
    )


@pytest.mark.parametrize(("command", "block"), OUTPUTS, ids=[block.name for _, block in OUTPUTS])
def test_a_quoted_output_is_what_its_command_prints(command: str, block: Block, workdir: Path) -> None:
    # When the quoted command runs (the checkout's CLI, no account)
    ran = subprocess.run(
        shlex.split(command),
        cwd=workdir,
        env=_environment(workdir) | {"COLUMNS": OUTPUT_COLUMNS},
        capture_output=True,
        text=True,
        timeout=OUTPUT_TIMEOUT_S,
    )
    assert ran.returncode == 0, f"{command} failed ({ran.returncode}):\n{ran.stdout[-2000:]}\n{ran.stderr[-3000:]}"

    # Then it printed the quoted lines, one for one
    printed, quoted = ran.stdout.splitlines(), block.text.splitlines()
    differ = [(q, p) for q, p in itertools.zip_longest(quoted, printed, fillvalue="") if not _same_line(q, p)]
    assert differ == [], f"{block.name}: the quoted output is not what `{command}` prints (quoted, printed): {differ}"


def _same_line(quoted: str, printed: str) -> bool:
    """Whether `printed` is the `quoted` line, each … of it standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in quoted.rstrip().split(ELIDED))
    return re.fullmatch(pattern, printed.rstrip()) is not None


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.config], ids=lambda b: b.name)
def test_a_marked_config_is_one_the_stack_accepts(block: Block) -> None:
    document = json.loads(block.text if block.text.lstrip().startswith("{") else "{" + block.text + "}")
    config = document.get("context", {}).get("stallwatch", document.get("stallwatch", document))
    StallwatchConfig.model_validate(config)


def test_the_docs_mark_the_blocks_a_newcomer_runs_first() -> None:
    # The marker must keep working: the README's loop, the agent's, a backtest of the corpus, the deploy's configs
    marked = {block.document.name for block in BLOCKS}
    assert {"README.md", "agent.md", "backtest.md", "deploy.md", "operators.md"} <= marked
    assert sum(block.config for block in BLOCKS) >= 3


# Where the docs quote a default: "`straggler_ratio` (1.2 by default)".
QUOTED_DEFAULT = re.compile(r"`(?P<field>[a-z_]+)` \((?P<value>[^()\s]+) by default\)")


def test_every_default_the_docs_quote_is_the_codes() -> None:
    defaults = Thresholds().model_dump() | Policy().model_dump() | StallwatchConfig().model_dump()
    quoted = [
        (path.name, match["field"], match["value"])
        for path in DOCUMENTS
        for match in QUOTED_DEFAULT.finditer(" ".join(path.read_text(encoding="utf-8").split()))
    ]
    assert quoted, "the docs quote no default: the pattern no longer matches how they write one"
    wrong = [(doc, field, value) for doc, field, value in quoted if not _same(defaults.get(field), value.strip("`"))]
    assert wrong == []


def _same(default: object, quoted: str) -> bool:
    if isinstance(default, bool) or not isinstance(default, int | float):
        return str(default).lower() == quoted.lower()
    try:
        return float(quoted) == float(default)
    except ValueError:
        return False


def test_the_readmes_fault_mix_figures_are_the_benchmarks_ones() -> None:
    # Given docs/benchmarks.md's fault mix: its first table's rows (group -> stalls, stopped, recall, p50, p95)
    fault_mix = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split("## Fault mix", 1)[1]
    table = fault_mix.split("| group |", 1)[1].split("\n\n", 1)[0]
    rows = {
        cells[0]: cells[1:]
        for line in table.splitlines()[2:]
        if (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    stalls, _, _, p50, _ = rows["all"]
    with_agent, without = rows["with the agent"][4], rows["without the agent"][4]

    # Then the README says the same
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"all {stalls} stalls that leave the job running are stopped, {p50} minutes after their onset" in readme
    assert f"({with_agent} at p95 with the agent, {without} without)" in readme


def test_the_clis_platform_flag_names_every_platform() -> None:
    [row] = [line for line in (ROOT / "docs" / "operators.md").read_text(encoding="utf-8").splitlines()
             if line.startswith("| `--platform` |")]  # fmt: skip
    assert [platform for platform in Platform if f"`{platform}`" not in row] == []


def test_the_security_section_says_who_writes_each_input_and_quotes_the_policy_as_the_stack_grants_it() -> None:
    # Given deploy.md's "Who can write what"
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("### Who can write what", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]

    # Then it has a row per input a decision reads, and says who writes each of a Slurm job's inputs: its lines, its
    # events, its commands, HyperPod's words
    inputs = [row.split("|")[1].strip() for row in rows[1:]]
    for name in ("logs", "Metrics", "Events", "Slack presses", "Tags"):
        assert any(name in cell for cell in inputs), name
    slurm = section.split("**Slurm.**", 1)[1]
    for name in ("*A job's lines.*", "*Job events.*", "*Commands.*", "*HyperPod's words.*"):
        assert name in slurm, name
    assert "stallwatch:slurm=controller" in slurm
    # And what it says IAM grants the nodes is what the stack grants
    assert f"`log-stream:{INSTANCE_STREAMS}`" in text
    assert "`cloudwatch:namespace`" in section
