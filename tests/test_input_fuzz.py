"""Property-based fuzzing of every input parser (issue 13): for any input, a parser
returns a valid object or raises ``InputError`` (naming the file, line or field) --
never another exception, never a hang. Inputs are random text and, more usefully,
well-formed files with one or more fields replaced by hostile values.

Budget: ``max_examples`` per parser and a per-example deadline (a slow example fails the
test as a hang). The last section (issue 46) holds every numeric field to the bounds on
input (``instances/limits.py``): floats that overflow (1e308, inf, nan, -0), huge
integers, times past 9e12 s, deeply nested JSON and TOML, corrupt and oversized gzip.
"""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from instances.cluster import ClusterSpec, NodeGroup, load_cluster
from instances.errors import InputError
from instances.traces import ARENA_COLUMNS, OUR_COLUMNS, OUR_MAGIC, PHILLY_COLUMNS, parse_trace

FUZZ = settings(max_examples=120, deadline=timedelta(seconds=3), derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

HOSTILE = ["", " ", "0", "-1", "1", "2", "8", "1.5", "-0.0", "nan", "NaN", "inf", "-inf", "1e30", "1e309",
           "99999999999", "9" * 40, "0x10", "abc", "a100", "v100", "gpt__1.3B", "tpu", "true", "null", "[]",
           "{}", "\x00", "é", "2017-10-09 07:01:55", "2017-13-40", "1,2", '"', "\n",
           # past the bounds on input (instances/limits.py, issue 46)
           "1e19", "1e17", "1e308", "-1e308", "9e12", "9000000000001", "-0", "1e-300", "9" * 400]
value = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12))


def assert_clean(exc: InputError) -> None:
    """An input error says where: a file, a line or a field."""
    assert exc.file is not None or exc.line is not None or exc.field is not None, str(exc)
    assert str(exc)


def parses_or_input_error(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except InputError as e:
        assert_clean(e)
        return None


# ----------------------------------------------------------------------------- traces
VALID_ROWS = {
    "ours": (OUR_COLUMNS, ["j1", "gpt__1.3B", "32", "100", "0.0", "", "1.0", "default", "a100", "2"]),
    "arena": (ARENA_COLUMNS, ["1", "0", "100", "gpt__1.3B", "1000", "32", "2", "a100"]),
    "philly": (PHILLY_COLUMNS, ["2017-10-09 07:01:55", "66.0", "1", "66.0", "11cb48"]),
}
CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("v100", 2, 8)))


def _trace_text(fmt: str, rows: list[list[str]]) -> str:
    cols, _ = VALID_ROWS[fmt]
    lines = ([OUR_MAGIC] if fmt == "ours" else []) + [",".join(cols)]
    lines += [",".join(r) for r in rows]
    return "\n".join(lines) + "\n"


@st.composite
def mutated_trace(draw, fmt):
    _, valid = VALID_ROWS[fmt]
    rows = []
    for i in range(draw(st.integers(1, 3))):
        row = list(valid)
        row[0] = row[0] if fmt == "philly" else f"{row[0]}{i}"
        for _ in range(draw(st.integers(1, 3))):
            row[draw(st.integers(0, len(row) - 1))] = draw(value)
        rows.append(row)
    return _trace_text(fmt, rows)


@pytest.mark.parametrize("fmt", sorted(VALID_ROWS))
def test_valid_trace_rows_parse(fmt):
    jobs = parse_trace(_trace_text(fmt, [VALID_ROWS[fmt][1]]), "t.csv", cluster=CLUSTER)
    assert len(jobs) == 1


@pytest.mark.parametrize("fmt", sorted(VALID_ROWS))
@FUZZ
@given(data=st.data())
def test_trace_fields_fuzzed(fmt, data):
    text = data.draw(mutated_trace(fmt))
    jobs = parses_or_input_error(parse_trace, text, "t.csv", cluster=CLUSTER)
    for j in jobs or ():
        assert j.num_iterations >= 1 and j.global_batch >= 1 and j.arrival_s >= 0


