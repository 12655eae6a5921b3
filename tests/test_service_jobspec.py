"""Job specifications of the service: TOML and dict input, every refusal naming the field,
the cluster check, conversion to the engine's Job, and a fuzz of the parser."""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.service.jobspec import JobSpec
from instances.cluster import ClusterSpec, NodeGroup
from instances.errors import InputError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
CLUSTER = ClusterSpec((NodeGroup("a100", 2, 4), NodeGroup("v100", 1, 2)), "small")
GOOD = {"name": "j1", "model": "tiny-gpt__2L", "global_batch": 8, "steps": 20}


def test_toml_file_with_every_key_and_relative_paths(tmp_path):
    (tmp_path / "models").mkdir()
    cfg = tmp_path / "models" / "mine.json"
    cfg.write_text((EXAMPLES / "tiny-llama-config.json").read_text())
    (tmp_path / "corpus.txt").write_text("hello world " * 100)
    job = tmp_path / "job.toml"
    job.write_text('name = "ft-1"\nmodel = "models/mine.json"\nglobal_batch = 8\nsteps = 50\n'
                   'gpu_type = "A100"\ngpus = 4\npriority = 2\ntenant = "team-a"\ndeadline_s = 600\n'
                   'seed = 7\ndata = "corpus.txt"\nafter = [3, 1]\n')
    spec = JobSpec.from_toml(job, cluster=CLUSTER)
    assert spec.model == str(cfg) and spec.data == str(tmp_path / "corpus.txt")
    assert (spec.gpu_type, spec.gpus, spec.priority, spec.tenant, spec.seed) == ("a100-40gb", 4, 2.0, "team-a", 7)
    assert spec.after == (3, 1) and spec.to_dict()["after"] == [3, 1]
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec      # stored form round-trips
    j = spec.to_job("42", arrival_s=100.0)
    assert (j.job_id, j.model, j.global_batch, j.num_iterations, j.deadline_s) == ("42", str(cfg), 8, 50, 700.0)
    assert (j.requested_gpu_type, j.requested_gpus, j.priority, j.tenant) == ("a100-40gb", 4, 2.0, "team-a")
    assert j.arch.num_layers == 3


def test_defaults_and_catalog_aliases():
    spec = JobSpec.from_dict(GOOD | {"model": "bert__1.3B"})
    assert spec.model == "gpt__1.3B" and spec.gpus is None and spec.tenant == "default" and spec.priority == 1.0
    assert spec.to_job("a", 0.0).deadline_s is None


def bad(d, field, *, cluster=None, match=None, roots=None):
    with pytest.raises(InputError, match=match) as e:
        JobSpec.from_dict(d, cluster=cluster, roots=roots)
    assert e.value.field == field and e.value.file == "request", str(e.value)
    return e.value


def test_refusals_name_the_field(tmp_path):
    bad(GOOD | {"steps": -5}, "steps")
    bad(GOOD | {"steps": 0}, "steps")
    bad(GOOD | {"steps": 2.5}, "steps")
    bad(GOOD | {"global_batch": True}, "global_batch")
    bad(GOOD | {"global_batch": 2**20 + 1}, "global_batch", match=r"must be in \[1, 1048576\]")   # MAX_GLOBAL_BATCH
    bad(GOOD | {"model": "gpt__99T"}, "model", match="unknown model")
    bad(GOOD | {"gpus": 9}, "gpus", cluster=CLUSTER, match="has 8 a100")
    bad(GOOD | {"gpus": 9, "gpu_type": "a100"}, "gpus", cluster=CLUSTER, match="has 8 a100")
    bad(GOOD | {"gpu_type": "a40"}, "gpu_type", cluster=CLUSTER, match="no a40")
    bad(GOOD | {"gpu_type": "tpu"}, "gpu_type", match="unknown GPU type")
    bad(GOOD | {"priority": 0}, "priority")
    bad(GOOD | {"priority": float("nan")}, "priority")
    bad(GOOD | {"priority": 10**400}, "priority")
    bad(GOOD | {"deadline_s": -1}, "deadline_s")
    bad(GOOD | {"seed": -1}, "seed")
    bad(GOOD | {"name": "../etc"}, "name")
    bad(GOOD | {"tenant": ""}, "tenant")
    bad(GOOD | {"name": "train\n"}, "name")               # ("$" matched before a final newline)
    bad(GOOD | {"tenant": "team-a\n"}, "tenant")          # (a second tenant "team-a")
    bad(GOOD | {"colour": "red"}, "colour", match="unknown key")
    bad({k: v for k, v in GOOD.items() if k != "steps"}, "steps", match="missing")
    bad(GOOD | {"data": str(tmp_path / "absent.txt")}, "data", match="file not found")
    for after in (3, [0], [True], ["1"], [1.0], [1, 1], list(range(1, 66)), "1,2"):
        bad(GOOD | {"after": after}, "after")
    assert "after" not in JobSpec.from_dict(GOOD | {"after": []}).to_dict()     # none: the stored form is as before
    (tmp_path / "c.txt").write_text("x")
    bad(GOOD | {"model": "tiny-wide_resnet__50", "data": str(tmp_path / "c.txt")}, "data", match="synthetic")


def test_a_config_json_with_inconsistent_heads_is_refused_naming_both(tmp_path):
    cfg = json.loads((EXAMPLES / "tiny-llama-config.json").read_text()) | {"num_key_value_heads": 4}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    e = bad(GOOD | {"model": str(tmp_path / "c.json")}, "model")
    assert "num_key_value_heads" in str(e) and "c.json" in str(e)


