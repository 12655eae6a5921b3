"""The service's HTTP server (engine/service/http_server.py, the API's body reader) holds no
connection for a client that does not send its request: a body that never arrives whole
and headers that never end are answered 408 in the error shape, and one client address
holds a bounded number of connections (429 beyond). A real uvicorn server on loopback,
over a real SQLite store, with real sockets; its timeouts shortened for the test."""
from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from engine.service.api import ApiContext, create_app
from engine.service.client import Client
from engine.service.http_server import server
from engine.service.scenario import free_port
from engine.service.store import Store
from instances.cluster import ClusterSpec, NodeGroup
from tests.test_engine_helpers import wait_until

TIMEOUT_S = 1.0


@contextmanager
def running(tmp_path, max_per_client: int = 4) -> Iterator[int]:
    db = tmp_path / "state.db"
    Store(db).close()
    app = create_app(ApiContext(str(db), str(tmp_path / "work"), ClusterSpec((NodeGroup("cpu", 1, 2),), "local-2"),
                                "fcfs"), body_timeout_s=TIMEOUT_S)
    port = free_port()
    srv = server(app, "127.0.0.1", port, header_timeout_s=TIMEOUT_S, max_per_client=max_per_client)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: srv.started, what="the server listening", timeout_s=30, poll_s=0.05)
        yield port
    finally:
        srv.should_exit = True
        thread.join(30)
        assert not thread.is_alive()


def _answer(sock: socket.socket, deadline_s: float = 10.0) -> tuple[int, dict, float]:
    """The status, JSON body and time to answer of what the server writes until it closes."""
    t0 = time.monotonic()
    sock.settimeout(deadline_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body), time.monotonic() - t0


def test_a_body_that_never_arrives_whole_is_answered_408_and_the_service_answers_on(tmp_path):
    with running(tmp_path) as port:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{}")
            status, body, took = _answer(s)
        assert status == 408 and took < TIMEOUT_S + 5, (status, took)
        assert body == {"error": f"the request body did not arrive within {TIMEOUT_S:g} s (2 of 100 bytes received)",
                        "field": "body", "file": None}
        with Store(tmp_path / "state.db", readonly=True) as st:
            assert st.jobs.rows() == []                     # nothing stored
        assert Client(f"http://127.0.0.1:{port}").get("/api/health")["ok"] is True


def test_headers_that_never_end_are_answered_408(tmp_path):
    with running(tmp_path) as port, socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /api/jobs HTTP/1.1\r\nHost: 127.0")
        status, body, took = _answer(s)
        assert status == 408 and body["field"] == "headers" and took < TIMEOUT_S + 5
        assert body["error"] == f"no complete request headers within {TIMEOUT_S:g} s of the connection"


def test_one_client_holds_a_bounded_number_of_connections(tmp_path):
    with running(tmp_path, max_per_client=4) as port:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            with socket.create_connection(("127.0.0.1", port)) as extra:
                status, body, _ = _answer(extra)
            assert status == 429 and body["field"] == "client" and "holds 4 connections" in body["error"]
        finally:
            for s in held:
                s.close()
        # (accepted in order: the first four are counted before the fifth comes)
        # once they are closed, the client is served again
        ok = wait_until(lambda: _health(port), what="an answer after the connections closed", timeout_s=30,
                        poll_s=0.1)
        assert ok["ok"] is True


def _health(port: int) -> dict | None:
    try:
        return Client(f"http://127.0.0.1:{port}").get("/api/health")
    except Exception:
        return None