@FUZZ
@given(text=st.text(max_size=300), header=st.sampled_from(["", OUR_MAGIC + "\n", ",".join(ARENA_COLUMNS) + "\n",
                                                           ",".join(PHILLY_COLUMNS) + "\n"]))
def test_trace_random_text(text, header):
    parses_or_input_error(parse_trace, header + text, "t.csv", cluster=CLUSTER)


@FUZZ
@given(opts=st.dictionaries(st.sampled_from(["iteration_divisor", "deadline_slack_factor", "seed", "max_jobs",
                                             "start_s", "end_s", "max_gpus", "gpu_types", "nope"]),
                            st.one_of(st.integers(-3, 10**12), st.floats(allow_nan=True), st.text(max_size=5),
                                      st.none(), st.booleans()), max_size=3),
       fmt=st.sampled_from(sorted(VALID_ROWS)))
def test_trace_import_options_fuzzed(opts, fmt):
    parses_or_input_error(parse_trace, _trace_text(fmt, [VALID_ROWS[fmt][1]]), "t.csv", cluster=CLUSTER, **opts)


def test_trace_files_binary_and_folder(tmp_path):
    from instances.traces import load_trace
    (tmp_path / "b.csv").write_bytes(bytes(range(256)))
    (tmp_path / "g.csv").write_bytes(b"\x1f\x8b" + bytes(50))
    for p in (tmp_path / "b.csv", tmp_path / "g.csv", tmp_path, tmp_path / "missing.csv"):
        with pytest.raises(InputError) as e:
            load_trace(p)
        assert e.value.file == str(p)


# ----------------------------------------------------------------------------- cluster JSON
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**20), st.floats(allow_nan=True),
                      st.sampled_from(HOSTILE), st.sampled_from([10**400, -10**400, 1e308, -0.0, 1e19, 9e12]))
json_any = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=8)
GROUP = {"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4}


@st.composite
def cluster_doc(draw):
    kind = draw(st.sampled_from(["ours", "arena", "any"]))
    if kind == "any":
        return draw(json_any)
    if kind == "arena":
        return [{draw(st.sampled_from(["a100", "v100", "a40", "a10", "tpu", ""])):
                 draw(st.one_of(st.fixed_dictionaries({"node_num": json_leaf}), json_leaf))
                 for _ in range(draw(st.integers(0, 3)))}]
    groups = []
    for _ in range(draw(st.integers(0, 3))):
        g = dict(GROUP)
        for _ in range(draw(st.integers(0, 2))):
            key = draw(st.sampled_from(list(GROUP) + ["nodes_per_switch", "inter_node_bw_bytes_per_s", "x"]))
            if draw(st.booleans()):
                g[key] = draw(json_leaf)
            else:
                g.pop(key, None)
        groups.append(g)
    doc = {"node_groups": groups}
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["name", "schema_version"]))] = draw(json_leaf)
    return doc


@FUZZ
@given(doc=cluster_doc())
def test_cluster_json_fuzzed(tmp_path, doc):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    spec = parses_or_input_error(load_cluster, p)
    if spec is not None:
        assert spec.num_gpus >= 1 and all(g.inter_bw_bytes_per_s > 0 for g in spec.groups)
        assert spec.nodes()


@FUZZ
@given(raw=st.binary(max_size=200))
def test_cluster_bytes_fuzzed(tmp_path, raw):
    p = tmp_path / "c.json"
    p.write_bytes(raw)
    parses_or_input_error(load_cluster, p)


# ----------------------------------------------------------------------------- plans, configs, CLI values
@FUZZ
@given(text=st.one_of(st.text(max_size=30),
                      st.lists(st.tuples(st.sampled_from(["dp", "tp", "pp", "DP", "xp", ""]),
                                         st.sampled_from(["=", ":", ""]), value), max_size=4)
                      .map(lambda parts: ",".join(k + s + v for k, s, v in parts))))
