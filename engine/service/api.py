"""The service's JSON HTTP API (FastAPI) and status page, served by the ``arena serve``
process; the ``arena submit/status/cancel/logs/jobs`` commands are its clients.

| method | path | what |
|---|---|---|
| GET | /api/health | the service is up; policy (and shadow policy), cluster size, scheduler (503: stalled) |
| POST | /api/jobs | submit: a JobSpec as JSON, or ``{"toml": "..."}``; 201 with the job's id (a key: below) |
| GET | /api/jobs | every job (status, plan, GPUs, progress, loss); ``?status=S``: one status; ``?last=N``: N newest |
| GET | /api/jobs/{id} | one job, with its history and loss curve |
| POST | /api/jobs/{id}/cancel | ask the scheduler to cancel it (stopped with a checkpoint) |
| POST | /api/jobs/{id}/hold | ask the scheduler to set it aside until released (``{"reason": ...}``) |
| POST | /api/jobs/{id}/release | a held job back to the queue (or a hold not yet carried out withdrawn) |
| POST | /api/jobs/{id}/priority | set its priority (``{"priority": P, "reason": ...}``) for the next round |
| GET | /api/jobs/{id}/logs | the latest launch's output |
| POST | /api/nodes/{node}/drain | take a node (id or host) out of service; its jobs move off (``{"reason": ...}``) |
| POST | /api/nodes/{node}/undrain | return it to service |
| GET | /api/cluster | every GPU and the job holding it; drained nodes |
| GET | /api/rounds | the last rounds' decisions, solve time and gap (and the shadow policy's comparison) |
| GET | /api/shadow | the shadow policy's agreement counts over every round it was asked in |
| GET | /api/state | what the page polls: cluster, queue, rounds, jobs not ended, the ``?ended=N`` (50) last ended |
| GET | /metrics | the state for monitoring (Prometheus text format) |
| GET | / | the status page |

A submission with an ``Idempotency-Key`` header (1-200 printable characters) is stored
once: the same key again answers 200 with the job it stored (``"replayed": true``), so a
client that got no answer can resend it safely; the same key with another job is a 409.

Bad input is a 4xx with ``{"error": ..., "field": ..., "file": ...}`` and nothing stored.
A request body over ``MAX_BODY_BYTES`` is refused (413) before it is read whole. When a
token is set (required off loopback), every request needs ``Authorization: Bearer
<token>`` (the page: ``?token=``). A change sent by a page of another site (cross-site
``Origin``, or a body that is not JSON) and, without a token, a request for another host
name than the service's own are refused (403): see ``_foreign``.
"""
from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.structured import loads_json

from .jobspec import JobSpec
from .losses import LossLog
from .store import JOB_STATUSES, StateConflict, Store
from .views import STATE_ENDED_JOBS, cluster_view, job_logs, job_view, jobs_view, metrics_text, rounds_view, state_view

MAX_BODY_BYTES = 64 * 1024
MAX_ENDED = 100_000               # /api/state?ended=N, /api/jobs?last=N: at most this many jobs listed


@dataclass(frozen=True)
class ApiContext:
    db_path: str
    work_dir: str
    cluster: ClusterSpec
    policy: str
    token: str | None = None
    wake: Callable[[], None] = lambda: None       # tell the scheduler a request arrived
    check: Callable[[JobSpec], None] = lambda spec: None   # refuse a job the cluster cannot run
    plugins: tuple[str, ...] = ()                  # plug-ins loaded (path, sha256, what they registered)
    shadow_policy: str | None = None               # asked beside the policy, never carried out (--shadow-policy)
    # without a token: the host names the API answers to (a page on another site that
    # resolves its own name to 127.0.0.1 -- DNS rebinding -- is refused); None: any
    local_hosts: frozenset[str] | None = None
    # the scheduler thread's liveness (Service.liveness): health answers 503 when it stalled
    liveness: Callable[[], dict] | None = None
    # per node, the different jobs whose runs failed on it lately (Service.node_failures)
    node_failures: Callable[[], dict[int, int]] | None = None
    # loss curves read from the run folders, kept between requests (engine/service/losses.py)
    losses: LossLog = field(default_factory=LossLog)


async def _json_body(request: Request, empty: Any) -> Any:
    """The request's JSON body (``empty`` when there is none), or a 400 naming the body."""
    raw = await request.body()
    if not raw:
        return empty
    try:
        return loads_json(raw, field="body")
    except InputError as e:
        raise InputError(f"body is not JSON: {e.reason}", field="body") from None


async def _body_and_reason(request: Request) -> tuple[Any, str | None]:
    """The JSON body (``{}`` when there is none) and its optional ``reason`` (``""`` when
    absent; None when it is not a string, or the body not an object)."""
    body = await _json_body(request, {})
    reason = body.get("reason", "") if isinstance(body, dict) else None
    return body, reason if isinstance(reason, str) else None


