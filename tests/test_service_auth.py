"""Who may call the service (engine/service/auth.py): the rule a token meets, the tokens
file and its refusals, each job's submitter recorded (schema v10, an older database
opened), a change of a job by its submitter or an admin only, the header's scheme in any
case, and ``?token=`` refused by the API. The real FastAPI application over a real SQLite
store; the CLI against a real uvicorn server."""
from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine.cli.main import main as cli_main
from engine.service.api import ApiContext, create_app
from engine.service.auth import MAKE_TOKEN, Tokens, bearer, token_problem
from engine.service.jobspec import JobSpec
from engine.service.store import SCHEMA_VERSION, Store, migrate
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError

CLUSTER = ClusterSpec((NodeGroup("cpu", 1, 4),), "local-4")
GOOD = {"name": "ok", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 10}
ALICE, BOB, ROOT = "alice-Token-0123456789", "bob-Token-0123456789x", "root-Token-0123456789"


@pytest.mark.parametrize("token, says", [
    ("", "is 0 characters long; at least 16 are needed"),
    (" " * 24, "may hold only visible ASCII characters"),
    ("a", "is 1 characters long"),
    ("Tr0ub4dor&3", "is 11 characters long"),
    ("a" * 32, "uses one kind of character only"),
    ("1234567890123456", "uses one kind of character only"),
    ("abababababababab1", "has 3 different characters (a repeated pattern); at least 8"),
    ("correct horse battery staple", "may hold only visible ASCII"),
    ("pässwörd-0123456789", "may hold only visible ASCII"),
])
def test_a_weak_token_is_refused_naming_the_rule(token, says):
    assert says in token_problem(token)


def test_generated_tokens_meet_the_rule():
    for _ in range(200):
        assert token_problem(secrets.token_urlsafe(24)) is None and token_problem(secrets.token_hex(16)) is None
    assert "secrets.token_urlsafe(24)" in MAKE_TOKEN


def test_the_bearer_scheme_is_read_in_any_case():
    assert bearer("Bearer abc") == bearer("bearer abc") == bearer("BEARER   abc ") == "abc"
    assert bearer("Basic abc") is None and bearer(None) is None and bearer("") is None


def tokens_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    p = tmp_path / "tokens"
    p.write_text(text)
    os.chmod(p, mode)
    return p


@pytest.mark.parametrize("text, mode, line, says", [
    (f"alice {ALICE}\n", 0o644, None, "its permissions -rw-r--r-- let other users read or change it"),
    (f"alice {ALICE}\n", 0o640, None, "chmod 600"),
    ("alice\n", 0o600, 1, "a line is 'USER TOKEN' or 'USER TOKEN admin', got 1 field(s)"),
    (f"alice {ALICE} root\n", 0o600, 1, "got 3 field(s) ending in 'root'"),
    (f"# users\n\nal/ice {ALICE}\n", 0o600, 3, "user 'al/ice': 1-64 letters"),
    (f"alice {ALICE}\nalice {BOB}\n", 0o600, 2, "user 'alice' is already on line 1"),
    (f"alice {ALICE}\nbob {ALICE}  # the same\n", 0o600, 2, "the token of user 'bob' is the same as line 1's"),
    ("alice aaaaaaaaaaaaaaaaaaaa\n", 0o600, 1, "the token of user 'alice' uses one kind of character only; mix at "
                                              "least two of lower case, upper case, digits and other characters; "
                                              "make one with: python -c 'import secrets; "
                                              "print(secrets.token_urlsafe(24))'"),
    ("# nobody yet\n", 0o600, None, "no user in it"),
])
def test_a_bad_tokens_file_is_refused_naming_its_line(tmp_path, text, mode, line, says):
    with pytest.raises(InputError) as e:
        Tokens.from_file(tokens_file(tmp_path, text, mode))
    assert says in e.value.reason and e.value.line == line and e.value.field == "--tokens-file"
    assert ALICE not in str(e.value)                           # a token is never echoed


def users_app(tmp_path: Path) -> tuple[TestClient, Path]:
    tokens = Tokens.from_file(tokens_file(tmp_path, f"# who\nalice {ALICE}\nbob {BOB}\nroot {ROOT} admin\n"))
    db = tmp_path / "state.db"
    Store(db).close()
    return TestClient(create_app(ApiContext(str(db), str(tmp_path / "work"), CLUSTER, "arena", tokens=tokens))), db


def auth(token: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}"}


