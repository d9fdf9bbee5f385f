"""A Slack interaction request, before anything is done with it: its signature (Slack's HMAC over the 5-minute window,
every header of any bytes or size refused, never raising), its `block_actions` payload, and the signed request handed
to the function's own asynchronous invocation (`DeferredPress`). `interactions` applies what passes.

    signature = verify_signature(signing_secret, body, headers, time.time)   # InvalidSignatureError: a 401
    payload = parse_payload(body_text)                                       # MalformedPayloadError: a 400
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError

from stallwatch.aws.buttons import ButtonValue, OperatorAction

SIGNATURE_WINDOW_SECONDS = 5 * 60  # Slack's replay window
TIMESTAMP = re.compile(r"[0-9]{1,12}")  # epoch seconds; a longer value is refused before int() ever sees it
SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")  # ASCII only: hmac.compare_digest raises on anything else
TIMESTAMP_HEADER = "x-slack-request-timestamp"
SIGNATURE_HEADER = "x-slack-signature"
DEFERRED_BODY_MAX = 240 * 1024  # Lambda's asynchronous payload limit is 256 KB


class RejectedRequestError(ValueError):
    """A request that changes nothing; `status` is the HTTP answer."""

    status: ClassVar[int] = 400


class InvalidSignatureError(RejectedRequestError):
    status = 401


class ExpiredRequestError(RejectedRequestError):
    status = 401


class MethodNotAllowedError(RejectedRequestError):
    status = 405


class ReplayedRequestError(RejectedRequestError):
    status = 409


class PayloadTooLargeError(RejectedRequestError):
    status = 413


class MalformedPayloadError(RejectedRequestError):
    status = 400


# ---- the interaction payload ------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SlackUser(_Model):
    id: str = Field(pattern=r"^[UW][A-Z0-9]{2,}$")
    username: str | None = None


class ButtonPress(_Model):
    action_id: OperatorAction
    value: Json[ButtonValue]


class Container(_Model):
    message_ts: str | None = None
    channel_id: str | None = None


class Message(_Model):
    text: str = ""
    blocks: list[dict[str, Any]] = Field(default_factory=list)


class BlockActionsPayload(_Model):
    """A `block_actions` interaction: who pressed which button on which message."""

    type: Literal["block_actions"]
    user: SlackUser
    actions: list[ButtonPress] = Field(min_length=1, max_length=1)
    response_url: str = Field(pattern=r"^https?://")
    container: Container = Field(default_factory=Container)
    message: Message | None = None

    @property
    def press(self) -> ButtonPress:
        return self.actions[0]


def parse_payload(body: str) -> BlockActionsPayload:
    """The form-encoded body's `payload` field; `MalformedPayloadError` names what is wrong."""
    fields = parse_qs(body, keep_blank_values=True)
    raw = fields.get("payload")
    if not raw or len(raw) != 1:
        raise MalformedPayloadError("form field 'payload' missing or repeated")
    try:
        return BlockActionsPayload.model_validate_json(raw[0])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise MalformedPayloadError(f"payload.{where}: {first['msg']}") from exc


# ---- verification -----------------------------------------------------------------------------------------------


def verify_signature(
    signing_secret: str,
    body: bytes | str,
    headers: Mapping[str, Any],
    now: Callable[[], float],
    window: float = SIGNATURE_WINDOW_SECONDS,
) -> str:
    """Check Slack's signature (HMAC-SHA256 of ``v0:<timestamp>:<body>``) over the 5-minute window (`window`);
    returns the signature (the request's identity). Any header of any type, bytes or size is an
    `InvalidSignatureError`.

    Written here rather than with slack_sdk's `SignatureVerifier`, which raises where a request must get a 401:
    ``int()`` on the timestamp header (a ValueError on text, or on more than 4,300 digits), ``hmac.compare_digest`` on
    the signature header (a TypeError on non-ASCII text), and ``body.decode("utf-8")`` before signing (Slack signs
    the body's bytes; any other bytes raise UnicodeDecodeError instead of failing the comparison)."""
    body = body_bytes(body)
    lowered = {str(k).lower(): v for k, v in headers.items()}
    timestamp, signature = lowered.get(TIMESTAMP_HEADER), lowered.get(SIGNATURE_HEADER)
    if not isinstance(timestamp, str) or not isinstance(signature, str):
        raise InvalidSignatureError(f"headers {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} are required")
    if not TIMESTAMP.fullmatch(timestamp):
        raise InvalidSignatureError(f"{TIMESTAMP_HEADER} is not epoch seconds: {timestamp[:20]!r}")
    if not SIGNATURE.fullmatch(signature):
        raise InvalidSignatureError(f"{SIGNATURE_HEADER} is not a v0 signature: {signature[:20]!r}")
    age = now() - int(timestamp)
    if abs(age) > window:
        raise ExpiredRequestError(f"{TIMESTAMP_HEADER} is {age:.0f} s from now (window {window:.0f} s)")
    digest = hmac.new(signing_secret.encode(), b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256)
    if not hmac.compare_digest(f"v0={digest.hexdigest()}", signature):
        raise InvalidSignatureError(f"{SIGNATURE_HEADER} does not match the body")
    return signature


class DeferredPress(BaseModel):
    """The signed request, handed to this function's asynchronous invocation after Slack got its answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    body: str = Field(max_length=DEFERRED_BODY_MAX)
    timestamp: str = Field(max_length=12)
    signature: str = Field(max_length=67)

    def headers(self) -> dict[str, str]:
        return {TIMESTAMP_HEADER: self.timestamp, SIGNATURE_HEADER: self.signature}


def body_bytes(body: bytes | str) -> bytes:
    """The body as signed; text of any code points (lone surrogates too) becomes bytes the signature then refuses."""
    return body if isinstance(body, bytes) else body.encode(errors="surrogatepass")


def text_of(body: bytes) -> str:
    """The signed body as text; `MalformedPayloadError` where it is not UTF-8."""
    try:
        return body.decode()
    except UnicodeDecodeError as exc:
        raise MalformedPayloadError("the body is not UTF-8") from exc