class _BodyLimit:
    """ASGI middleware: refuse a body larger than ``limit`` bytes (declared or streamed)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _too_large(send, self.limit)
        seen = [0]

        async def limited():
            msg = await receive()
            if msg["type"] == "http.request":
                seen[0] += len(msg.get("body", b""))
                if seen[0] > self.limit:
                    raise _TooLarge()
            return msg
        try:
            return await self.app(scope, limited, send)
        except _TooLarge:
            return await _too_large(send, self.limit)


class _TooLarge(Exception):
    pass


async def _too_large(send, limit: int) -> None:
    body = json.dumps({"error": f"request body larger than {limit} bytes", "field": "body"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _error(status: int, message: str, field: str | None = None, file: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field, "file": file}, status_code=status)


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _foreign(request: Request, local_hosts: frozenset[str] | None) -> str | None:
    """Why a request that a web page on another site made the operator's browser send is
    refused (None: it is not one). Without a token the API acts for whoever reaches it, so
    a page elsewhere must not be able to make the browser cancel, drain or submit:
    a change from another origin (the ``Origin`` header browsers send with every
    cross-site POST) is refused, and so is one whose body is not JSON (a cross-site form
    or "simple" request cannot send ``application/json`` without the browser asking first,
    which this API never allows); ``local_hosts`` also refuses a ``Host`` that is not the
    service's own name (DNS rebinding)."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    try:
        name = urlsplit("//" + host).hostname or ""
        origin_host = None if origin is None else urlsplit(origin).netloc.lower()
    except ValueError:                               # e.g. "[::1" (an unclosed IPv6 bracket)
        return f"malformed Host {host!r} or Origin {origin!r} refused"
    if local_hosts is not None and name not in local_hosts:
        return (f"request for host {host!r} refused: without a token this service answers only as "
                f"{', '.join(sorted(local_hosts))}")
    if request.method in UNSAFE_METHODS:
        if origin_host is not None and origin_host != host.lower():
            return f"cross-site request from {origin!r} refused (a change must come from this service's own origin)"
        kind = request.headers.get("content-type")
        if kind is not None and kind.split(";")[0].strip().lower() != "application/json":
            return f"a change must send JSON (Content-Type: application/json), got {kind!r}"
    return None


