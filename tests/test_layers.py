"""The rooms and their one-way doors, read from the imports of every module (../shared/HOUSE.md).

handlers → runtime → aws → core; offline → (aws, core); stacks → core's config schema and contract only;
core is pure (no boto3, no I/O, no clock); trainer_agent imports nothing of the control plane; no import circle.
Every import counts, also one inside a function.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAMBDAS = ROOT / "lambdas"

# What each room may import of the control plane (itself included).
DOORS = {
    "core": {"core"},
    "aws": {"core", "aws"},
    "runtime": {"core", "aws", "runtime"},
    "offline": {"core", "aws", "offline"},
    "handlers": {"core", "aws", "runtime"},
}
# Pure means none of these in core: AWS and Slack clients, terminals, files, sockets, processes, clocks.
CORE_FORBIDDEN = {
    "boto3",
    "botocore",
    "aws_lambda_powertools",
    "slack_sdk",
    "rich",
    "os",
    "io",
    "pathlib",
    "shutil",
    "socket",
    "http",
    "urllib",
    "subprocess",
    "threading",
    "time",
    "random",
}
# The CLI's libraries, not in the Lambda asset (lambdas/requirements.txt): only the laptop's room may import them.
OFFLINE_ONLY = {"rich", "matplotlib"}
STACKS_MAY_IMPORT = {"stallwatch.core.config", "stallwatch.core.contract", "stallwatch.core.policy"}
CONTROL_PLANE = ("stallwatch", "handlers", "stacks")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules `path` imports, anywhere in it; `from pkg import mod` counts as `pkg.mod` when that is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(names & known or {node.module})
    return found


def import_graph(root: Path, packages: tuple[str, ...] = ("stallwatch", "handlers")) -> dict[str, set[str]]:
    """Module → the modules it imports, for every module of `packages` under `root`."""
    paths = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    known = set(paths)
    return {name: imports_of(path, known) for name, path in paths.items()}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "handlers":
        return "handlers"
    if parts[0] == "stallwatch" and len(parts) > 1 and parts[1] in DOORS:
        return parts[1]
    return None


def door_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes through a door the wrong way, or leaves core impure."""
    wrong = []
    for module, imported in sorted(graph.items()):
        room = room_of(module)
        if room is None:
            continue
        for target in sorted(imported):
            top = target.split(".")[0]
            if room == "core" and top in CORE_FORBIDDEN:
                wrong.append(f"{module} imports {target}: core is pure")
            elif room != "offline" and top in OFFLINE_ONLY:
                wrong.append(f"{module} imports {target}: only offline may, it is not in the Lambda asset")
            elif top in ("aws_cdk", "stacks", "trainer_agent"):
                wrong.append(f"{module} imports {target}: the runtime never imports CDK, stacks or the agent")
            elif top in ("stallwatch", "handlers"):
                target_room = room_of(target)
                if target_room is not None and target_room not in DOORS[room]:
                    wrong.append(f"{module} imports {target}: {room} may not import {target_room}")
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles among the graph's own modules (a package counts through its modules)."""
    edges = {m: {t for t in imported if t in graph and t != m} for m, imported in graph.items()}
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# ---- the checks on a tree made wrong on purpose -----------------------------------------------------------------


def test_a_core_module_importing_an_adapter_is_caught(tmp_path: Path) -> None:
    # Given a tree whose engine imports the AWS source and boto3 (inside a function, as a lazy import would)
    write_tree(
        tmp_path,
        {
            "stallwatch/__init__.py": "",
            "stallwatch/core/__init__.py": "",
            "stallwatch/core/engine.py": "def decide():\n    import boto3\n    from stallwatch.aws import source\n",
            "stallwatch/aws/__init__.py": "",
            "stallwatch/aws/source.py": "from stallwatch.core import engine\n",
            "handlers/__init__.py": "",
        },
    )
    # When the doors are checked
    wrong = door_violations(import_graph(tmp_path))
    # Then both wrong imports are named, and the circle they make too
    assert wrong == [
        "stallwatch.core.engine imports boto3: core is pure",
        "stallwatch.core.engine imports stallwatch.aws.source: core may not import aws",
    ]
    assert cycles(import_graph(tmp_path)) == [
        ["stallwatch.aws.source", "stallwatch.core.engine", "stallwatch.aws.source"]
    ]


