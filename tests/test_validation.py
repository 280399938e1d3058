"""Input that used to be accepted silently: each case is now an error naming the field (or, for
traces larger than the instance, a replay note), and the loaders turn unreadable files into one line."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hetplan.cluster_state import event_stream
from hetplan.errors import InstanceError, PlanError
from hetplan.instance import instance_from_dict, load_instance
from hetplan.plan import load_plan, plan_from_dict, validate_plan
from hetplan.orchestration.replay import ReplayOptions, replay
from test_instance_and_plan import BASE, mutated  # the bundled instance as a dict, and one field changed

REPO = Path(__file__).resolve().parents[1]
PLAN = json.loads((REPO / "instances" / "plans" / "a100_v100_one_zone.json").read_text())
ZONE = "us-central1-a"


def write(folder: Path, data: dict, name: str = "inst.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def rejected(data: dict, pattern: str) -> str:
    with pytest.raises(InstanceError, match=pattern) as err:
        instance_from_dict(data)
    assert "\n" not in str(err.value)
    return str(err.value)


# ---- 1. non-finite numbers -------------------------------------------------------------------------
@pytest.mark.parametrize("path, value, field", [
    (["cluster", "network", "inter_node", "bandwidth_GBps"], float("inf"),
     r"cluster\.network\.inter_node\.bandwidth_GBps"),
    (["cluster", "network", "inter_node", "latency_s"], float("nan"), r"cluster\.network\.inter_node\.latency_s"),
    (["cluster", "network", "inter_node", "bandwidth_GBps"], "inf", r"cluster\.network\.inter_node\.bandwidth_GBps"),
    (["cluster", "node_groups", 0, "price_per_gpu_hour_usd"], float("inf"),
     r"cluster\.node_groups\[0\]\.price_per_gpu_hour_usd"),
    (["cluster", "network", "egress"], {"inter_region_usd_per_GB": float("inf")},
     r"cluster\.network\.egress\.inter_region_usd_per_GB"),
    (["cluster", "gpu_overrides"], {"A100-40": {"peak_fp16_tflops": float("inf")}},
     r"cluster\.gpu_overrides\.A100-40\.peak_fp16_tflops"),
    (["cluster", "gpu_overrides"], {"A100-40": {"memory_gib": "inf"}}, r"cluster\.gpu_overrides\.A100-40\.memory_gib"),
    (["constraints"], {"max_cost_per_iteration_usd": float("inf")}, r"constraints\.max_cost_per_iteration_usd"),
    (["events"], {"bandwidth": [{"time_s": float("inf"), "link": "inter_node", "bandwidth_GBps": 1.0}]},
     r"events\.bandwidth\[0\]\.time_s"),
], ids=["inf bandwidth", "nan latency", "'inf' string in a catalogue link", "inf price", "inf egress",
        "inf override", "'inf' string override", "inf budget", "inf event time"])
def test_non_finite_numbers_are_refused_by_field(path, value, field):
    msg = rejected(mutated(path, value), field)
    assert "finite" in msg


@pytest.mark.parametrize("path, value, field", [
    (["cluster", "node_groups", 0, "price_per_gpu_hour_usd"], -1.0, r"price_per_gpu_hour_usd: .*greater than or equal"),
    (["cluster", "network", "inter_zone"], {"bandwidth_GBps": 1.0, "latency_s": -1e-3}, r"inter_zone\.latency_s"),
    (["cluster", "network", "egress"], {"pairs": [{"zones": [ZONE, ZONE], "usd_per_GB": -0.1}]}, r"usd_per_GB"),
], ids=["price", "latency", "egress"])
def test_negative_numbers_are_refused_by_field(path, value, field):
    rejected(mutated(path, value), field)


def test_cli_names_an_infinite_bandwidth_in_one_line(tmp_path):
    path = write(tmp_path, mutated(["cluster", "network", "inter_node", "bandwidth_GBps"], float("inf")))
    assert "inf" in path.read_text()  # YAML's .inf, as a user would write it
    assert_cli_error(["validate", str(path)], "cluster.network.inter_node.bandwidth_GBps: must be a finite number")


# ---- 2. the trace named by the instance ---------------------------------------------------------------
HEADER = f",Timestamp,A100-40_{ZONE},V100-16_{ZONE}\n"


def traced(folder: Path, csv_text: str | bytes | None, name: str = "t.csv") -> Path:
    """An instance file in `folder` naming trace `name` (written unless csv_text is None)."""
    if isinstance(csv_text, bytes):
        (folder / name).write_bytes(csv_text)
    elif csv_text is not None:
        (folder / name).write_text(csv_text)
    return write(folder, mutated(["events"], {"trace_csv": name}))


@pytest.mark.parametrize("csv_text, pattern", [
    (None, r"events\.trace_csv: file not found: .*t\.csv \('t\.csv' is relative to the instance file\)"),
    ("a,b,c\n1,2,3\n", r"events\.trace_csv: .*t\.csv: Timestamp: missing column 'Timestamp'"),
    (HEADER, r"events\.trace_csv: .*t\.csv: expected a header and at least one row"),
    (HEADER + "0,100,4,4\n1,soon,4,4\n", r"events\.trace_csv: .*t\.csv: line 3\.Timestamp: expected a number"),
    (HEADER + "0,100,4,4\n1,200,4\n", r"events\.trace_csv: .*t\.csv: line 3: expected 4 cells, got 3"),
    (HEADER + "0,100,4,-2\n", rf"events\.trace_csv: .*line 2\.V100-16_{ZONE}: expected a GPU count"),
    (",Timestamp,T4_us-central1-a\n0,100,4\n", r"events\.trace_csv: .*columns \['T4_us-central1-a'\] are no"),
    (b"\xff\xfe\x00garbage", r"events\.trace_csv: .*t\.csv: not a UTF-8 text file"),
], ids=["missing", "no Timestamp", "no rows", "bad number", "short row", "negative count", "unknown column",
        "binary"])
def test_trace_is_read_when_the_instance_loads(tmp_path, csv_text, pattern):
    with pytest.raises(InstanceError, match=pattern):
        load_instance(traced(tmp_path, csv_text))


def test_trace_that_is_a_directory(tmp_path):
    (tmp_path / "t.csv").mkdir()
    with pytest.raises(InstanceError, match=r"events\.trace_csv: .*t\.csv: is a directory"):
        load_instance(traced(tmp_path, None))


def test_trace_path_is_relative_to_the_instance_file(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    path = traced(sub, HEADER + "0,100,8,8\n1,700,4,8\n")
    monkeypatch.chdir(tmp_path)  # not where the trace is
    assert load_instance(path).events.trace_csv == "t.csv"


def test_cli_names_a_missing_trace(tmp_path):
    assert_cli_error(["validate", str(traced(tmp_path, None))], "events.trace_csv: file not found")


# ---- 3. availability events above the cluster's GPUs ------------------------------------------------
def test_availability_event_above_the_cluster_count():
    ev = {"time_s": 60, "zone": ZONE, "gpu_type": "A100-40", "available_gpus": 4}
    instance_from_dict(mutated(["events"], {"availability": [ev]}))
    msg = rejected(mutated(["events"], {"availability": [ev, {**ev, "available_gpus": 12}]}),
                   r"events\.availability\[1\]\.available_gpus: 12 GPUs of A100-40 in zone us-central1-a, "
                   r"but the cluster has 8")
    assert "[0]" not in msg


# ---- 4. TP that does not split the model ------------------------------------------------------------
def test_tp_must_divide_the_heads(a100_v100):
    plan = copy.deepcopy(PLAN)
    plan["stages"][1]["replicas"][0]["tp"] = 3  # OPT-350M: 16 heads
    with pytest.raises(PlanError, match=r"stages\[1\]\.replicas\[0\]\.tp: tp=3 does not divide num_heads 16"):
        validate_plan(a100_v100, plan_from_dict(plan))


def test_tp_must_divide_the_kv_heads():
    arch = {"num_layers": 2, "hidden_size": 64, "num_heads": 8, "num_kv_heads": 2, "ffn_hidden_size": 256,
            "vocab_size": 512, "seq_len": 32}
    inst = instance_from_dict(mutated(["workload", "model"], {"arch": arch}))
    rep = {"gpu_type": "A100-40", "zone": ZONE, "microbatch_share": 64}
    for tp, ok in ((2, True), (4, False)):
        plan = plan_from_dict({"num_microbatches": 1, "stages": [
            {"layer_start": 0, "layer_end": 4, "replicas": [{**rep, "tp": tp}]}]})
        if ok:
            validate_plan(inst, plan)
        else:
            with pytest.raises(PlanError, match=r"stages\[0\]\.replicas\[0\]\.tp: tp=4 does not divide num_kv_heads 2"):
                validate_plan(inst, plan)


def test_cli_refuses_tp3_on_16_heads(tmp_path):
    plan = copy.deepcopy(PLAN)
    plan["stages"][1]["replicas"][0]["tp"] = 3
    path = tmp_path / "tp3.json"
    path.write_text(json.dumps(plan))
    assert_cli_error(["simulate", "a100_v100_one_zone", str(path)], "stages[1].replicas[0].tp: tp=3 does not divide")


# ---- 5. no GPUs -----------------------------------------------------------------------------------
def test_a_cluster_without_gpus():
    rejected(mutated(["cluster", "node_groups"], []), r"^cluster\.node_groups: no GPUs: the list is empty")
    data = copy.deepcopy(BASE)
    for group in data["cluster"]["node_groups"]:
        group["count"] = 0
    rejected(data, r"^cluster\.node_groups: no GPUs: every node group has count 0 \(a100, v100\)")


# ---- 6. replay says when a trace asks for more GPUs than the instance has ------------------------------
def test_replay_notes_trace_counts_above_the_instance(tmp_path, a100_v100):
    trace = tmp_path / "big.csv"
    trace.write_text(HEADER + "0,100,8,8\n1,700,32,4\n2,1300,4,8\n")
    notes: list[str] = []
    stream = event_stream(a100_v100, trace, notes=notes)
    assert notes == [f"trace big.csv column A100-40_{ZONE}: up to 32 GPUs requested (first at t=600 s), the "
                     f"instance has 8 A100-40 in {ZONE}: counts above 8 are clamped"]
    # the stream itself absorbs the 32 (clamped to 8, no change): the note is all that says so
    assert [(e.time_s, e.available_gpus) for e in stream if e.gpu_type == "A100-40"] == [(1200, 4)]
    plan = validate_plan(a100_v100, load_plan("a100_v100_one_zone"))
    res = replay(a100_v100, trace, ReplayOptions(horizon_s=1500, initial_plan=plan, strategies=("static",)))
    assert res.notes == notes


def test_no_note_when_the_trace_fits():
    notes: list[str] = []
    event_stream(load_instance("spot_trace_2type"), notes=notes)
    assert notes == []


# ---- 7. related cases -------------------------------------------------------------------------------
PAIR = [ZONE, "us-central1-b"]
WEST = {"name": "west", "gpu_type": "A100-40", "gpus_per_node": 4, "count": 1, "zone": "us-central1-b",
        "price_per_gpu_hour_usd": 3.67}


def two_zones(path: list | None = None, value=None) -> dict:
    data = mutated(["cluster", "node_groups"], BASE["cluster"]["node_groups"] + [WEST])
    if path is not None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return data


@pytest.mark.parametrize("data, pattern", [
    (mutated(["cluster", "node_groups", 0, "gpus_per_node"], 0), r"node_groups\[0\]\.gpus_per_node: .*greater than 0"),
    (mutated(["cluster", "node_groups", 1, "name"], "a100"),
     r"cluster\.node_groups\[1\]\.name: 'a100' is already the name of cluster\.node_groups\[0\]"),
    (mutated(["workload", "global_batch_size"], 0), r"workload\.global_batch_size: .*greater than 0"),
    (mutated(["events"], {"availability": [{"time_s": -5, "zone": ZONE, "gpu_type": "A100-40", "available_gpus": 4}]}),
     r"events\.availability\[0\]\.time_s: .*greater than or equal to 0"),
    (two_zones(["cluster", "network", "zone_pairs"], [{"zones": [ZONE, "mars-1a"], "bandwidth_GBps": 1}]),
     r"cluster\.network\.zone_pairs\[0\]\.zones: \['mars-1a'\] not in the cluster"),
    (two_zones(["cluster", "network", "zone_pairs"], [{"zones": [ZONE, ZONE], "bandwidth_GBps": 1}]),
     r"cluster\.network\.zone_pairs\[0\]\.zones: both ends are us-central1-a"),
    (two_zones(["cluster", "network", "zone_pairs"], [{"zones": PAIR, "bandwidth_GBps": 1},
                                                      {"zones": PAIR[::-1], "bandwidth_GBps": 2}]),
     r"cluster\.network\.zone_pairs\[1\]\.zones: .* is already given by cluster\.network\.zone_pairs\[0\]"),
    (two_zones(["events"], {"bandwidth": [{"time_s": 1, "link": "zone_pair", "zones": [ZONE, "mars-1a"],
                                           "bandwidth_GBps": 1}]}),
     r"events\.bandwidth\[0\]\.zones: \['mars-1a'\] not in the cluster"),
    (mutated(["cluster", "node_groups", 1, "region"], "europe-west4"),
     r"cluster\.node_groups\[1\]\.region: zone us-central1-a is in region us-central1 \(cluster\.node_groups\[0\]\)"),
    (mutated(["constraints"], {"allowed_gpu_types": []}),
     r"constraints\.allowed_gpu_types: an empty list allows nothing"),
    (mutated(["workload", "model"], {"preset": "OPT-350M", "overrides": {"num_kv_heads": 3}}),
     r"workload\.model: num_heads 16 must be divisible by num_kv_heads 3"),
    (mutated(["workload", "model"], {"preset": "OPT-350M", "overrides": {"num_layers": 0}}),
     r"workload\.model\.overrides: num_layers: .*greater than 0"),
], ids=["gpus_per_node 0", "duplicate group name", "global_batch_size 0", "event at negative time",
        "zone pair unknown zone", "zone pair of one zone", "zone pair twice",
        "bandwidth event unknown zone", "zone in two regions", "empty allowed list", "kv heads", "bad model override"])
def test_related_silent_cases(data, pattern):
    rejected(data, pattern)


def test_two_zone_fixture_is_valid():
    """The base of the zone-pair cases above is itself valid: each case fails for its own reason."""
    inst = instance_from_dict(two_zones(["cluster", "network", "zone_pairs"], [{"zones": PAIR, "bandwidth_GBps": 1}]))
    assert inst.total_gpus == 20


def test_plan_gpus_without_a_node():
    plan = copy.deepcopy(PLAN)
    plan["stages"][0]["replicas"][0]["gpus"] = [3]
    with pytest.raises(PlanError, match=r"stages\[0\]\.replicas\[0\]: .*'gpus' are local indices on a node"):
        plan_from_dict(plan)


# ---- loaders: unreadable files are one line naming the file ----------------------------------------------
@pytest.mark.parametrize("name, content, pattern", [
    ("garbage.json", '{"stages": [', r"garbage\.json: invalid JSON at line 1, column 13"),
    ("empty.json", "", r"empty\.json: invalid JSON at line 1, column 1"),
    ("empty.yaml", "", r"empty\.yaml: a plan must be a mapping .*; got an empty file"),
    ("list.json", "[1, 2]", r"list\.json: a plan must be a mapping .*; got a list"),
    ("binary.json", bytes(range(256)) * 4, r"binary\.json: not a UTF-8 text file"),
    ("nul.yaml", "stages: \x00\x01\n", r"nul\.yaml: invalid YAML: unacceptable character"),
    ("date.yaml", "num_microbatches: 2024-13-40\n", r"date\.yaml: invalid YAML: month must be in 1\.\.12"),
    ("keys.yaml", "{1: 2}\n", r"keywords must be strings"),
], ids=["garbage", "empty json", "empty yaml", "list", "binary", "NUL", "bad date", "int key"])
def test_bad_plan_files(tmp_path, name, content, pattern):
    path = tmp_path / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(PlanError, match=pattern) as err:
        load_plan(path)
    assert "\n" not in str(err.value)


def test_plan_directory_and_unknown_bundled_name(tmp_path):
    (tmp_path / "plans").mkdir()
    with pytest.raises(PlanError, match=r"plans: is a directory, not a file"):
        load_plan(tmp_path / "plans")
    with pytest.raises(PlanError, match=r"file not found: no_such_plan \(and no bundled plan"):
        load_plan("no_such_plan")


@pytest.mark.parametrize("name, content, pattern", [
    ("binary.yaml", bytes(range(256)) * 4, r"binary\.yaml: not a UTF-8 text file"),
    ("empty.yaml", "", r"empty\.yaml: an instance must be a mapping .*; got an empty file"),
    ("text.yaml", "just words\n", r"text\.yaml: an instance must be a mapping .*; got a str"),
    ("twice.yaml", yaml.safe_dump(BASE).replace("- count: 2", "- count: 2\n    count: 200", 1),
     r"twice\.yaml: invalid YAML at line 9, column 5: the key 'count' is given twice"),
    ("twice.json", json.dumps(BASE).replace('"count": 2', '"count": 2, "count": 200', 1),
     r"twice\.json: invalid JSON: the key 'count' is given twice"),
    ("unhashable.yaml", "? [a, b]\n: 1\n", r"unhashable\.yaml: invalid YAML at line 1, column 3: found unhashable key"),
    # 1 kB whose aliases expand to 6e6 values (two more levels of 9: 5e8, and the checks walked them for minutes)
    ("laughs.yaml", "a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 7)) + yaml.safe_dump(BASE),
     r"laughs\.yaml: YAML aliases expand this file to 6\.05e\+06 values \(from 1,\d{3} characters\)"),
    ("loop.yaml", "a: &a [1, *a]\n", r"loop\.yaml: invalid YAML: an alias sits inside the list or mapping it names"),
], ids=["binary", "empty", "text", "a key twice in YAML", "a key twice in JSON", "a list as a key", "aliases x 9^7",
        "an alias inside itself"])
def test_bad_instance_files(tmp_path, name, content, pattern):
    path = tmp_path / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(InstanceError, match=pattern):
        load_instance(path)
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(InstanceError, match=r"folder\.yaml: is a directory, not a file"):
        load_instance(tmp_path / "folder.yaml")


def test_cli_loaders_print_one_line(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    (tmp_path / "dir.json").mkdir()
    assert_cli_error(["validate", str(binary)], "binary.yaml: not a UTF-8 text file")
    assert_cli_error(["validate", str(tmp_path)], "is a directory, not a file")
    assert_cli_error(["simulate", "a100_v100_one_zone", str(tmp_path / "dir.json")], "dir.json: is a directory")


# ---- through the installed command -----------------------------------------------------------------------
def assert_cli_error(args: list[str], needle: str) -> None:
    exe = shutil.which("hetplan")
    if exe is None:
        pytest.skip("the hetplan command is not installed")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr and needle in lines[0], proc.stderr


# ---- 8. figures no cluster has: refused before the planner or the simulator takes minutes or prints inf ----
@pytest.mark.parametrize("path, value, pattern", [
    (["cluster", "node_groups", 0, "count"], 300_000,
     r"cluster\.node_groups: 1,200,008 GPUs in all; hetplan plans clusters of at most 1,000,000"),
    (["cluster", "node_groups", 0, "price_per_gpu_hour_usd"], 1e308,
     r"cluster\.node_groups\[0\]\.price_per_gpu_hour_usd: 1e\+308 USD per GPU-hour is outside \[0, 1e\+06\]"),
    (["cluster", "network", "inter_node"], {"bandwidth_GBps": 1e-20},
     r"cluster\.network\.inter_node\.bandwidth_GBps: 1e-20 GB/s is outside \[1e-06, 1e\+06\]"),
    (["cluster", "network", "inter_zone"], {"bandwidth_GBps": 5.0, "latency_s": 1e12},
     r"cluster\.network\.inter_zone\.latency_s: 1e\+12 s is outside \[0, 60\]"),
    (["cluster", "network", "egress"], {"inter_region_usd_per_GB": 1e7},
     r"cluster\.network\.egress\.inter_region_usd_per_GB: 1e\+07 USD per GB is outside"),
    (["workload", "model"], {"preset": "OPT-350M", "overrides": {"num_layers": 100_000}},
     r"workload\.model\.overrides: num_layers: .*less than or equal to 4096"),
    (["estimators"], {"iteration": "sailor"},
     r"estimators: iteration 'sailor' needs time: sailor and memory: sailor \(got time: analytic"),
    (["base_dir"], "/nonexistent", r"base_dir: not a field of instance files"),
    (["cluster", "gpu_overrides"], {"A100-40": {"memory_gib": 1e300}},  # overflowed the byte count: exit 70
     r"cluster\.gpu_overrides\.A100-40\.memory_gib: 1e\+300 GiB is outside \[1e-06, 1e\+06\]"),
    (["cluster", "gpu_overrides"], {"V100-16": {"peak_fp16_tflops": 1e-300}},
     r"cluster\.gpu_overrides\.V100-16\.peak_fp16_tflops: 1e-300 TFLOP/s is outside \[1e-09, 1e\+09\]"),
], ids=["1.6 M GPUs", "price 1e308", "bandwidth 1e-20", "latency 1e12", "egress 1e7", "100,000 layers",
        "sailor iteration alone", "base_dir", "memory 1e300 GiB", "fp16 1e-300 TFLOP/s"])
def test_figures_beyond_any_cluster(path, value, pattern):
    rejected(mutated(path, value), pattern)


@pytest.mark.parametrize("path, value", [
    (["cluster", "node_groups", 0, "count"], 249_998),  # 4-GPU nodes, with the 8 V100s: 1,000,000 GPUs
    (["cluster", "node_groups", 0, "price_per_gpu_hour_usd"], 1e6),
    (["cluster", "network", "inter_zone"], {"bandwidth_GBps": 1e-6, "latency_s": 60.0}),
    (["workload", "model"], {"preset": "OPT-350M", "overrides": {"num_layers": 4096}}),
    (["estimators"], {"preset": "sailor", "iteration": "sailor"}),
], ids=["1,000,000 GPUs", "price 1e6", "slowest link", "4,096 layers", "sailor preset"])
def test_the_edges_of_those_ranges_are_accepted(path, value):
    data = mutated(path, value)
    if path[-1] == "count":
        assert sum(g["count"] * g["gpus_per_node"] for g in data["cluster"]["node_groups"]) == 1_000_000
    instance_from_dict(data)


def test_validate_builds_the_estimators(tmp_path):
    """`validate` refuses what `solve` would: an unknown estimator, a bad option."""
    assert_cli_error(["validate", str(write(tmp_path, mutated(["estimators"], {"time": "bogus"})))],
                     "estimators.time: unknown estimator 'bogus'")
    assert_cli_error(["validate", str(write(tmp_path, mutated(["estimators"], {"options": {"mfu": {"A100-40": 0}}})))],
                     "estimators.options.mfu.A100-40: must be a share of peak in (0, 1], got 0")


def test_plan_replica_in_a_zone_the_cluster_lacks(a100_v100):
    """It used to read "no node of A100-40 in mars has 1 free GPUs left", as if the zone were full."""
    plan = copy.deepcopy(PLAN)
    plan["stages"][0]["replicas"][0]["zone"] = "mars"
    with pytest.raises(PlanError, match=r"stages\[0\]\.replicas\[0\]\.zone: zone 'mars' is not in the cluster "
                                        r"\(has \['us-central1-a'\]\)"):
        validate_plan(a100_v100, plan_from_dict(plan))


def test_missing_profile_file_names_its_field(tmp_path):
    from hetplan.errors import EstimatorError
    from hetplan.estimators import build_estimators

    data = mutated(["workload", "profiles"], [{"gpu_type": "A100-40", "path": "nope.json"}])
    data["estimators"] = {"time": "profile"}
    inst = instance_from_dict(data, base_dir=str(tmp_path))
    with pytest.raises(EstimatorError, match=r"workload\.profiles\[0\]\.path: file not found: .*nope\.json"):
        build_estimators(inst)


def test_a_key_beside_a_yaml_merge_overrides_it(tmp_path):
    """`<<: *anchor` then the same key: YAML's override, not a key given twice."""
    from hetplan.instance import read_structured

    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {count: 1, zone: z}\ngroup:\n  <<: *b\n  count: 2\n")
    assert read_structured(path) == {"base": {"count": 1, "zone": "z"}, "group": {"count": 2, "zone": "z"}}


def test_a_bad_replica_is_one_problem_not_two():
    """pydantic also reports the replicas tuple as empty when an item fails; the message said
    "...tp: Input should be greater than or equal to 1; stages[0].replicas: Tuple should have at least
    1 item", a false second clause. An empty tuple is still reported."""
    plan = copy.deepcopy(PLAN)
    plan["stages"][0]["replicas"][0]["tp"] = 0
    with pytest.raises(PlanError) as err:
        plan_from_dict(plan)
    assert str(err.value) == "stages[0].replicas[0].tp: Input should be greater than or equal to 1"
    plan["stages"][0]["replicas"] = []
    with pytest.raises(PlanError, match=r"^stages\[0\]\.replicas: Tuple should have at least 1 item"):
        plan_from_dict(plan)
