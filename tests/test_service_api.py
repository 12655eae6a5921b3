"""The service's HTTP API and its command line on bad input: every case is a 4xx naming
the field (or a clear CLI error), and nothing is stored. The API is the real FastAPI
application over a real SQLite store, called in-process (no scheduler thread needed to
validate and store submissions)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine.cli.main import main as cli_main
from engine.service.api import MAX_BODY_BYTES, ApiContext, create_app
from engine.service.store import Store
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from tests.prometheus import parse_metrics

CLUSTER = ClusterSpec((NodeGroup("cpu", 1, 4),), "local-4")
GOOD = {"name": "ok", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 10}


@pytest.fixture()
def api(tmp_path):
    db = tmp_path / "state.db"
    Store(db).close()
    woken = []
    app = create_app(ApiContext(str(db), str(tmp_path / "work"), CLUSTER, "arena", wake=lambda: woken.append(1)))
    return TestClient(app), db, woken


def stored(db: Path) -> int:
    with Store(db, readonly=True) as st:
        return len(st.jobs.rows())


def test_a_good_job_is_stored_and_wakes_the_scheduler(api):
    client, db, woken = api
    r = client.post("/api/jobs", json=GOOD)
    assert r.status_code == 201 and r.json()["id"] == 1 and woken
    assert stored(db) == 1
    assert client.get("/api/jobs/1").json()["status"] == "queued"
    assert client.post("/api/jobs/1/cancel").json()["cancel_requested"] is True
    with Store(db, readonly=True) as st:
        assert st.jobs.cancel_requests() == [1]


def heads_config(tmp_path: Path) -> str:
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 6,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64}
    p = tmp_path / "bad-config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize("case", ["toml", "model", "heads", "gpus", "steps", "unknown", "not-json", "type",
                                  "key-twice"])
def test_bad_submissions_are_refused_with_the_field_and_nothing_stored(api, tmp_path, case):
    client, db, _ = api
    body, field = {
        "toml": ({"toml": "name = \"x\"\nsteps = = 3\n"}, None),
        "model": ({**GOOD, "model": "nosuch__1B"}, "model"),
        "heads": ({**GOOD, "model": heads_config(tmp_path)}, "model"),
        "gpus": ({**GOOD, "gpus": 64}, "gpus"),
        "steps": ({**GOOD, "steps": -5}, "steps"),
        "unknown": ({**GOOD, "bogus": 1}, "body.bogus"),
        "not-json": (b"{not json", "body"),
        "type": ([1, 2], None),
        "key-twice": (json.dumps(GOOD)[:-1].encode() + b', "steps": 1000}', "body.steps"),
    }[case]
    r = client.post("/api/jobs", content=body) if isinstance(body, bytes) else client.post("/api/jobs", json=body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()
    assert err["error"]
    if field is not None:
        assert err["field"] == field, err
    if case == "toml":
        assert "malformed TOML" in err["error"]
    if case == "key-twice":
        assert "key 'steps' given twice" in err["error"]
    assert stored(db) == 0


def test_a_huge_body_is_refused_before_it_is_read(api):
    client, db, _ = api
    r = client.post("/api/jobs", content=b"x" * (MAX_BODY_BYTES + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"
    assert stored(db) == 0


def test_unknown_job_is_404_and_cancelling_an_ended_job_is_409(api):
    client, db, _ = api
    assert client.get("/api/jobs/99").status_code == 404
    client.post("/api/jobs", json=GOOD)
    with Store(db) as st:
        st.jobs.request_cancel(1)
        st.jobs.set_status(1, "cancelled", "test")
    assert client.post("/api/jobs/1/cancel").status_code == 409


def test_hold_and_release_are_requests_the_scheduler_carries_out_and_bad_ones_are_refused(api):
    client, db, woken = api
    client.post("/api/jobs", json=GOOD)
    woken.clear()
    r = client.post("/api/jobs/1/hold", json={"reason": "urgent run first"})
    assert r.status_code == 200 and r.json() == {"id": 1, "hold_requested": True, "already": False,
                                                 "status": "queued"} and woken
    assert client.get("/api/jobs/1").json()["hold_requested"] is True
    assert client.post("/api/jobs/1/hold").json()["already"] is True
    assert client.post("/api/jobs/1/hold", json={"reason": 3}).json()["field"] == "reason"
    # a key the request does not read is refused, not dropped (here a misspelt reason); nothing is asked
    for path, body in (("/api/jobs/1/hold", {"reson": "x"}), ("/api/jobs/1/priority", {"priority": 2, "node": 1}),
                       ("/api/nodes/0/drain", {"why": "disk"})):
        r = client.post(path, json=body)
        assert r.status_code == 400 and r.json()["field"].startswith("body.") and "unknown key" in r.json()["error"]
    with Store(db, readonly=True) as st:
        assert st.nodes.drained() == {} and st.jobs.hold_requests() == [(1, "urgent run first")]
    with Store(db) as st:                             # the scheduler carries it out
        assert st.jobs.hold_requests() == [(1, "urgent run first")] and st.jobs.hold(1)
    job = client.get("/api/jobs/1").json()
    assert job["status"] == "held" and job["hold_requested"] is False
    assert client.post("/api/jobs/1/release").json() == {"id": 1, "released": "released", "status": "queued"}
    r = client.post("/api/jobs/1/release")
    assert r.status_code == 409 and "not held" in r.json()["error"]
    assert client.post("/api/jobs/99/hold").status_code == 404
    assert client.post("/api/jobs/99/release").status_code == 404
    with Store(db) as st:
        st.jobs.request_cancel(1)
        st.jobs.set_status(1, "cancelled", "test")
    assert client.post("/api/jobs/1/hold").status_code == 409
    m = parse_metrics(client.get("/metrics").text)
    assert m['arena_jobs{status="held"}'] == 0 and m['arena_jobs{status="cancelled"}'] == 1


def test_a_job_after_an_unknown_job_is_refused_and_one_after_a_queued_job_waits_for_it(api):
    client, db, _ = api
    client.post("/api/jobs", json=GOOD)
    r = client.post("/api/jobs", json={**GOOD, "after": [7]})
    assert r.status_code == 400 and r.json()["field"] == "after" and "no job 7" in r.json()["error"]
    assert client.post("/api/jobs", json={**GOOD, "after": [1]}).status_code == 201
    job = client.get("/api/jobs/2").json()
    assert job["after"] == [1] and job["waiting_for"] == [1]


def test_a_priority_change_is_stored_shown_and_bad_ones_are_refused(api, capsys):
    from engine.cli.main import main as cli_main
    client, db, woken = api
    client.post("/api/jobs", json=GOOD)
    woken.clear()
    r = client.post("/api/jobs/1/priority", json={"priority": 4, "reason": "paper deadline"})
    assert r.json() == {"id": 1, "priority": 4.0, "was": 1.0, "status": "queued"} and woken
    job = client.get("/api/jobs/1").json()
    assert job["priority"] == 4.0 and "priority 1 -> 4 by the user: paper deadline" in job["history"][-1]["reason"]
    for body in ({}, {"priority": 0}, {"priority": "high"}, {"priority": 2, "reason": 1}, [2]):
        r = client.post("/api/jobs/1/priority", json=body)
        assert r.status_code == 400 and r.json()["field"] in ("priority", "reason"), (body, r.json())
    assert client.post("/api/jobs/99/priority", json={"priority": 2}).status_code == 404
    assert cli_main(["priority", "1", "0", "--url", "http://127.0.0.1:9"]) == 2   # refused before sending
    assert "field 'priority': must be a finite number in [0.0001, 10000]" in capsys.readouterr().err
    with Store(db) as st:
        st.jobs.request_cancel(1)
        st.jobs.set_status(1, "cancelled", "test")
    assert client.post("/api/jobs/1/priority", json={"priority": 2}).status_code == 409


def test_a_page_of_another_site_cannot_make_the_browser_change_anything(tmp_path):
    """Without a token the API acts for whoever reaches it; what a page elsewhere can make
    the operator's browser send is refused: a POST from another origin, a form or
    plain-text body, and (DNS rebinding) a request for another host name. The CLI's
    requests, and the page's own, still pass."""
    db = tmp_path / "state.db"
    Store(db).close()
    ctx = ApiContext(str(db), str(tmp_path / "work"), CLUSTER, "arena", local_hosts=frozenset({"127.0.0.1"}))
    client = TestClient(create_app(ctx), base_url="http://127.0.0.1:8765")
    assert client.post("/api/jobs", json=GOOD).status_code == 201
    for headers, content, says in (
            ({"origin": "https://evil.example"}, None, "cross-site request from 'https://evil.example'"),
            ({"origin": "http://127.0.0.1:9999"}, None, "cross-site"),           # another port: another origin
            ({"content-type": "application/x-www-form-urlencoded"}, b"reason=x", "must send JSON"),
            ({"content-type": "text/plain"}, b'{"reason": "x"}', "must send JSON"),
            ({"host": "evil.example:8765"}, None, "host 'evil.example:8765' refused"),
            ({"origin": "http://[::1"}, None, "malformed Host"),                   # no 500
            ({"host": "[::1"}, None, "malformed Host")):
        for path in ("/api/jobs/1/cancel", "/api/jobs/1/hold", "/api/nodes/0/drain"):
            r = client.post(path, content=content, headers=headers)
            assert r.status_code == 403 and says in r.json()["error"], (path, headers, r.json())
    r = client.get("/api/jobs", headers={"host": "evil.example:8765"})       # nothing is read either
    assert r.status_code == 403
    with Store(db, readonly=True) as st:
        assert st.jobs.cancel_requests() == [] and st.jobs.hold_requests() == [] and st.nodes.drained() == {}
    same = {"origin": "http://127.0.0.1:8765", "content-type": "application/json"}
    assert client.post("/api/jobs/1/hold", json={"reason": "r"}, headers=same).status_code == 200
    assert client.get("/").status_code == 200 and client.get("/api/state").status_code == 200


