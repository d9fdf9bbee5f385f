"""A name kept within a limit and still unique: cut, it ends in a hash of the whole, so two names that share their
first characters never become one.

    within("stallwatch restart " + job + " 1767225600", 100)   # itself when it fits; else "<its start>~<hash>"
"""

from __future__ import annotations

import hashlib

HASH_CHARS = 12  # of the sha256: 48 bits, no collision among names that share a cut start
CUT_MARK = "~"


def within(name: str, limit: int) -> str:
    """`name` if it has at most `limit` characters, else its first characters, `CUT_MARK` and a hash of the whole."""
    if len(name) <= limit:
        return name
    if limit <= HASH_CHARS + len(CUT_MARK):
        raise ValueError(f"a limit of {limit} leaves no room for a name before its hash")
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]
    return f"{name[: limit - HASH_CHARS - len(CUT_MARK)]}{CUT_MARK}{digest}"
