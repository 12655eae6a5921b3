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
| GET | /api/cluster | every GPU and the job holding it; drained nodes; on Slurm, each node's Slurm state |
| GET | /api/rounds | the last rounds' decisions, solve time and gap (and the shadow policy's comparison) |
| GET | /api/shadow | the shadow policy's agreement counts over every round it was asked in |
| GET | /api/state | what the page polls: cluster, queue, rounds, jobs not ended, the ``?ended=N`` (50) last ended |
| GET | /metrics | the state for monitoring (Prometheus text format) |
| GET | / | the status page |

A submission with an ``Idempotency-Key`` header (1-200 printable characters) is stored
once: the same key again answers 200 with the job it stored (``"replayed": true``), so a
client that got no answer can resend it safely; the same key with another job is a 409.

Every error is ``{"error": ..., "field": ..., "file": ...}`` with its status (and nothing
stored): bad input 400 (404 for an unknown job or node), a path or query parameter out
of its range or unknown 422, an unknown route 404, a method a route does not take 405
(with ``Allow``), a body not whole ``BODY_TIMEOUT_S`` after the headers 408, a body over
``MAX_BODY_BYTES`` 413 (refused before it is read whole, declared or streamed), headers
over ``MAX_HEADER_BYTES`` 431 (the HTTP server's own bounds: http_server.py). When tokens are set
(``--token`` or ``--tokens-file``; required off loopback), every request needs
``Authorization: Bearer <token>`` (the scheme in any case), except the page's own HTML
(``GET /``, which holds no data): its script takes the token from the page's address
(``/?token=``) and sends the header; the server refuses ``?token=`` everywhere else.
With a tokens file, a change of a job needs its submitter's token or an admin's, a drain
an admin's (engine/service/auth.py). A change sent by a page of another site
(cross-site ``Origin``, or a body that is not JSON) and, without a token, a request for
another host name than the service's own are refused (403): see ``_foreign``.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Callable
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from instances.cluster import ClusterSpec
from instances.errors import InputError
from instances.structured import loads_json

from .auth import Caller, Tokens, bearer
from .jobspec import JOB_KEYS, MAX_JOB_ID, JobSpec
from .losses import LossLog
from .store import JOB_STATUSES, StateConflict, Store
from .views import (
    MAX_LOG_CHARS,
    MAX_ROUNDS_SHOWN,
    STATE_ENDED_JOBS,
    cluster_view,
    job_logs,
    job_view,
    jobs_view,
    mark_slurm_jobs,
    metrics_text,
    rounds_view,
    state_view,
)

MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 32 * 1024      # every header name and value of a request together (more: 431)
BODY_TIMEOUT_S = 30.0             # a request's body arrives whole within this of its headers (else 408)
MAX_ENDED = 100_000               # /api/state?ended=N, /api/jobs?last=N: at most this many jobs listed
PAGE_PATH = "/"                   # the page's HTML: no token needed (a browser cannot send a header to open it)
CALLER = "arena.caller"           # the request scope's key for its Caller (None: no tokens set)

JobId = Annotated[int, PathParam(ge=1, le=MAX_JOB_ID, description="a job's id")]
StoreOpener = Callable[[], Store]           # a new connection to the state (create_app's ``store``)


@dataclass(frozen=True)
class ApiContext:
    db_path: str
    work_dir: str
    cluster: ClusterSpec
    policy: str
    tokens: Tokens | None = None                   # None: no token needed (loopback only; see _foreign)
    wake: Callable[[], None] = lambda: None       # tell the scheduler a request arrived
    check: Callable[[JobSpec], None] = lambda spec: None   # refuse a job the cluster cannot run
    plugins: tuple[str, ...] = ()                  # plug-ins loaded (path, sha256, what they registered)
    shadow_policy: str | None = None               # asked beside the policy, never carried out (--shadow-policy)
    data_roots: tuple[str, ...] | None = None      # a job's data file and config.json lie in these (None: anywhere)
    # without a token: the host names the API answers to (a page on another site that
    # resolves its own name to 127.0.0.1 -- DNS rebinding -- is refused); None: any
    local_hosts: frozenset[str] | None = None
    # the scheduler thread's liveness (Service.liveness): health answers 503 when it stalled
    liveness: Callable[[], dict] | None = None
    # per node, the different jobs whose runs failed on it lately (Service.node_failures)
    node_failures: Callable[[], dict[int, int]] | None = None
    # on Slurm: Slurm's node state for ``/api/cluster`` and the page (SlurmNodeState.peek); None: not on Slurm
    slurm_nodes: Callable[[], dict] | None = None
    # on Slurm: Slurm's state of batch jobs by id (SlurmNodeState.jobs), for the job views
    slurm_jobs: Callable[[list[int]], dict[int, dict]] | None = None
    # off Slurm, with hosts: whether each host answers (Service.host_watch.peek); None: not watched
    host_watch: Callable[[], dict] | None = None
    # loss curves read from the run folders, kept between requests (engine/service/losses.py)
    losses: LossLog = field(default_factory=LossLog)


async def _json_body(request: Request, empty: Any) -> Any:
    """The request's JSON body (``empty`` when there is none), or a 400 naming the body."""
    raw = await request.body()
    if not raw:
        return empty
    try:
        return loads_json(raw, field="body")
    except InputError as e:                 # a key given twice names its place (body.KEY)
        if e.field != "body":
            raise
        raise InputError(f"body is not JSON: {e.reason}", field="body") from None


async def _body_and_reason(request: Request, known: tuple[str, ...] = ("reason",)) -> tuple[Any, str | None]:
    """The JSON body (``{}`` when there is none) and its optional ``reason`` (``""`` when
    absent; None when it is not a string, or the body not an object); a key not in
    ``known`` is a 400 naming it (a misspelt ``reson`` would be dropped without a word)."""
    body = await _json_body(request, {})
    _refuse_unknown(body, known)
    reason = body.get("reason", "") if isinstance(body, dict) else None
    return body, reason if isinstance(reason, str) else None


def _refuse_unknown(body: Any, known) -> None:
    """A 400 naming the first key of the JSON object ``body`` not in ``known`` as
    ``body.KEY`` (a misspelt key would otherwise be dropped, or blamed on a field)."""
    unknown = sorted(set(body) - set(known), key=str) if isinstance(body, dict) else []
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}",
                         field=f"body.{unknown[0]}")