def test_a_job_is_changed_only_by_its_submitter_or_an_admin_and_read_by_anyone(tmp_path):
    client, db = users_app(tmp_path)
    r = client.post("/api/jobs", json=GOOD, headers=auth(ALICE, "bearer"))     # the scheme in lower case
    assert r.status_code == 201
    jid = r.json()["id"]
    assert client.get(f"/api/jobs/{jid}", headers=auth(BOB)).json()["submitted_by"] == "alice"
    assert [j["submitted_by"] for j in client.get("/api/jobs", headers=auth(BOB)).json()] == ["alice"]
    for path, body, verb in ((f"/api/jobs/{jid}/hold", {}, "hold"), (f"/api/jobs/{jid}/release", None, "release"),
                             (f"/api/jobs/{jid}/priority", {"priority": 3}, "change the priority of"),
                             (f"/api/jobs/{jid}/cancel", None, "cancel")):
        r = client.post(path, json=body, headers=auth(BOB))
        assert r.status_code == 403 and r.json() == {
            "error": f"job {jid} was submitted by 'alice'; only its submitter's token or an admin's may {verb} it "
                     "(you are 'bob')", "field": "token", "file": None}, (path, r.json())
    with Store(db, readonly=True) as st:
        assert st.jobs.hold_requests() == [] and st.jobs.cancel_requests() == []
        assert st.jobs.get(jid).spec["priority"] == 1.0
    assert client.post(f"/api/jobs/{jid}/hold", json={}, headers=auth(ALICE)).status_code == 200
    assert client.post(f"/api/jobs/{jid}/release", headers=auth(ALICE)).status_code == 200
    assert client.post(f"/api/jobs/{jid}/priority", json={"priority": 2}, headers=auth(ROOT)).status_code == 200
    assert client.post(f"/api/jobs/{jid}/cancel", headers=auth(ROOT)).status_code == 200
    r = client.post("/api/nodes/0/drain", json={}, headers=auth(ALICE))
    assert r.status_code == 403 and r.json()["error"].startswith("only an admin may drain a node (you are 'alice'")
    assert client.post("/api/nodes/0/undrain", headers=auth(BOB)).status_code == 403
    assert client.post("/api/nodes/0/drain", json={}, headers=auth(ROOT)).json()["drained"] is True
    assert client.post(f"/api/jobs/{jid + 1}/cancel", headers=auth(BOB)).status_code == 404   # unknown: 404


def test_a_key_sent_by_another_user_does_not_give_back_their_job(tmp_path):
    client, db = users_app(tmp_path)
    first = client.post("/api/jobs", json=GOOD, headers={**auth(ALICE), "Idempotency-Key": "k1"})
    assert client.post("/api/jobs", json=GOOD, headers={**auth(ALICE), "Idempotency-Key": "k1"}).status_code == 200
    r = client.post("/api/jobs", json=GOOD, headers={**auth(BOB), "Idempotency-Key": "k1"})
    assert r.status_code == 409 and "was used by another user" in r.json()["error"] and first.status_code == 201
    with Store(db, readonly=True) as st:
        assert [(j.id, j.submitted_by) for j in st.jobs.rows()] == [(1, "alice")]


def test_the_token_goes_in_the_header_and_the_page_alone_is_open(tmp_path):
    client, _ = users_app(tmp_path)
    r = client.get(f"/api/jobs?token={ALICE}")
    assert r.status_code == 401 and r.json()["field"] == "token" and r.json()["error"].startswith(
        "?token= is read only by the status page's script (open /?token=...); the API takes the token in the "
        "header Authorization: Bearer <token>")
    assert client.get(f"/api/jobs?token={ALICE}", headers=auth(ALICE)).status_code == 401   # even beside it
    assert client.get("/api/jobs", headers=auth(ALICE, "Basic")).json()["error"] == \
        "the Authorization header must be 'Bearer <token>'"
    assert client.get("/api/jobs", headers=auth(ALICE, "BEARER")).status_code == 200
    for path in ("/", f"/?token={ALICE}", "/?token=wrong"):                 # static HTML: no data in it
        assert client.get(path).status_code == 200 and "<title>arena serve</title>" in client.get(path).text
    assert client.get("/api/state").status_code == 401 and client.get("/metrics").status_code == 401


