"""A CloudWatch Logs subscription's delivery, inflated at most `INFLATED_BYTES`: Powertools' `CloudWatchLogsModel`
inflates ``awslogs.data`` whole (64 KB of gzip made 48 MB of JSON, 144 MB at its peak), this one stops there.

    event = parse_event(raw, LogLinesEvent)     # aws.events.LogLinesEvent is `BoundedLogsModel`
    data = event.awslogs.decoded_data           # as Powertools decodes it; `dropped_bytes` past the bound

A payload inflated whole reads as Powertools reads it. One past the bound keeps its events read whole before it
(`core.json_prefix`), and counts the compressed bytes it left uninflated (`dropped_bytes`): a real delivery holds at
most one PutLogEvents batch (1,048,576 bytes of messages, CloudWatch Logs API reference) with its JSON around it, so
a fatal line near the start still wakes its job.
"""

from __future__ import annotations

import base64
import codecs
import json
import zlib
from typing import Any

from aws_lambda_powertools.utilities.parser.models import CloudWatchLogsModel
from aws_lambda_powertools.utilities.parser.models.cloudwatch import CloudWatchLogsData, CloudWatchLogsDecode
from pydantic import Field, field_validator

from stallwatch.core import json_prefix

INFLATED_BYTES = 1 << 20  # a payload's JSON is inflated this far
GZIP_OR_ZLIB = zlib.MAX_WBITS | 32  # the header told apart, as Powertools does


class BoundedLogsDecode(CloudWatchLogsDecode):
    """The delivery's JSON, and how many compressed bytes past `INFLATED_BYTES` were left uninflated."""

    dropped_bytes: int = 0


class BoundedLogsData(CloudWatchLogsData):
    decoded_data: BoundedLogsDecode = Field(..., alias="data")  # type: ignore[assignment]

    @field_validator("decoded_data", mode="before")
    @classmethod
    def prepare_data(cls, value: Any) -> dict[str, Any]:  # Powertools' own validator, of the same name, replaced
        return inflate(value)


class BoundedLogsModel(CloudWatchLogsModel):
    awslogs: BoundedLogsData  # type: ignore[assignment]


def inflate(data: Any, limit: int = INFLATED_BYTES) -> dict[str, Any]:
    """``awslogs.data`` (base64 of gzipped JSON) as its JSON object, inflated at most `limit` bytes; ValueError if
    it is not one."""
    try:
        inflater = zlib.decompressobj(GZIP_OR_ZLIB)
        raw = inflater.decompress(base64.b64decode(data), limit)
        if inflater.eof:
            decoded = json.loads(raw.decode("utf-8"))
            dropped = 0
        elif len(raw) >= limit:
            text = codecs.getincrementaldecoder("utf-8")().decode(raw)  # a character the limit cut in two is left out
            decoded, _ = json_prefix.read(text)
            dropped = len(inflater.unconsumed_tail)
        else:
            raise ValueError("the gzip stream ends before its end")
    except Exception as exc:  # bad base64, gzip, UTF-8 or JSON, nesting too deep: not a delivery
        raise ValueError("unable to decompress data") from exc
    if not isinstance(decoded, dict):
        raise ValueError("the payload is not a JSON object")
    return decoded | {"dropped_bytes": dropped}