class _BodyLimit:
    """ASGI middleware: refuse a body larger than ``limit`` bytes, declared
    (``Content-Length``) or streamed (chunked), with a 413 before the application sees
    it, and one that has not arrived whole ``timeout_s`` after the request's headers
    with a 408 (a client that declares 100 bytes and sends 2 would otherwise hold its
    request open for ever). The body (at most ``limit`` bytes) is read here whole and
    handed on as one message, so no error can arise halfway through the application's
    own reading."""

    def __init__(self, app, limit: int, timeout_s: float = BODY_TIMEOUT_S):
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        if sum(len(k) + len(v) for k, v in headers) > MAX_HEADER_BYTES:
            return await _refuse(send, 431, f"request headers larger than {MAX_HEADER_BYTES} bytes", "headers")
        declared = dict(headers).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _too_large(send, self.limit)
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                got = f"{size} of {int(declared)} bytes" if declared is not None and declared.isdigit() \
                    else f"{size} bytes"
                return await _refuse(send, 408, f"the request body did not arrive within {self.timeout_s:g} s "
                                                f"({got} received)", "body")
            if msg["type"] != "http.request":          # the client went away: nobody to answer
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _too_large(send, self.limit)
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        whole: list[dict] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return whole.pop() if whole else await receive()
        return await self.app(scope, replay, send)


async def _too_large(send, limit: int) -> None:
    await _refuse(send, 413, f"request body larger than {limit} bytes", "body")


async def _refuse(send, status: int, message: str, field: str) -> None:
    """An error answered before the application (``_error``'s shape), closing the connection."""
    body = json.dumps({"error": message, "field": field, "file": None}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _error(status: int, message: str, field: str | None = None, file: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field, "file": file}, status_code=status, headers=headers)