def test_plan_strings_fuzzed(text):
    from launcher.config import ParallelPlan
    plan = parses_or_input_error(ParallelPlan.parse, text)
    if plan is not None:
        assert min(plan.dp, plan.tp, plan.pp) >= 1 and str(ParallelPlan.parse(str(plan))) == str(plan)


@FUZZ
@given(doc=st.dictionaries(st.sampled_from(["model", "plan", "steps", "global_batch", "checkpoint_every",
                                            "checkpoint_interval_s", "device", "num_nodes", "stall_timeout_s",
                                            "optimizer", "seed", "bogus"]), json_any, max_size=5))
def test_train_config_json_fuzzed(doc):
    from launcher.config import TrainConfig
    base = {"model": "tiny-gpt__2L", "plan": {"dp": 1}, "steps": 5}
    try:
        TrainConfig.from_json({**base, **doc})
    except InputError as e:
        assert_clean(e)
    except (TypeError, AttributeError, KeyError) as e:
        # wrong JSON types in nested config objects: must be input errors too
        pytest.fail(f"{type(e).__name__}: {e} for {doc!r}")


@FUZZ
@given(items=st.lists(st.text(max_size=12), max_size=4))
def test_cli_key_values_fuzzed(items):
    from engine.cli.common import parse_options
    parses_or_input_error(parse_options, items, "--policy-opt")


@FUZZ
@given(text=st.text(max_size=40))
def test_objective_weights_fuzzed(text):
    from engine.cli.commands.bench.synthetic import parse_weights
    parses_or_input_error(parse_weights, text)


@FUZZ
@given(lines=st.lists(st.one_of(st.sampled_from(["h1", "h1:2", "h1:0", "h1:-3", "h1:x", "# c", ":", "h:1:2"]),
                                st.text(max_size=10)), max_size=5))
def test_hostfiles_fuzzed(tmp_path, lines):
    from launcher.launch import hostfile_hosts
    p = tmp_path / "hosts"
    p.write_text("\n".join(lines))
    hosts = parses_or_input_error(hostfile_hosts, p)
    assert hosts is None or all(n >= 1 for _, n in hosts)


@FUZZ
@given(argv=st.lists(st.sampled_from(["--gpus", "--batch", "--model", "--gpu-type", "--gpus-per-node"]) |
                     st.sampled_from(["0", "-1", "16", "1e3", "99999999999", "nan", "gpt__1.3B", "a100", "x"]),
                     max_size=8))
@example(argv=["--gpus", "99999999999", "--batch", "16"])       # was a hang (a loop over every count)
def test_estimate_command_numbers_fuzzed(argv, capsys):
    """CLI numbers: argparse rejects non-numbers (SystemExit 2); the command refuses the rest
    with exit status 2 (an input error), or answers (1: a valid request no grid can run)."""
    from engine.cli.main import main
    base = {"--model": "gpt__350M", "--gpu-type": "a100", "--gpus": "8"}
    args = ["estimate"] + [x for k, v in base.items() if k not in argv for x in (k, v)] + argv
    try:
        rc = main(args)
    except SystemExit as e:
        assert e.code == 2
        return
    assert rc in (0, 1, 2)


# ----------------------------------------------------------------------------- paths the OS refuses
def test_every_reader_names_a_path_the_os_refuses_or_that_is_no_regular_file(tmp_path):
    """A name too long (errno 36), a symbolic link loop (errno 40), a FIFO and a device: an
    ``InputError`` naming the file from each reader, never an ``OSError`` and never a hang."""
    import os

    from instances.hf_config import load_hf_config
    from instances.outages import load_outages
    from instances.traces import load_trace
    (tmp_path / "loop1.json").symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(tmp_path / "loop1.json")
    os.mkfifo(tmp_path / "fifo.json")
    readers = {"cluster": load_cluster, "trace": load_trace, "outages": lambda p: load_outages(p, CLUSTER),
               "model": load_hf_config}
    for path, words in ((tmp_path / ("x" * 300 + ".json"), "too long"),
                        (tmp_path / "loop1.json", "symbolic links"),
                        (tmp_path / "fifo.json", "not a regular file"),
                        (Path("/dev/zero"), "not a regular file")):
        for name, read in readers.items():
            with pytest.raises(InputError) as e:
                read(path)
            assert e.value.file == str(path) and words in e.value.reason, (name, path.name[:20], e.value)


