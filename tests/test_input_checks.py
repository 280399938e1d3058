"""Inputs that once passed silently or failed without naming their file or field (a fuzz run's
findings, session 57): each is now refused by name, or planned as it should be.

- a zone Sailor's bandwidth table lacks: every plan kept to one node (60.83 s against 26.87 s);
- a profile measured at one TP degree on 2-GPU nodes: `validate` passed, `solve` exited 1;
- a profile file's errors named its free-text `source`, an empty list named no file;
- a negative Sailor update time hid behind the max over units;
- `count: true` counted 1 node; a mistyped `estimators.options` key was ignored;
- Metis' short memory list printed Python's warning with its source line.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from hetplan.errors import EstimatorError, InstanceError
from hetplan.estimators import build_estimators
from hetplan.importers.sailor import read_sailor_profile, zone_table_gap, zone_table_gaps
from hetplan.instance import instance_from_dict, load_instance
from hetplan.orchestration.planner import PlannerOptions, plan
from hetplan.profiles import BandwidthFit, GpuProfile, ProfileSet, TimeMeasurement, UnitTime

from test_cli_contract import error_lines, executable, run

METIS = Path(__file__).resolve().parent / "fixtures" / "metis"
SHARED = Path(os.environ.get("HETPLAN_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
SAILOR = SHARED / "reference" / "sailor"
needs_sailor = pytest.mark.skipif(not (SAILOR / "profiles").is_dir(), reason=f"Sailor reference data absent ({SAILOR})")
ARCH = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 256, "vocab_size": 1000,
        "seq_len": 128}


def _doc(profiles: list[dict], gpu: str = "V100-16", **extra) -> dict:
    return {"name": "tiny",
            "cluster": {"node_groups": [{"name": "box", "gpu_type": gpu, "gpus_per_node": 2, "count": 1,
                                         "zone": "z-a", "price_per_gpu_hour_usd": 1.0}]},
            "workload": {"model": {"arch": ARCH}, "global_batch_size": 8, "precision": "fp16", "profiles": profiles},
            "estimators": {"time": "profile"}, **extra}


def _write(folder: Path, doc: dict, name: str = "tiny.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc))
    return path


# ---- Sailor's zone bandwidth table ---------------------------------------------------------------
FIT = BandwidthFit(0.0, 0.0, 10.0, 1e10)


def test_zone_table_gaps_are_the_pairs_without_a_same_zone_entry():
    fits = {("za", "A", 1, "za", "A", 1): FIT, ("za", "B", 1, "zb", "B", 1): FIT, ("zb", "B", 4, "zb", "B", 4): FIT}
    # B in za reaches zb only, not another B in za; A in zb is not in the table at all
    assert zone_table_gaps(fits, {("A", "za"), ("B", "za"), ("B", "zb"), ("A", "zb")}) == [("A", "zb"), ("B", "za")]
    text = zone_table_gap(fits, {("A", "za"), ("B", "za"), ("B", "zb"), ("A", "zb")}, "/x/table.json")
    assert zone_table_gap(fits, {("A", "za"), ("B", "zb")}, "/x/table.json") is None
    assert text.startswith("table.json has no bandwidth between A nodes in zone 'zb'") and "['za']" in text
    assert "also B@za" in text


@needs_sailor
def test_a_zone_the_table_lacks_is_refused_by_import_and_by_the_estimator(tmp_path):
    exe = executable()
    proc = run(exe, ["import", "sailor", "--model", "OPT-350", "--cluster", "A100-40@nozone=8", "-o", "x.yaml"],
               tmp_path)
    lines = error_lines(proc.stderr)
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --cluster: multizone_bandwidths_het.json has no bandwidth between A100-40 "
                               "nodes in zone 'nozone'"), lines
    assert not (tmp_path / "x.yaml").exists()
    # a file written by hand (or by an older hetplan) with such a zone: its estimator refuses it
    proc = run(exe, ["import", "sailor", "--model", "OPT-350", "--cluster", "A100-40@us-central1-a=8",
                     "-o", "x.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((tmp_path / "x.yaml").read_text())
    doc["cluster"]["node_groups"][0]["zone"] = "nozone"
    with pytest.raises(EstimatorError, match=r"^sailor: multizone_bandwidths_het.json has no bandwidth between "
                                             r"A100-40 nodes in zone 'nozone'"):
        build_estimators(instance_from_dict(doc))


@needs_sailor
def test_sailor_poly_refuses_the_zone_unless_the_homogeneous_fit_covers_it():
    from hetplan.estimators.sailor_network import SailorNetworkComm
    from hetplan.importers.sailor import sailor_instance_dict

    doc = sailor_instance_dict(SAILOR, "OPT-350", gpu_types=["A100-40"], zones=["us-central1-a"])
    doc["cluster"]["node_groups"][0]["zone"] = "nozone"
    inst = instance_from_dict(doc)
    opts = inst.estimators.options
    with pytest.raises(EstimatorError, match=r"^sailor_poly: multizone_bandwidths_het.json has no bandwidth"):
        SailorNetworkComm.from_instance(inst, opts)
    homo = SAILOR / "network" / "network_coeffs_all_homo.json"
    if homo.is_file():  # its same-zone "inter" fit of A100-40 is the estimator's fallback there
        SailorNetworkComm.from_instance(inst, {**opts, "homo_file": str(homo)})


@needs_sailor
def test_import_names_its_own_numeric_options(tmp_path):
    proc = run(executable(), ["import", "sailor", "--model", "OPT-350", "--cluster", "A100-40@us-central1-a=8",
                              "--max-cost", "0", "-o", "x.yaml"], tmp_path)
    assert proc.returncode == 1 and error_lines(proc.stderr) == [
        "error: --max-cost: must be a positive finite number, got 0"], proc.stderr


@needs_sailor
def test_import_refuses_a_partial_vm_and_writes_json_where_asked(tmp_path):
    """--cluster A100-40@...=5 wrote one 4-GPU node, and =3 beside V100s dropped the A100s, both with
    exit 0; -o x.json got YAML, which `validate x.json` then refused as invalid JSON."""
    for cluster in ("A100-40@us-central1-a=5", "A100-40@us-central1-a=3,V100-16@us-central1-a=8"):
        proc = run(executable(), ["import", "sailor", "--model", "OPT-350", "--cluster", cluster, "-o", "x.yaml"],
                   tmp_path)
        assert proc.returncode == 1 and error_lines(proc.stderr) == [
            f"error: --cluster: {cluster.split(',')[0]}: Sailor rents A100-40 in VMs of 4 GPUs; give a multiple of 4"]
    proc = run(executable(), ["import", "sailor", "--model", "GPT-9", "--cluster", "A100-40@us-central1-a=8",
                              "-o", "x.yaml"], tmp_path)
    assert proc.returncode == 1 and error_lines(proc.stderr)[0].startswith(  # it said "model:"
        "error: --model: no profiles for model 'GPT-9' under "), proc.stderr
    assert not (tmp_path / "x.yaml").exists()
    proc = run(executable(), ["import", "sailor", "--model", "OPT-350", "--cluster", "A100-40@us-central1-a=8",
                              "-o", "x.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    inst = instance_from_dict(json.loads((tmp_path / "x.json").read_text()))
    assert [(g.gpu_type, g.count * g.gpus_per_node) for g in inst.cluster.node_groups] == [("A100-40", 8)]


# ---- profiles ------------------------------------------------------------------------------------
def test_a_profile_of_one_tp_degree_plans_on_wider_nodes(tmp_path):
    # Metis' V100 fixture has TP 1 only; the nodes have 2 GPUs, so TP 2 is a choice it cannot price
    inst = load_instance(_write(tmp_path, _doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])))
    result = plan(inst, PlannerOptions(time_limit_s=20))
    assert result.plan is not None and result.status == "complete"
    assert {r.tp for s in result.plan.stages for r in s.replicas} == {1}


def _profile(gpu: str = "G") -> GpuProfile:
    units = (UnitTime(0.001, 0.002),) * 4
    return GpuProfile(gpu, (TimeMeasurement(1, 1, units, 0.01),), source="ignored text")


def test_a_profile_files_errors_name_the_file(tmp_path):
    path = tmp_path / "p.json"
    ProfileSet((_profile(),)).to_json(path)
    assert ProfileSet.from_json(path).profiles[0].source == f"{path}: profiles[0]"
    assert ProfileSet.from_json(path) == ProfileSet((_profile(),))  # where it was read from is not a figure
    doc = json.loads(path.read_text())
    doc["profiles"][0]["times"] = []
    path.write_text(json.dumps(doc))
    with pytest.raises(InstanceError, match=r"p.json: profiles\[0\]: no time measurements"):
        ProfileSet.from_json(path)
    doc["profiles"] = []
    path.write_text(json.dumps(doc))
    with pytest.raises(InstanceError, match=r"p.json: profiles: no profile in the list"):
        ProfileSet.from_json(path)


def test_a_gpu_type_missing_from_a_profile_file_names_the_file(tmp_path):
    path = tmp_path / "p.json"
    ProfileSet((_profile("G"),)).to_json(path)
    doc = _doc([{"gpu_type": "A100-40", "path": "p.json"}], gpu="A100-40")
    doc["workload"]["model"]["arch"] = {**ARCH, "num_layers": 2}
    inst = load_instance(_write(tmp_path, doc))
    with pytest.raises(EstimatorError, match=r"p.json: no profile for GPU type 'A100-40'; the file has \['G'\]"):
        build_estimators(inst)


def test_a_negative_sailor_update_time_is_refused(tmp_path):
    folder = tmp_path / "M" / "G"
    folder.mkdir(parents=True)
    entry = {"0": [0.001, 0.002, 0.5], "1": [0.001, 0.002, -0.5]}  # the max would have kept 0.5
    (folder / "profile.json").write_text(json.dumps({"1": {"1": entry}}))
    with pytest.raises(InstanceError, match=r"expected a number >= 0, got -0.5"):
        read_sailor_profile(folder / "profile.json")


def test_metis_short_memory_list_is_one_warning_line(tmp_path):
    metis = tmp_path / "metis"
    metis.mkdir()
    for f in METIS.glob("DeviceType.A100_tp1_*.json"):
        shutil.copy(f, metis / f.name)
    short = metis / "DeviceType.A100_tp1_bs1.json"
    data = json.loads(short.read_text())
    data["execution_memory"]["layer_memory_total_mb"] = data["execution_memory"]["layer_memory_total_mb"][:-1]
    short.write_text(json.dumps(data))
    _write(tmp_path, _doc([{"gpu_type": "A100-40", "path": "metis", "format": "metis"}], gpu="A100-40"))
    proc = run(executable(), ["validate", "tiny.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert error_lines(proc.stderr) == [
        f"warning: {short}: execution_memory.layer_memory_total_mb has 3 entries for 4 layer units; ignored"]


# ---- instance fields and options ------------------------------------------------------------------
@pytest.mark.parametrize("where", ["count", "gpus_per_node", "max_gpus", "global_batch_size"])
def test_a_yes_no_value_is_no_count(where):
    doc = _doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])
    target = {"count": doc["cluster"]["node_groups"][0], "gpus_per_node": doc["cluster"]["node_groups"][0],
              "global_batch_size": doc["workload"]}.get(where, doc.setdefault("constraints", {}))
    target[where] = True
    with pytest.raises(InstanceError, match=rf"{where}: expected an integer, got true"):
        instance_from_dict(doc)


def test_a_yes_no_value_is_no_count_in_a_model_or_a_plan():
    """A model override and a plan's counts read `true` as 1 and `false` as 0 (exit 0)."""
    from hetplan.errors import PlanError
    from hetplan.plan import plan_from_dict

    doc = _doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])
    doc["workload"]["model"] = {"preset": "OPT-350M", "overrides": {"num_layers": True}}
    with pytest.raises(InstanceError, match=r"^workload\.model\.overrides: num_layers: expected an integer, got true$"):
        instance_from_dict(doc)
    stage = {"layer_start": 0, "layer_end": 26, "replicas": [{"gpu_type": "V100-16", "zone": "z-a"}]}
    with pytest.raises(PlanError, match=r"num_microbatches: expected an integer, got true"):
        plan_from_dict({"num_microbatches": True, "stages": [stage]})
    with pytest.raises(PlanError, match=r"stages\[0\]\.layer_start: expected an integer, got false"):
        plan_from_dict({"num_microbatches": 1, "stages": [{**stage, "layer_start": False}]})