def create_app(ctx: ApiContext):
    app = FastAPI(title="arena serve", description=__doc__.split("\n\n")[0], docs_url="/api/docs",
                  openapi_url="/api/openapi.json", redoc_url=None)

    def store() -> Store:
        return Store(ctx.db_path)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refused = _foreign(request, ctx.local_hosts)
        if refused is not None:
            return _error(403, refused, field="origin")
        if ctx.token is not None:
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip() \
                or request.query_params.get("token", "")
            if not hmac.compare_digest(given.encode(), ctx.token.encode()):
                return _error(401, "missing or wrong token (Authorization: Bearer <token>)", field="token")
        return await call_next(request)

    @app.exception_handler(InputError)
    async def input_error(_request: Request, e: InputError):
        status = 404 if e.field in ("job_id", "node") else 400
        return _error(status, e.reason, e.field, e.file)

    @app.exception_handler(StateConflict)
    async def conflict(_request: Request, e: StateConflict):
        return _error(409, str(e))

    @app.get("/api/health")
    def health() -> Any:
        body = {"ok": True, "policy": ctx.policy, "shadow_policy": ctx.shadow_policy, "cluster": ctx.cluster.name,
                "gpus": sum(ctx.cluster.gpus_by_type().values()), "plugins": list(ctx.plugins)}
        if ctx.liveness is not None:
            live = ctx.liveness()
            body["scheduler"] = live
            if live["stalled"]:                   # a supervisor's liveness probe restarts the service
                body["ok"] = False
                body["error"] = f"no sign of life from the scheduler for {live['since_s']:.0f} s (in '{live['phase']}')"
                return JSONResponse(body, status_code=503)
        return body

    @app.post("/api/jobs", status_code=201)
    async def submit(request: Request) -> Any:
        body = await _json_body(request, None)
        if isinstance(body, dict) and set(body) == {"toml"}:
            if not isinstance(body["toml"], str):
                return _error(400, "toml must be a string", field="toml")
            spec = JobSpec.from_toml_text(body["toml"], source="request", cluster=ctx.cluster)
        else:
            spec = JobSpec.from_dict(body, source="request", cluster=ctx.cluster)
        ctx.check(spec)
        spec = spec.with_frozen_model(Path(ctx.work_dir) / "models")
        with store() as s:
            job_id, new = s.submit_once(spec, request.headers.get("idempotency-key"))
        if not new:              # the job this key already submitted: 200, as it was
            with store() as s:
                row = s.job(job_id)
            return JSONResponse({"id": job_id, "name": row.name, "status": row.status, "replayed": True})
        ctx.wake()
        return JSONResponse({"id": job_id, "name": spec.name, "status": "queued"}, status_code=201)

    @app.get("/api/jobs")
    def jobs(status: str | None = None, last: int | None = None) -> Any:
        if status is not None and status not in JOB_STATUSES:
            return _error(422, f"unknown status {status!r}; known: {', '.join(JOB_STATUSES)}", field="status")
        if last is not None and not 1 <= last <= MAX_ENDED:
            return _error(422, f"must be in 1..{MAX_ENDED}, got {last}", field="last")
        with store() as s:
            return jobs_view(s, ctx.work_dir, s.jobs(status, last=last), losses=ctx.losses)

    @app.get("/api/jobs/{job_id}")
    def job(job_id: int) -> dict:
        with store() as s:
            return job_view(s, ctx.work_dir, job_id, losses=ctx.losses)

    @app.post("/api/jobs/{job_id}/cancel")
    def cancel(job_id: int) -> Any:
        with store() as s:
            ok = s.request_cancel(job_id)
            status = s.job(job_id).status
        if not ok:
            return _error(409, f"job {job_id} has already ended ({status})", field="job_id")
        ctx.wake()
        return {"id": job_id, "cancel_requested": True, "status": status}

    @app.post("/api/jobs/{job_id}/hold")
    async def hold(job_id: int, request: Request) -> Any:
        _, reason = await _body_and_reason(request)
        if reason is None:
            return _error(400, "reason must be a string", field="reason")
        with store() as s:
            new = s.request_hold(job_id, reason)
            status = s.job(job_id).status
        ctx.wake()
        return {"id": job_id, "hold_requested": True, "already": not new, "status": status}

    @app.post("/api/jobs/{job_id}/release")
    def release(job_id: int) -> Any:
        with store() as s:
            what = s.release(job_id)
            status = s.job(job_id).status
        ctx.wake()
        return {"id": job_id, "released": what, "status": status}

    @app.post("/api/jobs/{job_id}/priority")
    async def priority(job_id: int, request: Request) -> Any:
        body, reason = await _body_and_reason(request)
        if not isinstance(body, dict) or "priority" not in body:
            return _error(400, 'send {"priority": P} (P a finite number in [1e-4, 1e4])', field="priority")
        if reason is None:
            return _error(400, "reason must be a string", field="reason")
        with store() as s:
            was = s.set_priority(job_id, body["priority"], reason)
            status = s.job(job_id).status
        ctx.wake()
        return {"id": job_id, "priority": float(body["priority"]), "was": was, "status": status}

    @app.get("/api/jobs/{job_id}/logs")
    def logs(job_id: int, chars: int = 20_000) -> dict:
        with store() as s:
            s.job(job_id)
            return job_logs(s, ctx.work_dir, job_id, max(0, min(chars, 1_000_000)))

    @app.post("/api/nodes/{node}/drain")
    async def drain(node: str, request: Request) -> Any:
        _, reason = await _body_and_reason(request)
        if reason is None:
            return _error(400, "reason must be a string", field="reason")
        nid = ctx.cluster.node_id(node)
        with store() as s:
            new = s.drain(nid, reason or "drained by the operator")
        ctx.wake()
        return {"node": nid, "drained": True, "already": not new}

    @app.post("/api/nodes/{node}/undrain")
    def undrain(node: str) -> Any:
        nid = ctx.cluster.node_id(node)
        with store() as s:
            was = s.undrain(nid)
        ctx.wake()
        return {"node": nid, "drained": False, "already": not was}

    @app.get("/api/cluster")
    def cluster() -> dict:
        with store() as s:
            return cluster_view(s, ctx.cluster)

    @app.get("/api/rounds")
    def rounds(last: int = 20) -> list:
        with store() as s:
            return rounds_view(s, max(1, min(last, 1000)))

    @app.get("/api/shadow")
    def shadow() -> dict:
        with store() as s:
            return {"shadow_policy": ctx.shadow_policy, "counts": s.shadow_counts()}

    @app.get("/api/state")
    def state(ended: int = STATE_ENDED_JOBS) -> Any:
        if not 0 <= ended <= MAX_ENDED:
            return _error(422, f"must be in 0..{MAX_ENDED}, got {ended}", field="ended")
        with store() as s:
            return {**state_view(s, ctx.work_dir, ctx.cluster, losses=ctx.losses, ended=ended), "policy": ctx.policy,
                    "shadow_policy": ctx.shadow_policy,
                    "scheduler": None if ctx.liveness is None else ctx.liveness()}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        with store() as s:
            text = metrics_text(s, ctx.cluster, ctx.policy, None if ctx.liveness is None else ctx.liveness(),
                                None if ctx.node_failures is None else ctx.node_failures())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    page = resources.files("engine.service").joinpath("page.html").read_text()

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    return _BodyLimit(app, MAX_BODY_BYTES)