class ApiError(Exception):
    """A refusal with its status, in the documented shape (``_error``)."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def validation_message(err: dict) -> tuple[str | None, str]:
    """(field, reason) of one of FastAPI's validation errors, in this API's words."""
    loc = [str(x) for x in err.get("loc", ())]
    field = loc[-1] if len(loc) > 1 else None
    kind, ctx, got = err.get("type", ""), err.get("ctx") or {}, err.get("input")
    if kind in ("int_parsing", "int_type", "int_from_float"):
        reason = "must be an integer"
    elif kind == "greater_than_equal":
        reason = f"must be >= {ctx.get('ge')}"
    elif kind == "less_than_equal":
        reason = f"must be <= {ctx.get('le')}"
    else:
        msg = str(err.get("msg", "invalid"))
        reason = msg[:1].lower() + msg[1:]
    where = {"path": "path parameter", "query": "query parameter", "header": "header"}.get(loc[0] if loc else "")
    prefix = f"{where} '{field}' " if where and field else ""
    return field, f"{prefix}{reason}" + (f", got {_short(got)}" if got is not None else "")


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
        return f"malformed Host {_short(host)} or Origin {_short(origin)} refused"
    if local_hosts is not None and name not in local_hosts:
        return (f"request for host {_short(host)} refused: without a token this service answers only as "
                f"{', '.join(sorted(local_hosts))}")
    if request.method in UNSAFE_METHODS:
        if origin_host is not None and origin_host != host.lower():
            return (f"cross-site request from {_short(origin)} refused (a change must come from this service's "
                    "own origin)")
        kind = request.headers.get("content-type")
        if kind is not None and kind.split(";")[0].strip().lower() != "application/json":
            return f"a change must send JSON (Content-Type: application/json), got {_short(kind)}"
    return None


def _authenticate(request: Request, tokens: Tokens) -> Caller | str:
    """The caller a request's token names, or why it is refused (401). The token comes in
    ``Authorization: Bearer <token>`` and only there: the server never reads one from an
    address (``?token=`` is refused, as it ends up in logs and browser histories). The
    page's own HTML (``GET /``) holds no data and needs none: its script reads
    ``?token=`` from the page's address and sends the header."""
    if "token" in request.query_params:
        return ("?token= is read only by the status page's script (open /?token=...); the API takes the token "
                "in the header Authorization: Bearer <token>")
    given = bearer(request.headers.get("authorization"))
    if given is None and request.headers.get("authorization") is not None:
        return "the Authorization header must be 'Bearer <token>'"
    caller = tokens.caller(given)
    return caller if caller is not None else "missing or wrong token (Authorization: Bearer <token>)"


def _may_change_job(request: Request, s: Store, job_id: int, what: str) -> None:
    """Refuse (403) a change of a job by a caller who neither submitted it nor is an admin
    (no tokens: anyone may; docs/service.md, "Who may do what")."""
    caller: Caller | None = request.scope.get(CALLER)
    if caller is None or caller.admin:
        return
    owner = s.jobs.get(job_id).submitted_by                     # (404 for an unknown job)
    if owner != caller.user:
        by = f"by {owner!r}" if owner is not None else "without a token"
        raise ApiError(403, f"job {job_id} was submitted {by}; only its submitter's token or an admin's may "
                            f"{what} it (you are {caller.user!r})", field="token")


def _admin_only(request: Request, what: str) -> None:
    caller: Caller | None = request.scope.get(CALLER)
    if caller is not None and not caller.admin:
        raise ApiError(403, f"only an admin may {what} (you are {caller.user!r}; an admin's line in the tokens "
                            "file ends in 'admin')", field="token")


async def _known_query(request: Request) -> None:
    """Every route: a query parameter it does not take is refused (422, naming it), not
    silently ignored (``?stauts=queued`` would list every job)."""
    route = request.scope.get("route")
    takes = {p.alias for p in getattr(getattr(route, "dependant", None), "query_params", ())}
    if request.url.path == PAGE_PATH:
        takes.add("token")
    unknown = sorted(set(request.query_params) - takes)
    if unknown:
        raise ApiError(422, f"unknown query parameter {_short(unknown[0])}; this route takes "
                            f"{', '.join(sorted(takes)) or 'none'}", field=unknown[0])