def test_profiles_no_chosen_estimator_reads_are_said_to_be_unused():
    """Profiles listed beside the analytic estimators were ignored without a word (a missing file too)."""
    import warnings

    doc = _doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])
    doc["estimators"] = {"time": "analytic"}
    with pytest.warns(UserWarning, match=r"^workload\.profiles lists 1 profile\(s\), but none of the chosen "
                                         r"estimators reads them \(time: analytic, memory: analytic\)"):
        build_estimators(instance_from_dict(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_estimators(instance_from_dict(_doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])))


def test_an_options_key_no_chosen_estimator_reads_is_refused(tmp_path):
    base = _doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])
    ok = {**base, "estimators": {"time": "profile", "options": {"decomposition": "linear", "allreduce": "ring",
                                                                "framework_overhead_GiB": 1,
                                                                "profile": {"decomposition": "linear"}}}}
    build_estimators(instance_from_dict(ok))  # every key is read by a chosen estimator
    for options, needle in (({"mfu": 0.4}, "'mfu' is read by none"),  # analytic time's, not profile's
                            ({"framework_overhead_gib": 0}, "'framework_overhead_gib' is read by none of the "
                             "chosen estimators (did you mean 'framework_overhead_GiB'?)"),
                            ({"profile": {"decompositon": "linear"}}, "estimators.options.profile: 'decompositon'"),
                            ({"bandwidth_file": "x.json"}, "'bandwidth_file' is read by none")):
        bad = {**base, "estimators": {"time": "profile", "options": options}}
        with pytest.raises(EstimatorError, match=re.escape(needle)):
            build_estimators(instance_from_dict(bad))


