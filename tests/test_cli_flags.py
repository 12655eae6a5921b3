"""A config's error names the flag that set the value (engine/cli/flags.py): each
command's table of config fields -> flags is walked against the config's fields (a new
field needs a flag or a word that no flag sets it) and the command's parser (every flag
named exists), and a bad value of every flag of `arena train`, `arena serve` and `arena
bench`'s options is refused naming that flag, as the user types it; the flags of `arena
serve` and `arena bench` are made from their config's fields."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field

import pytest

from engine.cli.commands.service import SERVE_FLAGS, SERVE_NOT_FLAGS, SLURM_FLAGS
from engine.cli.commands.train import TRAIN_FLAGS, TRAIN_NOT_FLAGS
from engine.cli.flags import add_config_flags, config_flags, config_not_flags, config_values
from engine.cli.main import build_parser, main
from engine.service.config import ServiceConfig
from launcher.config import OptimizerConfig, ParallelPlan, TrainConfig


def options_of(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


@pytest.mark.parametrize("command, configs, table, not_flags", [
    ("train", (TrainConfig, ParallelPlan, OptimizerConfig), TRAIN_FLAGS, TRAIN_NOT_FLAGS),
    ("serve", (ServiceConfig,), SERVE_FLAGS, SERVE_NOT_FLAGS),
])
def test_every_config_field_has_its_flag_or_is_set_by_no_flag(command, configs, table, not_flags):
    names = {f.name for cls in configs for f in fields(cls)}
    assert names - set(table) - not_flags == set(), "a config field with no flag named in the table"
    assert not (set(table) & not_flags)
    assert not_flags <= names, "a field said to be set by no flag is not a field"
    assert set(table.values()) <= options_of(command), "a flag of the table that the command does not have"


def test_every_flag_a_table_names_is_a_flag_of_its_command():
    from engine.cli.commands.estimate import ESTIMATE_FLAGS
    from engine.cli.commands.profile import PROFILE_FLAGS
    for command, table in (("train", TRAIN_FLAGS), ("serve", SERVE_FLAGS), ("serve", SLURM_FLAGS),
                           ("estimate", ESTIMATE_FLAGS),
                           ("profile", PROFILE_FLAGS)):
        assert set(table.values()) <= options_of(command), command


TRAIN = ["train", "--model", "tiny-gpt__2L", "--plan", "dp=1,tp=1,pp=1", "--steps", "2", "--dry-run"]
TRAIN_BAD = [   # (flag, bad value): each refused naming the flag
    ("--model", "nosuch"), ("--plan", "dp=x"), ("--plan", "dp=1,tp=3"), ("--microbatches", "0"),
    ("--stage-layers", "5,5"), ("--steps", "0"), ("--global-batch", "0"), ("--lr", "-1"),
    ("--checkpoint-every", "-1"), ("--checkpoint-interval", "-1"), ("--stall-timeout", "0"),
    ("--step-delay", "-1"), ("--step-delay", "nan"), ("--num-nodes", "3"), ("--memory-device", "nosuch"),
    ("--data", "{tmp}/none.txt"), ("--telemetry", "{tmp}/afile/x.jsonl"), ("--telemetry-store", "{tmp}/afile/x"),
    ("--run-dir", "{tmp}/afile/x"), ("--checkpoint-dir", "{tmp}/afile"),
]


@pytest.mark.parametrize("flag, value", TRAIN_BAD, ids=[f"{f} {v}" for f, v in TRAIN_BAD])
def test_a_bad_train_flag_is_named_as_typed(flag, value, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    argv = TRAIN + [flag, value.replace("{tmp}", str(tmp_path))]
    if flag in argv[:-2]:
        i = argv.index(flag)
        argv[i + 1] = argv.pop()
        argv.pop()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and "Traceback" not in err, err


SERVE_BAD = [("--round-interval", "0"), ("--checkpoint-interval", "-1"), ("--stop-timeout", "0"),
             ("--max-failures", "0"), ("--failure-backoff", "-1"), ("--stop-after", "0"), ("--step-delay", "-1"),
             ("--keep-rounds", "-1"), ("--keep-measurements", "-1"), ("--stall-after", "0"),
             ("--launch-stall-after", "-1"), ("--drain-after-failures", "-1"), ("--failure-window", "0"),
             ("--host-check-interval", "-1"), ("--host-down-after", "nan"), ("--host-check-port", "0"),
             ("--host-check-port", "70000")]


@pytest.mark.parametrize("flag, value", SERVE_BAD, ids=[f"{f} {v}" for f, v in SERVE_BAD])
def test_a_bad_serve_flag_is_named_as_typed(flag, value, tmp_path, capsys):
    argv = ["serve", "--local-slots", "2", "--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w"),
            flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and "Traceback" not in err, err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()      # refused before anything


# ------------------------------------------------------- flags made from a config's fields
@dataclass(frozen=True)
class _Knobs:
    path: str = dataclass_field(metadata={"flag": "--path", "default": "p.db", "metavar": "PATH",
                                          "help": "where (default %(default)s)"})
    every: int = dataclass_field(default=3, metadata={"flag": "--every", "metavar": "N", "help": "how often"})
    after: float | None = dataclass_field(default=None, metadata={"flag": "--after", "metavar": "S", "help": "x"})
    how: str = dataclass_field(default="d2d", metadata={"flag": "--how", "choices": ("d2d", "storage"), "help": "y"})
    roots: tuple[str, ...] | None = dataclass_field(default=None, metadata={"flag": "--root", "action": "append",
                                                                           "metavar": "DIR", "help": "z"})
    loud: bool = dataclass_field(default=False, metadata={"flag": "--loud", "help": "a switch"})
    hidden: int = 7                                 # no flag


def test_add_config_flags_makes_one_argument_per_flag_field():
    p = argparse.ArgumentParser()
    add_config_flags(p, _Knobs)
    assert [a.option_strings[0] for a in p._actions[1:]] == ["--path", "--every", "--after", "--how", "--root",
                                                             "--loud"]     # field order
    a = p.parse_args([])
    assert config_values(a, _Knobs) == {"path": "p.db", "every": 3, "after": None, "how": "d2d",
                                        "loud": False}          # (--root not given: the field's default)
    a = p.parse_args(["--every", "5", "--after", "1.5", "--how", "storage", "--root", "a", "--root", "b", "--loud"])
    k = _Knobs(**config_values(a, _Knobs))
    assert (k.every, k.after, k.how, k.roots, k.loud, k.hidden) == (5, 1.5, "storage", ["a", "b"], True, 7)
    assert type(k.every) is int and type(k.after) is float
    assert "where (default p.db)" in " ".join(p.format_help().split())
    with pytest.raises(SystemExit):
        p.parse_args(["--how", "tape"])                 # choices kept
    with pytest.raises(SystemExit):
        p.parse_args(["--every", "x"])                  # type from the annotation
    assert config_flags(_Knobs) == {"path": "--path", "every": "--every", "after": "--after", "how": "--how",
                                    "roots": "--root", "loud": "--loud"}
    assert config_not_flags(_Knobs) == {"hidden"}
    q = argparse.ArgumentParser()
    add_config_flags(q, _Knobs, only=("after", "every"))
    add_config_flags(q, _Knobs, skip=("after", "every", "loud"))
    assert [a.option_strings[0] for a in q._actions[1:]] == ["--every", "--after", "--path", "--how", "--root"]
    with pytest.raises(KeyError, match="hidden"):
        add_config_flags(argparse.ArgumentParser(), _Knobs, only=("hidden",))


def _odd_int(text: str) -> int:
    v = int(text)
    if v % 2 == 0:
        raise argparse.ArgumentTypeError(f"must be odd, got {v}")
    return v


@dataclass(frozen=True)
class _MoreKnobs:
    odd: int = dataclass_field(default=1, metadata={"flag": "--odd", "type": _odd_int, "help": "an odd number"})
    names: tuple[str, ...] = dataclass_field(default=("a", "b"), metadata={
        "flag": "--name", "action": "append", "help": lambda: "made when the parser is built"})
    time_limit_s: float = dataclass_field(default=1.0, metadata={"flag": "--time-limit", "help": "s"})


def test_a_flag_field_may_name_its_parser_a_help_made_late_and_keeps_a_repeatable_default(capsys):
    p = argparse.ArgumentParser()
    add_config_flags(p, _MoreKnobs)
    assert _MoreKnobs(**config_values(p.parse_args([]), _MoreKnobs)).names == ("a", "b")   # not [] nor None
    a = p.parse_args(["--name", "x", "--odd", "3"])
    assert config_values(a, _MoreKnobs) == {"odd": 3, "names": ["x"], "time_limit_s": 1.0}  # not a, b, x
    text = " ".join(p.format_help().split())
    assert "made when the parser is built" in text
    assert "--time-limit TIME_LIMIT " in text and "TIME_LIMIT_S" not in text      # the flag's placeholder
    with pytest.raises(SystemExit):
        p.parse_args(["--odd", "2"])
    assert "argument --odd: must be odd, got 2" in capsys.readouterr().err


def test_a_flag_field_needs_a_default_and_known_metadata():
    @dataclass
    class NoDefault:
        x: int = dataclass_field(metadata={"flag": "--x"})

    @dataclass
    class Typo:
        x: int = dataclass_field(default=1, metadata={"flag": "--x", "metvar": "N"})

    @dataclass
    class Required:
        x: int = dataclass_field(metadata={"flag": "--x", "required": True})

    @dataclass
    class RequiredWithDefault:
        x: int = dataclass_field(default=1, metadata={"flag": "--x", "required": True})

    with pytest.raises(TypeError, match="NoDefault.x"):
        add_config_flags(argparse.ArgumentParser(), NoDefault)
    with pytest.raises(TypeError, match="RequiredWithDefault.x"):
        add_config_flags(argparse.ArgumentParser(), RequiredWithDefault)
    p = argparse.ArgumentParser()
    add_config_flags(p, Required)
    assert Required(**config_values(p.parse_args(["--x", "4"]), Required)).x == 4
    with pytest.raises(SystemExit):
        p.parse_args([])                                # the required flag missing: argparse's error
    with pytest.raises(KeyError, match="metvar"):
        add_config_flags(argparse.ArgumentParser(), Typo)


def test_every_serve_flag_of_service_config_is_made_from_its_field():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {s: a for a in sub.choices["serve"]._actions for s in a.option_strings}
    by_name = {f.name: f for f in fields(ServiceConfig)}
    assert len(SERVE_FLAGS) >= 16
    for name, flag in SERVE_FLAGS.items():
        f, a = by_name[name], actions[flag]
        assert a.dest == name and a.help == f.metadata["help"], name
        assert a.default == f.metadata.get("default", f.default), name


# ------------------------------------------------------- arena bench and arena simulate: flags made from options
def _parser_of(*path: str) -> argparse.ArgumentParser:
    p = build_parser()
    for name in path:
        p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return p


def _options_classes():
    from engine.cli.commands.bench.bound import BOUND_BENCH_FLAGS, BoundBench
    from engine.cli.commands.bench.incremental import INCREMENTAL_BENCH_FLAGS, IncrementalBench
    from engine.cli.commands.bench.policies import POLICY_BENCH_FLAGS, PolicyBench
    from engine.cli.commands.bench.solver import SOLVER_BENCH_FLAGS, SolverBench
    from engine.cli.commands.simulate import SIMULATE_FLAGS, SimulateOptions
    from engine.cli.commands.train import TrainOptions
    return ((("bench", "solver"), SolverBench, SOLVER_BENCH_FLAGS),
            (("bench", "incremental"), IncrementalBench, INCREMENTAL_BENCH_FLAGS),
            (("bench", "policies"), PolicyBench, POLICY_BENCH_FLAGS),
            (("bench", "bound"), BoundBench, BOUND_BENCH_FLAGS),
            (("simulate",), SimulateOptions, SIMULATE_FLAGS),
            (("train",), TrainOptions, config_flags(TrainOptions)))


def test_every_flag_of_a_commands_options_is_made_from_its_field():
    for path, cls, table in _options_classes():
        assert table == config_flags(cls)
        parser = _parser_of(*path)
        actions = {s: a for a in parser._actions for s in a.option_strings}
        for f in fields(cls):
            if "flag" not in f.metadata:
                assert not f.init, f"{cls.__name__}.{f.name}: a knob with no flag"     # (parsed forms only)
                continue
            a = actions[f.metadata["flag"]]
            text = f.metadata["help"]
            assert a.dest == f.name and a.help == (text() if callable(text) else text), (path, f.name)
            assert a.required == bool(f.metadata.get("required")), (path, f.name)
            if f.metadata.get("action") != "append" and not a.required:
                assert a.default == f.default, (path, f.name)
        if not any(a.required for a in parser._actions):
            built = cls(**config_values(parser.parse_args([]), cls))     # the defaults are valid
            assert built == cls(), path


BENCH_BAD = [   # (arguments, what the error says): each refused by its flag as typed, before any work
    (["solver", "--gpus", "4"], "field '--gpus': must be in 8..1,048,576, got 4"),
    (["solver", "--jobs", "0"], "field '--jobs': must be in 1..100,000, got 0"),
    (["solver", "--backend", "nosuch"], "field '--backend': unknown solver backend 'nosuch'"),
    (["solver", "--repeat", "0"], "field '--repeat': must be in 1..1,000, got 0"),
    (["solver", "--repeat", "99999999999999999999"], "field '--repeat': must be in 1..1,000, got 1e+20"),  # hung
    (["solver", "--seed", "99999999999999999999"], "field '--seed': must be at most 2,147,483,647 (the solvers"),
    (["solver", "--time-limit", "0"], "field '--time-limit': must be a finite number of seconds > 0, got 0.0"),
    (["solver", "--rel-gap", "1"], "field '--rel-gap': must be in [0, 1), got 1.0"),
    (["solver", "--threads", "0"], "field '--threads': must be >= 1, got 0"),
    (["solver", "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["solver", "--objective", "nosuch=1"], "field '--objective': unknown objective term 'nosuch'"),
    (["incremental", "--rounds", "0"], "field '--rounds': must be in 1..1,000, got 0"),
    (["incremental", "--backend", "nosuch"], "field '--backend': unknown solver backend 'nosuch'"),
    (["incremental", "--objective", "jct=x"], "field '--objective': expected term=weight, got 'jct=x'"),
    (["incremental", "--move-cost-per-gpu", "nan"], "field '--move-cost-per-gpu': must be a finite number of"),
    (["incremental", "--move-cost-cap", "-1"], "field '--move-cost-cap': must be >= 0, got -1.0"),
    # issue 58 D5: 1e308 was taken, a move priced past any schedule's length (the bound on times)
    (["incremental", "--move-cost-per-gpu", "1e308"], "field '--move-cost-per-gpu': must be <= 9e12 s (about"),
    (["incremental", "--move-cost-cap", "1e308"], "field '--move-cost-cap': must be <= 9e12 s (about 285,000"),
    # issue 58 D3: named the objective's internal w_jct; now the flag and the part as typed
    (["solver", "--objective", "throughput=1,jct=1e5"], "field '--objective': jct=1e5: a term's weight must be a "
                                                        "finite number in [0, 10000] (larger values overflow"),
    (["incremental", "--objective", "jct=-1"], "field '--objective': jct=-1: a term's weight must be a finite"),
    (["incremental", "--queued", "x"], "field '--queued': must be one of all, small, got 'x'"),
    (["incremental", "--other-type", "x"], "field '--other-type': must be one of same, any, got 'x'"),
    (["incremental", "--move-budget-jobs", "2"], "field '--move-budget-jobs': must be a fraction in [0, 1]"),
    (["incremental", "--move-budget-gpus", "-1"], "field '--move-budget-gpus': must be a fraction in [0, 1]"),
    (["incremental", "--follow", "x"], "argument --follow: invalid choice: 'x'"),
    (["policies", "--reconfig-opt", "nokv"], "field '--reconfig-opt': expected KEY=VALUE, got 'nokv'"),
    (["policies", "--policy", "a b=fcfs"], "field '--policy': expected NAME or LABEL=NAME"),
    (["policies", "--policy", "fcfs", "--policy-opt", "gavel:x=1"], "field '--policy-opt': --policy-opt for 'gavel'"),
    (["policies", "--rounds", "0"], "field '--rounds': must be >= 1, got 0"),
    (["policies", "--perf", "nosuch"], "field '--perf': unknown performance model kind 'nosuch'"),
    (["policies", "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["policies", "--seeds", "x"], "field '--seeds': expected seeds like 0-4 or 0,1,7, got 'x'"),
    (["policies", "--baseline", "fcfs"], "field '--baseline': --baseline needs --seeds"),
    (["policies", "--out", "{tmp}/afile"], "field '--out': exists and is not a directory"),
    (["bound", "--max-gpus", "0"], "field '--max-gpus': must be in 1..1,048,576 (the GPUs a cluster may have), got 0"),
    (["bound", "--plot", "{tmp}"], "field '--plot': is a directory, not a file"),
]


@pytest.mark.parametrize("argv, says", BENCH_BAD, ids=[" ".join(a[:3]) for a, _ in BENCH_BAD])
def test_a_bad_bench_flag_is_named_as_typed(argv, says, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "policies":
        argv += ["--policy", "fcfs"] if "--policy" not in argv else []
    try:
        rc = main(["bench", *argv])
    except SystemExit as e:             # argparse's own refusal
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err, err
    assert not any(line.startswith(("bench ", "bounds of")) for line in err.splitlines())   # before any work
