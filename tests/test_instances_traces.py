"""Trace formats: ours (round trip), Arena's and Philly's importers, and errors that name
file, line and field. Hypothesis fuzzes the parsers."""
import gzip
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError
from instances.jobs import Job
from instances.traces import (
    ARENA_COLUMNS,
    OUR_MAGIC,
    format_trace,
    load_bundled_trace,
    load_trace,
    parse_trace,
    write_trace,
)

ARENA_HEAD = ",".join(ARENA_COLUMNS) + "\n"
OURS_HEAD = (OUR_MAGIC + "\njob_id,model,global_batch,num_iterations,arrival_s,deadline_s,priority,tenant,"
             "requested_gpu_type,requested_gpus\n")
MODELS = ("gpt__1.3B", "moe__690M", "wide_resnet__2B", "llama__7B", "tiny-gpt__2L")
GPUS = ("a100-40gb", "h100-sxm", "a40", "v100-32gb")


def test_roundtrip_example(tmp_path):
    jobs = (Job("a", "bert__1.3B", 128, 10, 0.0), Job("b,\"q\"", "moe__690M", 256, 3, 1.5, 100.25, 2.0,
                                                     "team x", "a100", 8))
    p = tmp_path / "t.csv"
    write_trace(jobs, p)
    assert p.read_text().splitlines()[0] == OUR_MAGIC
    assert load_trace(p) == jobs


finite_time = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
text_id = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
    lambda s: s == s.strip())      # (a job id or tenant with white space around it is refused: below)


@st.composite
def jobs_strategy(draw):
    n = draw(st.integers(0, 8))
    ids = draw(st.lists(text_id, min_size=n, max_size=n, unique=True))
    out = []
    for jid in ids:
        arrival = draw(finite_time)
        deadline = draw(st.one_of(st.none(), finite_time.map(lambda d: arrival + d)))
        if deadline is not None and not math.isfinite(deadline):
            deadline = None
        gpu = draw(st.one_of(st.none(), st.sampled_from(GPUS)))
        out.append(Job(jid, draw(st.sampled_from(MODELS)), draw(st.integers(1, 4096)), draw(st.integers(1, 10**7)),
                       arrival, deadline, draw(st.floats(min_value=1e-3, max_value=1e3)), draw(text_id), gpu,
                       draw(st.one_of(st.none(), st.integers(1, 64)))))
    return tuple(out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy())
def test_random_traces_roundtrip(jobs):
    assert parse_trace(format_trace(jobs), "mem.csv") == jobs


# corruptions that make any valid row invalid: (column, replacement)
CORRUPTIONS = {
    "model": ["no_such_model", ""], "global_batch": ["0", "-3", "x", "1.5", ""],
    "num_iterations": ["0", "abc", "nan", ""], "arrival_s": ["-1", "nan", "inf", "soon", ""],
    "priority": ["0", "-2", "nan", "", "high"], "requested_gpu_type": ["tpu-v9"],
    "requested_gpus": ["0", "two", "-8"], "deadline_s": ["-1", "nan", "x"],
}
COLS = ("job_id", "model", "global_batch", "num_iterations", "arrival_s", "deadline_s", "priority",
        "tenant", "requested_gpu_type", "requested_gpus")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy().filter(lambda js: len(js) > 0), st.data())
def test_random_corruption_raises_input_error(jobs, data):
    import csv
    import io
    text = format_trace(jobs)
    lines = text.split("\n")
    rows = list(csv.reader(io.StringIO("\n".join(lines[2:]))))
    rows = [r for r in rows if r]
    i = data.draw(st.integers(0, len(rows) - 1))
    kind = data.draw(st.sampled_from(["field", "drop_column", "extra_field", "duplicate_id", "header"]))
    if kind == "field":
        col = data.draw(st.sampled_from(sorted(CORRUPTIONS)))
        rows[i][COLS.index(col)] = data.draw(st.sampled_from(CORRUPTIONS[col]))
        expect_field = col
    elif kind == "drop_column":
        del rows[i][data.draw(st.integers(0, len(COLS) - 1))]
        expect_field = None
    elif kind == "extra_field":
        rows[i].append("surplus")
        expect_field = None
    elif kind == "duplicate_id":
        rows.append(list(rows[i]))
        expect_field = "job_id"
    else:
        col = data.draw(st.sampled_from(COLS))
        lines[1] = lines[1].replace(col, col.upper(), 1)
        expect_field = col
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    bad = "\n".join(lines[:2]) + "\n" + buf.getvalue()
    with pytest.raises(InputError) as e:
        parse_trace(bad, "fuzz.csv")
    assert e.value.file == "fuzz.csv" and e.value.line is not None
    if expect_field is not None:
        assert e.value.field == expect_field


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(tmp_path_factory, blob):
    p = tmp_path_factory.mktemp("fz") / "t.csv"
    p.write_bytes(blob)
    try:
        load_trace(p)
    except InputError:
        pass


