"""The deployment's `StallwatchConfig`, read from cdk.json context and/or a JSON file.

    config = load_config(app.node)  # context "stallwatch" over the file named by "stallwatch:config-file"

A bad value raises `ConfigError` naming the field, e.g.
``stallwatch.policy.thresholds.stall_minutes: Input should be greater than 0``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from constructs import Node
from pydantic import ValidationError

from stacks.constants import CONFIG_CONTEXT_KEY, CONFIG_FILE_CONTEXT_KEY
from stallwatch.core.config import StallwatchConfig


class ConfigError(ValueError):
    """The deployment's configuration is missing, unreadable or invalid."""


def load_config(node: Node) -> StallwatchConfig:
    """Validate the file named by context `stallwatch:config-file`, overridden field by field by `stallwatch`."""
    raw: dict[str, Any] = {}
    file_name = node.try_get_context(CONFIG_FILE_CONTEXT_KEY)
    if file_name:
        raw = _read_file(Path(file_name))
    raw = _deep_merge(raw, _as_object(node.try_get_context(CONFIG_CONTEXT_KEY), f"context {CONFIG_CONTEXT_KEY!r}"))
    try:
        return StallwatchConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{CONFIG_FILE_CONTEXT_KEY}: cannot read {path}: {exc.strerror}") from None
    return _as_object(text, str(path))


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
