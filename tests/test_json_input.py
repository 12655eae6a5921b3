"""A key given twice in a JSON object is refused, naming the key and where it stands, in
every JSON file a user gives (instances/structured.py, loads_json): cluster files in both formats,
Hugging Face config.json models, train configs and profile stores (the service's request
bodies: tests/test_service_api.py). ``json.loads`` keeps the last value without a word."""
from __future__ import annotations

import json

import pytest

from instances.cluster import load_cluster
from instances.errors import InputError
from instances.hf_config import load_hf_config
from instances.structured import loads_json

GROUP = '{"gpu_type": "a100", "num_nodes": 2, "gpus_per_node": 4}'


@pytest.mark.parametrize("text, key, field", [
    ('{"a": 1, "a": 2}', "a", "a"),
    ('{"a": 1, "b": {"c": [1, {"d": 1, "e": 2, "d": 3}]}}', "d", "b.c[1].d"),
    ('[{"x": 1}, {"y": 1, "y": 1}]', "y", "[1].y"),
    ('{"p": {"q": 1, "q": 2}, "r": {"s": 1, "s": 2}}', "q", "p.q"),      # the first in the document
])
def test_a_repeated_key_is_named_with_its_place(text, key, field):
    with pytest.raises(InputError, match=rf"key '{key}' given twice in one object \(the first value would be "
                                         r"lost\); give it once") as e:
        loads_json(text, file="f.json")
    assert e.value.field == field and e.value.file == "f.json"


def test_json_without_repeated_keys_reads_as_json_loads_does():
    text = '{"a": [1, 2.5, null, true, {"b": "c", "B": "d"}], "": {}}'
    assert loads_json(text) == json.loads(text)
    with pytest.raises(InputError, match="not valid JSON"):
        loads_json('{"a": }', file="f.json")


@pytest.mark.parametrize("content, field", [
    ('{"name": "a", "name": "b", "node_groups": [' + GROUP + ']}', "name"),
    ('{"node_groups": [' + GROUP[:-1] + ', "num_nodes": 3}]}', "node_groups[0].num_nodes"),
    ('[{"a100": {"node_num": 2}, "a100": {"node_num": 3}}]', "[0].a100"),
    ('[{"a100": {"node_num": 2, "node_num": 0}}]', "[0].a100.node_num"),
])
def test_a_cluster_file_with_a_key_twice_is_refused(tmp_path, content, field):
    f = tmp_path / "c.json"
    f.write_text(content)
    with pytest.raises(InputError, match="given twice") as e:
        load_cluster(f)
    assert e.value.field == field and e.value.file == str(f)


def test_a_config_json_model_with_a_key_twice_is_refused(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,\n'
                 ' "intermediate_size": 128, "vocab_size": 256, "hidden_size": 128}')
    with pytest.raises(InputError, match="key 'hidden_size' given twice") as e:
        load_hf_config(f)
    assert e.value.field == "hidden_size" and e.value.file == str(f)


def test_a_train_config_with_a_key_twice_is_refused(tmp_path):
    from launcher.config import ParallelPlan, TrainConfig
    cfg = TrainConfig(model="tiny-gpt__2L", plan=ParallelPlan(), steps=3)
    text = json.dumps(cfg.to_json())
    f = tmp_path / "config.json"
    f.write_text(text.replace('"steps": 3', '"steps": 3, "steps": 30'))
    with pytest.raises(InputError, match="key 'steps' given twice") as e:
        TrainConfig.read(f)
    assert e.value.field == "steps" and e.value.file == str(f)
    f.write_text(text.replace('"dp": 1', '"dp": 1, "dp": 2'))
    with pytest.raises(InputError) as e:
        TrainConfig.read(f)
    assert e.value.field == "plan.dp"


def test_a_profile_store_file_with_a_key_twice_is_refused(tmp_path):
    from estimators.profile_store import ProfileStore
    store = ProfileStore(tmp_path)
    path = store.collectives_path("cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema_version": 1, "device": "cpu", "entries": [], "entries": []}')
    with pytest.raises(InputError, match="key 'entries' given twice") as e:
        store.collective_records("cpu")
    assert e.value.file == str(path)