@pytest.mark.parametrize("row, line, field", [
    ("a,gpt__1.3B,128,10,-1,,1.0,t,,\n", 3, "arrival_s"),
    ("a,gpt__1.3B,128,10,5,4,1.0,t,,\n", 3, "deadline_s"),
    ("a,gpt__9T,128,10,5,,1.0,t,,\n", 3, "model"),
    ("a,gpt__1.3B,128,10,5,,1.0,t,quantum,\n", 3, "requested_gpu_type"),
    ("a,gpt__1.3B,128,10,5,,1.0,t,,0\n", 3, "requested_gpus"),
    ("a,gpt__1.3B,12x,10,5,,1.0,t,,\n", 3, "global_batch"),
    ("a,gpt__1.3B,2000000,10,5,,1.0,t,,\n", 3, "global_batch"),       # above MAX_GLOBAL_BATCH
])
def test_ours_errors_name_line_and_field(row, line, field):
    with pytest.raises(InputError) as e:
        parse_trace(OURS_HEAD + row, "x.csv")
    assert (e.value.file, e.value.line, e.value.field) == ("x.csv", line, field)
    assert f"line {line}" in str(e.value) and field in str(e.value)


def test_duplicate_job_id_names_both_lines():
    row = "a,gpt__1.3B,128,10,5,,1.0,t,,\n"
    with pytest.raises(InputError, match="first on line 3") as e:
        parse_trace(OURS_HEAD + row + "\n" + row, "x.csv")
    assert e.value.line == 5 and e.value.field == "job_id"


def test_job_ids_and_tenants_are_stripped_so_that_spaces_make_no_second_job():
    # ours: " 1 " is job 1, so a second "1" is a duplicate; the tenant " a " is tenant a
    row = "{id},gpt__1.3B,128,10,5,,1.0,{tenant},,\n"
    jobs = parse_trace(OURS_HEAD + row.format(id=" 1 ", tenant=" a "), "x.csv")
    assert [(j.job_id, j.tenant) for j in jobs] == [("1", "a")]
    with pytest.raises(InputError, match=r"duplicate job id '1' \(first on line 3\)") as e:
        parse_trace(OURS_HEAD + row.format(id="1", tenant="a") + row.format(id=" 1 ", tenant="a"), "x.csv")
    assert (e.value.line, e.value.field) == (4, "job_id")
    with pytest.raises(InputError, match="must be non-empty") as e:
        parse_trace(OURS_HEAD + row.format(id="  ", tenant="a"), "x.csv")
    # Arena's format: the same
    arena = "{id},0,100,gpt__1.3B,1000,64,4,a100\n"
    with pytest.raises(InputError, match="duplicate job id '7'") as e:
        parse_trace(ARENA_HEAD + arena.format(id="7") + arena.format(id="7 "), "a.csv")
    assert (e.value.line, e.value.field) == (3, "job_id")
    # (Philly's ids are made from the line: philly-<line>, unique by construction)
    # a job built in code with spaces around its id or tenant is refused, not written to a trace
    for kw in ({"job_id": " 1"}, {"tenant": "a "}):
        with pytest.raises(InputError, match="without white space around it"):
            Job(**{"job_id": "1", "model": "gpt__1.3B", "global_batch": 8, "num_iterations": 1, "arrival_s": 0.0,
                   **kw})