def create_app(ctx: ApiContext, *, body_timeout_s: float = BODY_TIMEOUT_S):
    """The API and the page over ``ctx``, inside ``_BodyLimit``: ``_guard`` sees every
    request first, ``_known_query`` checks every route's query parameters, and every error
    is answered in ``_error``'s shape (``_ERROR_HANDLERS``)."""
    app = FastAPI(title="arena serve", description=__doc__.split("\n\n")[0], docs_url="/api/docs",
                  openapi_url="/api/openapi.json", redoc_url=None, dependencies=[Depends(_known_query)])

    def store() -> Store:
        return Store(ctx.db_path)

    app.middleware("http")(_guard(ctx))
    for kind, handler in _ERROR_HANDLERS:
        app.exception_handler(kind)(handler)
    # (the routes in the order of the table above, which is the OpenAPI schema's)
    _add_health_route(app, ctx)
    _add_jobs_routes(app, ctx, store)
    _add_job_action_routes(app, ctx, store)
    _add_node_routes(app, ctx, store)
    _add_status_routes(app, ctx, store)
    return _BodyLimit(app, MAX_BODY_BYTES, body_timeout_s)


def _guard(ctx: ApiContext) -> Callable:
    """The middleware before every route: a request from a page of another site (or for
    another host) is refused (403, ``_foreign``); with tokens set, one without a valid
    token is refused (401) except the page's own HTML, and the caller is kept in the
    request's scope (``CALLER``) for the routes that check who may change what."""
    async def guard(request: Request, call_next):
        refused = _foreign(request, ctx.local_hosts)
        if refused is not None:
            return _error(403, refused, field="origin")
        request.scope[CALLER] = None
        page = request.url.path == PAGE_PATH and request.method in ("GET", "HEAD")   # static: no data in it
        if ctx.tokens is not None and not page:
            who = _authenticate(request, ctx.tokens)
            if isinstance(who, str):
                return _error(401, who, field="token", headers={"WWW-Authenticate": "Bearer"})
            request.scope[CALLER] = who
        return await call_next(request)
    return guard


async def _input_error(_request: Request, e: InputError):
    status = 404 if e.field in ("job_id", "node") else 400
    return _error(status, e.reason, e.field, e.file)


async def _conflict(_request: Request, e: StateConflict):
    return _error(409, str(e))


async def _refused(_request: Request, e: ApiError):
    return _error(e.status, e.message, e.field)


async def _invalid(_request: Request, e: RequestValidationError):
    errors = list(e.errors())
    field, reason = validation_message(errors[0]) if errors else (None, "invalid request")
    return _error(422, reason, field)


async def _http_error(request: Request, e: StarletteHTTPException):
    path = _short(request.url.path, 120)
    if e.status_code == 404:
        message, field = f"no route {request.method} {path} (the routes: /api/docs)", None
    elif e.status_code == 405:
        allowed = (e.headers or {}).get("Allow", "")
        message, field = f"{request.method} is not allowed on {path}; it takes {allowed}", "method"
    else:
        message, field = str(e.detail), None
    return _error(e.status_code, message, field, headers=dict(e.headers or {}))


async def _internal(_request: Request, e: Exception):       # a bug: still in the shape (and logged)
    return _error(500, f"internal error ({type(e).__name__}); the service's log has the details")


# every error, raised anywhere in a request, answered in ``_error``'s shape
_ERROR_HANDLERS: tuple[tuple[type[Exception], Callable], ...] = (
    (InputError, _input_error), (StateConflict, _conflict), (ApiError, _refused), (RequestValidationError, _invalid),
    (StarletteHTTPException, _http_error), (Exception, _internal))


def _add_health_route(app: FastAPI, ctx: ApiContext) -> None:
    """``/api/health``: up, or 503 when the scheduler stalled (a supervisor's probe)."""
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
                body["field"], body["file"] = "scheduler", None
                return JSONResponse(body, status_code=503)
        return body


