"""The platform seam (docs/lambdas.md, "Platforms"): nothing outside the platforms' own modules names a platform.

A platform is its description (`stallwatch/core/platforms/`) and its adapter (`stallwatch/aws/platforms/`); the
engine, the store, the runtime, the offline commands and the handlers ask the registries and never branch on the
platform: no `Platform.EC2`, no comparison with a platform's name, no event type of one platform told apart from
another's. Read from the source of every module, as tests/test_layers.py reads the imports.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from stallwatch.aws import events
from stallwatch.aws.platforms import ADAPTERS
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.core.signals import JobStatus, Platform
from tests.test_layers import LAMBDAS, write_tree

# The modules that may name a platform: its own, the registries, and the enum.
PLATFORM_MODULES = ("stallwatch/core/platforms/", "stallwatch/aws/platforms/")
ENUM_MODULE = "stallwatch/core/signals.py"


def platform_references(path: Path, relative: str) -> list[str]:
    """Where the module at `path` names a platform: a `Platform` member, or a comparison with a platform's value."""
    members = {p.name for p in Platform}
    values = {p.value for p in Platform}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "Platform" and node.attr in members:
                found.append(f"{relative}:{node.lineno}: Platform.{node.attr}")
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Constant) and operand.value in values:
                    found.append(f"{relative}:{node.lineno}: compared with {operand.value!r}")
    return found


def branches(root: Path) -> list[str]:
    """Every reference to a platform outside the platforms' modules, under `root` (the Lambda asset)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(PLATFORM_MODULES) or relative == ENUM_MODULE:
            continue
        found += platform_references(path, relative)
    return found


def test_a_runtime_module_branching_on_the_platform_is_caught(tmp_path: Path) -> None:
    # Given a tree whose sweep branches on EC2, whose store compares a key's platform with "sagemaker", and whose
    # adapter (allowed) names its platform
    write_tree(
        tmp_path,
        {
            "stallwatch/runtime/sweep.py": "def f(p):\n    if p is Platform.EC2:\n        return 1\n",
            "stallwatch/aws/store.py": "def g(key):\n    return key.split('#')[1] == 'sagemaker'\n",
            "stallwatch/aws/platforms/ec2.py": "platform = Platform.EC2\n",
            "stallwatch/core/signals.py": "class Platform:\n    EC2 = 'ec2'\n",
        },
    )
    # When the tree is read, Then both branches are named, and neither the adapter nor the enum
    assert branches(tmp_path) == [
        "stallwatch/aws/store.py:2: compared with 'sagemaker'",
        "stallwatch/runtime/sweep.py:2: Platform.EC2",
    ]


def test_nothing_outside_the_platforms_modules_names_a_platform() -> None:
    assert branches(LAMBDAS) == []


def status_words(path: Path, relative: str) -> list[str]:
    """Where the module at `path` compares a job's status with a word of it (`facts.status == "InProgress"`), or
    keeps one as a constant of its own (`RUNNING = "InProgress"`), not `JobStatus`: only the adapters map a
    platform's words."""
    words = {s.value for s in JobStatus}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        f"{relative}:{node.lineno}: {node.value.value!r} kept as a constant"
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in words
    ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = (node.left, *node.comparators)
        if not any(isinstance(o, ast.Attribute) and o.attr == "status" for o in operands):
            continue
        for operand in operands:
            literals = operand.elts if isinstance(operand, (ast.Set, ast.Tuple, ast.List)) else [operand]
            named = [c.value for c in literals if isinstance(c, ast.Constant) and c.value in words]
            found += [f"{relative}:{node.lineno}: status compared with {word!r}" for word in named]
    return found


def status_readers(root: Path) -> list[str]:
    """Every status word read outside the platforms' modules, under `root` (the Lambda asset)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if not relative.startswith(PLATFORM_MODULES):
            found += status_words(path, relative)
    return found


def test_a_status_compared_with_a_platforms_word_is_caught(tmp_path: Path) -> None:
    # Given a tree whose runtime compares a job's status with SageMaker's words, and whose adapter (allowed) does too
    write_tree(
        tmp_path,
        {
            "stallwatch/runtime/sweep.py": "def f(facts):\n    return facts.status in ('Stopped', 'Failed')\n",
            "stallwatch/runtime/decide.py": (
                "RUNNING = 'InProgress'\ndef g(facts):\n    return facts.status != 'InProgress'\n"
            ),
            "stallwatch/aws/platforms/sagemaker.py": "def h(job):\n    return job.status == 'Stopping'\n",
        },
    )
    # When the tree is read, Then the runtime's comparisons are named, and not the adapter's
    assert status_readers(tmp_path) == [
        "stallwatch/runtime/decide.py:1: 'InProgress' kept as a constant",
        "stallwatch/runtime/decide.py:3: status compared with 'InProgress'",
        "stallwatch/runtime/sweep.py:2: status compared with 'Stopped'",
        "stallwatch/runtime/sweep.py:2: status compared with 'Failed'",
    ]


def test_nothing_above_the_adapters_reads_a_platforms_status_words() -> None:
    assert status_readers(LAMBDAS) == []


def test_every_platform_has_a_description_and_an_adapter_that_implements_the_interface() -> None:
    assert set(DESCRIPTIONS) == set(ADAPTERS) == set(Platform)
    operations = [
        name for name in vars(PlatformAdapter) if not name.startswith("_") and callable(getattr(PlatformAdapter, name))
    ]
    for platform, adapter in ADAPTERS.items():
        assert adapter.platform is platform
        assert adapter.description is DESCRIPTIONS[platform]
        assert [name for name in operations if not callable(getattr(adapter, name, None))] == [], adapter.__name__


def test_every_platforms_state_event_is_one_the_handler_parses() -> None:
    handled = set(events.JobStateEvent.__origin__.__args__)  # type: ignore[attr-defined]
    # an adapter's state events: one model, or a union of them (Slurm's job events and HyperPod's node health)
    models = {m for adapter in ADAPTERS.values() for m in typing.get_args(adapter.state_event) or [adapter.state_event]}
    assert models == handled


def test_no_adapter_reads_the_environment() -> None:
    # Given every adapter module (and their base), Then none imports `os`: an adapter's settings come with its
    # construction (`aws.platforms.adapter`: config, store, clock and the deployment's documents), one way
    adapters = [*sorted((LAMBDAS / "stallwatch/aws/platforms").glob("*.py")), LAMBDAS / "stallwatch/aws/source.py"]
    found = [
        f"{path.relative_to(LAMBDAS).as_posix()}:{node.lineno}"
        for path in adapters
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import) and any(alias.name == "os" for alias in node.names)
    ]
    assert found == []