def test_unknown_format_and_version():
    with pytest.raises(InputError, match="unknown trace format"):
        parse_trace("a,b,c\n1,2,3\n", "x.csv")
    with pytest.raises(InputError, match="unsupported trace version"):
        parse_trace("# arena-trace v9\n", "x.csv")
    with pytest.raises(InputError) as e:
        parse_trace("job_id,submission_time,num_iteration,model_name,deadline\n", "x.csv")
    assert e.value.field == "batch_size"


def test_arena_import_shifts_time_and_applies_options():
    body = ("j1,1000,12,bert__1.3B,1100,128,4,a100\n"
            "j2,1050,3,moe__690M,1250,256,2,a40\n")
    raw = parse_trace(ARENA_HEAD + body, "a.csv")
    assert [(j.arrival_s, j.deadline_s, j.num_iterations) for j in raw] == [(0.0, 100.0, 12), (50.0, 250.0, 3)]
    assert raw[0].model == "gpt__1.3B" and raw[0].requested_gpu_type == "a100-40gb" and raw[0].requested_gpus == 4
    arena = parse_trace(ARENA_HEAD + body, "a.csv", iteration_divisor=5, deadline_slack_factor=5)
    assert [(j.arrival_s, j.deadline_s, j.num_iterations) for j in arena] == [(0.0, 500.0, 2), (50.0, 1050.0, 1)]
    with pytest.raises(InputError) as e:
        parse_trace(ARENA_HEAD + body, "a.csv", iteration_divisor=0)
    assert e.value.field == "iteration_divisor"
    with pytest.raises(InputError) as e:
        parse_trace(ARENA_HEAD + body, "a.csv", deadline_slack_factor=float("nan"))
    assert e.value.field == "deadline_slack_factor"
    with pytest.raises(InputError) as e:
        parse_trace(ARENA_HEAD + body, "a.csv", seed=3)
    assert e.value.field == "seed"


@pytest.mark.parametrize("row, field", [
    ("j1,1000,12,bert__1.3B,900,128,4,a100\n", "deadline"),
    ("j1,inf,12,bert__1.3B,1100,128,4,a100\n", "submission_time"),
    ("j1,1000,12,bert__1.3B,1100,128,4,k80\n", "gpu_type"),
    ("j1,1000,zero,bert__1.3B,1100,128,4,a100\n", "num_iteration"),
    ("j1,1000,12,bert__1.3B,1100,128,0,a100\n", "num_gpu"),
])
def test_arena_errors(row, field):
    with pytest.raises(InputError) as e:
        parse_trace(ARENA_HEAD + "j0,1,1,moe__690M,2,256,1,a10\n" + row, "a.csv")
    assert (e.value.line, e.value.field) == (3, field)


@pytest.mark.parametrize("text, field", [
    (ARENA_HEAD.strip() + ",priority\nj0,1,1,moe__690M,2,256,1,a10,5\n", "priority"),
    ("timestamp,duration,num_gpus,gpu_time,cluster,user\n2017-10-09 07:01:55,66.0,1,66.0,vc1,bob\n", "user"),
    (OURS_HEAD.strip() + ",colour\na,gpt__1.3B,128,10,5,,1.0,t,,,red\n", "colour"),
])
def test_a_column_the_format_does_not_read_is_refused(text, field):
    # (an Arena trace with a priority column looked as if priorities counted)
    with pytest.raises(InputError, match=f"unknown column\\(s\\) '{field}'; .* reads ") as e:
        parse_trace(text, "t.csv")
    assert e.value.field == field and e.value.line == (2 if text.startswith("#") else 1)


def test_job_larger_than_cluster_is_rejected():
    small = ClusterSpec((NodeGroup("a100", 1, 4), NodeGroup("a40", 2, 2)))
    with pytest.raises(InputError, match="job 'big' requests 8") as e:
        parse_trace(ARENA_HEAD + "ok,1,1,moe__690M,2,256,4,a40\nbig,1,1,moe__690M,2,256,8,a100\n", "a.csv",
                    cluster=small)
    assert e.value.field == "requested_gpus" and e.value.line == 3


def test_bundled_arena_traces():
    philly = load_bundled_trace("arena-philly", iteration_divisor=5, deadline_slack_factor=5)
    assert len(philly) == 1938 and min(j.arrival_s for j in philly) == 0.0
    assert {j.requested_gpus for j in philly} == {1, 2, 4, 8, 16}
    assert all(j.deadline_s is not None and j.deadline_s >= j.arrival_s for j in philly)
    assert len(load_bundled_trace("arena-venus")) == 438 and len(load_bundled_trace("arena-pai")) == 125