def _add_jobs_routes(app: FastAPI, ctx: ApiContext, store: StoreOpener) -> None:
    """``/api/jobs`` (submit, list) and ``/api/jobs/{id}`` (one job)."""
    @app.post("/api/jobs", status_code=201)
    async def submit(request: Request) -> Any:
        body = await _json_body(request, None)
        if isinstance(body, dict) and set(body) == {"toml"}:
            if not isinstance(body["toml"], str):
                return _error(400, "toml must be a string", field="toml")
            spec = JobSpec.from_toml_text(body["toml"], source="request", cluster=ctx.cluster, roots=ctx.data_roots)
        else:
            _refuse_unknown(body, JOB_KEYS)
            spec = JobSpec.from_dict(body, source="request", cluster=ctx.cluster, roots=ctx.data_roots)
        ctx.check(spec)
        spec = spec.with_frozen_model(Path(ctx.work_dir) / "models")
        caller: Caller | None = request.scope.get(CALLER)
        with store() as s:
            job_id, new = s.jobs.submit_once(spec, request.headers.get("idempotency-key"),
                                        user=None if caller is None else caller.user)
        if not new:              # the job this key already submitted: 200, as it was
            with store() as s:
                row = s.jobs.get(job_id)
            return JSONResponse({"id": job_id, "name": row.name, "status": row.status, "replayed": True})
        ctx.wake()
        return JSONResponse({"id": job_id, "name": spec.name, "status": "queued"}, status_code=201)

    @app.get("/api/jobs")
    def jobs(status: str | None = None, last: Annotated[int | None, Query(ge=1, le=MAX_ENDED)] = None) -> Any:
        if status is not None and status not in JOB_STATUSES:
            return _error(422, f"unknown status {_short(status)}; known: {', '.join(JOB_STATUSES)}", field="status")
        with store() as s:
            views = jobs_view(s, ctx.work_dir, s.jobs.rows(status, last=last), losses=ctx.losses, cluster=ctx.cluster)
        return _with_slurm_jobs(ctx, views)

    @app.get("/api/jobs/{job_id}")
    def job(job_id: JobId) -> dict:
        with store() as s:
            view = job_view(s, ctx.work_dir, job_id, losses=ctx.losses, cluster=ctx.cluster)
        return _with_slurm_jobs(ctx, [view])[0]


def _with_slurm_jobs(ctx: ApiContext, views: list[dict]) -> list[dict]:
    """On Slurm, the job views with their batch jobs' state (``mark_slurm_jobs``; read
    outside the store's transaction)."""
    ids = [v["slurm_job_id"] for v in views if v.get("slurm_job_id") is not None]
    if ctx.slurm_jobs is None or not ids:
        return views
    return mark_slurm_jobs(views, ctx.slurm_jobs(ids))


def _with_node_states(ctx: ApiContext, view: dict) -> dict:
    """The cluster view with each node's state from outside the database: Slurm's
    (``SlurmNodeState.peek``, as ``slurm``) on Slurm, whether its host answers
    (``HostWatch.peek``, as ``host_check``) off Slurm with hosts."""
    for key, peek in (("slurm", ctx.slurm_nodes), ("host_check", ctx.host_watch)):
        if peek is None:
            continue
        states = peek()
        for n in view["nodes"]:
            n[key] = states["nodes"].get(n["node"])
        view[key] = {k: v for k, v in states.items() if k != "nodes"}
    return view