def test_output_paths_are_really_written_to_not_asked_of_os_access(tmp_path):
    """``os.access`` says yes to root, and to /proc: the check creates a file for real (in
    the folder, or in a missing folder's nearest existing ancestor), then removes it."""
    from instances.paths import check_output_dir, check_output_file
    for check, path in ((check_output_dir, "/proc/nope"), (check_output_dir, "/proc"),
                        (check_output_file, "/proc/nope.csv")):
        with pytest.raises(InputError) as e:
            check(path, "--out")
        assert e.value.field == "--out", path
    deep = tmp_path / "a" / "b"
    assert check_output_dir(deep, "--out") == deep and not (tmp_path / "a").exists()
    assert check_output_file(deep / "f.csv", "--out") and not (tmp_path / "a").exists()
    assert check_output_dir(tmp_path, "--out") == tmp_path and not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- bounds on input (issue 46)
# a number as every source gives it: a float (overflowing, signed zero, subnormal), a huge
# integer, or the text a command line or CSV passes on
NUMBER = st.one_of(st.sampled_from([0, -0.0, 1, 2, 1.5, 300.0, 9e12, 9000000000001.0, 1e17, 1e19, 1e308, -1e308,
                                    float("inf"), float("-inf"), float("nan"), 5e-324, 10**18, 10**400, -10**400,
                                    True]),
                   st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**30), 10**30),
                   st.sampled_from(["1e308", "inf", "nan", "-0", "9" * 400, "1e19", "x"]))


@FUZZ
@given(depth=st.integers(1, 3000), brackets=st.sampled_from(["[]", "{}"]), key=st.sampled_from(["a", '"k"']))
def test_nesting_fuzzed_in_every_json_and_toml_reader(tmp_path, depth, brackets, key):
    """Any depth: a valid document or an InputError naming the file, never a RecursionError."""
    from engine.service.jobspec import JobSpec
    from instances.hf_config import load_hf_config
    from instances.limits import MAX_NESTING_DEPTH
    from instances.structured import loads_json, loads_toml
    o, c = brackets
    inner = ('{"a": ' * depth + "1" + "}" * depth) if o == "{" else (o * depth + c * depth)
    toml_inner = ("{a = " * depth + "1" + "}" * depth) if o == "{" else (o * depth + c * depth)
    deep = depth + 1 > MAX_NESTING_DEPTH              # the document's own object is a level too
    for fn, arg, kw in ((loads_json, f'{{"model_type": {inner}}}', {"file": "x.json"}),
                        (loads_toml, f"{key} = {toml_inner}\n", {"file": "x.toml"}),
                        (JobSpec.from_toml_text, f"name = {toml_inner}\n", {"source": "job.toml"})):
        try:
            fn(arg, **kw)
            assert not deep, (fn, depth)
        except InputError as e:
            assert_clean(e)
            assert not deep or "nested too deeply" in e.reason, e
    p = tmp_path / "config.json"
    p.write_text(f'{{"model_type": {inner}}}')
    for load in (load_cluster, load_hf_config):
        with pytest.raises(InputError) as e:
            load(p)
        assert e.value.file is not None and (not deep or "nested too deeply" in e.value.reason)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(["global_batch", "steps", "gpus", "priority", "deadline_s", "seed",
                                               "after"]), st.one_of(NUMBER, st.lists(NUMBER, max_size=2)),
                              min_size=1, max_size=3))
def test_job_spec_numbers_fuzzed(fields):
    """Every numeric field of a job (a TOML file or an API body): a valid job or an
    InputError naming the field; a valid one makes a valid engine Job."""
    from engine.service.jobspec import JobSpec
    base = {"name": "ok", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 10}
    spec = parses_or_input_error(JobSpec.from_dict, {**base, **fields})
    if spec is not None:
        job = spec.to_job("1", 0.0)
        assert 1e-4 <= job.priority <= 1e4 and (job.deadline_s is None or job.deadline_s <= 9e12)