@pytest.mark.parametrize("duration", ["5e12", "8.9e12"])   # (past 9e12 s the bound on times refuses it first,
def test_a_philly_duration_too_long_for_the_iteration_limit_is_blamed_on_the_duration(duration):  # on 'duration' too)
    text = ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,3600,1,3600,vc1\n"
            f"2017-10-09 08:01:55,{duration},4,1,vc1\n")
    with pytest.raises(InputError, match=r"s is [0-9.e+]+ iterations of .* on 4 .* GPUs, above the limit of "
                                         r"1,000,000,000 iterations per job") as e:
        parse_trace(text, "p.csv")
    assert (e.value.line, e.value.field) == (3, "duration")


def test_gzip_and_philly_import(tmp_path):
    head = "timestamp,duration,num_gpus,gpu_time,cluster\n"
    body = ("2017-10-09 07:01:55,3600.0,1,3600.0,vc1\n"
            "2017-10-09 06:01:55,7200.0,3,21600.0,vc2\n"
            "2017-10-09 09:01:55,60.0,64,3840.0,vc1\n")
    p = tmp_path / "philly.csv.gz"
    p.write_bytes(gzip.compress((head + body).encode()))
    jobs = load_trace(p, seed=1, max_gpus=16)
    assert [j.job_id for j in jobs] == ["philly-3", "philly-2", "philly-4"]      # by arrival
    assert [j.arrival_s for j in jobs] == [0.0, 3600.0, 3 * 3600.0]
    assert [j.requested_gpus for j in jobs] == [4, 1, 16]                          # pow2, capped
    assert [j.tenant for j in jobs] == ["vc2", "vc1", "vc1"]
    from instances.gpus import get_gpu
    from instances.oracle import TableOracle
    from instances.traces import compact_shape
    o = TableOracle()
    for j, dur in zip(jobs, (7200.0, 3600.0, 60.0)):
        shape = compact_shape(j.requested_gpu_type, j.requested_gpus,
                              get_gpu(j.requested_gpu_type).default_gpus_per_node)
        t = o.true_iteration_time(j, shape)
        assert t is not None and abs(j.num_iterations * t - dur) <= max(t / 2 + 1e-9, 0) or j.num_iterations == 1
    assert load_trace(p, seed=1, max_gpus=16) == jobs                              # deterministic
    assert len(load_trace(p, seed=1, max_jobs=2)) == 2
    assert [j.job_id for j in load_trace(p, start_s=3000, end_s=4000)] == ["philly-2"]
    with pytest.raises(InputError) as e:
        load_trace(p, max_gpus=12)
    assert e.value.field == "max_gpus"
    bad = tmp_path / "bad.csv"
    bad.write_text(head + "2017-10-09 07:01:55,-5,1,1,vc\n")
    with pytest.raises(InputError) as e:
        load_trace(bad)
    assert (e.value.line, e.value.field) == (2, "duration")
    bad.write_text(head + "yesterday,5,1,1,vc\n")
    with pytest.raises(InputError) as e:
        load_trace(bad)
    assert (e.value.line, e.value.field) == (2, "timestamp")


def test_bundled_pollux_philly_subset():
    jobs = load_bundled_trace("pollux-philly", max_jobs=300, seed=0)
    assert len(jobs) == 300 and jobs[0].arrival_s == 0.0
    assert all(j.requested_gpus in (1, 2, 4, 8, 16) for j in jobs)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(jobs, jobs[1:]))


def test_missing_file():
    with pytest.raises(InputError, match="not found"):
        load_trace("/nonexistent/trace.csv")


@st.composite
def arena_rows(draw):
    n = draw(st.integers(1, 6))
    ids = draw(st.lists(st.text(alphabet="abcdef0123456789-", min_size=1, max_size=10), min_size=n, max_size=n,
                        unique=True))
    rows = []
    for jid in ids:
        sub = draw(st.integers(0, 10**7))
        rows.append([jid, str(sub), str(draw(st.integers(1, 10**6))),
                     draw(st.sampled_from(["bert__1.3B", "moe__690M", "wide_resnet__2B", "moe__10B"])),
                     str(sub + draw(st.integers(0, 10**6))), str(draw(st.sampled_from([128, 256, 512]))),
                     str(draw(st.sampled_from([1, 2, 4, 8, 16]))),
                     draw(st.sampled_from(["a100", "v100", "a40", "a10"]))])
    return rows