def test_toml_errors_name_the_file_and_line(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text('name = "x"\nsteps = = 3\n')
    with pytest.raises(InputError, match="malformed TOML") as e:
        JobSpec.from_toml(p)
    assert e.value.file == str(p) and e.value.line == 2
    p.write_text('name = "x"\nmodel = "tiny-gpt__2L"\nglobal_batch = 8\nsteps = -1\n')
    with pytest.raises(InputError) as e:
        JobSpec.from_toml(p)
    assert e.value.file == str(p) and e.value.field == "steps"
    p.write_text('name = "x"\nmodel = "tiny-gpt__2L"\nglobal_batch = 8\nsteps = 3\nsteps = 30\n')   # (TOML refuses it)
    with pytest.raises(InputError, match="malformed TOML: Cannot overwrite a value") as e:
        JobSpec.from_toml(p)
    assert e.value.line == 5
    for path, words in ((tmp_path, "folder"), (tmp_path / "none.toml", "not found")):
        with pytest.raises(InputError, match=words):
            JobSpec.from_toml(path)
    with pytest.raises(InputError, match="UTF-8"):
        JobSpec.from_toml_text(b"\xff\xfe name")
    with pytest.raises(InputError, match="larger"):
        JobSpec.from_toml_text("#" * 70000)


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 40), st.integers(), st.floats(allow_nan=True),
                   st.text(max_size=6), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
                   st.sampled_from(["tiny-gpt__2L", "a100", "v100", "gpt__1.3B", "x.json"]),
                   st.lists(st.integers(), max_size=2))
KEYS = st.sampled_from(["name", "model", "global_batch", "steps", "gpu_type", "gpus", "priority", "tenant",
                        "deadline_s", "seed", "data", "after", "other"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=5))
def test_fuzz_dict_gives_a_valid_spec_or_an_input_error(changes):
    try:
        spec = JobSpec.from_dict(GOOD | changes, cluster=CLUSTER)
    except InputError as e:
        assert e.file == "request" and e.field
        return
    assert spec.global_batch >= 1 and spec.steps >= 1 and spec.priority > 0
    assert spec.gpus is None or spec.gpus <= CLUSTER.num_gpus
    assert JobSpec.from_dict(spec.to_dict()) == spec
    spec.to_job("j", 0.0)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=120))
def test_fuzz_toml_text_gives_a_spec_or_an_input_error(text):
    try:
        JobSpec.from_toml_text('name = "j"\nmodel = "tiny-gpt__2L"\n' + text)
    except InputError:
        pass


def test_steps_above_the_jobs_limit_are_refused_at_submission():
    # found by the fuzz test above: a spec the service accepted, then could not make a job of
    from instances.jobs import MAX_ITERATIONS
    with pytest.raises(InputError, match="steps") as e:
        JobSpec.from_dict(GOOD | {"steps": MAX_ITERATIONS + 1}, cluster=CLUSTER)
    assert e.value.field == "steps"
    JobSpec.from_dict(GOOD | {"steps": MAX_ITERATIONS}, cluster=CLUSTER).to_job("j", 0.0)


def test_data_and_config_files_outside_the_roots_are_refused_naming_the_roots(tmp_path):
    root, home = tmp_path / "work", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    (root / "corpus.txt").write_bytes(b"a" * 1000)
    (home / "corpus.txt").write_bytes(b"a" * 1000)
    (home / "mine.json").write_text((EXAMPLES / "tiny-llama-config.json").read_text())
    (root / "link.txt").symlink_to(home / "corpus.txt")
    roots = (str(root),)
    spec = JobSpec.from_dict(GOOD | {"data": str(root / "corpus.txt")}, roots=roots)
    assert spec.data == str(root / "corpus.txt")
    for key, value in (("data", "/etc/shadow"), ("data", str(home / "corpus.txt")), ("data", str(root / "link.txt")),
                       ("data", str(root / ".." / "home" / "corpus.txt")), ("model", str(home / "mine.json"))):
        e = bad(GOOD | {key: value}, key, match="is outside the folders jobs' files may be read from", roots=roots)
        assert str(root) in str(e) and "arena serve --data-root DIR" in str(e)
    # a job file's relative path is taken from its folder; the refusal says where that led and what is allowed
    job = home / "job.toml"
    job.write_text('name = "j"\nmodel = "tiny-gpt__2L"\nglobal_batch = 8\nsteps = 5\ndata = "corpus.txt"\n')
    with pytest.raises(InputError) as e:
        JobSpec.from_toml(job, roots=roots)
    assert e.value.field == "data" and str(home / "corpus.txt") in str(e.value) and str(root) in str(e.value)
    assert JobSpec.from_toml(job).data == str(home / "corpus.txt")          # no roots (the client's own check)


def test_the_data_file_is_checked_for_the_model_at_submission(tmp_path):
    from instances.models import get_model
    need = get_model("tiny-gpt__2L").seq_len + 2
    short = tmp_path / "short.txt"
    short.write_bytes(b"b" * (need - 1))
    bad(GOOD | {"data": str(short)}, "data", match=f"needs at least {need}")
    bad(GOOD | {"data": str(tmp_path)}, "data", match="is a folder")
    short.write_bytes(b"b" * need)
    assert JobSpec.from_dict(GOOD | {"data": str(short)}).data == str(short)
    short.unlink()                 # a stored spec is read back without its file (checked again at launch)
    assert JobSpec.from_dict(GOOD | {"data": str(short)}, check_files=False).data == str(short)
