"""Slurm cluster discovery (instances/slurm.py): parsing outputs captured from Debian's Slurm
22.05 (tests/data/slurm/, fast), then the same against a real Slurm cluster on this host
(the ``slurm_cluster`` fixture, tests/slurm_cluster.py): nodes, GPU GRES, state, capacity
held by other jobs, and every bad input as a clear error."""
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from instances.errors import InputError
from instances.slurm import (
    SlurmCommands,
    SlurmNode,
    SlurmView,
    catalog_type,
    discover,
    list_jobs,
    load_gpu_type_table,
    nodes_from_scontrol,
    nodes_from_sinfo_json,
    parse_gres,
    parse_key_values,
    parse_state,
    partitions_from_scontrol,
    spec_order,
)

DATA = Path(__file__).parent / "data" / "slurm"
TABLE = load_gpu_type_table()


def read(name: str) -> str:
    return (DATA / name).read_text()


# --- captured outputs ------------------------------------------------------------------------
def test_json_and_text_forms_read_the_same_nodes():
    # captured with a foreign job holding one GPU and one CPU of n1, and n3 drained
    js = nodes_from_sinfo_json(read("sinfo.json"), TABLE)
    tx = nodes_from_scontrol(read("scontrol_nodes.txt"), TABLE)
    assert js == tx
    n1, n2, n3 = js
    assert (n1.name, n1.state, n1.gpus, n1.gpus_alloc, n1.cpus, n1.cpus_alloc) == ("n1", "MIXED", 2, 1, 4, 1)
    assert (n1.gres_type, n1.gpu_type, n1.launch_gres, n1.partitions) == ("a100", "a100-40gb", "gpu:a100", ("arena",))
    assert n1.out_of_service is None and n2.out_of_service is None and n2.slots_alloc == 0
    assert (n3.gpus, n3.gpu_type, n3.slots, n3.launch_gres) == (0, "cpu", 4, None)
    assert n3.out_of_service == "drained (maint x)"


def test_states_that_take_a_node_out_of_service():
    # captured: n1 drained while a job runs on it, n2's slurmd stopped (not responding), n3 set to FAIL
    for nodes in (nodes_from_sinfo_json(read("sinfo_states.json"), TABLE),
                  nodes_from_scontrol(read("scontrol_nodes_states.txt"), TABLE)):
        assert {n.name: n.out_of_service for n in nodes} == {
            "n1": "draining (disk check)", "n2": "not responding", "n3": "failing (psu)"}
    assert parse_state("down*") == ("DOWN", ("NOT_RESPONDING",))
    assert parse_state("IDLE+DRAIN") == ("IDLE", ("DRAIN",))
    assert parse_state("idle", ["DRAIN"]) == ("IDLE", ("DRAIN",))
    assert parse_state("MIXED#") == ("MIXED", ("POWERING_UP",))
    down = SlurmNode("x", (), "DOWN", (), 4, 0, "a100", 2, 0, "a100-40gb", "dead")
    assert down.out_of_service == "down (dead)"
    busy = SlurmNode("x", (), "ALLOCATED", ("COMPLETING",), 4, 4, None, 0, 0, "cpu")
    assert busy.out_of_service is None


def test_gres_strings():
    assert parse_gres("gpu:a100:2(S:0-1)") == [("a100", 2)]
    assert parse_gres("gpu:2") == [(None, 2)]
    assert parse_gres("gpu:a100:1(IDX:0,1),mps:100,gpu:v100:0(IDX:N/A)") == [("a100", 1), ("v100", 0)]
    assert parse_gres("(null)") == [] and parse_gres("") == [] and parse_gres(None) == []
    assert parse_gres("gpu:0") == [(None, 0)]
    with pytest.raises(InputError, match="cannot read the GPU GRES 'gpu:a100:x'"):
        parse_gres("gpu:a100:x")


