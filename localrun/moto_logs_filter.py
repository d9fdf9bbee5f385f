"""A small moto extension: FilterLogEvents' filter patterns as CloudWatch Logs applies them to unstructured events:
terms (`?` any of them, `-` excluded) and ``%regex%`` patterns, with CloudWatch's limits.

    from localrun import moto_logs_filter
    moto_logs_filter.install()
    moto_logs_filter.keeps("%NCCL.WARN|Killed%", "NCCL WARN Call to recv failed")  # True (a subscription's view)

moto matches one term or one quoted phrase, and returns every event for a pattern it does not parse (such as
``%NCCL.WARN|[Kk]illed%``). Stallwatch asks for its fatal and checkpoint lines with such a pattern
(`log_patterns.FILTER_PATTERNS`); without this, tests and the bench would page through the noise CloudWatch leaves
out, and a pattern CloudWatch refuses would pass. A regex may hold only alphanumerics, ``:_#=@/;,-`` and the operators
``^$?[]{}|\\*+.`` (no parentheses, no spaces), and matches anywhere in the message, case-sensitively; a pattern holds
at most 1,024 characters (CloudWatch Logs user guide, "Filter pattern syntax"; API reference). Terms are matched
case-sensitively, a quoted phrase exactly; a pattern of plain terms needs them all, one of `?` terms needs any; a `-`
term excludes. JSON and space-delimited patterns are left to moto.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from moto.logs import models
from moto.logs.exceptions import InvalidParameterException

_original: Any = None
_TERM = re.compile(r'\??-?(?:"[^"]*"|\S+)')
PATTERN_MAX = 1024
REGEX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_#=@/;,-^$?[]{}|\\*+.")


class TermsFilter:
    """A pattern of terms: all plain ones, any `?` one, none of the `-` ones."""

    def __init__(self, pattern: str) -> None:
        self.required: list[str] = []
        self.any_of: list[str] = []
        self.excluded: list[str] = []
        for raw in _TERM.findall(pattern.strip()):
            optional = raw.startswith("?")
            raw = raw.removeprefix("?")
            negated = raw.startswith("-")
            term = shlex.split(raw.removeprefix("-"))[0] if raw.removeprefix("-") else ""
            (self.excluded if negated else self.any_of if optional else self.required).append(term)

    def matches(self, message: str) -> bool:
        if any(term in message for term in self.excluded):
            return False
        if not all(term in message for term in self.required):
            return False
        return not self.any_of or any(term in message for term in self.any_of)


class RegexFilter:
    """A ``%regex%`` pattern: CloudWatch's regex subset, searched anywhere in the message."""

    def __init__(self, pattern: str) -> None:
        body = pattern.strip()[1:-1]
        bad = sorted(set(body) - REGEX_CHARS)
        if bad:
            raise InvalidParameterException(f"Invalid character(s) in regex filter pattern: {''.join(bad)!r}")
        try:
            self.regex = re.compile(body)
        except re.error as exc:
            raise InvalidParameterException(f"Invalid regex filter pattern: {exc}") from exc

    def matches(self, message: str) -> bool:
        return self.regex.search(message) is not None


def parse(pattern: str) -> TermsFilter | RegexFilter:
    """The filter CloudWatch Logs would apply for `pattern` (terms or one regex); InvalidParameterException where it
    would refuse it."""
    text = (pattern or "").strip()
    if len(pattern or "") > PATTERN_MAX:
        raise InvalidParameterException(f"filterPattern is {len(pattern)} characters; at most {PATTERN_MAX}")
    if len(text) >= 2 and text.startswith("%") and text.endswith("%"):
        return RegexFilter(text)
    return TermsFilter(text)


def keeps(pattern: str, message: str) -> bool:
    """Whether CloudWatch Logs keeps `message` under `pattern` (FilterLogEvents, a subscription filter)."""
    return parse(pattern).matches(message)


def _filter(pattern: str) -> Any:
    """moto's filter for JSON (``{...}``) and space-delimited (``[...]``) patterns; terms and regexes, ours."""
    text = (pattern or "").strip()
    if text and text[0] in "{[":
        return _original(pattern)
    return parse(pattern)


def install() -> None:
    global _original
    if _original is None:
        _original = models.EventMessageFilter
        models.EventMessageFilter = _filter  # type: ignore[misc,assignment]
