"""Plug-ins from outside the package (instances/plugins.py, ``arena --plugin``): a file,
a module, the environment and installed entry points; every way one can fail names it;
the example plug-in (examples/plugins/energy.py) decides a simulation end to end."""
from __future__ import annotations

import csv
import json
import re
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli.main import main, plugin_registries
from engine.core.policy import policy_names
from engine.decide.formulation import build_model, tiny_round_data
from engine.decide.formulation.model import ModelBuilder
from engine.decide.objectives import make_term, parse_objective
from instances.errors import InputError
from instances.plugins import ENV_DISABLE_AUTOLOAD, ENV_PLUGINS, entry_point_specs, load_plugin, load_plugins

ROOT = Path(__file__).resolve().parents[1]
ENERGY = ROOT / "examples" / "plugins" / "energy.py"


@pytest.fixture
def registries(monkeypatch):
    """The registries plug-ins add to; whatever a test loads is taken back out after it
    (so that other tests see only the built-in names), with the modules it imported."""
    monkeypatch.delenv(ENV_PLUGINS, raising=False)
    monkeypatch.delenv(ENV_DISABLE_AUTOLOAD, raising=False)
    regs = plugin_registries()
    before = {r.kind: set(r.names()) for r in regs}
    modules = set(sys.modules)
    yield regs
    for r in regs:
        for name in set(r.names()) - before[r.kind]:
            r.unregister(name)
    for name in set(sys.modules) - modules:
        if name.startswith("arena_plugin_") or name.startswith("mylab_"):
            del sys.modules[name]