def test_an_adapter_importing_the_runtime_and_offline_importing_the_runtime_are_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "stallwatch/__init__.py": "",
            "stallwatch/aws/__init__.py": "",
            "stallwatch/aws/slack.py": "from stallwatch.runtime.interactions import action_buttons\n",
            "stallwatch/runtime/__init__.py": "",
            "stallwatch/runtime/interactions.py": "action_buttons = None\n",
            "stallwatch/offline/__init__.py": "",
            "stallwatch/offline/ops.py": "from stallwatch.runtime import interactions\n",
            "handlers/__init__.py": "",
        },
    )
    assert door_violations(import_graph(tmp_path)) == [
        "stallwatch.aws.slack imports stallwatch.runtime.interactions: aws may not import runtime",
        "stallwatch.offline.ops imports stallwatch.runtime.interactions: offline may not import runtime",
    ]


def test_a_lambda_room_importing_the_clis_chart_library_is_caught(tmp_path: Path) -> None:
    # Given a tree whose Slack adapter draws a chart with matplotlib, and an offline command that does too
    write_tree(
        tmp_path,
        {
            "stallwatch/__init__.py": "",
            "stallwatch/aws/__init__.py": "",
            "stallwatch/aws/slack.py": "def chart():\n    from matplotlib.figure import Figure\n",
            "stallwatch/offline/__init__.py": "",
            "stallwatch/offline/plots.py": "from matplotlib.figure import Figure\n",
            "handlers/__init__.py": "",
        },
    )
    # Then only the adapter's import is wrong
    assert door_violations(import_graph(tmp_path)) == [
        "stallwatch.aws.slack imports matplotlib.figure: only offline may, it is not in the Lambda asset"
    ]


# ---- the checks on the real tree --------------------------------------------------------------------------------


def test_the_tree_has_the_four_rooms_and_every_module_sits_in_one() -> None:
    graph = import_graph(LAMBDAS)
    assert {room_of(m) for m in graph} - {None} == {"core", "aws", "runtime", "offline", "handlers"}
    homeless = [m for m in graph if room_of(m) is None and m not in ("stallwatch",)]
    assert homeless == []


def test_every_import_in_the_control_plane_goes_through_its_doors_the_right_way() -> None:
    assert door_violations(import_graph(LAMBDAS)) == []


def test_the_control_plane_has_no_import_circle() -> None:
    assert cycles(import_graph(LAMBDAS)) == []


def test_core_imports_with_boto3_and_the_clients_blocked() -> None:
    """Importing every core module works where boto3, Powertools and slack_sdk cannot be imported at all."""
    modules = sorted(m for m in import_graph(LAMBDAS) if room_of(m) == "core")
    blocked = ["boto3", "botocore", "aws_lambda_powertools", "slack_sdk", "rich"]
    code = (
        "import importlib, sys\n"
        f"sys.modules.update(dict.fromkeys({blocked!r}))\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=LAMBDAS, timeout=120)


def test_the_stacks_import_only_the_config_schema_and_the_contract() -> None:
    graph = import_graph(ROOT, packages=("stacks",))
    graph["app"] = imports_of(ROOT / "app.py", set())
    used = {t for imported in graph.values() for t in imported if t.split(".")[0] in ("stallwatch", "handlers")}
    assert used - {"stallwatch.core"} <= STACKS_MAY_IMPORT


@pytest.mark.parametrize("package", ["trainer_agent", "examples"])
def test_the_agent_and_the_examples_never_import_the_control_plane(package: str) -> None:
    root = (ROOT / package).resolve()
    imported = {t for p in root.rglob("*.py") for t in imports_of(p, set())}
    assert {t for t in imported if t.split(".")[0] in (*CONTROL_PLANE, "aws_cdk")} == set()


@pytest.mark.parametrize("package", ["bench", "localrun", "corpus"])
def test_the_benchmarks_the_demo_and_the_corpus_never_import_the_tests(package: str) -> None:
    imported = {t for p in (ROOT / package).rglob("*.py") for t in imports_of(p, set())}
    assert {t for t in imported if t.split(".")[0] == "tests"} == set()


# ---- rooms split by concern -------------------------------------------------------------------------------------

MODULE_LINES_MAX = 500  # past this, a module says why it is kept whole (or is split by concern)
KEPT_WHOLE = "Kept whole (over 500 lines):"
CODE_FOLDERS = ("lambdas", "stacks", "localrun", "corpus", "bench", "trainer_agent", "examples")


def test_no_module_is_over_500_lines_without_the_reason_it_is_kept_whole_in_its_docstring() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for folder in CODE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if ".egg-info" not in path.as_posix() and "node_modules" not in path.parts
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES_MAX
        and KEPT_WHOLE not in (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")
    ]
    assert long == []
