"""The HTTP client of the ``arena submit/status/cancel/logs/jobs`` commands (stdlib
``urllib``; bounded timeouts). Errors come back as ``Refused`` (an ``InputError`` with the
HTTP status) naming the field the service named, or as ``NoAnswer`` saying that no
service answers."""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

from instances.errors import InputError

DEFAULT_URL = "http://127.0.0.1:8765"


class NoAnswer(InputError):
    """No service answered, or it went away before its answer was whole. ``maybe_done``:
    the request had reached it (a POST may have been carried out)."""

    def __init__(self, message: str, *, maybe_done: bool):
        super().__init__(message, field="--url")
        self.maybe_done = maybe_done


class Refused(InputError):
    """The service answered with an error; ``status``: its HTTP status (400, 404, 409, ...)."""

    def __init__(self, message: str, *, status: int, file: str | None = None, field: str | None = None):
        super().__init__(message, file=file, field=field)
        self.status = status


def check_url(url: str, field: str = "--url") -> str:
    """``url`` as the client sends to it: ``http(s)://HOST[:PORT][/...]``, with a host, a
    port in 0..65535 and no space or control character (``http://[::1`` was a
    ``ValueError`` traceback), else an ``InputError`` naming ``field``."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(f"must start with http:// or https://, got {url!r}", field=field)
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InputError(f"must not hold spaces or control characters, got {url!r}", field=field)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port                                  # (a port that is not a number in 0..65535 raises)
    except ValueError as e:
        raise InputError(f"is not a URL ({e}), got {url!r}", field=field) from None
    if not parts.hostname:
        raise InputError(f"names no host, got {url!r}", field=field)
    try:
        parts.hostname.encode("idna")               # (what the connection does first: a traceback there)
    except UnicodeError as e:
        raise InputError(f"names a host that cannot be looked up ({e}), got {url[:80]!r}"
                         f"{'...' if len(url) > 80 else ''}", field=field) from None
    return url.rstrip("/")


class Client:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = 30.0, *,
                 url_field: str = "--url", token_field: str = "--token"):
        from .auth import token_chars_problem
        problem = None if token is None else token_chars_problem(token)
        if problem is not None:                     # (an HTTP header cannot carry it: a traceback before)
            raise InputError(f"the token {problem}", field=token_field)
        self.url, self.token, self.timeout_s = check_url(url, url_field), token, timeout_s

    def request(self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
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
            except (json.JSONDecodeError, UnicodeDecodeError):
                err = {}
            if not isinstance(err, dict):          # not the service's shape (a proxy's answer)
                err = {}
            msg = err.get("error") or e.reason
            if e.code == 401:                      # what to do about it, in the command's own flags
                msg = f"{msg}; give the token with --token or ARENA_TOKEN"
            raise Refused(f"the service answered {e.code}: {msg}", status=e.code, file=err.get("file"),
                          field="--token" if e.code == 401 else err.get("field")) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
            # URLError: nothing reached the service; the rest: it went away (or stalled) after the request
            # was sent, in the middle of its answer (IncompleteRead, RemoteDisconnected) or before it
            reason = getattr(e, "reason", None) or (f"no answer within {self.timeout_s} s"
                                                    if isinstance(e, TimeoutError)
                                                    else f"the connection closed mid-answer: {type(e).__name__}")
            sent = not isinstance(e, urllib.error.URLError) and method != "GET"
            raise NoAnswer(f"no service answers at {self.url} ({reason}); is `arena serve` running?"
                           + ("; it may have done what was asked before it went: look before asking again"
                              if sent else ""), maybe_done=sent) from None

    def get(self, path: str) -> object:
        return self.request("GET", path)

    def post(self, path: str, body: object = None, *, key: str | None = None) -> object:
        """``key``: an idempotency key (the service answers a repeated key with what it did
        the first time; ``POST /api/jobs``)."""
        return self.request("POST", path, body if body is not None else {},
                            {"Idempotency-Key": key} if key is not None else None)
