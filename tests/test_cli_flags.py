"""A config's error names the flag that set the value (engine/cli/flags.py): each
command's table of config fields -> flags is walked against the config's fields (a new
field needs a flag or a word that no flag sets it) and the command's parser (every flag
named exists), and a bad value of every flag of `arena train` and `arena serve` is
refused naming that flag, as the user types it."""
from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from engine.cli.commands.service import SERVE_FLAGS, SERVE_NOT_FLAGS, SLURM_FLAGS
from engine.cli.commands.train import TRAIN_FLAGS, TRAIN_NOT_FLAGS
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
             ("--drain-after-failures", "-1"), ("--failure-window", "0")]


@pytest.mark.parametrize("flag, value", SERVE_BAD, ids=[f"{f} {v}" for f, v in SERVE_BAD])
def test_a_bad_serve_flag_is_named_as_typed(flag, value, tmp_path, capsys):
    argv = ["serve", "--local-slots", "2", "--db", str(tmp_path / "s.db"), "--work-dir", str(tmp_path / "w"),
            flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"field '{flag}'" in err and "Traceback" not in err, err
    assert not (tmp_path / "w").exists() and not (tmp_path / "s.db").exists()      # refused before anything
