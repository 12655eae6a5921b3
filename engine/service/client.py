"""The HTTP client of the ``arena submit/status/cancel/logs/jobs`` commands (stdlib
``urllib``; bounded timeouts). Errors come back as ``InputError`` naming the field the
service named, or saying that no service answers."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from instances.errors import InputError

DEFAULT_URL = "http://127.0.0.1:8765"


class Client:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = 30.0):
        if not url.startswith(("http://", "https://")):
            raise InputError(f"must start with http:// or https://, got {url!r}", field="--url")
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s

    def request(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read() or b"{}")
            except json.JSONDecodeError:
                err = {}
            msg = err.get("error") or err.get("detail") or e.reason
            raise InputError(f"the service answered {e.code}: {msg}", file=err.get("file"),
                             field=err.get("field")) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise InputError(f"no service answers at {self.url} ({reason}); is `arena serve` running?",
                             field="--url") from None

    def get(self, path: str) -> object:
        return self.request("GET", path)

    def post(self, path: str, body: object = None) -> object:
        return self.request("POST", path, body if body is not None else {})