def test_gres_type_table_maps_slurm_names_and_names_what_is_missing(tmp_path):
    assert catalog_type("nvidia_a100-sxm4-80gb", "n1", TABLE) == "a100-80gb"
    assert catalog_type("H100", "n1", TABLE) == "h100-sxm"
    assert catalog_type("a100-80gb", "n1", TABLE) == "a100-80gb"        # a catalog name maps to itself
    with pytest.raises(InputError) as e:
        catalog_type("mi250x", "gpu07", TABLE)
    msg = str(e.value)
    assert msg.startswith("field '--slurm-gpu-types': node gpu07: Slurm GRES gpu:mi250x is not in the GRES type "
                          "table; map it to a catalog GPU type in a JSON file given with --slurm-gpu-types FILE, "
                          'e.g. {"mi250x": "a100-80gb"}'), msg
    with pytest.raises(InputError, match='node n9: Slurm GRES gpu \\(no type\\) .* e.g. {"untyped"'):
        catalog_type(None, "n9", TABLE)
    own = tmp_path / "types.json"
    own.write_text(json.dumps({"MI250X": "h100-sxm", "untyped": "a40", "a100": "a100-80gb"}))
    t = load_gpu_type_table(own)
    assert catalog_type("mi250x", "n1", t) == "h100-sxm" and catalog_type(None, "n1", t) == "a40"
    assert catalog_type("a100", "n1", t) == "a100-80gb"                 # the operator's entry wins
    own.write_text(json.dumps({"mi250x": "mi250x"}))
    with pytest.raises(InputError, match=f"{re.escape(str(own))}, field '--slurm-gpu-types': GRES type 'mi250x' "
                                         "maps to 'mi250x', which is not a catalog GPU type; known: a10, a100-40gb"):
        load_gpu_type_table(own)
    own.write_text(json.dumps({"mi250x": "cpu"}))
    with pytest.raises(InputError, match="maps to 'cpu', which is not a catalog GPU type"):
        load_gpu_type_table(own)
    own.write_text("[1]")
    with pytest.raises(InputError, match="must be a JSON object"):
        load_gpu_type_table(own)
    with pytest.raises(InputError, match="GRES type table not found"):
        load_gpu_type_table(tmp_path / "missing.json")


def test_a_node_with_unmapped_or_mixed_gpu_types_is_an_error():
    line = read("scontrol_nodes.txt").splitlines()[0]
    with pytest.raises(InputError, match="node n1: Slurm GRES gpu:mi250x is not in the GRES type table"):
        nodes_from_scontrol(line.replace("Gres=gpu:a100:2", "Gres=gpu:mi250x:2").replace(
            "GresUsed=gpu:a100:1(IDX:0)", "GresUsed=gpu:mi250x:1(IDX:0)"), TABLE)
    with pytest.raises(InputError, match="node n1 has GPUs of several GRES types \\(a100, v100\\)"):
        nodes_from_scontrol(line.replace("Gres=gpu:a100:2", "Gres=gpu:a100:2,gpu:v100:2"), TABLE)
    untyped = nodes_from_scontrol(line.replace("Gres=gpu:a100:2", "Gres=gpu:2").replace(
        "GresUsed=gpu:a100:1(IDX:0)", "GresUsed=gpu:1(IDX:0)"), {**TABLE, "untyped": "a40"})
    assert (untyped[0].gpu_type, untyped[0].gpus, untyped[0].gpus_alloc, untyped[0].launch_gres) == \
        ("a40", 2, 1, "gpu")


def test_controller_down_and_malformed_output_are_clear_errors():
    # sinfo --json with the controller stopped: exit status 0 and an "errors" list
    with pytest.raises(InputError, match="`sinfo --json` reported: Unspecified error \\(errno -1\\) "
                                         "\\(is the Slurm controller up\\?\\)"):
        nodes_from_sinfo_json(read("sinfo_controller_down.json"), TABLE)
    with pytest.raises(InputError, match="`sinfo --json` did not print JSON"):
        nodes_from_sinfo_json("sinfo: error: plugin", TABLE)
    with pytest.raises(InputError, match="no 'nodes' list"):
        nodes_from_sinfo_json('{"meta": {}}', TABLE)
    broken = json.loads(read("sinfo.json"))
    del broken["nodes"][1]["cpus"]
    with pytest.raises(InputError, match="`sinfo --json` node 1: missing or malformed 'cpus'"):
        nodes_from_sinfo_json(json.dumps(broken), TABLE)
    with pytest.raises(InputError, match="`scontrol show nodes` line 1: no State"):
        nodes_from_scontrol("NodeName=n1 CPUTot=4", TABLE)


