"""``weir models list|load|unload|weights``: the repository extension from a shell.

Talks to a gateway's HTTP port as any client would (Triton's routes, plus Weir's traffic
weights), so scripts need no client library. Exit status 0 on success, 1 with the gateway's
error message on stderr otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any


def run(options: dict[str, Any]) -> int:
    action, names = options["action"], options.get("names", [])
    if action != "list" and not names:
        print(f"weir models {action}: name a model", file=sys.stderr)
        return 2
    try:
        if action == "list":
            _print_index(_call(options, "/v2/repository/index", {}))
        elif action == "load":
            for name in names:
                _call(options, f"/v2/repository/models/{name}/load", _load_body(options))
                print(f"{name}: loaded")
        elif action == "unload":
            body = {"parameters": {"unload_dependents": bool(options.get("unload_dependents"))}}
            for name in names:
                _call(options, f"/v2/repository/models/{name}/unload", body)
                print(f"{name}: unloaded")
        else:
            weights = dict(_weight(item) for item in names[1:])
            _call(options, f"/v2/repository/models/{names[0]}/traffic", {"weights": weights})
            print(f"{names[0]}: traffic weights {weights or 'cleared'}")
    except (ValueError, OSError) as exc:
        print(f"weir models {action}: {exc}", file=sys.stderr)
        return 1
    return 0


def _load_body(options: dict[str, Any]) -> dict[str, Any]:
    config = options.get("config")
    return {"parameters": {"config": config}} if config else {}


def _weight(item: str) -> tuple[str, int]:
    version, _, weight = item.partition("=")
    if not weight.isdigit():
        raise ValueError(f"{item!r}: write VERSION=WEIGHT")
    return version, int(weight)


def _call(options: dict[str, Any], path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        options["url"].rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **_auth(options)},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=options["timeout_s"]) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise ValueError(_error_text(exc.read()) or f"HTTP {exc.code}") from None
    return json.loads(raw) if raw.strip() else None


def _auth(options: dict[str, Any]) -> dict[str, str]:
    token = options.get("token") or os.environ.get("WEIR_GATEWAY_MANAGEMENT_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _error_text(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")


def _print_index(models: list[dict[str, str]]) -> None:
    print(f"{'MODEL':<28} {'VERSION':<8} {'STATE':<12} REASON")
    for model in models:
        print(
            f"{model['name']:<28} {model.get('version', ''):<8} "
            f"{model.get('state', ''):<12} {model.get('reason', '')}"
        )