# ---- bounds: no nan from a class without a link ---------------------------------------------------
def test_no_send_costs_nothing_even_without_a_link():
    from hetplan.formulations.joint.bounds.regions import _sends_s

    got = _sends_s(np.array([0, 2]), np.array([math.inf, 1.5]))
    assert got.tolist() == [[0.0, math.inf], [0.0, 3.0]]


# ---- the command line: no option or argument means anything empty ----------------------------------
@pytest.mark.parametrize("args, named", [
    (["solve", ""], "the argument after 'solve'"),  # was ".: is a directory, not a file"
    (["replay", "elastic_small", ""], "the argument after 'elastic_small'"),
    (["run", "elastic_small", "--local", "--elastic", "--checkpoint-dir", "ck", "--events", ""], "--events"),
    (["run", "elastic_small", "--local", "--elastic", "--checkpoint-dir", "ck", "--events="], "--events"),
    (["import", "sailor", "--model", "OPT-350", "--cluster", "A100-40@us-central1-a=8", "--sailor-dir", "",
      "-o", "x.yaml"], "--sailor-dir"),
    (["solve", "elastic_small", "-o", " "], "-o"),  # wrote the plan to a file named ' '
    (["solve", "elastic_small", "--output=  "], "--output"),
])
def test_an_empty_value_is_refused_by_name(tmp_path, args, named):
    proc = run(executable(), args, tmp_path)
    assert proc.returncode == 1 and error_lines(proc.stderr) == [
        f"error: {named}: must not be empty; leave the option out for its default"], proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["count", "global_batch_size"])
def test_a_number_in_quotes_is_no_count(where):
    """pydantic's lax mode read `"num_microbatches": "3"` and `count: "2"` as numbers (exit 0 for
    simulate, compile, launch and export-plan; helper-11): a number in quotes is refused as a
    yes/no value is."""
    from hetplan.errors import PlanError
    from hetplan.plan import plan_from_dict

    doc = _doc([{"gpu_type": "V100-16", "path": str(METIS), "format": "metis"}])
    target = doc["cluster"]["node_groups"][0] if where == "count" else doc["workload"]
    target[where] = "2"
    with pytest.raises(InstanceError, match=rf"{where}: expected an integer, got the text '2'"):
        instance_from_dict(doc)
    stage = {"layer_start": 0, "layer_end": 26, "replicas": [{"gpu_type": "V100-16", "zone": "z-a"}]}
    with pytest.raises(PlanError, match=r"num_microbatches: expected an integer, got the text '3' \(a number is"):
        plan_from_dict({"num_microbatches": "3", "stages": [stage]})
