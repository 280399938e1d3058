"""Instance and plan validation: every bad input gets one clear message naming the field."""
import copy
import json
from pathlib import Path

import pytest
import yaml

from hetplan.errors import EstimatorError, InstanceError, PlanError
from hetplan.instance import instance_from_dict, instance_json_schema, load_instance
from hetplan.plan import load_plan, plan_from_dict, redistribution, sample_ranges, validate_plan, workers

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "instances" / "a100_v100_one_zone.yaml").read_text())
PLAN = json.loads((REPO / "instances" / "plans" / "a100_v100_one_zone.json").read_text())


def mutated(path, value):
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def test_all_bundled_instances_load():
    names = sorted(p.stem for p in (REPO / "instances").glob("*.yaml"))
    assert len(names) >= 6
    for name in names:
        inst = load_instance(REPO / "instances" / f"{name}.yaml")
        assert inst.name == name and inst.total_gpus > 0


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncluster: [\n  - a\n b: c\n")
    with pytest.raises(InstanceError, match=r"invalid YAML at line \d+"):
        load_instance(bad)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(InstanceError, match="file not found"):
        load_instance(tmp_path / "nope.yaml")


def test_unknown_gpu_type_names_field():
    data = mutated(["cluster", "node_groups", 0, "gpu_type"], "A200")
    with pytest.raises(InstanceError, match=r"cluster\.node_groups\[0\]\.gpu_type: unknown GPU type 'A200'"):
        instance_from_dict(data)


def test_negative_bandwidth_names_field():
    data = mutated(["cluster", "network", "inter_node", "bandwidth_GBps"], -5)
    with pytest.raises(InstanceError, match=r"cluster\.network\.inter_node\.bandwidth_GBps: .*greater than 0"):
        instance_from_dict(data)


def test_unknown_field_and_preset():
    with pytest.raises(InstanceError, match=r"workload\.batch: Extra inputs"):
        instance_from_dict(mutated(["workload", "batch"], 3))
    with pytest.raises(InstanceError, match="unknown model preset 'GPT-5'"):
        instance_from_dict(mutated(["workload", "model"], "GPT-5"))


def test_bf16_on_v100_is_refused():
    with pytest.raises(InstanceError, match=r"bf16 is not supported by \['V100-16'\]"):
        instance_from_dict(mutated(["workload", "precision"], "bf16"))


def test_constraints_must_name_cluster_members():
    with pytest.raises(InstanceError, match=r"constraints\.allowed_zones: \['mars-1a'\] not in the cluster"):
        instance_from_dict(mutated(["constraints"], {"allowed_zones": ["mars-1a"]}))


def test_gpu_override_adds_a_type_and_is_validated():
    data = mutated(["cluster", "gpu_overrides"], {"A100-40": {"memory_gib": 44}})
    assert instance_from_dict(data).gpu("A100-40").memory_gib == 44
    with pytest.raises(InstanceError, match=r"gpu_overrides\.A100-40\.memory_gib: -1 GiB is outside \[1e-06, 1e\+06\]"):
        instance_from_dict(mutated(["cluster", "gpu_overrides"], {"A100-40": {"memory_gib": -1}}))


def test_unknown_estimator_is_clear():
    from hetplan.estimators import build_estimators

    inst = instance_from_dict(mutated(["estimators"], {"time": "oracle"}))
    with pytest.raises(EstimatorError, match=r"estimators\.time: unknown estimator 'oracle'"):
        build_estimators(inst)


def test_schema_file_is_current():
    on_disk = json.loads((REPO / "instances" / "schema.json").read_text())
    assert on_disk == json.loads(json.dumps(instance_json_schema())), "run: hetplan schema -o instances/schema.json"


# ---- plans -----------------------------------------------------------------------------------------
def plan_with(**changes):
    data = copy.deepcopy(PLAN)
    data.update(changes)
    return plan_from_dict(data)


def test_plan_json_round_trip(a100_v100):
    plan = load_plan(REPO / "instances" / "plans" / "a100_v100_one_zone.json")
    placed = validate_plan(a100_v100, plan)
    again = plan_from_dict(json.loads(placed.to_json()))
    assert again == placed


def test_layers_not_covered(a100_v100):
    data = copy.deepcopy(PLAN)
    data["stages"][1]["layer_start"] = 17
    with pytest.raises(PlanError, match=r"stages\[1\]\.layer_start: layer_start 17 leaves a gap"):
        validate_plan(a100_v100, plan_from_dict(data))
    data["stages"][1]["layer_start"] = 16
    data["stages"][1]["layer_end"] = 25
    with pytest.raises(PlanError, match=r"stages: stages cover layer units \[0, 25\) but the model has 26"):
        validate_plan(a100_v100, plan_from_dict(data))


def test_overlapping_layers(a100_v100):
    data = copy.deepcopy(PLAN)
    data["stages"][1]["layer_start"] = 10
    with pytest.raises(PlanError, match="overlaps the previous stage"):
        validate_plan(a100_v100, plan_from_dict(data))


def test_more_gpus_than_exist(a100_v100):
    data = copy.deepcopy(PLAN)
    data["stages"][0]["replicas"] = [{"gpu_type": "A100-40", "zone": "us-central1-a", "microbatch_share": 1}] * 8
    data["num_microbatches"] = 8
    data["stages"][1]["replicas"] = [{"gpu_type": "A100-40", "zone": "us-central1-a", "microbatch_share": 8}]
    with pytest.raises(PlanError, match="uses more GPUs than exist"):
        validate_plan(a100_v100, plan_from_dict(data))


def test_a_tp_group_wider_than_a_node_is_not_a_shortage(a100_v100):
    """tp 8 in a zone of 4-GPU A100 nodes was "the plan uses more GPUs than exist" (it used 8 of 16);
    3 GPUs free on two nodes are not a shortage for tp 3 either."""
    data = copy.deepcopy(PLAN)
    data["stages"][1]["replicas"] = [{"gpu_type": "A100-40", "tp": 8, "zone": "us-central1-a", "microbatch_share": 8}]
    with pytest.raises(PlanError, match=r"^stages\[1\]\.replicas\[0\]\.tp: tp=8 exceeds the 4 GPUs of every A100-40 "
                                        r"node in us-central1-a: TP stays inside a node$"):
        validate_plan(a100_v100, plan_from_dict(data))
    a100 = lambda tp, share: {"gpu_type": "A100-40", "tp": tp, "zone": "us-central1-a",  # noqa: E731
                              "microbatch_share": share}
    data["stages"][0]["replicas"] = [a100(1, 2), a100(1, 2), a100(3, 4)]  # a100-0: 2 left, a100-1: 1 left
    data["stages"][1]["replicas"] = [a100(3, 8)]
    with pytest.raises(PlanError, match=r"has 3 free GPUs left \(3 free in total there\): they are split over nodes"):
        validate_plan(a100_v100, plan_from_dict(data))


def test_tp_across_nodes_and_gpu_reuse(a100_v100):
    data = copy.deepcopy(PLAN)
    data["stages"][1]["replicas"][0] = {"gpu_type": "V100-16", "tp": 8, "node": "v100-0", "microbatch_share": 3}
    with pytest.raises(PlanError, match="TP stays inside a node"):
        validate_plan(a100_v100, plan_from_dict(data))
    data["stages"][1]["replicas"][0] = {"gpu_type": "A100-40", "node": "a100-0", "gpus": [0], "microbatch_share": 3}
    data["stages"][0]["replicas"][0] = {"gpu_type": "A100-40", "node": "a100-0", "gpus": [0], "microbatch_share": 4}
    with pytest.raises(PlanError, match="already used by another replica"):
        validate_plan(a100_v100, plan_from_dict(data))


def test_wrong_gpu_type_on_node(a100_v100):
    data = copy.deepcopy(PLAN)
    data["stages"][0]["replicas"][0] = {"gpu_type": "V100-16", "node": "a100-1", "microbatch_share": 4}
    with pytest.raises(PlanError, match=r"replicas\[0\]\.gpu_type: node a100-1 has A100-40"):
        validate_plan(a100_v100, plan_from_dict(data))


def test_inconsistent_batch_split(a100_v100):
    data = copy.deepcopy(PLAN)
    data["stages"][1]["replicas"][0]["microbatch_share"] = 2
    with pytest.raises(PlanError, match=r"stages\[1\]: microbatch shares sum to 7, stage 0's to 8"):
        validate_plan(a100_v100, plan_from_dict(data))
    with pytest.raises(PlanError, match="num_microbatches: global microbatch 8 x num_microbatches 4 = 32"):
        validate_plan(a100_v100, plan_with(num_microbatches=4))


def test_malformed_plan_fields():
    with pytest.raises(PlanError, match=r"num_microbatches: Input should be greater than or equal to 1"):
        plan_with(num_microbatches=0)
    with pytest.raises(PlanError, match=r"schedule: Input should be '1F1B' or 'GPipe'"):
        plan_with(schedule="ZigZag")


def test_rank_table_invariants(a100_v100):
    plan = validate_plan(a100_v100, load_plan(REPO / "instances" / "plans" / "a100_v100_one_zone.json"))
    table = workers(a100_v100, plan)
    assert [w.rank for w in table] == list(range(plan.num_gpus))
    assert len({(w.node_id, w.local_gpu) for w in table}) == len(table)
    for w in table:  # TP group members share the node
        mates = [x for x in table if (x.stage, x.replica) == (w.stage, w.replica)]
        assert {x.node_id for x in mates} == {w.node_id}


def test_redistribution_moves_every_sequence_once():
    assert sample_ranges([3, 1]) == [(0, 3), (3, 4)]
    assert redistribution([3, 1], [2, 2]) == [(0, 0, 2), (0, 1, 1), (1, 1, 1)]
    moves = redistribution([4, 4], [3, 5])
    assert sum(n for *_, n in moves) == 8


def test_model_copy_recomputes_resolved_views(a100_v100):
    assert len(a100_v100.nodes) == 4  # fills the cache
    groups = [g.model_copy(update={"count": 1}) for g in a100_v100.cluster.node_groups]
    smaller = a100_v100.model_copy(update={"cluster": a100_v100.cluster.model_copy(update={"node_groups": groups})})
    assert len(smaller.nodes) == 2 and set(smaller.node_by_id) == {"a100-0", "v100-0"}