def test_partitions_and_key_values():
    parts = partitions_from_scontrol(read("scontrol_partitions.txt"))
    assert list(parts) == ["arena"] and parts["arena"].state == "UP" and parts["arena"].default
    kv = parse_key_values("NodeName=n1 OS=Linux 6.1 #1 SMP  RealMemory=4000 Reason=maint x [root@2026-12-04]")
    assert kv == {"NodeName": "n1", "OS": "Linux 6.1 #1 SMP", "RealMemory": "4000",
                  "Reason": "maint x [root@2026-12-04]"}


def test_view_spec_groups_nodes_by_type_and_counts_foreign_capacity():
    nodes = tuple(nodes_from_sinfo_json(read("sinfo.json"), TABLE))
    v = SlurmView("arena", nodes, "sinfo --json")
    spec = v.spec()
    assert [(g.gpu_type, g.num_nodes, g.gpus_per_node, g.hosts) for g in spec.groups] == \
        [("a100-40gb", 2, 2, ("n1", "n2")), ("cpu", 1, 4, ("n3",))]
    assert v.node_names() == {0: "n1", 1: "n2", 2: "n3"} and spec.node_id("n2") == 1
    assert v.unusable_slots() == {"n1": 1}                 # one GPU of n1 held by a job not ours
    assert v.unusable_slots({"n1": 1}) == {}               # ... unless it is ours
    assert v.out_of_service() == {"n3": "drained (maint x)"}
    assert v.launch_gres() == {"n1": "gpu:a100", "n2": "gpu:a100", "n3": None}


def test_nodes_a_partition_gains_come_after_the_known_ones():
    """``spec_order`` with an earlier cluster's order: the known nodes keep their node ids
    (a restarted service re-adopts launches by node id), a gained node comes after them in
    a group of its own even where its kind is known; a known node gone: the plain order."""
    n1, n2, n3 = nodes_from_sinfo_json(read("sinfo.json"), TABLE)
    n0 = replace(n2, name="n0")                           # a100 x2, sorts first by name
    plain = spec_order([n0, n1, n2, n3])
    assert plain == ["n0", "n1", "n2", "n3"]
    kept = spec_order([n0, n1, n2, n3], order=("n1", "n2", "n3"))
    assert kept == ["n1", "n2", "n3", "n0"]
    spec = SlurmView("arena", tuple({n.name: n for n in (n0, n1, n2, n3)}[x] for x in kept), "sinfo --json").spec()
    assert [(g.gpu_type, g.hosts) for g in spec.groups] == \
        [("a100-40gb", ("n1", "n2")), ("cpu", ("n3",)), ("a100-40gb", ("n0",))]
    assert [spec.node_id(h) for h in ("n1", "n2", "n3", "n0")] == [0, 1, 2, 3]
    assert spec_order([n0, n1, n3], order=("n1", "n2", "n3")) == ["n0", "n1", "n3"]     # n2 gone


def test_a_missing_slurm_conf_is_refused_at_once(tmp_path):
    # Slurm's own commands retry a missing slurm.conf for 60 s before they give up
    with pytest.raises(InputError) as e:
        SlurmCommands(str(tmp_path / "slurm.conf"))
    assert str(e.value) == f"{tmp_path / 'slurm.conf'}, field '--slurm-conf': file not found"


def test_no_slurm_commands_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError) as e:
        discover(SlurmCommands())
    assert str(e.value) == ("field '--slurm': no Slurm command 'scontrol' on PATH: run on a host with Slurm's "
                            "client commands (Debian: apt-get install slurm-client) and the cluster's slurm.conf")