POLICY_KEYS = ["w_jct", "w_throughput", "w_queue", "w_makespan", "jct.max_factor", "jct.exponent", "queue.aging_s",
               "reconfig.per_move", "reconfig.give_way", "reconfig.horizon_rounds", "threads", "time_limit_s",
               "seed", "max_gpus", "rel_gap", "payback_max_s", "move_backoff_s", "change_budget_per_job",
               "max_moves_per_hour", "move_budget_jobs"]


@FUZZ
@given(opts=st.dictionaries(st.sampled_from(POLICY_KEYS), NUMBER, min_size=1, max_size=3),
       policy=st.sampled_from(["arena", "sia", "gavel", "elasticflow-ls"]))
def test_policy_numbers_fuzzed(opts, policy):
    """``--policy-opt`` numbers (as the command line parses them, or as Python values): a
    policy or an InputError on ``--policy-opt``, never an overflow, never a policy whose
    objective could overflow."""
    from engine.cli.common import build_policy, parse_value
    opts = {k: parse_value(v) if isinstance(v, str) else v for k, v in opts.items()}
    if policy == "elasticflow-ls":
        opts = {k: v for k, v in opts.items() if k in ("payback_max_s", "move_backoff_s", "change_budget_per_job",
                                                        "max_moves_per_hour")}
        opts["slack_factor"] = opts.pop("payback_max_s", 10.0)
    pol = parses_or_input_error(build_policy, policy, opts)
    for w, term in getattr(getattr(pol, "objective", None), "terms", ()):
        assert 0 < w <= 1e4


@FUZZ
@given(data=st.one_of(st.binary(max_size=300).map(lambda b: b"\x1f\x8b" + b),
                      st.tuples(st.text(max_size=200), st.integers(0, 400))
                      .map(lambda t: __import__("gzip").compress((OUR_MAGIC + "\n" + t[0]).encode())[:t[1] or None])))
def test_gzip_input_fuzzed(tmp_path, data):
    """Corrupt, truncated or valid gzip as a trace or an outage file: parsed, or an
    InputError naming the file (was a zlib.error traceback)."""
    from instances.outages import load_outages
    from instances.traces import load_trace
    p = tmp_path / "t.csv.gz"
    p.write_bytes(data)
    for load in (load_trace, lambda q: load_outages(q, CLUSTER)):
        try:
            load(p)
        except InputError as e:
            assert e.file == str(p), e


@FUZZ
@given(start=st.sampled_from(HOSTILE), end=st.sampled_from(HOSTILE))
def test_outage_times_fuzzed(tmp_path, start, end):
    from instances.outages import load_outages
    p = tmp_path / "o.csv"
    p.write_text(f"node,start_s,end_s\n0,{start},{end}\n".replace("\x00", ""))
    outs = parses_or_input_error(load_outages, p, CLUSTER)
    for o in outs or ():
        assert o.start_s <= 9e12 and (o.end_s == float("inf") or o.end_s <= 9e12)


