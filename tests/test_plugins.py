"""Plug-ins from outside the package (instances/plugins.py, ``arena --plugin``): a file,
a module, the environment and installed entry points; every way one can fail names it;
the example plug-in (examples/plugins/energy.py) decides a simulation end to end."""
from __future__ import annotations

import csv
import json
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

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
    """)
    for policy, match in (("buggy", r"field '--policy': policy 'buggy' \(defined in .*odd\.py\) could not be built: "
                                    r"TypeError: object of type 'int' has no len\(\) \(.*odd\.py, line 5\)"),
                          ("no-decide", r"field '--policy': policy 'no-decide' \(defined in .*odd\.py\) built a "
                                        r"NoDecide object, which has no decide\(ctx\) method")):
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
