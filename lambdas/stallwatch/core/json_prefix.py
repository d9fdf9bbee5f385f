"""The JSON object or array a text begins with, read as far as it is whole: a document cut at a limit (a log line
over its length, a payload inflated up to its size) gives what it holds before the cut.

    value, whole = json_prefix.read('{"a": [1, {"b": 2}, {"c": 3', 0)   # ({"a": [1, {"b": 2}]}, False)
    value, whole = json_prefix.read('{"a": 1, "b": {"c": 2, "d"', 0)  # ({"a": 1, "b": {"c": 2}}, False)

An object keeps the members read before the first one that is not whole (the cut, or anything that is not JSON
there), a member cut inside its own object or array with what that holds; an array keeps the elements read whole
(a list of records loses the one the cut goes through); a number or literal that ends the text may be cut short and
is left out. Containers nest at
most `MAX_DEPTH` deep (json's own decoder raises RecursionError on a deep one); deeper is read as the cut. Only the
scalars go to json's decoder, so the work is one pass over the text, whatever it holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_CUT = object()  # a value the text does not hold whole


def read(text: str, start: int = 0) -> tuple[Any, bool]:
    """The object or array at `start` (after whitespace) and whether it is whole; ValueError if none begins there."""
    at = _SPACE.match(text, start).end()
    if at >= len(text) or text[at] not in "{[":
        raise ValueError(f"no JSON object or array at {start}")
    value, end = _value(text, at, 0)
    return value, end is not None


def _value(text: str, at: int, depth: int) -> tuple[Any, int | None]:
    """The value at `at` and where it ends; (partial container or _CUT, None) where it is not whole."""
    at = _SPACE.match(text, at).end()
    if at >= len(text) or depth > MAX_DEPTH:
        return _CUT, None
    if text[at] == "{":
        return _object(text, at + 1, depth + 1)
    if text[at] == "[":
        return _array(text, at + 1, depth + 1)
    try:
        value, end = _DECODER.raw_decode(text, at)
    except ValueError:
        return _CUT, None
    return (_CUT, None) if end >= len(text) else (value, end)


def _object(text: str, at: int, depth: int) -> tuple[dict[str, Any], int | None]:
    found: dict[str, Any] = {}
    at = _SPACE.match(text, at).end()
    if text.startswith("}", at):
        return found, at + 1
    while True:
        key, end = _value(text, at, depth)
        if not isinstance(key, str) or end is None:
            return found, None
        at = _SPACE.match(text, end).end()
        if not text.startswith(":", at):
            return found, None
        value, end = _value(text, at + 1, depth)
        if value is not _CUT:
            found[key] = value
        if end is None:
            return found, None
        at = _SPACE.match(text, end).end()
        if text.startswith("}", at):
            return found, at + 1
        if not text.startswith(",", at):
            return found, None
        at += 1


def _array(text: str, at: int, depth: int) -> tuple[list[Any], int | None]:
    found: list[Any] = []
    at = _SPACE.match(text, at).end()
    if text.startswith("]", at):
        return found, at + 1
    while True:
        value, end = _value(text, at, depth)
        if end is None:
            return found, None
        found.append(value)
        at = _SPACE.match(text, end).end()
        if text.startswith("]", at):
            return found, at + 1
        if not text.startswith(",", at):
            return found, None
        at += 1
