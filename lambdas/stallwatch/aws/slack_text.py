"""Text as Slack shows it, never as markup: what a log, a tag, a dump or an AWS answer says enters a message
escaped, so a line's ``<!channel>`` or ``<https://example.com|Snooze 1 h>`` comes through as the words it is.

    MarkdownTextObject(text=f"*Why*\\n{escape(reason)}")

Slack reads ``&``, ``<`` and ``>`` as control characters in text objects and in a message's top-level text, to be
sent as ``&amp;``, ``&lt;`` and ``&gt;``; nothing else is to be encoded (Slack, "Formatting text for app surfaces",
https://api.slack.com/reference/surfaces/formatting#escaping). The Block Kit builders (`aws.slack`, `aws.buttons`)
escape every text they are given; only Stallwatch's own markup (a user's mention, the dashboard's link) is added
after, by the code that writes it.
"""

from __future__ import annotations

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def escape(text: str) -> str:
    """`text` with ``&``, ``<`` and ``>`` as Slack's entities."""
    return text.translate(_ENTITIES)