def test_a_token_is_required_when_set(tmp_path):
    from engine.service.auth import Tokens
    db = tmp_path / "state.db"
    Store(db).close()
    secret = "s3cret-Token-0123456789"
    client = TestClient(create_app(ApiContext(str(db), str(tmp_path), CLUSTER, "arena",
                                              tokens=Tokens.single(secret))))
    r = client.get("/api/health")
    assert r.status_code == 401 and r.json()["field"] == "token" and r.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/health", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    assert client.get("/?token=" + secret).status_code == 200


def test_health_names_the_plugins_that_decide(tmp_path):
    db = tmp_path / "state.db"
    Store(db).close()
    plugins = ("/p/energy.py sha256:284af2304def (policy arena-energy, objective term energy)",)
    client = TestClient(create_app(ApiContext(str(db), str(tmp_path), CLUSTER, "arena-energy", plugins=plugins)))
    assert client.get("/api/health").json()["plugins"] == list(plugins)


def test_serve_refuses_a_non_local_bind_without_a_token_and_bad_options(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    base = ["serve", "--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w")]
    for argv, field in [(["--local-slots", "4", "--host", "0.0.0.0"], "--token"),
                        ([], "--cluster"),
                        (["--local-slots", "0"], "--local-slots"),
                        (["--local-slots", "2", "--local-nodes", "0"], "--local-nodes"),
                        (["--local-slots", "2", "--policy", "nosuch"], "--policy"),
                        (["--local-slots", "2", "--round-interval", "0"], "--round-interval"),
                        (["--local-slots", "2", "--failure-backoff", "-1"], "--failure-backoff"),
                        (["--local-slots", "2", "--max-failures", "0"], "--max-failures"),
                        (["--local-slots", "2", "--keep-rounds", "-1"], "--keep-rounds"),
                        (["--local-slots", "2", "--keep-measurements", "-1"], "--keep-measurements"),
                        (["--local-slots", "2", "--stall-after", "0"], "--stall-after"),
                        (["--local-slots", "2", "--drain-after-failures", "-1"], "--drain-after-failures"),
                        (["--local-slots", "2", "--failure-window", "0"], "--failure-window"),
                        (["--local-slots", "2", "--profile-store", str(tmp_path / "none")], "--profile-store"),
                        (["--local-slots", "2", "--data-root", str(tmp_path / "none")], "--data-root")]:
        assert cli_main(base + argv) == 2
        assert f"field '{field}'" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()   # refused before making anything
    (tmp_path / "dir.db").mkdir()
    assert cli_main(["serve", "--local-slots", "2", "--db", str(tmp_path / "dir.db")]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_serve_flags_default_to_the_service_config(tmp_path):
    """Every setting ``arena serve`` does not name comes from ``ServiceConfig``'s own
    defaults (one place for each), and ``--move-path`` offers the launcher's move paths."""
    import dataclasses
    import socket

    from engine.cli.commands.service import build_service_parts
    from engine.cli.main import build_parser
    from engine.service.config import ServiceConfig
    from launcher.config import MOVE_PATHS
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = build_parser().parse_args(["serve", "--local-slots", "2", "--db", str(tmp_path / "s.db"),
                                      "--work-dir", str(tmp_path / "w"), "--port", str(port)])
    parts = build_service_parts(args)
    parts.lock.release()
    cfg = parts.cfg
    given = ServiceConfig(db_path=cfg.db_path, work_dir=cfg.work_dir)
    assert dataclasses.asdict(cfg) == dataclasses.asdict(given)
    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices["serve"]._actions
                 if "--move-path" in a.option_strings)
    assert tuple(serve.choices) == MOVE_PATHS
    with pytest.raises(InputError, match="move_path"):
        ServiceConfig(db_path="x", work_dir="y", move_path="tape")