# --- a real Slurm cluster -----------------------------------------------------------------------
def test_discovery_on_a_real_cluster(slurm_cluster):
    cmds = SlurmCommands(str(slurm_cluster.conf))
    v = discover(cmds)                                     # the default partition
    assert v.source == "sinfo --json" and v.partition == "arena"
    assert [(g.gpu_type, g.num_nodes, g.gpus_per_node, g.hosts) for g in v.spec().groups] == \
        [("a100-40gb", 2, 2, ("n1", "n2")), ("cpu", 1, 4, ("n3",))]
    assert v == discover(cmds, "arena", form="json")
    text = discover(cmds, form="text")
    assert text.source == "scontrol -o -d show nodes" and text.nodes == v.nodes
    assert v.out_of_service() == {} and v.unusable_slots() == {}

    # a job arena did not submit holds a GPU of n1, and n3 is drained: seen at the next read
    job = int(slurm_cluster.run("sbatch", "--parsable", "-w", "n1", "--gres=gpu:a100:1", "-n1", "-J", "foreign",
                                "-o", "/dev/null", "--wrap", "sleep 60").stdout.strip())
    slurm_cluster.run("scontrol", "update", "nodename=n3", "state=drain", "reason=maintenance")
    try:
        deadline = time.monotonic() + 60        # until slurmctld has started the job (its scheduler's pace)
        while True:
            v = discover(cmds)
            if v.unusable_slots() or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert v.unusable_slots() == {"n1": 1}
        assert v.out_of_service() == {"n3": "drained (maintenance)"}
        jobs = list_jobs(cmds, [job])
        assert jobs[job].name == "foreign" and jobs[job].state in ("RUNNING", "PENDING")
        assert list_jobs(cmds, [987654]) == {}               # a job Slurm does not know: none
    finally:
        slurm_cluster.run("scancel", str(job), check=False)
        slurm_cluster.run("scontrol", "update", "nodename=n3", "state=resume", check=False)
        slurm_cluster.wait_idle(30)


def test_real_cluster_bad_inputs(slurm_cluster, tmp_path):
    cmds = SlurmCommands(str(slurm_cluster.conf))
    with pytest.raises(InputError) as e:
        discover(cmds, "gpus")
    assert str(e.value) == "field '--partition': unknown Slurm partition 'gpus'; partitions: arena"
    # the controller down: a slurm.conf whose controller port nobody listens on
    from tests.slurm_cluster import free_ports
    dead = tmp_path / "slurm.conf"
    dead.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={free_ports(1)[0]}", slurm_cluster.conf.read_text()))
    with pytest.raises(InputError) as e:
        discover(SlurmCommands(str(dead)))
    assert re.fullmatch(r"field '--slurm': the Slurm controller does not answer \(`scontrol ping`: Slurmctld"
                        r"\(primary\) at \S+ is DOWN\); start slurmctld or point SLURM_CONF at the cluster's "
                        r"slurm.conf", str(e.value)), str(e.value)


def test_availability_against_the_cluster_read_at_start():
    """Each round's reading maps onto the node ids of the cluster read at start: Slurm's
    states, nodes gone from the partition, nodes whose GPUs changed, nodes added."""
    start = SlurmView("arena", tuple(nodes_from_sinfo_json(read("sinfo.json"), TABLE)), "sinfo --json")
    spec = start.spec()
    now = SlurmView("arena", tuple(nodes_from_sinfo_json(read("sinfo_states.json"), TABLE)), "sinfo --json")
    a = now.availability(spec)
    assert a.out_of_service == {0: "draining (disk check)", 1: "not responding", 2: "failing (psu)"}
    assert a.unusable_slots == {0: 1} and a.new_nodes == ()
    assert start.availability(spec, own={"n1": 1}).unusable_slots == {}
    n1, n2, n3 = start.nodes
    moved = SlurmView("arena", (n1, replace(n3, name="n4"), replace(n2, gpus=1)), "sinfo --json")
    a = moved.availability(spec)
    assert a.out_of_service == {
        1: "its slots changed in Slurm (2 x a100-40gb -> 1 x a100-40gb); a restart takes the new shape",
        2: "no longer in Slurm partition 'arena'"}
    assert a.new_nodes == ("n4",)


def test_only_the_partitions_nodes_are_read():
    """A node of another partition whose GRES type the table lacks (or mixes types) is no
    error for this partition's discovery: its GRES are not read."""
    raw = json.loads(read("sinfo.json"))
    odd = {**raw["nodes"][0], "name": "x1", "partitions": ["other"], "gres": "gpu:xpu9:2"}
    text = json.dumps({**raw, "nodes": raw["nodes"] + [odd]})
    assert [n.name for n in nodes_from_sinfo_json(text, TABLE, "arena")] == \
        [n.name for n in nodes_from_sinfo_json(read("sinfo.json"), TABLE)]
    with pytest.raises(InputError, match="node x1: Slurm GRES gpu:xpu9 is not in the GRES type table"):
        nodes_from_sinfo_json(text, TABLE)
    with pytest.raises(InputError, match="node x1: Slurm GRES gpu:xpu9"):
        nodes_from_sinfo_json(text, TABLE, "other")
