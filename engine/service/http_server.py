"""The HTTP server ``arena serve`` runs its API on (uvicorn), with the bounds a client's
connections are held to, so that no client can hold the service's connections without
sending a request.

- **A request's headers** must arrive within ``HEADER_TIMEOUT_S`` of the connection's
  opening (or of the end of the previous answer on a kept-alive connection); else the
  connection is answered ``408`` in the API's error shape and closed. (uvicorn bounds the
  time between requests, ``timeout_keep_alive``, but not a request that never ends.)
- **A request's body** must arrive within ``api.BODY_TIMEOUT_S`` of its headers: the
  API's body reader (engine/service/api.py, ``_BodyLimit``) answers ``408`` otherwise.
- **Connections per client address**: at most ``MAX_CLIENT_CONNECTIONS`` open at once;
  one more is answered ``429`` in the error shape and closed at once. (Every local
  client shares 127.0.0.1: the bound is far above what the CLI, a few status pages and
  the soak's eight clients open together.)

``server`` builds the ``uvicorn.Server``; ``arena serve`` and the tests run the same one.
"""
from __future__ import annotations

import asyncio
import json

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 30.0
MAX_CLIENT_CONNECTIONS = 64


def error_bytes(status: int, reason: str, message: str, field: str) -> bytes:
    """A whole HTTP/1.1 answer in the API's error shape that closes the connection,
    written to a connection whose request the HTTP parser has not finished reading."""
    body = json.dumps({"error": message, "field": field, "file": None}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


def bounded_protocol(header_timeout_s: float = HEADER_TIMEOUT_S,
                     max_per_client: int = MAX_CLIENT_CONNECTIONS) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the header timeout and the bound on a client's
    connections (module doc); each server gets its own class, with its own counts."""
    open_by_client: dict[str, int] = {}

    class Bounded(H11Protocol):
        _counted: str | None = None
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else ""
            if open_by_client.get(host, 0) >= max_per_client:
                transport.write(error_bytes(429, "Too Many Requests", f"this client ({host}) holds "
                                            f"{max_per_client} connections to the service already; close one "
                                            "and try again", "client"))
                transport.close()
                return
            open_by_client[host] = open_by_client.get(host, 0) + 1
            self._counted = host
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._counted is not None:
                left = open_by_client.get(self._counted, 1) - 1
                if left > 0:
                    open_by_client[self._counted] = left
                else:
                    open_by_client.pop(self._counted, None)
                self._counted = None
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()                       # the next request on this connection has its own time

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            """No request's headers within ``header_timeout_s``: 408 and close (a request whose
            headers arrived is the application's: its body has its own timeout)."""
            self._header_timer = None
            if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
                return
            self.transport.write(error_bytes(408, "Request Timeout", f"no complete request headers within "
                                             f"{header_timeout_s:g} s of the connection", "headers"))
            self.transport.close()

    return Bounded


def server(app, host: str, port: int, *, header_timeout_s: float = HEADER_TIMEOUT_S,
           max_per_client: int = MAX_CLIENT_CONNECTIONS) -> uvicorn.Server:
    """The service's HTTP server for ``app`` (``api.create_app``) on ``host:port``."""
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                         lifespan="off", http=bounded_protocol(header_timeout_s, max_per_client)))
