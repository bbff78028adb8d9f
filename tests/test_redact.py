"""Which header names are secret, and secret values found wherever they land in a JSON value
(engine/redact.py). The engine applies them to what it stores (tests/test_security.py)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.redact import REDACTED, is_secret, redact_headers, redact_value, secret_values

SECRET_NAMES = [
    "Authorization",
    "Proxy-Authorization",
    "X-Auth",
    "X-Auth-User",
    "x_auth_email",
    "Cookie",
    "Set-Cookie",
    "Session",
    "X-Session-Id",
    "X-Api-Key",
    "Ocp-Apim-Subscription-Key",
    "api_key",
    "X-Webhook-Secret",
    "X-CSRF-Token",
    "X-Amz-Security-Token",
    "Private-Token",
    "password",
    "X-Passphrase",
    "X-Jwt-Assertion",
    "Credentials",
]
PLAIN_NAMES = ["Content-Type", "Accept", "X-Request-Id", "Host", "User-Agent", "X-Forwarded-For",
               "Traceparent", "If-None-Match", "X-Author", "Keep-Alive"]  # fmt: skip


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_header_names(name: str) -> None:
    assert is_secret(name) and is_secret(name.upper()) and is_secret(name.lower())
    assert redact_headers({name: "value"}) == {name: REDACTED}


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_header_names_stay(name: str) -> None:
    assert not is_secret(name)
    assert redact_headers({name: "value"}) == {name: "value"}


HEADERS = {
    "Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.credentials",
    "Cookie": "theme=dark; sid=0123456789abcdef",
    "X-Session-Id": "sess-4242-4242",
    "X-Pin": "12345678",
    "X-Auth-Pin": "87654321",
    "X-Request-Id": "req-visible-1",
}


def test_secret_values_land_redacted_at_any_depth() -> None:
    secrets = secret_values(HEADERS)
    value = {
        "auth": "Bearer eyJhbGciOiJIUzI1NiJ9.credentials",  # the whole header
        "token": "eyJhbGciOiJIUzI1NiJ9.credentials",  # its credentials alone
        "said": "calling with sid=0123456789abcdef now",  # inside a longer string
        "pin": 87654321,  # a secret's digits, as a number
        "list": [1, ["x", {"deep": ("sess-4242-4242",)}]],
        "sess-4242-4242": "as a key",
        "plain": ["req-visible-1", 12345678, 3.5, True, None, "dark"],
    }
    assert redact_value(value, secrets) == {
        "auth": REDACTED,
        "token": REDACTED,
        "said": f"calling with {REDACTED} now",  # the whole cookie part goes
        "pin": REDACTED,
        "list": [1, ["x", {"deep": (REDACTED,)}]],
        REDACTED: "as a key",
        "plain": ["req-visible-1", 12345678, 3.5, True, None, "dark"],  # X-Pin is not secret
    }
    assert value["auth"] == "Bearer eyJhbGciOiJIUzI1NiJ9.credentials"  # a copy: the node's
    # value is its own


@pytest.mark.parametrize("value", ["text", 5, None, [1, "a"], {"a": {"b": []}}])
def test_without_secrets_a_value_is_unchanged(value: Any) -> None:
    assert redact_value(value, secret_values(HEADERS)) == value
    assert redact_value(value, ()) is value


def test_other_objects_are_left_alone() -> None:
    marker = object()
    assert redact_value({"o": marker}, secret_values(HEADERS))["o"] is marker
