"""A record kept within a size budget: what the table keeps of a decision (its audit record and reasons) fits
DynamoDB's item, whatever the evidence read from logs and metrics holds.

    kept = record_budget.fit(audit, AUDIT_BYTES)   # the record itself when it fits; else a copy cut to fit

Cutting goes by steps (`STEPS`), each keeping less of every text and of every list or object below the top level,
until the record fits; it then says so (`CUT_KEY`, at its top level). A record that still does not fit keeps its
top-level scalars alone, their texts cut short. Sizes are those of the JSON the table stores (`json.dumps`, with
`str` for anything else).
"""

from __future__ import annotations

import json
from typing import Any

CUT_KEY = "cut_to_fit"
# (characters per text, items per list or object): each step keeps less
STEPS = ((4096, 256), (1024, 64), (256, 16), (64, 4))
LAST_TEXT_CHARS = 64


def size(value: Any) -> int:
    """The bytes of `value` as the table stores it."""
    return len(json.dumps(value, default=str).encode())


def fit(record: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """`record` if it is within `max_bytes`, else a copy cut to fit (module docstring)."""
    if size(record) <= max_bytes:
        return record
    for chars, items in STEPS:
        kept = {key: _cut(value, chars, items) for key, value in record.items()} | {CUT_KEY: True}
        if size(kept) <= max_bytes:
            return kept
    scalars = {k: _cut(v, LAST_TEXT_CHARS, 0) for k, v in record.items() if not isinstance(v, (dict, list, tuple))}
    return scalars | {CUT_KEY: True}


def _cut(value: Any, chars: int, items: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else value[: chars - 1] + "…"
    if isinstance(value, dict):
        return {str(k)[:chars]: _cut(v, chars, items) for k, v in list(value.items())[:items]}
    if isinstance(value, (list, tuple)):
        return [_cut(v, chars, items) for v in list(value)[:items]]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _cut(str(value), chars, items)