def write(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


POLICY_PLUGIN = """
    import dataclasses
    from engine.decide.policies.arena import ARENA
    from engine.decide.policies.milp import register_milp_policy
    register_milp_policy(dataclasses.replace(ARENA, name="{name}", weights={{"throughput": 1.0}}))
"""


def test_a_file_plugin_registers_a_policy_and_is_recorded_with_its_hash(registries, tmp_path):
    path = write(tmp_path, "mine.py", POLICY_PLUGIN.format(name="only-throughput"))
    p = load_plugin(str(path), registries=registries)
    assert p.registered == ("policy only-throughput",)
    assert p.path == str(path.resolve()) and len(p.sha256) == 64 and p.source == "--plugin"
    assert "only-throughput" in policy_names()
    # the same file again (the command line and ARENA_PLUGINS): loaded once, listed once
    again = load_plugins([(str(path), "--plugin"), (str(path), ENV_PLUGINS)], registries)
    assert [q.module for q in again] == [p.module] and again[0].registered == ()


def test_the_example_energy_term_follows_its_formula(registries):
    load_plugin(str(ENERGY), registries=registries)
    jobs = [{"cols": [("a100-40gb", 1, 1, 1.0), ("a100-40gb", 1, 2, 1.8)], "remaining": 1000},
            {"cols": [("v100-32gb", 1, 4, 2.0)], "remaining": 500}]
    data = tiny_round_data({"a100-40gb": [2], "v100-32gb": [4]}, jobs)
    b = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
    make_term("energy").apply(data, b, 0.5)
    watts = {"a100-40gb": 400.0, "v100-32gb": 300.0}
    want = [-0.5 * g * watts[data.capacity.types[t]] / 300.0 for g, t in zip(data.col_gpus, data.col_type)]
    np.testing.assert_allclose(b.build().c[: data.n_cols], want)
    # it says it is columnwise: built from a subset of columns, the same model restricted
    obj = parse_objective({"w_energy": 0.5}, {"throughput": 1.0})
    cols = np.array([0, 2])
    assert obj.columnwise
    np.testing.assert_array_equal(build_model(data.restricted(cols), obj).c, build_model(data, obj, columns=cols).c)
    # a GPU type without a board power is an error naming it, not a free GPU
    b = ModelBuilder(data.n_cols, data.col_job, data.n_jobs)
    with pytest.raises(InputError, match="v100-32gb"):
        make_term("energy", watts="a100=400").apply(data, b, 0.5)
    with pytest.raises(InputError, match="energy.watts"):
        make_term("energy", watts="a100=-1")
    with pytest.raises(InputError, match="unknown GPU type"):
        make_term("energy", watts="b200=1000")


def test_arena_with_the_plugin_anywhere_in_the_command(registries, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "--instance", "demo", "--policy", "arena-energy", "--rounds", "6", "--quiet",
               "--no-plots", "--out", str(out), f"--plugin={ENERGY}"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "energy.py sha256:" in summary["plugins"] and "policy arena-energy" in summary["plugins"]
    assert "objective term energy" in summary["plugins"]
    assert "arena: plugin" in capsys.readouterr().err          # said on stderr, never on stdout
    # the energy weight is read: in the same rounds, the policy with it holds less board power than arena
    base = tmp_path / "base"
    assert main(["simulate", "--instance", "demo", "--policy", "arena", "--rounds", "6", "--quiet",
                 "--no-plots", "--out", str(base)]) == 0
    watts = {"a100-40gb": 400.0, "a40": 300.0}

    def energy_j(run: Path) -> float:
        rows = list(csv.DictReader((run / "rounds.csv").open()))
        return sum(float(r[f"gpu_busy_s_{t}"]) * w for r in rows for t, w in watts.items())
    assert energy_j(out) < energy_j(base)


def test_bench_policies_records_the_plugins(registries, tmp_path, capsys):
    # (fcfs decides: the plug-in's policy ran end to end above; here its record is what counts)
    rc = main(["bench", "policies", "--plugin", str(ENERGY), "--instance", "demo", "--policy", "fcfs",
               "--rounds", "4", "--no-run-out", "--quiet", "--json", "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)                   # --json: pure JSON on stdout
    assert [r["policy"] for r in rows] == ["fcfs"]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [p["registered"] for p in doc["plugins"]] == [["policy arena-energy", "objective term energy"]]


def test_the_environment_names_plugins_too(registries, tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "env_policy.py", POLICY_PLUGIN.format(name="from-env"))
    monkeypatch.setenv(ENV_PLUGINS, str(path))
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "from-env" in capsys.readouterr().out                 # the help lists the plug-in's policy


@pytest.mark.parametrize("body, match", [
    ("def broken(:\n    pass\n", r"SyntaxError.*bad\.py, line 1"),
    ("x = 1\nraise RuntimeError('no licence server')\n", r"RuntimeError: no licence server \(.*bad\.py, line 2\)"),
    ("x = 1\n", "registered nothing"),
    (POLICY_PLUGIN.format(name="arena"), "policy 'arena' registered twice"),
    ("import not_a_module_anywhere\n", "ModuleNotFoundError.*not_a_module_anywhere"),
])
def test_a_broken_plugin_is_an_error_naming_it(registries, tmp_path, body, match):
    path = write(tmp_path, "bad.py", body)
    with pytest.raises(InputError, match=match) as e:
        load_plugin(str(path), registries=registries)
    assert "bad.py" in str(e.value)
    assert not [m for m in sys.modules if m.startswith("arena_plugin_bad_")]     # nothing left half-loaded


@pytest.mark.parametrize("code", ["0", "3", "'no GPU here'", "None"])
def test_a_plugin_that_calls_sys_exit_is_an_error_naming_it(registries, tmp_path, capsys, code):
    body = textwrap.dedent(POLICY_PLUGIN.format(name="exits")) + f"import sys\nsys.exit({code})\n"
    path = write(tmp_path, "quits.py", body)
    with pytest.raises(InputError, match=rf"plugin .*quits\.py \(--plugin\) called sys\.exit\({code}\) while "
                                         rf"loading \(.*quits\.py, line 7\)") as e:
        load_plugin(str(path), registries=registries)
    assert e.value.field == "--plugin"
    assert "exits" not in policy_names()                            # what it registered went back out
    assert not [m for m in sys.modules if m.startswith("arena_plugin_quits_")]
    # the command: exit 2 with the line, never the plug-in's own code having done nothing
    assert main(["instances", "--plugin", str(path)]) == 2
    assert "called sys.exit(" in capsys.readouterr().err


def test_a_keyboard_interrupt_while_loading_a_plugin_stays_one(registries, tmp_path):
    path = write(tmp_path, "ctrl_c.py", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_plugin(str(path), registries=registries)
    assert not [m for m in sys.modules if m.startswith("arena_plugin_ctrl_c_")]


def test_a_plugins_policy_that_cannot_be_built_or_cannot_decide_is_named_not_its_options(registries, tmp_path,
                                                                                          capsys):
    # registering something that is not callable: refused while loading, naming the plug-in
    path = write(tmp_path, "notcallable.py", "from engine.core.policy import register_policy\n"
                                             "register_policy('not-callable')(42)\n")
    with pytest.raises(InputError, match=r"notcallable\.py \(--plugin\) failed to load: TypeError: policy "
                                         r"'not-callable' must be a class or a function that builds one, got 42"):
        load_plugin(str(path), registries=registries)
    assert "not-callable" not in policy_names()
    # a factory that fails with no option given, and one that builds an object without decide(): --policy
    write(tmp_path, "odd.py", """
        from engine.core.policy import register_policy
        @register_policy("buggy")
        def make(**kw):
            return len(3)
        @register_policy("no-decide")
        class NoDecide:
            decide = 3
        @register_policy("bare")
        class Bare:
            name = "bare"
            def decide(self, ctx):
                return None
    """)
    for policy, match in (("buggy", r"field '--policy': policy 'buggy' \(defined in .*odd\.py\) could not be built: "
                                    r"TypeError: object of type 'int' has no len\(\) \(.*odd\.py, line 5\)"),
                          ("no-decide", r"field '--policy': policy 'no-decide' \(defined in .*odd\.py\) built a "
                                        r"NoDecide object, which has no decide\(ctx\) method"),
                          ("bare", r"field '--policy': policy 'bare' \(defined in .*odd\.py\) built a Bare object, "
                                   r"which lacks event_driven \(bool\), max_queued \(int >= 0\) \(subclass "
                                   r"engine\.core\.policy\.Policy for the defaults\)")):
        assert main(["simulate", "--plugin", str(tmp_path / "odd.py"), "--instance", "demo", "--policy", policy,
                     "--rounds", "2", "--quiet", "--no-plots", "--out", str(tmp_path / policy)]) == 2
        err = capsys.readouterr().err
        assert re.search(match, err) and "--policy-opt" not in err and "Traceback" not in err, err
    # a bad option of a built-in policy is still the option's fault
    assert main(["simulate", "--instance", "demo", "--policy", "fcfs", "--policy-opt", "backfill=maybe",
                 "--rounds", "2", "--quiet", "--no-plots", "--out", str(tmp_path / "f")]) == 2
    assert "field '--policy-opt': policy 'fcfs'" in capsys.readouterr().err


def test_a_plugin_that_fails_after_registering_is_taken_back_out(registries, tmp_path):
    body = textwrap.dedent(POLICY_PLUGIN.format(name="half-way")) + "raise ValueError('then it broke')\n"
    path = write(tmp_path, "half.py", body)
    with pytest.raises(InputError, match="then it broke"):
        load_plugin(str(path), registries=registries)
    assert "half-way" not in policy_names()


def test_missing_paths_and_modules_are_named(registries, tmp_path, capsys):
    with pytest.raises(InputError, match="nope.py .*does not exist"):
        load_plugin(str(tmp_path / "nope.py"), registries=registries)
    with pytest.raises(InputError, match="is a folder"):
        load_plugin(str(tmp_path) + "/", registries=registries)
    with pytest.raises(InputError, match="no module named 'mylab_missing'"):
        load_plugin("mylab_missing.terms", registries=registries)
    # through the command line: exit 2, one line naming the plug-in, before any work
    assert main(["simulate", "--instance", "demo", "--plugin", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "arena: error:" in err and "nope.py" in err and "Traceback" not in err


def test_installed_entry_points_load_unless_disabled(registries, tmp_path, monkeypatch):
    # a distribution on sys.path, as pip would install it: a module and its dist-info
    write(tmp_path, "mylab_sched.py", POLICY_PLUGIN.format(name="from-entry-point"))
    info = tmp_path / "mylab_sched-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab-sched\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[arena_sched.plugins]\nmylab = mylab_sched\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = entry_point_specs()
    assert ("mylab_sched", "entry point mylab (mylab-sched)") in specs
    monkeypatch.setenv(ENV_DISABLE_AUTOLOAD, "1")
    assert ("mylab_sched", "entry point mylab (mylab-sched)") not in entry_point_specs()
    monkeypatch.delenv(ENV_DISABLE_AUTOLOAD)
    loaded = load_plugins([s for s in specs if s[0] == "mylab_sched"], registries)
    assert loaded[0].registered == ("policy from-entry-point",) and loaded[0].path.endswith("mylab_sched.py")
    sys.modules.pop("mylab_sched", None)


# ------------------------------------------------------ plug-in decisions (issue 58, E1-E5)
DECIDES = """
    from engine.core.context import Decisions, DecisionStats
    from engine.core.policy import Policy, register_policy
    from instances.grid import Grid, Shape
    from instances.plan import BatchPlan, Plan


    def raw_grid(t, nodes, per_node, pp=1):          # a Grid its constructor would refuse
        s = object.__new__(Shape)
        for k, v in (("gpu_type", t), ("num_nodes", nodes), ("gpus_per_node", per_node)):
            object.__setattr__(s, k, v)
        g = object.__new__(Grid)
        object.__setattr__(g, "shape", s)
        object.__setattr__(g, "pp", pp)
        return g


    @register_policy("bad")
    class Bad(Policy):
        name = "bad"

        def __init__(self, **options):
            pass

        def decide(self, ctx):
            jobs, t = [v.job_id for v in ctx.jobs], ctx.cluster.groups[0].gpu_type
            return {body}
"""

BAD_DECISIONS = {          # what decide returns -> the field named, and words of the reason
    "unknown job": ("Decisions({'nope': Grid(Shape(t, 1, 1))})", "grids", "decided for job 'nope', which is not"),
    "negative GPUs": ("Decisions({jobs[0]: raw_grid(t, 1, -2)})", "grids", "has 1 node(s) of -2 GPU(s)"),
    "None": ("None", "return", "returned None, not engine.core.context.Decisions"),
    "a string": ("'a100:1x1'", "return", "returned 'a100:1x1', not"),
    "a dict": ("{'grids': {}}", "return", "returned {'grids': {}}, not"),
    "grids None": ("Decisions(None)", "grids", "grids is None, not a mapping of job ids"),
    "grid a string": ("Decisions({jobs[0]: 'a100'})", "grids", "is 'a100', not instances.grid.Grid"),
    "pp 3 of 2 GPUs": ("Decisions({jobs[0]: raw_grid(t, 1, 2, 3)})", "grids", "pipeline depth 3, which does not"),
    "pp 0": ("Decisions({jobs[0]: raw_grid(t, 1, 2, 0)})", "grids", "pipeline depth 0"),
    "pp a string": ("Decisions({jobs[0]: raw_grid(t, 1, 2, 'x')})", "grids", "is malformed"),
    "a GPU type the cluster lacks": ("Decisions({jobs[0]: Grid(Shape('v100', 1, 1))})", "grids",
                                     "on GPU type 'v100-32gb', which the cluster lacks"),
    "pin on node 999": ("Decisions({jobs[0]: Grid(Shape(t, 1, 1))}, placements={jobs[0]: ((999, 0),)})",
                        "placements", "names GPU (999, 0), which the cluster lacks"),
    "pin of too few GPUs": ("Decisions({jobs[0]: Grid(Shape(t, 1, 2))}, placements={jobs[0]: ((0, 0),)})",
                            "placements", "(1 GPU(s) on 1 node(s)) does not match its grid"),
    "two jobs pinned to one GPU": ("Decisions({j: Grid(Shape(t, 1, 1)) for j in jobs[:2]}, "
                                   "placements={j: ((0, 0),) for j in jobs[:2]})", "placements",
                                   "are both pinned to GPU (0, 0)"),
    "a pin that is a string": ("Decisions({jobs[0]: Grid(Shape(t, 1, 1))}, placements={jobs[0]: 'x'})",
                               "placements", "not a tuple of (node, gpu) integer pairs"),
    "a pin of a job that waits": ("Decisions({}, placements={jobs[0]: ((0, 0),)})", "placements",
                                  "which it gives no grid"),
    "a plan that is a string": ("Decisions({jobs[0]: Grid(Shape(t, 1, 1))}, plans={jobs[0]: 'x'})", "plans",
                                "not instances.plan.Plan or BatchPlan"),
    "a plan of other GPUs": ("Decisions({jobs[0]: Grid(Shape(t, 1, 1))}, plans={jobs[0]: Plan(1, 2, 1, (4,))})",
                             "plans", "does not fit its grid"),
    "stats a string": ("Decisions({}, stats='fast')", "stats", "not engine.core.context.DecisionStats"),
    "fallbacks without smaller": ("Decisions({}, fallbacks=3)", "fallbacks", "which has no smaller(job_id, grid)"),
    "it raises": ("1 / 0", "decide", "failed to decide: ZeroDivisionError: division by zero"),
    "an unknown GPU type": ("Decisions({jobs[0]: Grid(Shape('zzz', 1, 1))})", "gpu_type",
                            "failed to decide: unknown GPU type 'zzz'"),
    "a Shape it cannot build": ("Decisions({jobs[0]: Grid(Shape(t, 1, -2))})", "decide",
                                "ValueError: shape needs at least one node"),
}


def _bad_plugin(tmp_path: Path, body: str) -> Path:
    return write(tmp_path, "bad_decisions.py", DECIDES.replace("{body}", body))


@pytest.mark.parametrize("case", sorted(BAD_DECISIONS))
def test_a_plugins_bad_decision_is_named_by_file_policy_and_field(registries, tmp_path, case):
    """E1, E4, E5: whatever a plug-in's policy returns or raises, a PolicyError naming its
    file, the policy and the field, before the round carries anything out."""
    from engine.core.decision_check import PolicyError
    from engine.core.policy import make_policy
    from engine.sim.simulator import simulate
    from instances.builtin import get_instance
    body, field, words = BAD_DECISIONS[case]
    path = _bad_plugin(tmp_path, body)
    load_plugin(str(path), registries=registries)
    with pytest.raises(PolicyError) as e:
        simulate(get_instance("demo"), make_policy("bad"), rounds=3)
    assert e.value.file == str(path.resolve()) and e.value.field == field, str(e.value)
    assert "policy 'bad', round " in str(e.value) and words in str(e.value), str(e.value)
    if field in ("decide", "gpu_type"):                     # the line of the plug-in's own code that raised
        assert e.value.line == path.read_text().splitlines().index(f"        return {body}") + 1


@pytest.mark.parametrize("command", ["simulate", "bench"])
def test_a_plugins_bad_decision_is_one_line_in_simulate_and_bench(registries, tmp_path, capsys, command):
    path = _bad_plugin(tmp_path, BAD_DECISIONS["pin on node 999"][0])
    argv = (["simulate", "--no-plots"] if command == "simulate" else ["bench", "policies", "--no-run-out"])
    assert main(argv + ["--plugin", str(path), "--instance", "demo", "--policy", "bad", "--rounds", "2",
                        "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"arena: error: {path.resolve()}, field 'placements': policy 'bad', round 0: the pin")
    assert not any("Traceback" in line for line in err)


def test_a_term_with_nan_coefficients_names_its_plugin(registries, tmp_path, capsys):
    """E2: a plug-in term's NaN objective coefficients, or NaN rows, name the plug-in and
    the term, not a traceback (nor a silent greedy decision every round)."""
    path = write(tmp_path, "nan_terms.py", """
        import dataclasses
        from dataclasses import dataclass
        import numpy as np
        from engine.decide.objectives.base import register_term
        from engine.decide.policies.arena import ARENA
        from engine.decide.policies.milp import register_milp_policy
        @register_term("nanterm")
        @dataclass(frozen=True)
        class NanTerm:
            def apply(self, data, builder, weight):
                builder.add_x_objective(np.full(data.n_cols, np.nan))
        @register_term("nanrows")
        @dataclass(frozen=True)
        class NanRows:
            def apply(self, data, builder, weight):
                builder.add_rows(np.zeros(data.n_cols, dtype=np.int64), np.arange(data.n_cols),
                                 np.full(data.n_cols, np.nan), 0.0, 1.0, ["nan"])
        register_milp_policy(dataclasses.replace(ARENA, name="arena-nan", weights={**ARENA.weights, "nanterm": 1.0}))
        register_milp_policy(dataclasses.replace(ARENA, name="arena-nanrows", weights={**ARENA.weights,
                                                                                      "nanrows": 1.0}))
    """)
    line = [i for i, s in enumerate(path.read_text().splitlines(), 1) if "add_x_objective(np.full" in s][0]
    for policy, words in (("arena-nan", rf", line {line}, field 'decide': policy 'arena-nan', round 0: failed to "
                                        r"decide: ValueError: objective coefficients must be finite"),
                          ("arena-nanrows", r", field 'objective': policy 'arena-nanrows', round 0: failed to decide: "
                                            r"the round's model holds a NaN or infinite coefficient or bound, added "
                                            r"by objective term\(s\) nanrows \(plug-in .*nan_terms\.py\)")):
        assert main(["simulate", "--plugin", str(path), "--instance", "demo", "--policy", policy, "--rounds", "2",
                     "--quiet", "--no-plots", "--out", str(tmp_path / policy)]) == 2
        err = capsys.readouterr().err
        assert re.search(re.escape(f"arena: error: {path.resolve()}") + words, err), err


def test_a_symlink_loop_as_plugin_is_named(registries, tmp_path, capsys):
    """E3: was a RuntimeError traceback (Path.resolve on the loop)."""
    import os
    os.symlink("b.py", tmp_path / "a.py")
    os.symlink("a.py", tmp_path / "b.py")
    with pytest.raises(InputError, match=r"a\.py \(--plugin\) cannot be read: Too many levels of symbolic links"):
        load_plugin(str(tmp_path / "a.py"), registries=registries)
    assert main(["instances", "--plugin", str(tmp_path / "a.py")]) == 2
    assert "Traceback" not in capsys.readouterr().err


FUZZED = """
    from engine.core.policy import Policy, register_policy
    RETURN = None                                    # set by the test: ctx -> what decide returns
    @register_policy("fuzzed")
    class Fuzzed(Policy):
        name = "fuzzed"
        def decide(self, ctx):
            return RETURN(ctx)
"""


@st.composite
def any_decision(draw):
    """A function of the round's context: what a plug-in's decide returns (or raises)."""
    from engine.core.context import Decisions, DecisionStats
    from instances.grid import Grid, Shape
    from instances.plan import BatchPlan, Plan
    ids = st.sampled_from(["A", "B", "C", "nope", 3, None])
    num = st.sampled_from([-1, 0, 1, 2, 3, 4, 2.5, "2", None, 10**20])

    def raw_grid(t, n, m, pp):
        s, g = object.__new__(Shape), object.__new__(Grid)
        for k, v in (("gpu_type", t), ("num_nodes", n), ("gpus_per_node", m)):
            object.__setattr__(s, k, v)
        object.__setattr__(g, "shape", s)
        object.__setattr__(g, "pp", pp)
        return g
    grid = st.one_of(st.builds(raw_grid, st.sampled_from(["a100-40gb", "a40", "v100-32gb", "zzz", 7]), num, num, num),
                     st.sampled_from([None, "a100", 3, (1, 2)]))
    pin = st.one_of(st.lists(st.tuples(st.integers(-1, 4), st.integers(-1, 4)), max_size=5).map(tuple),
                    st.sampled_from(["x", None, ((0, 0.5),), [(0, 0)], (("0", 0),)]))
    plan = st.sampled_from([None, "x", BatchPlan(), Plan(1, 1, 1, (4,)), Plan(2, 1, 1, (2, 2)), 3])
    value = st.one_of(
        st.sampled_from([None, "grids", {"grids": {}}, 42, Decisions({}), [Decisions({})]]),
        st.builds(Decisions, st.dictionaries(ids, grid, max_size=3),
                  st.one_of(st.dictionaries(ids, pin, max_size=3), st.sampled_from([None, "x"])),
                  st.one_of(st.dictionaries(ids, plan, max_size=2), st.just(None)),
                  st.sampled_from([DecisionStats(), None, "fast"]),
                  st.sampled_from([None, 3, "x"])))
    good = st.sampled_from([Grid(Shape("a100-40gb", 1, 1)), Grid(Shape("a100-40gb", 1, 2)),
                            Grid(Shape("a100-40gb", 2, 2), 2), Grid(Shape("a40", 1, 2)), Grid(Shape("a40", 1, 1))])
    near = st.builds(Decisions, st.dictionaries(st.sampled_from(["A", "B", "C"]), good, max_size=3),
                     st.dictionaries(st.sampled_from(["A", "B", "C"]),
                                     st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1, max_size=4,
                                              unique=True).map(tuple), max_size=2),
                     st.dictionaries(st.sampled_from(["A", "B"]), st.sampled_from([BatchPlan(), Plan(1, 1, 1, (4,))]),
                                     max_size=1))
    how = draw(st.sampled_from(["return", "return", "return", "raise", "bad type"]))
    if how == "return" and draw(st.booleans()):
        v = draw(near)                  # well-formed or nearly: its pins may clash, its plans not fit
        return lambda ctx: v
    if how == "raise":
        return lambda ctx: 1 / 0
    if how == "bad type":
        return lambda ctx: Decisions({v.job_id: Grid(Shape("zzz", 1, 1)) for v in ctx.jobs})
    v = draw(value)
    return lambda ctx: v


@settings(max_examples=150, deadline=timedelta(seconds=5), derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(decision=any_decision())
def test_any_value_a_plugin_returns_is_a_decision_or_an_error_naming_it(registries, tmp_path_factory, decision):
    """The property (issue 58): whatever a plug-in's policy returns or raises, the
    simulation runs on (a well-formed decision) or stops with a PolicyError naming the
    plug-in's file and the policy; never another exception."""
    from engine.core.decision_check import PolicyError
    from engine.core.policy import make_policy
    from engine.sim.simulator import simulate
    from tests.test_engine_helpers import Inst, LinearOracle, cluster, job
    if "fuzzed" not in policy_names():
        d = tmp_path_factory.mktemp("fuzzed")
        load_plugin(str(write(d, "fuzzed_policy.py", FUZZED)), registries=registries)
    policy = make_policy("fuzzed")
    module = sys.modules[type(policy).__module__]
    module.RETURN = decision
    inst = Inst("fuzz", cluster(("a100", 2, 2), ("a40", 1, 2)),
                (job("A", 0.0, 50), job("B", 0.0, 50), job("C", 400.0, 50)), LinearOracle(20.0))
    try:
        simulate(inst, policy, rounds=3)
    except PolicyError as e:
        assert e.file == module.__file__ and "policy 'fuzzed', round " in str(e), str(e)