def test_cli_clients_name_a_missing_service_and_a_bad_job_file(tmp_path, capsys):
    assert cli_main(["jobs", "--url", "http://127.0.0.1:9"]) == 2
    assert "no service answers" in capsys.readouterr().err
    assert cli_main(["jobs", "--last", "0", "--url", "http://127.0.0.1:9"]) == 2     # refused before asking
    assert "field '--last'" in capsys.readouterr().err
    bad = tmp_path / "job.toml"
    bad.write_text("name = 'x'\nmodel = 'tiny-gpt__2L'\nglobal_batch = 8\nsteps = -1\n")
    assert cli_main(["submit", str(bad), "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "field 'steps'" in err
    with pytest.raises(InputError):
        from engine.service.client import Client
        Client("ftp://x")


def test_a_config_json_model_is_copied_at_submission(api, tmp_path):
    client, db, _ = api
    src = Path(__file__).resolve().parents[1] / "examples" / "models" / "tiny-llama-config.json"
    mine = tmp_path / "mine.json"
    mine.write_text(src.read_text())
    r = client.post("/api/jobs", json={**GOOD, "model": str(mine)})
    assert r.status_code == 201, r.text
    with Store(db, readonly=True) as st:
        kept = Path(st.jobs.get(1).spec["model"])
    assert kept.parent == tmp_path / "work" / "models" and kept.read_text() == src.read_text()
    mine.write_text("{}")                       # the user edits (or breaks) their file later
    assert kept.read_text() == src.read_text()


def test_a_job_no_grid_can_run_is_refused_at_submission(tmp_path):
    from engine.core.policy import make_policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig
    from engine.service.jobspec import JobSpec
    from estimators import make_performance_model
    svc = Service(CLUSTER, make_policy("arena"), make_performance_model("analytic"), ReconfigCostModel(),
                  ServiceConfig(db_path=str(tmp_path / "s.db"), work_dir=str(tmp_path / "w")), log=lambda m: None)
    try:
        svc.check_runnable(JobSpec.from_dict(GOOD))                      # fits: accepted
        client = TestClient(create_app(ApiContext(str(tmp_path / "s.db"), str(tmp_path / "w"), CLUSTER, "arena",
                                                  check=svc.check_runnable)))
        r = client.post("/api/jobs", json={**GOOD, "model": "llama__70B", "global_batch": 64})
        assert r.status_code == 400 and r.json()["field"] == "model" and "not to fit" in r.json()["error"]
        assert stored(tmp_path / "s.db") == 0
    finally:
        svc.shutdown()


def test_scenario_ports_lie_below_the_ephemeral_range():
    """The end-to-end scenarios start and restart the service on one port; one the system
    would hand out itself (port 0 binds, outgoing connections) could be taken in between."""
    import socket

    from engine.service.scenario import EPHEMERAL_RANGE_FILE, free_port
    low = int(Path(EPHEMERAL_RANGE_FILE).read_text().split()[0]) if Path(EPHEMERAL_RANGE_FILE).exists() else 32768
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and all(1024 <= p < low for p in ports)
    with socket.socket() as s:                  # and it is free
        s.bind(("127.0.0.1", ports.pop()))


def test_a_service_that_goes_away_mid_answer_is_a_clear_error_that_warns_a_submitter(capsys):
    """A service killed while it answers (headers sent, body cut short) is "no service
    answers", as a refused connection is, so waiting for it and resubmitting after a
    restart go the same way; a POST's error also says it may have been done."""
    import socket
    import threading

    from engine.service.client import Client, NoAnswer

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(2)
        srv.settimeout(10)
        port = srv.getsockname()[1]

        def cut_short() -> None:          # two requests at most, then the thread ends
            for _ in range(2):
                conn, _ = srv.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 57\r\n\r\n{")

        t = threading.Thread(target=cut_short, daemon=True)
        t.start()
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(NoAnswer, match="no service answers.*closed mid-answer") as got:
            Client(url, timeout_s=5.0).get("/api/health")
        assert not got.value.maybe_done and "may have done" not in str(got.value)
        assert cli_main(["submit", "--name", "ok", "--model", "tiny-gpt__2L", "--batch", "8", "--steps", "10",
                         "--url", url]) == 2
        err = capsys.readouterr().err
        assert "may have done what was asked" in err and "run this again with --key " in err
        t.join(10)
    with pytest.raises(NoAnswer) as got:                    # nothing listens there now
        Client(url, timeout_s=5.0).post("/api/jobs", GOOD)
    assert not got.value.maybe_done and "--key" not in str(got.value)


def test_a_keyed_submission_sent_again_gives_back_the_job_and_stores_nothing_new(api):
    """What a client that got no answer does: it sends the same job with the same key."""
    client, db, _ = api
    first = client.post("/api/jobs", json=GOOD, headers={"Idempotency-Key": "k1"})
    again = client.post("/api/jobs", json=GOOD, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "name": "ok", "status": "queued", "replayed": True}
    assert stored(db) == 1
    other = client.post("/api/jobs", json={**GOOD, "steps": 11}, headers={"Idempotency-Key": "k1"})
    assert other.status_code == 409 and "k1" in other.json()["error"]
    bad = client.post("/api/jobs", json=GOOD, headers={"Idempotency-Key": "x" * 201})
    assert bad.status_code == 400 and bad.json()["field"] == "Idempotency-Key"
    assert client.post("/api/jobs", json=GOOD).status_code == 201 and stored(db) == 2   # no key: a new job


def test_status_watch_waits_through_a_restart_within_its_patience(capsys):
    """`arena status --watch` across a service that is down for a moment (a restart)
    keeps watching, says so on stderr, and gives up only after --patience. The service
    here is a stand-in that lists one finished job (the real service's status output is
    tested end to end in test_service_e2e)."""
    import http.server
    import socket
    import threading
    import time

    with socket.socket() as probe:                    # a port nothing listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    assert cli_main(["status", "--watch", "--patience", "0", "--url", url]) == 2
    assert "no service answers" in capsys.readouterr().err

    job = {"id": 1, "name": "ok", "status": "finished"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps([job]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    def come_back_later() -> None:
        time.sleep(1.0)
        with http.server.HTTPServer(("127.0.0.1", port), Handler) as srv:
            srv.timeout = 10
            srv.handle_request()                      # one request, then the server stops

    t = threading.Thread(target=come_back_later, daemon=True)
    t.start()
    assert cli_main(["status", "--watch", "--json", "--patience", "30", "--url", url]) == 0
    out, err = capsys.readouterr()
    assert "no answer from" in err and json.loads(out) == [job]
    t.join(15)
    start = time.monotonic()
    assert cli_main(["status", "--patience", "30", "--url", url]) == 2     # without --watch: no waiting
    assert "no service answers" in capsys.readouterr().err and time.monotonic() - start < 10
    assert cli_main(["status", "--watch", "--patience", "nan", "--url", url]) == 2
    assert "field '--patience'" in capsys.readouterr().err


def test_drain_and_undrain_name_the_node_and_are_stored(tmp_path):
    db = tmp_path / "state.db"
    Store(db).close()
    woken = []
    cluster = ClusterSpec((NodeGroup("cpu", 2, 2, hosts=("alpha", "beta")),), "two")
    client = TestClient(create_app(ApiContext(str(db), str(tmp_path / "work"), cluster, "fcfs",
                                              wake=lambda: woken.append(1))))
    r = client.post("/api/nodes/beta/drain", json={"reason": "disk"})
    assert r.status_code == 200 and r.json() == {"node": 1, "drained": True, "already": False} and woken
    assert client.post("/api/nodes/1/drain").json()["already"]           # the first reason stays
    nodes = client.get("/api/cluster").json()["nodes"]
    assert nodes[0]["drained"] is None and nodes[1]["drained"]["reason"] == "disk" and nodes[1]["host"] == "beta"
    for path, code, field in [("/api/nodes/gamma/drain", 404, "node"), ("/api/nodes/2/drain", 404, "node"),
                              ("/api/nodes/gamma/undrain", 404, "node")]:
        bad = client.post(path, json={})
        assert bad.status_code == code and bad.json()["field"] == field, (path, bad.json())
    bad = client.post("/api/nodes/0/drain", json={"reason": 5})
    assert bad.status_code == 400 and bad.json()["field"] == "reason"
    with Store(db, readonly=True) as st:
        assert set(st.nodes.drained()) == {1}
    assert client.post("/api/nodes/beta/undrain").json() == {"node": 1, "drained": False, "already": False}
    assert client.post("/api/nodes/beta/undrain").json()["already"]
    with Store(db, readonly=True) as st:
        assert st.nodes.drained() == {}


def test_metrics_expose_jobs_gpus_drains_and_rounds_for_monitoring(api):
    client, db, _ = api
    for _ in range(3):
        client.post("/api/jobs", json=GOOD)
    client.post("/api/jobs/2/cancel")
    from engine.core.move_ledger import MoveEntry
    with Store(db) as st:
        st.jobs.set_status(3, "cancelled", "test")
        st.rounds.record(policy="arena", trigger="test", solve_time_s=0.25, objective=None, gap=None, decisions={})
        paid = MoveEntry("1", 10.0, False, "a", "b", 1.0, 1.0, 2.0, 5.0, 0.0, paid_back_s=30.0)
        st.moves.record([paid, MoveEntry("1", 20.0, False, "b", "a", 1.0, 2.0, 1.0, 5.0, 40.0),     # gave way
                         MoveEntry("1", 30.0, True, "a", "c", 0.0, 1.0, 1.0, 5.0, 50.0)])            # forced
    client.post("/api/nodes/0/drain")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = parse_metrics(r.text)
    assert m['arena_jobs{status="queued"}'] == 2 and m['arena_jobs{status="cancelled"}'] == 1
    assert m['arena_jobs{status="running"}'] == 0
    assert m['arena_gpus{gpu_type="cpu"}'] == 4 and m['arena_gpus_held{gpu_type="cpu"}'] == 0
    assert m["arena_nodes_drained"] == 1 and m["arena_gpus_drained"] == 4
    assert m['arena_rounds{policy="arena"}'] == 1 and m["arena_last_round_solve_seconds"] == 0.25
    assert m['arena_moves_total{kind="decided"}'] == 2 and m['arena_moves_total{kind="forced"}'] == 1
    assert m["arena_moves_giving_way_total"] == 1
    assert m["arena_moves_judged_total"] == 1 and m["arena_moves_paid_back_total"] == 1


def test_shadow_comparisons_are_counted_for_the_api_metrics_and_the_rounds_command(api):
    from engine.cli.commands.service import shadow_line
    from engine.core.shadow import JobDiff, ShadowComparison
    client, db, _ = api
    agree = ShadowComparison("sia-ap", 3, 3, (), 0, (3, 3), (4, 4), (0, 0), None, 0.01)
    differ = ShadowComparison("sia-ap", 2, 1, (JobDiff("7", "cpu:1x2:pp1", "cpu:1x4:pp1", None),), 1, (2, 1),
                              (4, 2), (1, 1), None, 0.02)
    failed = ShadowComparison("sia-ap", 2, 0, (), 0, (0, 0), (0, 0), (0, 0), None, 0.0, error="ValueError: x")
    with Store(db) as st:
        st.rounds.record(policy="arena", trigger="t", solve_time_s=0.1, decisions={"grids": {}})   # no shadow
        for c in (agree, differ, failed):
            st.rounds.record(policy="arena", trigger="t", solve_time_s=0.1,
                            decisions={"grids": {}, "shadow": c.to_dict()})
    assert client.get("/api/shadow").json()["counts"] == {
        "sia-ap": {"rounds": 3, "agreeing": 1, "failed": 1, "jobs": 5, "disagreeing": 1}}
    m = parse_metrics(client.get("/metrics").text)
    assert m['arena_shadow_rounds_total{shadow_policy="sia-ap"}'] == 3
    assert m['arena_shadow_rounds_agreeing_total{shadow_policy="sia-ap"}'] == 1
    assert m['arena_shadow_rounds_failed_total{shadow_policy="sia-ap"}'] == 1
    assert m['arena_shadow_jobs_compared_total{shadow_policy="sia-ap"}'] == 5
    assert m['arena_shadow_jobs_disagreeing_total{shadow_policy="sia-ap"}'] == 1
    rounds = client.get("/api/rounds").json()
    assert "shadow" not in rounds[0]["decisions"] and rounds[2]["decisions"]["shadow"]["disagreements"] == 1
    line = shadow_line(rounds[2]["decisions"]["shadow"])
    assert "same grid for 1/2 jobs" in line and "job 7 cpu:1x4:pp1 -> waits" in line
    assert shadow_line(rounds[3]["decisions"]["shadow"]) == "shadow sia-ap: failed: ValueError: x"


def test_metrics_have_no_shadow_series_without_a_shadow(api):
    client, _, _ = api
    assert "arena_shadow" not in client.get("/metrics").text
    assert client.get("/api/shadow").json() == {"shadow_policy": None, "counts": {}}


def test_export_trace_writes_the_submitted_workload_and_it_replays(api, tmp_path, capsys):
    from instances.traces import load_trace
    client, db, _ = api
    src = Path(__file__).resolve().parents[1] / "examples" / "models" / "tiny-llama-config.json"
    for body in (GOOD, {**GOOD, "name": "cfg", "model": str(src), "deadline_s": 600, "tenant": "team-a"},
                 {**GOOD, "name": "moe", "model": "tiny-moe__2L", "gpus": 2, "priority": 2.0}):
        assert client.post("/api/jobs", json=body).status_code == 201
    client.post("/api/jobs/3/cancel")
    with Store(db) as st:
        st.jobs.set_status(3, "cancelled", "test")
        subs = {r.id: r.submitted_at for r in st.jobs.rows()}
    out = tmp_path / "exported" / "trace.csv"
    assert cli_main(["export-trace", "--db", str(db), "--out", str(out)]) == 0
    assert "3 job(s)" in capsys.readouterr().err
    jobs = load_trace(out)
    assert [j.job_id for j in jobs] == ["1-ok", "2-cfg", "3-moe"]
    assert [j.arrival_s for j in jobs] == pytest.approx([subs[i] - subs[1] for i in (1, 2, 3)])
    assert jobs[1].model == str(tmp_path / "work" / "models" / Path(jobs[1].model).name)    # the frozen copy
    assert jobs[1].deadline_s == pytest.approx(jobs[1].arrival_s + 600) and jobs[1].tenant == "team-a"
    assert jobs[2].requested_gpus == 2 and jobs[2].priority == 2.0 and jobs[0].num_iterations == GOOD["steps"]
    cluster = tmp_path / "local.json"
    cluster.write_text(json.dumps({"name": "local-4", "node_groups": [{"gpu_type": "cpu", "num_nodes": 1,
                                                                       "gpus_per_node": 4}]}))
    assert cli_main(["simulate", "--cluster", str(cluster), "--trace", str(out), "--policy", "arena", "--run-out",
                     "--round-interval", "5", "--out", str(tmp_path / "replay"), "--no-plots", "--quiet"]) == 0
    summary = json.loads((tmp_path / "replay" / "summary.json").read_text())
    assert summary["jobs_finished_runout"] == 3


def test_export_trace_names_an_empty_or_missing_database(tmp_path, capsys):
    Store(tmp_path / "empty.db").close()
    assert cli_main(["export-trace", "--db", str(tmp_path / "empty.db"), "--out", str(tmp_path / "t.csv")]) == 2
    assert "no job was ever submitted" in capsys.readouterr().err
    assert cli_main(["export-trace", "--db", str(tmp_path / "none.db"), "--out", str(tmp_path / "t.csv")]) == 2
    assert "no state database here" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()
    assert cli_main(["export-trace", "--db", str(tmp_path / "empty.db"), "--out", "/proc/t.csv"]) == 2
    assert "field '--out'" in capsys.readouterr().err     # (as root os.access would have said yes)


def test_health_is_503_while_the_scheduler_is_stuck_in_a_round_and_metrics_say_so(tmp_path):
    """A real service thread whose policy blocks in its first decision (a stand-in for a
    hung solver): with --stall-after 3 s, health turns 503 naming the round, /metrics
    reports the phase and the stall, and both recover once the round ends."""
    import threading
    import time as _time

    from engine.core.context import Decisions
    from engine.core.policy import Policy
    from engine.core.reconfig import ReconfigCostModel
    from engine.service.daemon import Service, ServiceConfig

    class Blocking(Policy):
        name = "blocking"

        def __init__(self):
            self.entered, self.release = threading.Event(), threading.Event()

        def decide(self, ctx):
            self.entered.set()
            self.release.wait(30)
            return Decisions({})

    policy = Blocking()
    svc = Service(CLUSTER, policy, None, ReconfigCostModel(),
                  ServiceConfig(db_path=str(tmp_path / "s.db"), work_dir=str(tmp_path / "w"), stall_after_s=3,
                                round_interval_s=3600), log=lambda m: None)
    client = TestClient(create_app(ApiContext(str(tmp_path / "s.db"), str(tmp_path / "w"), CLUSTER, "blocking",
                                              liveness=svc.liveness)))
    stop = threading.Event()
    thread = threading.Thread(target=svc.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert policy.entered.wait(30)
        r = client.get("/api/health")
        assert r.status_code == 200 and r.json()["scheduler"]["phase"] == "round 1" and r.json()["ok"]
        _time.sleep(3.2)
        r = client.get("/api/health")
        assert r.status_code == 503 and r.json()["ok"] is False
        assert r.json()["error"].startswith("no sign of life from the scheduler for ")
        assert r.json()["error"].endswith(" s (in 'round 1')")
        m = parse_metrics(client.get("/metrics").text)
        assert m['arena_scheduler_phase_seconds{phase="round 1"}'] > 3 and m["arena_scheduler_stalled"] == 1
        policy.release.set()
        deadline = _time.monotonic() + 30
        while client.get("/api/health").status_code != 200 and _time.monotonic() < deadline:
            _time.sleep(0.05)
        r = client.get("/api/health").json()
        assert r["ok"] and r["scheduler"]["phase"] == "idle" and r["scheduler"]["stalled"] is False
        assert parse_metrics(client.get("/metrics").text)["arena_scheduler_stalled"] == 0
    finally:
        policy.release.set()
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and svc.liveness()["phase"] == "stopped" and not svc.liveness()["stalled"]
    assert svc.mpi.config.run_stall_s == 600.0          # --launch-stall-after's default reaches the executor
    with pytest.raises(InputError) as e:
        ServiceConfig(db_path="x", work_dir="y", stall_after_s=0)
    assert e.value.field == "stall_after_s"


def test_data_outside_the_data_roots_is_refused_at_submission_and_nothing_stored(tmp_path):
    db, work = tmp_path / "state.db", tmp_path / "work"
    Store(db).close()
    work.mkdir()
    (work / "corpus.txt").write_bytes(b"c" * 2000)
    client = TestClient(create_app(ApiContext(str(db), str(work), CLUSTER, "arena", data_roots=(str(work),))))
    (work / "escape.txt").symlink_to("/etc/hostname")
    for data in ("/etc/shadow", str(work / "escape.txt"), str(work / ".." / "state.db")):
        r = client.post("/api/jobs", json={**GOOD, "data": data})
        assert r.status_code == 400 and r.json()["field"] == "data", r.text
        assert f"is outside the folders jobs' files may be read from: {work}" in r.json()["error"], r.text
    r = client.post("/api/jobs", json={"toml": 'name = "t"\nmodel = "tiny-gpt__2L"\nglobal_batch = 8\nsteps = 5\n'
                                               'data = "/etc/passwd"\n'})
    assert r.status_code == 400 and r.json()["field"] == "data"
    assert stored(db) == 0
    r = client.post("/api/jobs", json={**GOOD, "data": str(work / "corpus.txt")})
    assert r.status_code == 201, r.text
