"""A config's error names the flag that set the value (engine/cli/flags.py): each
command's table of config fields -> flags is walked against the config's fields (a new
field needs a flag or a word that no flag sets it) and the command's parser (every flag
named exists), and a bad value of every flag of `arena train` and `arena serve` is
refused naming that flag, as the user types it."""
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
             ("--launch-stall-after", "-1"), ("--drain-after-failures", "-1"), ("--failure-window", "0")]


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
    assert config_values(a, _Knobs) == {"path": "p.db", "every": 3, "after": None, "how": "d2d", "roots": None,
                                        "loud": False}
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


def test_a_flag_field_needs_a_default_and_known_metadata():
    @dataclass
    class NoDefault:
        x: int = dataclass_field(metadata={"flag": "--x"})

    @dataclass
    class Typo:
        x: int = dataclass_field(default=1, metadata={"flag": "--x", "metvar": "N"})

    with pytest.raises(TypeError, match="NoDefault.x"):
        add_config_flags(argparse.ArgumentParser(), NoDefault)
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