@settings(max_examples=60, deadline=timedelta(seconds=10), derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(arrival=st.sampled_from(["0", "8.99e12", "9e12", "1e13", "1e17", "1e19", "1e308"]),
       priority=st.sampled_from(["1", "1e-4", "1e4", "1e-300", "1e308"]),
       interval=st.sampled_from([None, 1e-9, 1e-3, 300.0, 1e7, 9e12, 1e20]),
       rounds=st.sampled_from([None, 1, 3, 2_000_000]), run_out=st.booleans())
def test_simulations_with_huge_times_end_or_are_refused(tmp_path, arrival, priority, interval, rounds, run_out):
    """A trace whose times and priority are anywhere, simulated with any round interval and
    horizon: results, or an InputError before the first round; never a hang (the deadline),
    never another exception."""
    from engine.cli.common import build_policy
    from engine.sim.simulator import simulate
    from instances.builtin import Instance
    from instances.oracle import TableOracle
    text = (OUR_MAGIC + "\n" + ",".join(OUR_COLUMNS) + "\n"
            + f"j1,gpt__1.3B,32,50,{arrival},,{priority},default,a100,2\nj2,gpt__1.3B,32,20,{arrival},,1,default,,\n")
    try:
        jobs = parse_trace(text, "t.csv", cluster=CLUSTER)
        inst = Instance("t", "", CLUSTER, jobs, TableOracle())
        res = simulate(inst, build_policy("fcfs", {}), rounds=rounds, run_out=run_out, round_interval_s=interval,
                       max_rounds=2000, check_invariants_every_round=False)
    except InputError as e:
        assert_clean(e)
        return
    assert res.summary["end_reason"] in ("horizon", "all jobs finished", "stalled", "safety limit", "clock bound")
    assert all(r.time_s <= 9e12 for r in res.rounds)


# ------------------------------------------------------------- the Sia artifact (issue 58)
SIA_FIXTURE = Path(__file__).parent / "data" / "sia_artifact"
SIA_CSVS = sorted(str(p.relative_to(SIA_FIXTURE / "sia-simulator")) for p in SIA_FIXTURE.rglob("*.csv")
                  if "pipes" not in str(p))
SIA_NAMES = ["cluster_nnodes", "cluster_ngpus_per_node", "cluster_max_physical_nnodes", "SLOWDOWNS",
             "sia_default_p_val", "sia_default_lambda_n", "sia_default_lambda_a", "sia_goodput_clip_val"]
SIA_LITERALS = ["0", "-1", "1", "-0.0", "1e-300", "1e308", "1e999", "-1e308", "10**12", "9" * 400, "None", "'x'",
                "True", "{}", "[1]", "{'aws': 0}", "{'aws': 10**9, 'rtx': 1}", "{'aws': 1000000, 'rtx': 1}",
                "{'toy': float('nan'), 'big': 1}", "{'toy': 1e300, 'big': 1}", "{'toy': 1e-300, 'big': 1}",
                "{'tpu': 1}", "dict(aws=2)", "{'aws': 2, 'rtx': 1}", "{'toy': 2, 'big': 0.5}", "0.5", "-2", "2"]


@st.composite
def corrupted_artifact(draw):
    """(file, how): one field of one file of the fixture replaced by a hostile value, or by
    its own value scaled far (which the importer may accept, and the run must survive)."""
    if draw(st.integers(0, 3)):
        rel = draw(st.sampled_from(SIA_CSVS))
        lines = (SIA_FIXTURE / "sia-simulator" / rel).read_text().splitlines()
        row = draw(st.integers(1, len(lines) - 1))
        col = draw(st.integers(0, lines[0].count(",")))
        cell = lines[row].split(",")[col]
        scaled = repr(float(cell) * draw(st.sampled_from([0.0, 1e-6, 0.5, 2.0, 1e3, 1e6, -1.0])))
        return rel, (row, col, draw(st.one_of(value, st.just(scaled), st.just(scaled))))
    return "simulator_config.py", (draw(st.sampled_from(SIA_NAMES)), draw(st.sampled_from(SIA_LITERALS)))


@settings(max_examples=30, deadline=timedelta(seconds=20), derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=corrupted_artifact(), policy=st.sampled_from(["sia", "gavel", "pollux", "pollux-artifact", "fcfs",
                                                          "arena"]))
def test_sia_artifact_fields_fuzzed(tmp_path_factory, case, policy):
    """A corrupted copy of the fixture (any CSV field, or a setting of simulator_config.py):
    an InputError naming the file, or an instance that simulates (a few rounds, every
    policy of the goodput jobs) without another exception or a hang."""
    import shutil

    from engine.cli.common import goodput_perf, reconfig_for
    from engine.core.policy import make_policy
    from engine.sim.simulator import simulate
    from instances import sia_artifact, sia_instances
    from instances.sia_instances import load_sia_instance
    root = tmp_path_factory.mktemp("sia") / "a"
    shutil.copytree(SIA_FIXTURE, root)
    sim = root / "sia-simulator"
    rel, how = case
    path = sim / rel
    if rel.endswith(".csv"):
        row, col, text = how
        lines = path.read_text().splitlines()
        cells = lines[row].split(",")
        cells[min(col, len(cells) - 1)] = text
        lines[row] = ",".join(cells)
        path.write_text("\n".join(lines) + "\n")
    else:
        name, literal = how
        path.write_text(path.read_text() + f"\n{name} = {literal}\n")
    sia_artifact.forget_loaded()
    sia_instances.sia_world.cache_clear()
    try:
        inst = load_sia_instance("sia:mini/workload-1", sim)
        simulate(inst, make_policy(policy), perf=goodput_perf(None, None, None, inst.oracle),
                 reconfig=reconfig_for(inst, {}), rounds=4)
    except InputError as e:
        assert_clean(e)
        assert e.file is not None or e.field in ("--instance", "--perf"), e
    finally:
        sia_artifact.forget_loaded()
        sia_instances.sia_world.cache_clear()


GOODPUT_OPTIONS = {"sia": ["p", "lambda_n", "clip", "max_replicas_factor", "time_limit_s", "rel_gap",
                           "restart_factor", "project_throughputs", "estimates"],
                   "gavel": ["round_s", "share_ties"],
                   "pollux": ["p", "restart_delay_s", "max_replicas", "max_replicas_factor", "time_limit_s",
                              "rel_gap", "estimates"],
                   "pollux-artifact": ["p", "generations", "population", "max_replicas", "estimates"]}


# values at and near each option's bounds (instances/limits.py), and the artifact's own
PLAUSIBLE = {"p": [-10, -4, -1, -0.5, 0.5, 1, 10, 10.5], "lambda_n": [-1e6, -2, -1.1, 1, 1.1, 2, 1e6],
             "clip": [0.5, 1, 3000, 1e9], "max_replicas_factor": [0, 0.5, 2, 1e6], "time_limit_s": [0.01, 1, 60],
             "rel_gap": [0, 1e-4, 1], "round_s": [1, 60, 360, 1200, 1300, 86400], "restart_delay_s": [0, 30, 1e6],
             "max_replicas": [1, 2, 16, 2.5, 10**6], "generations": [1, 10, 1001],
             "population": [2, 10, 1001]}


@settings(max_examples=40, deadline=timedelta(seconds=20), derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), policy=st.sampled_from(sorted(GOODPUT_OPTIONS)))
def test_goodput_policy_options_fuzzed(data, policy):
    """The goodput policies' options (as the command line parses them, or Python values):
    an InputError on --policy-opt before any round, or a policy that decides the fixture's
    goodput jobs for a few rounds (no overflow, no solver stalled at status 15)."""
    from engine.cli.common import (
        build_policy,
        check_policy_on,
        goodput_perf,
        instance_workload,
        parse_value,
        reconfig_for,
    )
    from engine.sim.simulator import simulate
    from instances.sia_instances import load_sia_instance
    keys = data.draw(st.lists(st.sampled_from(GOODPUT_OPTIONS[policy]), min_size=1, max_size=3, unique=True))
    opts = {k: data.draw(st.one_of(NUMBER, st.sampled_from(PLAUSIBLE.get(k, ["true", "false", "fitted", "profiles"])),
                                   st.sampled_from(PLAUSIBLE.get(k, ["true", "false", "fitted", "profiles"]))))
            for k in keys}
    opts = {k: parse_value(v) if isinstance(v, str) else v for k, v in opts.items()}
    inst = load_sia_instance("sia:mini/workload-1", SIA_FIXTURE)
    try:
        pol = build_policy(policy, opts)
        check_policy_on(pol, instance_workload(inst, run_out=True))
    except InputError as e:
        assert e.field == "--policy-opt" and f"policy {policy!r}" in str(e), e
        return
    simulate(inst, pol, perf=goodput_perf(None, None, None, inst.oracle), reconfig=reconfig_for(inst, {}), rounds=4)
