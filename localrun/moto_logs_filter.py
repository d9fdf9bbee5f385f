"""A small moto extension: FilterLogEvents' filter patterns of terms, `?` (any of them) included, as CloudWatch
Logs matches unstructured events.

    from localrun import moto_logs_filter
    moto_logs_filter.install()

moto matches one term or one quoted phrase, and returns every event for a pattern it does not parse (such as
``?"CUDA error" ?Traceback``). Stallwatch asks for its fatal and checkpoint lines with such a pattern
(`log_patterns.FILTER_PATTERN`); without this, tests and the bench would page through the noise CloudWatch leaves
out. Terms are matched case-sensitively, a quoted phrase exactly; a pattern of plain terms needs them all, one of
`?` terms needs any; a `-` term excludes. JSON and space-delimited patterns are left to moto.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from moto.logs import models

_original: Any = None
_TERM = re.compile(r'\??-?(?:"[^"]*"|\S+)')


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


def _filter(pattern: str) -> Any:
    """moto's filter for JSON (``{...}``) and space-delimited (``[...]``) patterns; terms, ours."""
    text = (pattern or "").strip()
    if not text or text[0] in "{[":
        return _original(pattern)
    return TermsFilter(text)


def install() -> None:
    global _original
    if _original is None:
        _original = models.EventMessageFilter
        models.EventMessageFilter = _filter  # type: ignore[misc,assignment]
