"""Raw HTTP for server tests: what the openai client refuses to send (bad JSON, huge bodies)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """(status, parsed JSON body or text)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(
            method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})}
        )
        resp = conn.getresponse()
        data = resp.read().decode()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)
    except json.JSONDecodeError:
        return resp.status, data


def post_json(
    url: str, path: str, payload: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    return request(url, "POST", path, json.dumps(payload).encode(), headers)


def assert_error(
    status: int,
    body: Any,
    expected_status: int,
    *,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """An OpenAI-style error body with the given status (and param/code when given)."""
    assert status == expected_status, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err
