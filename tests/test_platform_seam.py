"""The platform seam (docs/lambdas.md, "Platforms"): nothing outside the platforms' own modules names a platform.

A platform is its description (`stallwatch/core/platforms/`), its adapter (`stallwatch/aws/platforms/`), its part of
the stack (`stacks/platforms/`) and its settings (`platforms.<name>` in the config, its description's sub-model); the
engine, the store, the runtime, the offline commands, the handlers, the stacks and the config ask the registries and
never branch on the platform: no `Platform.EC2`, no comparison with a platform's name, no setting of one platform read
by name (`monitor_ec2`, `platforms.slurm`, `log_subscriptions.ec2`, `watches("slurm")`), no event type of one platform
told apart from another's. Read from the source of every module, as tests/test_layers.py reads the imports.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from stacks.platforms import part_of
from stallwatch.aws import events
from stallwatch.aws.platforms import ADAPTERS
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.core.policy import Policy
from stallwatch.core.signals import JobStatus, Platform
from tests.test_layers import LAMBDAS, ROOT, write_tree

# The modules that may name a platform: its own, the registries, and the enum (under the Lambda asset, and the stacks).
PLATFORM_MODULES = ("stallwatch/core/platforms/", "stallwatch/aws/platforms/", "stacks/platforms/")
ENUM_MODULE = "stallwatch/core/signals.py"
# The config's accessors of one platform's settings (`StallwatchConfig`, `PlatformsSettings`): called with a name.
SETTING_READERS = {"watches", "subscribes", "log_group", "of"}
# The settings' containers, read by platform: `config.platforms.ec2`, last release's `config.log_subscriptions.ec2`.
SETTINGS = {"platforms", "log_subscriptions"}


def platform_references(path: Path, relative: str) -> list[str]:
    """Where the module at `path` names a platform: a `Platform` member, a comparison with a platform's value, or one
    platform's setting read by name (`monitor_<platform>`, `platforms.<platform>`, `watches("<platform>")`)."""
    members = {p.name for p in Platform}
    values = {p.value for p in Platform}
    monitors = {f"monitor_{value}" for value in values}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        is_member = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in members
        if is_member and node.value.id == "Platform":
            found.append(f"{relative}:{node.lineno}: Platform.{node.attr}")
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Constant) and operand.value in values:
                    found.append(f"{relative}:{node.lineno}: compared with {operand.value!r}")
        named = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if named is None and isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = node.value
        if named in monitors:
            found.append(f"{relative}:{node.lineno}: the setting {named}")
        if isinstance(node, ast.Attribute) and node.attr in values:
            container = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", None)
            if container in SETTINGS:
                found.append(f"{relative}:{node.lineno}: the setting {container}.{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SETTING_READERS:
            named_platform = [a.value for a in node.args if isinstance(a, ast.Constant) and a.value in values]
            found += [f"{relative}:{node.lineno}: {node.func.attr}({value!r})" for value in named_platform]
    return found


def branches(root: Path, folders: tuple[str, ...] = ("stallwatch", "handlers")) -> list[str]:
    """Every reference to a platform outside the platforms' modules, in `folders` under `root` (the Lambda asset, or
    the repository's stacks and CDK app)."""
    found = []
    paths = sorted(p for folder in folders for p in (root / folder).rglob("*.py")) if folders else []
    for path in paths:
        relative = path.relative_to(root).as_posix()
        if relative.startswith(PLATFORM_MODULES) or relative == ENUM_MODULE:
            continue
        found += platform_references(path, relative)
    return found


def test_a_stack_or_doctor_branching_on_a_platforms_settings_is_caught(tmp_path: Path) -> None:
    # Given a stack that builds Slurm's documents when monitor_slurm holds, a subscription read by platform, a
    # doctor that reads EC2's settings and asks whether Slurm is watched, and a platform's part (allowed) that does
    write_tree(
        tmp_path,
        {
            "stacks/stallwatch_stack.py": "if config.policy.monitor_slurm:\n    build()\n",
            "stacks/log_subscriptions.py": "if config.log_subscriptions.ec2:\n    subscribe()\n",
            "stallwatch/offline/doctor.py": "s = config.platforms.ec2\nif config.watches('slurm'):\n    check()\n",
            "stacks/platforms/slurm.py": "if config.watches('slurm') and config.platforms.slurm.log_subscription:\n"
            "    build()\n",
        },
    )
    # When the trees are read, Then each branch is named, and not the platform's own part
    assert branches(tmp_path, ("stacks", "stallwatch")) == [
        "stacks/log_subscriptions.py:1: the setting log_subscriptions.ec2",
        "stacks/stallwatch_stack.py:1: the setting monitor_slurm",
        "stallwatch/offline/doctor.py:1: the setting platforms.ec2",
        "stallwatch/offline/doctor.py:2: watches('slurm')",
    ]


def test_the_stacks_and_the_cdk_app_name_no_platform_outside_their_parts() -> None:
    assert branches(ROOT, ("stacks",)) == []
    assert platform_references(ROOT / "app.py", "app.py") == []


def test_the_config_names_no_platform_but_through_the_registry() -> None:
    # The config's and the policy's own fields name no platform (but `ec2_log_group`, the training nodes' group, EC2's
    # and Slurm's nodes' alike); each platform's settings are its description's sub-model, under `platforms.<name>`
    values = {p.value for p in Platform}
    fields = [*StallwatchConfig.model_fields, *Policy.model_fields]
    assert [f for f in fields if any(v in f.split("_") for v in values)] == ["ec2_log_group"]
    platforms = type(StallwatchConfig().platforms)
    assert {name: model.annotation for name, model in platforms.model_fields.items()} == {
        p.value: d.settings for p, d in DESCRIPTIONS.items()
    }


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


def test_every_platform_has_a_description_an_adapter_that_implements_the_interface_and_a_part_of_the_stack() -> None:
    assert set(DESCRIPTIONS) == set(ADAPTERS) == set(Platform)
    assert [part_of(p.value).name for p in Platform] == [p.value for p in Platform]
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