def test_an_older_database_opens_and_its_jobs_have_no_submitter(tmp_path):
    """A v9 database (before submitters were recorded) migrates: its job has none, an
    admin (the single --token) may change it, a tokens file's user may not."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=9)
    conn.execute("INSERT INTO jobs(name, spec, status, submitted_at, updated_at) VALUES ('old', ?, 'queued', 1, 1)",
                 (json.dumps(JobSpec.from_dict(GOOD).to_dict()),))
    conn.execute("INSERT INTO job_history(job_id, from_status, to_status, reason, at) "
                 "VALUES (1, NULL, 'queued', 'submitted', 1)")
    conn.close()
    client, _ = users_app(tmp_path)                       # (opens the same state.db: it migrates)
    with Store(path, readonly=True) as st:
        assert st.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
        assert st.jobs.get(1).submitted_by is None and st.check() == []
    assert client.get("/api/jobs/1", headers=auth(BOB)).json()["submitted_by"] is None
    r = client.post("/api/jobs/1/hold", json={}, headers=auth(ALICE))
    assert r.status_code == 403 and "job 1 was submitted without a token" in r.json()["error"]
    assert client.post("/api/jobs/1/hold", json={}, headers=auth(ROOT)).status_code == 200
    single = TestClient(create_app(ApiContext(str(path), str(tmp_path / "w"), CLUSTER, "arena",
                                              tokens=Tokens.single(ALICE))))
    assert single.post("/api/jobs/1/release", headers=auth(ALICE)).status_code == 200   # --token: an admin
    assert single.post("/api/jobs", json=GOOD, headers=auth(ALICE)).json()["id"] == 2
    with Store(path, readonly=True) as st:
        assert st.jobs.get(2).submitted_by == "operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_refuses_weak_tokens_and_bad_tokens_files_before_making_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARENA_TOKEN", raising=False)
    base = ["serve", "--local-slots", "2", "--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w")]
    good = tokens_file(tmp_path, f"alice {ALICE}\n")
    for argv, says in [(["--host", "0.0.0.0", "--token", "   "], "field '--token': the token may hold only visible "
                                                                  "ASCII characters"),
                       (["--host", "0.0.0.0", "--token", "x"], "field '--token': the token is 1 characters long; "
                                                               "at least 16 are needed; make one with: python -c "
                                                               "'import secrets; print(secrets.token_urlsafe(24))'"),
                       (["--token", "aaaaaaaaaaaaaaaaaaaa"], "uses one kind of character only"),   # loopback too
                       (["--token", ALICE, "--tokens-file", str(good)], "field '--tokens-file': give --token (one "
                                                                        "user) or --tokens-file"),
                       (["--tokens-file", str(tmp_path / "none")], "field '--tokens-file': file not found"),
                       (["--host", "0.0.0.0"], "field '--token': binding to 0.0.0.0 (not loopback) needs API tokens")]:
        assert cli_main(base + argv) == 2, argv
        assert says in capsys.readouterr().err, argv
    monkeypatch.setenv("ARENA_TOKEN", "short")
    assert cli_main(base) == 2 and "field 'ARENA_TOKEN': the token is 5 characters long" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()
    from engine.cli.commands.service import build_service_parts
    from engine.cli.main import build_parser
    args = build_parser().parse_args(base + ["--tokens-file", str(good), "--port", str(free_port())])
    parts = build_service_parts(args)                # ARENA_TOKEN is not read beside --tokens-file
    parts.lock.release()
    assert parts.tokens.caller(ALICE).user == "alice" and parts.tokens.caller("short") is None


def test_the_cli_names_who_may_change_a_job(tmp_path, capsys):
    from tests.test_service_views import serving
    client, db = users_app(tmp_path)
    jid = client.post("/api/jobs", json=GOOD, headers=auth(ALICE)).json()["id"]
    app = create_app(ApiContext(str(db), str(tmp_path / "work"), CLUSTER, "arena",
                                tokens=Tokens.from_file(tmp_path / "tokens")))
    with serving(app) as port:
        url = f"http://127.0.0.1:{port}"
        assert cli_main(["cancel", str(jid), "--url", url, "--token", BOB]) == 2
        assert ("arena: error: field 'token': the service answered 403: job 1 was submitted by 'alice'; only its "
                "submitter's token or an admin's may cancel it (you are 'bob')") in capsys.readouterr().err
        assert cli_main(["status", str(jid), "--url", url, "--token", BOB]) == 0
        assert "submitted by alice" in capsys.readouterr().out
        assert cli_main(["cancel", str(jid), "--url", url, "--token", ALICE]) == 0
        assert cli_main(["jobs", "--url", url, "--token", "wrong"]) == 2
        assert ("arena: error: field '--token': the service answered 401: missing or wrong token (Authorization: "
                "Bearer <token>); give the token with --token or ARENA_TOKEN") in capsys.readouterr().err
        assert cli_main(["logs", str(jid), "--chars", "-1", "--url", url, "--token", ALICE]) == 2
        assert "field '--chars': must be in 0..1000000, got -1" in capsys.readouterr().err