def _add_job_action_routes(app: FastAPI, ctx: ApiContext, store: StoreOpener) -> None:
    """``/api/jobs/{id}/...``: cancel, hold, release, priority (a change: its submitter's
    or an admin's, ``_may_change_job``; the scheduler carries it out) and logs."""
    @app.post("/api/jobs/{job_id}/cancel")
    def cancel(job_id: JobId, request: Request) -> Any:
        with store() as s:
            _may_change_job(request, s, job_id, "cancel")
            ok = s.jobs.request_cancel(job_id)
            status = s.jobs.get(job_id).status
        if not ok:
            return _error(409, f"job {job_id} has already ended ({status})", field="job_id")
        ctx.wake()
        return {"id": job_id, "cancel_requested": True, "status": status}

    @app.post("/api/jobs/{job_id}/hold")
    async def hold(job_id: JobId, request: Request) -> Any:
        _, reason = await _body_and_reason(request)
        if reason is None:
            return _error(400, "reason must be a string", field="reason")
        with store() as s:
            _may_change_job(request, s, job_id, "hold")
            new = s.jobs.request_hold(job_id, reason)
            status = s.jobs.get(job_id).status
        ctx.wake()
        return {"id": job_id, "hold_requested": True, "already": not new, "status": status}

    @app.post("/api/jobs/{job_id}/release")
    def release(job_id: JobId, request: Request) -> Any:
        with store() as s:
            _may_change_job(request, s, job_id, "release")
            what = s.jobs.release(job_id)
            status = s.jobs.get(job_id).status
        ctx.wake()
        return {"id": job_id, "released": what, "status": status}

    @app.post("/api/jobs/{job_id}/priority")
    async def priority(job_id: JobId, request: Request) -> Any:
        body, reason = await _body_and_reason(request, ("priority", "reason"))
        if not isinstance(body, dict) or "priority" not in body:
            return _error(400, 'send {"priority": P} (P a finite number in [1e-4, 1e4])', field="priority")
        if reason is None:
            return _error(400, "reason must be a string", field="reason")
        with store() as s:
            _may_change_job(request, s, job_id, "change the priority of")
            was = s.jobs.set_priority(job_id, body["priority"], reason)
            status = s.jobs.get(job_id).status
        ctx.wake()
        return {"id": job_id, "priority": float(body["priority"]), "was": was, "status": status}

    @app.get("/api/jobs/{job_id}/logs")
    def logs(job_id: JobId, chars: Annotated[int, Query(ge=0, le=MAX_LOG_CHARS)] = 20_000) -> dict:
        with store() as s:
            s.jobs.get(job_id)
            return job_logs(s, ctx.work_dir, job_id, chars)


def _add_node_routes(app: FastAPI, ctx: ApiContext, store: StoreOpener) -> None:
    """``/api/nodes/{node}/drain`` and ``/undrain`` (an admin's, ``_admin_only``)."""
    @app.post("/api/nodes/{node}/drain")
    async def drain(node: str, request: Request) -> Any:
        _admin_only(request, "drain a node")
        _, reason = await _body_and_reason(request)
        if reason is None:
            return _error(400, "reason must be a string", field="reason")
        nid = ctx.cluster.node_id(node)
        with store() as s:
            new = s.nodes.drain(nid, reason or "drained by the operator")
        ctx.wake()
        return {"node": nid, "drained": True, "already": not new}

    @app.post("/api/nodes/{node}/undrain")
    def undrain(node: str, request: Request) -> Any:
        _admin_only(request, "return a node to service")
        nid = ctx.cluster.node_id(node)
        with store() as s:
            was = s.nodes.undrain(nid)
        ctx.wake()
        return {"node": nid, "drained": False, "already": not was}


def _add_status_routes(app: FastAPI, ctx: ApiContext, store: StoreOpener) -> None:
    """What the page, the status commands and monitoring read: ``/api/cluster``,
    ``/api/rounds``, ``/api/shadow``, ``/api/state``, ``/metrics``, and the page (``/``)."""
    @app.get("/api/cluster")
    def cluster() -> dict:
        with store() as s:
            view = cluster_view(s, ctx.cluster)
        return _with_node_states(ctx, view)             # (read outside the store's transaction)

    @app.get("/api/rounds")
    def rounds(last: Annotated[int, Query(ge=1, le=MAX_ROUNDS_SHOWN)] = 20) -> list:
        with store() as s:
            return rounds_view(s, last)

    @app.get("/api/shadow")
    def shadow() -> dict:
        with store() as s:
            return {"shadow_policy": ctx.shadow_policy, "counts": s.rounds.shadow_counts()}

    @app.get("/api/state")
    def state(ended: Annotated[int, Query(ge=0, le=MAX_ENDED)] = STATE_ENDED_JOBS) -> Any:
        with store() as s:
            view = state_view(s, ctx.work_dir, ctx.cluster, losses=ctx.losses, ended=ended)
        _with_node_states(ctx, view["cluster"])
        _with_slurm_jobs(ctx, view["jobs"])
        return {**view, "policy": ctx.policy, "shadow_policy": ctx.shadow_policy,
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