ARENA_CORRUPTIONS = {
    "submission_time": ["-5", "nan", "x", ""], "num_iteration": ["0", "1.5", "many"],
    "model_name": ["gpt__1T", ""], "deadline": ["-1", "inf", "?"], "batch_size": ["0", "b"],
    "num_gpu": ["0", "-1", "four"], "gpu_type": ["k80", ""],
}


@settings(max_examples=60, deadline=None)
@given(arena_rows(), st.integers(1, 7), st.floats(1, 10), st.data())
def test_arena_fuzz_valid_and_corrupted(rows, divisor, factor, data):
    text = ARENA_HEAD + "".join(",".join(r) + "\n" for r in rows)
    jobs = parse_trace(text, "a.csv", iteration_divisor=divisor, deadline_slack_factor=factor)
    t0 = min(int(r[1]) for r in rows)
    for r, j in zip(rows, jobs):
        assert j.job_id == r[0] and j.arrival_s == int(r[1]) - t0
        assert j.num_iterations == max(1, int(r[2]) // divisor)
        assert j.deadline_s == pytest.approx(j.arrival_s + (int(r[4]) - int(r[1])) * factor)
    i = data.draw(st.integers(0, len(rows) - 1))
    col = data.draw(st.sampled_from(sorted(ARENA_CORRUPTIONS)))
    rows[i][ARENA_COLUMNS.index(col)] = data.draw(st.sampled_from(ARENA_CORRUPTIONS[col]))
    with pytest.raises(InputError) as e:
        parse_trace(ARENA_HEAD + "".join(",".join(r) + "\n" for r in rows), "a.csv")
    assert (e.value.line, e.value.field) == (i + 2, col)


def test_gpu_types_from_the_command_line_is_a_comma_separated_string(capsys, tmp_path):
    from engine.cli.main import main
    text = "timestamp,duration,num_gpus,gpu_time,cluster\n0,3600,2,7200,vc1\n60,600,1,600,vc1\n"
    for value, types in (("a100,a40", {"a100-40gb", "a40"}), (" a40 ", {"a40"})):
        jobs = parse_trace(text, "p.csv", gpu_types=value)
        assert {j.requested_gpu_type for j in jobs} <= types and jobs, value
    for value in ("", " , ", "a100,,a40", "tpu"):
        with pytest.raises(InputError) as e:
            parse_trace(text, "p.csv", gpu_types=value)
        assert e.value.field == "gpu_types" and e.value.file == "p.csv", value
    (tmp_path / "c.json").write_text('[{"a100": {"node_num": 2}, "a40": {"node_num": 2}}]')
    (tmp_path / "p.csv").write_text(text)
    assert main(["simulate", "--cluster", str(tmp_path / "c.json"), "--trace", str(tmp_path / "p.csv"),
                 "--trace-opt", "gpu_types=a100,a40", "--rounds", "2", "--quiet", "--no-plots",
                 "--out", str(tmp_path / "r")]) == 0, capsys.readouterr().err


def test_an_unterminated_quote_is_named(tmp_path):
    rows = ['j1,0,100,gpt__1.3B,1000,32,1,a100', '"j2,0,100,gpt__1.3B,1000,32,1,a100',
            'j3,0,100,gpt__1.3B,1000,32,1,a100']
    for text, line in ((ARENA_HEAD + "\n".join(rows) + "\n", 3),
                       (OURS_HEAD + 'j1,"gpt__1.3B,32,10,0,,1,t,a100,1\nj2,gpt__1.3B,32,10,0,,1,t,a100,1\n', 3)):
        with pytest.raises(InputError) as e:
            parse_trace(text, "t.csv")
        assert e.value.line == line and "unterminated quote" in e.value.reason, e.value
    with pytest.raises(InputError, match="expected 8 fields, got 2"):          # no quote: the count as before
        parse_trace(ARENA_HEAD + "j1,0\n", "t.csv")
