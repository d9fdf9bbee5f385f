"""The deployment's name and `StallwatchConfig`, read from cdk.json, a JSON file and the command line.

    name = deployment_name(app.node)  # context "stallwatch:deployment", default "stallwatch"
    config = load_config(app.node, deployment=name, project_file=Path("cdk.json"))

The config's layers, each deep-merged over the one before (an object merges field by field; anything else replaces):
cdk.json's ``stallwatch`` object, the file named by ``stallwatch:config-file``, then ``-c stallwatch='{...}'``.
The CDK CLI hands the app either cdk.json's ``stallwatch`` or the command line's, never both, so cdk.json is read here.

A bad value raises `ConfigError` naming the field, e.g.
``stallwatch.policy.thresholds.stall_minutes: Input should be greater than 0``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from constructs import Node
from pydantic import ValidationError

from stacks.constants import (
    CONFIG_CONTEXT_KEY,
    CONFIG_FILE_CONTEXT_KEY,
    DEFAULT_DEPLOYMENT,
    DEPLOYMENT_CONTEXT_KEY,
    DEPLOYMENT_NAME_PATTERN,
)
from stallwatch.core.config import StallwatchConfig


class ConfigError(ValueError):
    """The deployment's configuration is missing, unreadable or invalid."""


def deployment_name(node: Node) -> str:
    """The context `stallwatch:deployment` (default `stallwatch`), checked against `DEPLOYMENT_NAME_PATTERN`."""
    name = node.try_get_context(DEPLOYMENT_CONTEXT_KEY) or DEFAULT_DEPLOYMENT
    if not isinstance(name, str) or not re.match(DEPLOYMENT_NAME_PATTERN, name):
        raise ConfigError(
            f"{DEPLOYMENT_CONTEXT_KEY}: expected letters, digits and inner hyphens, starting with a letter, "
            f"at most 30 characters ({DEPLOYMENT_NAME_PATTERN}), got {name!r}"
        )
    return name


def load_config(
    node: Node, *, deployment: str = DEFAULT_DEPLOYMENT, project_file: Path | None = None
) -> StallwatchConfig:
    """Validate cdk.json's `stallwatch` (`project_file`), overridden field by field by the file named by context
    `stallwatch:config-file`, then by context `stallwatch` where that is not cdk.json's own (`-c` on the command
    line). `alarm_prefix` defaults to ``<deployment>-``, `ec2_log_group` to ``/<deployment>/ec2`` (the stack creates
    it: two deployments cannot share it)."""
    project = _read_project(project_file) if project_file else {}
    raw = project
    file_name = node.try_get_context(CONFIG_FILE_CONTEXT_KEY)
    if file_name:
        raw = _deep_merge(raw, _read_file(Path(file_name)))
    context = _as_object(node.try_get_context(CONFIG_CONTEXT_KEY), f"context {CONFIG_CONTEXT_KEY!r}")
    if context != project:
        raw = _deep_merge(raw, context)
    raw = {"alarm_prefix": f"{deployment}-", "ec2_log_group": f"/{deployment}/ec2", **raw}
    try:
        return StallwatchConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _read_project(path: Path) -> dict[str, Any]:
    """cdk.json's `context.stallwatch` object."""
    project = _as_object(_read_text(path), str(path))
    context = _as_object(project.get("context"), f"{path}: context")
    return _as_object(context.get(CONFIG_CONTEXT_KEY), f"{path}: context.{CONFIG_CONTEXT_KEY}")


def _read_file(path: Path) -> dict[str, Any]:
    return _as_object(_read_text(path, origin=CONFIG_FILE_CONTEXT_KEY), str(path))


def _read_text(path: Path, origin: str = "cdk.json") -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read {path}: {exc.strerror}") from None


def _as_object(value: object, origin: str) -> dict[str, Any]:
    """Context from cdk.json is an object; from `-c stallwatch='{...}'` it is a JSON string."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{origin}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{origin}: expected a JSON object, got {type(value).__name__}")
    return value


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join([CONFIG_CONTEXT_KEY, *(str(part) for part in error["loc"])])
        lines.append(f"{field}: {error['msg']}")
    return "invalid Stallwatch configuration:\n" + "\n".join(lines)
