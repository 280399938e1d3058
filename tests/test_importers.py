"""Importers: Sailor's real data files (read from ../shared/reference/sailor, skipped when absent),
hand-made Metis fixtures (tests/fixtures/metis), the hetplan profile format, and malformed input.

Expected numbers are read by hand from the files and quoted next to each assertion.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hetplan.errors import EstimatorError, InstanceError
from hetplan.importers import load_profiles
from hetplan.importers.metis import match_device, parse_metis_filename, read_metis_dir, read_metis_file
from hetplan.importers.sailor import (read_availability_trace, read_egress_prices, read_homo_network_coeffs,
                                      read_intra_node_bandwidths, read_llm_info, read_node_groups,
                                      read_sailor_profile, read_training_config, read_zone_bandwidths,
                                      sailor_instance_dict)
from hetplan.instance import instance_from_dict
from hetplan.profiles import (BandwidthFit, GpuProfile, MemoryMeasurement, ProfileSet, TimeMeasurement, UnitMemory,
                              UnitTime)

REPO = Path(__file__).resolve().parents[1]
METIS = Path(__file__).resolve().parent / "fixtures" / "metis"


def sailor_dir() -> Path:
    shared = Path(os.environ.get("HETPLAN_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
    return shared / "reference" / "sailor"


SAILOR = sailor_dir()
needs_sailor = pytest.mark.skipif(not (SAILOR / "profiles").is_dir(), reason=f"Sailor reference data absent ({SAILOR})")


# ---- Sailor: profiles and model info ----------------------------------------------------------------
@needs_sailor
def test_sailor_profile_values_match_the_file():
    p = read_sailor_profile(SAILOR / "profiles/OPT-350/A100-40/profile.json")
    assert (p.gpu_type, p.model, p.num_units) == ("A100-40", "OPT-350", 26)  # 24 blocks + embedding + head
    assert p.tp_degrees == [1, 2, 4] and p.microbatches(1) == [1, 2, 4, 8]
    # "1" -> "1" -> "1": [0.002786, 0.005906, 0.002938]
    assert p.time(1, 1).units[1] == UnitTime(0.002786, 0.005906)
    assert p.time(1, 1).update_s == 0.002938
    # "1" -> "1" -> "0": [0.0004, 3e-06, 0.002938] (embedding), "25": [0.004508, 0.003989, ...] (head)
    assert p.time(1, 1).units[0] == UnitTime(0.0004, 3e-06)
    assert p.time(1, 1).units[25] == UnitTime(0.004508, 0.003989)
    # "8" -> "1" -> "1": [0.016615, 0.044968, 0.002947]
    assert p.time(8, 1).units[1] == UnitTime(0.016615, 0.044968)
    v100 = read_sailor_profile(SAILOR / "profiles/OPT-350/V100-16/profile.json")
    assert v100.tp_degrees == [1, 2, 4, 8] and v100.microbatches(1) == [1, 2, 4]  # "8" has no tp "1"


@needs_sailor
def test_sailor_llm_info_parameters_and_activations():
    mem = {m.tp: m for m in read_llm_info(SAILOR / "model/llm_info.json", "OPT-350")}
    assert sorted(mem) == [1, 2, 4, 8] and all(m.microbatch == 1 for m in mem.values())
    block = mem[1].units[1]
    # OPT-350 block, h = 1024: 12 h^2 + 13 h = 12 * 1048576 + 13 * 1024 = 12596224 parameters
    assert block.params_per_gpu == 12 * 1024**2 + 13 * 1024 == 12596224
    assert block.params_bytes == 50384896 and block.activation_bytes == 360726528
    assert block.output_bytes == 8388608  # act_output_bytes = 2048 x 1024 elements x 4 bytes
    assert mem[2].units[1].params_per_gpu == 6301184  # file: tp "2", unit "1"
    neo = {m.tp: m for m in read_llm_info(SAILOR / "model/llm_info.json", "GPT-Neo-2.7")}
    assert neo[1].units[1].params_per_gpu == 12 * 2560**2 + 13 * 2560  # 78676480, h = 2560
    with pytest.raises(InstanceError, match="'Llama-9'.*OPT-350"):
        read_llm_info(SAILOR / "model/llm_info.json", "Llama-9")


@needs_sailor
def test_sailor_profile_with_memory_and_hetplan_round_trip(tmp_path):
    p = read_sailor_profile(SAILOR / "profiles/GPT-Neo-2.7/V100-16/profile.json", llm_info=SAILOR / "model/llm_info.json")
    assert p.num_units == 34 and p.memory_at(1).units[1].params_per_gpu == 78676480
    path = tmp_path / "neo.json"
    ProfileSet((p,)).to_json(path)
    back = ProfileSet.from_json(path)
    assert back == ProfileSet((p,))  # exact: every float survives the JSON round trip
    assert load_profiles(path, "hetplan", "V100-16").get("V100-16") == p


# ---- Sailor: network ---------------------------------------------------------------------------------
@needs_sailor
def test_sailor_zone_polynomial_evaluated_by_hand():
    fits = read_zone_bandwidths(SAILOR / "network/multizone_bandwidths_het.json")
    fit = fits[("us-central1-a", "A100-40", 1, "us-central1-a", "A100-40", 1)]
    # file: [[-0.0024414231124647644, 0.1408627339370467, 1.116822757126346], 2420367713.517156]
    c0, c1, c2, cap = -0.0024414231124647644, 0.1408627339370467, 1.116822757126346, 2420367713.517156
    assert fit == BandwidthFit(c0, c1, c2, cap)
    # 256 MB: x = log2(256e6 / 1e6) = 8 -> -0.15625108 + 1.12690187 + 1.11682276 = 2.08747355 GB/s
    assert fit.bandwidth_Bps(256e6) == pytest.approx(2.08747355e9, rel=1e-8)
    assert fit.bandwidth_Bps(256e6) == pytest.approx((c0 * 64 + c1 * 8 + c2) * 1e9, rel=1e-12)
    # 32.768 GB: x = 15 -> raw 2.68 GB/s, above the 2.42 GB/s cap
    assert fit.raw_GBps(15) == pytest.approx(2.680443565877475)
    assert fit.bandwidth_Bps(2**15 * 1e6) == cap
    # below 1 MB the raw fit goes negative (x = -10: -0.536 GB/s); the guard uses the 1 MB value c2
    assert fit.raw_GBps(-10) < 0 and fit.bandwidth_Bps(1e3) == pytest.approx(c2 * 1e9)


@needs_sailor
def test_sailor_concave_fit_is_held_at_its_vertex():
    fits = read_zone_bandwidths(SAILOR / "network/multizone_bandwidths_het.json")
    fit = fits[("us-central1-a", "A100-40", 4, "us-central1-a", "A100-40", 4)]
    # file: [[-0.03667895496478979, 0.4773282044079026, 4.5592610071684785], 6035913051.04673]
    # vertex x* = 0.47733 / (2 x 0.03668) = 6.507; peak 4.5593 + 0.47733^2 / (4 x 0.03668) = 6.112 GB/s,
    # above the cap, so from x* on the bandwidth is the cap. At x = 16 the raw fit has fallen to 2.81 GB/s.
    assert fit.raw_GBps(16) == pytest.approx(-0.03667895496478979 * 256 + 0.4773282044079026 * 16 + 4.5592610071684785)
    assert fit.raw_GBps(16) < 3.0
    assert fit.bandwidth_Bps(2**16 * 1e6) == 6035913051.04673 == fit.peak_Bps
    # x = 2 (4 MB): -0.14672 + 0.95466 + 4.55926 = 5.36720 GB/s, below the cap
    assert fit.bandwidth_Bps(4e6) == pytest.approx(5.36720e9, rel=1e-5)
    # the whole table: 5 zones; V100 in us-west1-b reachable from A100 in us-central1-a
    assert ("us-central1-a", "A100-40", 4, "us-west1-b", "V100-16", 4) in fits
    assert len({k[0] for k in fits}) == 5


@needs_sailor
def test_sailor_intra_node_and_homo_tables():
    intra = read_intra_node_bandwidths(SAILOR / "network/intra_node_bandwidths.json")
    # A100-40 "2": [[0.80818532, 16.40103598, 32.98046678], 248876169884.0839]
    fit = intra[("A100-40", 2)]
    # 64 MB: x = 6 -> 0.80818532 * 36 + 16.40103598 * 6 + 32.98046678 = 160.4815 GB/s
    assert fit.bandwidth_Bps(64e6) == pytest.approx(160.4815e9, rel=1e-6)
    assert sorted(c for g, c in intra if g == "RTX-2080") == [2, 4, 8]
    homo = read_homo_network_coeffs(SAILOR / "network/network_coeffs_all_homo.json")
    # inter A100-40 "1" is the same fit as the het table's same-zone A100 -> A100 count-1 entry
    assert homo[("inter", "A100-40", 1)].c2 == 1.116822757126346


@needs_sailor
def test_sailor_egress_table_maps_to_prices():
    egress = read_egress_prices(SAILOR / "network/communication_cost_gcp_usd_per_GB.json")
    prices = {p.zones: p.usd_per_GB for p in egress.pairs}
    assert len(prices) == 5 * 4  # diagonal (0.0, same zone) left out: traffic inside a zone is free
    assert prices[("us-central1-a", "us-central1-b")] == 0.01  # same region
    assert prices[("us-central1-f", "us-west1-b")] == 0.02  # across regions
    assert prices[("us-west1-b", "us-central1-c")] == 0.02
    assert (egress.inter_zone_usd_per_GB, egress.inter_region_usd_per_GB) == (0.01, 0.02)


# ---- Sailor: workload, cluster, traces -----------------------------------------------------------------
@needs_sailor
def test_sailor_training_configs_to_workload_fields():
    opt = read_training_config(SAILOR / "training/training_config_opt_350.json")
    # global_batch_size 1024, hidden 1024, 16 heads, 24 layers, vocab 50272: the OPT-350M preset exactly
    assert opt == {"model": {"preset": "OPT-350M", "overrides": {}}, "global_batch_size": 1024, "optimizer": "adam"}
    neo = read_training_config(SAILOR / "training/training_config_gpt_neo27.json")
    # Sailor's GPT-Neo-2.7 file says 32 heads and vocab 128256 (preset: 20 heads, 50257), which Sailor
    # never reads: its model is llm_info.json, whose embedding unit is a 50,304-token vocabulary
    assert neo["model"] == {"preset": "GPT-Neo-2.7B", "overrides": {}}
    assert neo["global_batch_size"] == 2048
    from hetplan.catalog import model_presets
    from hetplan.estimators.model_stats import unit_params

    arch = model_presets()["GPT-Neo-2.7B"]
    llm_info = json.loads((SAILOR / "model/llm_info.json").read_text())["GPT-Neo-2.7"]["1"]
    for unit in (0, 1, arch.num_layers):  # the embedding (vocabulary padded to 50,304) and blocks, within 0.1 %
        assert unit_params(arch, unit).total == pytest.approx(llm_info[str(unit)]["params_floats"], rel=1e-3)


@needs_sailor
def test_sailor_quotas_to_node_groups():
    groups = read_node_groups(SAILOR / "cluster/quotas_dict.json", SAILOR / "cluster/basic_cluster_config.json")
    by_name = {g["name"]: g for g in groups}
    assert len(groups) == 10  # 2 GPU types x 5 zones
    # A100-40 quota in us-central1-a: 150 GPUs, 4 per VM -> 37 whole nodes; price: Sailor simulator's table
    assert by_name["A100-40_us-central1-a"] == {"name": "A100-40_us-central1-a", "gpu_type": "A100-40",
                                                 "gpus_per_node": 4, "count": 37, "zone": "us-central1-a",
                                                 "price_per_gpu_hour_usd": 3.673385}
    assert by_name["V100-16_us-central1-b"]["count"] == 12  # 50 // 4
    only = read_node_groups(SAILOR / "cluster/quotas_dict.json", SAILOR / "cluster/basic_cluster_config.json",
                            gpu_types=["V100-16"], zones=["us-west1-b"])
    assert [g["name"] for g in only] == ["V100-16_us-west1-b"]
    with pytest.raises(InstanceError, match="no price per GPU-hour for 'V100-16'"):
        read_node_groups(SAILOR / "cluster/quotas_dict.json", SAILOR / "cluster/basic_cluster_config.json",
                         prices={"A100-40": 3.0})


@needs_sailor
def test_sailor_trace_gives_events_relative_to_first_row():
    events = read_availability_trace(SAILOR / "cluster/gpu_trace_heterogeneous_imbalanced.csv")
    # rows: 1712574014.0187 -> (32, 96); 1712574137.19241 -> (80, 240); 1712574258.52282 -> (128, 384)
    got = [(round(e.time_s, 5), e.gpu_type, e.zone, e.available_gpus) for e in events]
    assert got == [(0.0, "A100-40", "us-central1-a", 32), (0.0, "V100-16", "us-central1-a", 96),
                   (123.17371, "A100-40", "us-central1-a", 80), (123.17371, "V100-16", "us-central1-a", 240),
                   (244.50412, "A100-40", "us-central1-a", 128), (244.50412, "V100-16", "us-central1-a", 384)]
    one_row = read_availability_trace(SAILOR / "cluster/gpu_trace_2zones_2gpus.csv")
    assert {(e.gpu_type, e.zone) for e in one_row} == {("A100-40", "us-central1-a"), ("A100-40", "us-central1-b"),
                                                      ("V100-16", "us-central1-a"), ("V100-16", "us-central1-b")}
    assert all(e.time_s == 0 and e.available_gpus == 128 for e in one_row)


def test_trace_changes_only(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(",Timestamp,A100-40_z-a,V100-16_z-a\n0,100.0,4,8\n1,160.5,4,0\n2,200,8,0")
    events = read_availability_trace(trace, changes_only=True)
    assert [(e.time_s, e.gpu_type, e.available_gpus) for e in events] == [
        (0.0, "A100-40", 4), (0.0, "V100-16", 8), (60.5, "V100-16", 0), (100.0, "A100-40", 8)]


@needs_sailor
def test_sailor_instance_dict_loads_and_matches_the_files():
    inst = instance_from_dict(sailor_instance_dict(SAILOR, "OPT-350"))
    assert inst.model_arch.name == "OPT-350M" and inst.workload.global_batch_size == 1024
    assert inst.gpu_types == ["A100-40", "V100-16"]
    # quotas: A100 150+50+100+50+100, V100 the same, in whole 4-GPU nodes: 2 x (37+12+25+12+25) x 4
    assert inst.total_gpus == 2 * (37 + 12 + 25 + 12 + 25) * 4 == 888
    assert inst.gpu("A100-40").memory_bytes == pytest.approx(42338615296, abs=1)  # basic_cluster_config
    assert {p.gpu_type for p in inst.workload.profiles} == {"A100-40", "V100-16"}
    pairs = {p.zones: p.usd_per_GB for p in inst.cluster.network.egress.pairs}
    assert pairs[("us-central1-a", "us-west1-b")] == 0.02
    traced = instance_from_dict(sailor_instance_dict(SAILOR, "GPT-Neo-2.7", trace="2zones_2gpus"))
    # the trace has 128 GPUs of each type in us-central1-{a,b}: 4 groups of 32 nodes
    assert sorted((g.name, g.count) for g in traced.cluster.node_groups) == [
        ("A100-40_us-central1-a", 32), ("A100-40_us-central1-b", 32),
        ("V100-16_us-central1-a", 32), ("V100-16_us-central1-b", 32)]
    assert len(traced.events.availability) == 4 and traced.model_arch.num_heads == 20  # the preset: Sailor reads none
    with pytest.raises(InstanceError, match="no profile of 'OPT-350' for \\['H100'\\]"):
        sailor_instance_dict(SAILOR, "OPT-350", gpu_types=["H100"])


# ---- malformed Sailor files ------------------------------------------------------------------------
def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _profile_doc(n_units: int = 3) -> dict:
    return {"1": {"1": {str(u): [0.001, 0.002, 0.0005] for u in range(n_units)}}}


def test_malformed_sailor_profile_names_file_and_key(tmp_path):
    doc = _profile_doc()
    doc["1"]["1"]["2"] = [0.001, "fast", 0.0005]
    path = _write(tmp_path / "OPT-350" / "A100-40" / "profile.json", doc)
    with pytest.raises(InstanceError) as err:
        read_sailor_profile(path)
    assert str(path) in str(err.value) and "1.1.2.1" in str(err.value) and "'fast'" in str(err.value)

    doc = _profile_doc()
    doc["1"]["1"]["1"] = [0.001, 0.002]
    with pytest.raises(InstanceError, match=r"1\.1\.1: expected \[fwd_s, bwd_s, update_s\]"):
        read_sailor_profile(_write(tmp_path / "p2.json", doc))
    doc = _profile_doc()
    del doc["1"]["1"]["1"]
    with pytest.raises(InstanceError, match=r"without gaps; missing \[1\]"):
        read_sailor_profile(_write(tmp_path / "p3.json", doc))
    doc = {"one": _profile_doc()["1"]}
    with pytest.raises(InstanceError, match=r"p4.json: one: expected an integer key"):
        read_sailor_profile(_write(tmp_path / "p4.json", doc))
    doc = _profile_doc()
    doc["2"] = {"1": {"0": [0.1, 0.1, 0.1]}}
    with pytest.raises(InstanceError, match="disagree on the number of layer units"):
        read_sailor_profile(_write(tmp_path / "p5.json", doc))
    with pytest.raises(InstanceError, match="invalid JSON at line 1"):
        read_sailor_profile(_write(tmp_path / "p6.json", "{\"1\": "))
    with pytest.raises(InstanceError, match="file not found"):
        read_sailor_profile(tmp_path / "nope.json")


def test_malformed_sailor_side_files_name_the_key(tmp_path):
    info = {"M": {"1": {"0": {"params_floats": 10, "act_mem_bytes": 4, "act_output_bytes": 4},
                        "1": {"act_mem_bytes": 4, "act_output_bytes": 4}}}}
    with pytest.raises(InstanceError, match=r"llm.json: M\.1\.1: missing key 'params_floats'"):
        read_llm_info(_write(tmp_path / "llm.json", info), "M")
    # a negative count was accepted (negative memory downstream), then blamed on profile.json
    info["M"]["1"]["1"]["params_floats"] = -12596224
    with pytest.raises(InstanceError, match=r"llm2.json: M\.1\.1\.params_floats: expected a number >= 0, got -12596224"):
        read_llm_info(_write(tmp_path / "llm2.json", info), "M")
    bw = {"z": {"A100-40": {"1": {"z": {"A100-40": {"1": [[1.0, 2.0], 5e9]}}}}}}
    with pytest.raises(InstanceError, match=r"bw.json: z\.A100-40\.1\.z\.A100-40\.1: expected \[\[c0, c1, c2\]"):
        read_zone_bandwidths(_write(tmp_path / "bw.json", bw))
    bw = {"z": {"A100-40": {"1": {"z": {"A100-40": {"1": [[1.0, 2.0, 3.0], -5]}}}}}}
    with pytest.raises(InstanceError, match=r"bw2.json: z\.A100-40\.1\.z\.A100-40\.1\.1: max bytes/s must be > 0"):
        read_zone_bandwidths(_write(tmp_path / "bw2.json", bw))
    with pytest.raises(InstanceError, match=r"cost.json: a\.b: a price must be >= 0"):
        read_egress_prices(_write(tmp_path / "cost.json", {"a": {"a": 0.0, "b": -0.01}}))
    with pytest.raises(InstanceError, match=r"train.json: missing key 'heads'"):
        read_training_config(_write(tmp_path / "train.json", {"global_batch_size": 8, "hidden_size": 64,
                                                               "sequence_length": 16, "num_layers": 2,
                                                               "vocab_size": 100, "model": "x"}))
    with pytest.raises(InstanceError, match=r"homo.json: cross: expected 'inter' or 'intra'"):
        read_homo_network_coeffs(_write(tmp_path / "homo.json", {"cross": {}}))


def test_malformed_traces_name_line_and_column(tmp_path):
    with pytest.raises(InstanceError, match="missing column 'Timestamp'"):
        read_availability_trace(_write(tmp_path / "a.csv", ",Time,A100-40_z\n0,1,2\n"))
    with pytest.raises(InstanceError, match=r"b.csv: line 3\.A100-40_z: expected a number, got 'x'"):
        read_availability_trace(_write(tmp_path / "b.csv", ",Timestamp,A100-40_z\n0,1,2\n1,2,x\n"))
    with pytest.raises(InstanceError, match=r"c.csv: A100: expected a column named <GPU>_<zone>"):
        read_availability_trace(_write(tmp_path / "c.csv", ",Timestamp,A100\n0,1,2\n"))
    with pytest.raises(InstanceError, match="time goes backwards"):
        read_availability_trace(_write(tmp_path / "d.csv", ",Timestamp,A100-40_z\n0,5,2\n1,4,2\n"))
    with pytest.raises(InstanceError, match=r"line 2\.A100-40_z: expected a GPU count, got '2.5'"):
        read_availability_trace(_write(tmp_path / "e.csv", ",Timestamp,A100-40_z\n0,5,2.5\n"))


# ---- Metis -------------------------------------------------------------------------------------------
def test_metis_file_names():
    assert parse_metis_filename("DeviceType.A100_tp2_bs4.json") == ("A100", 2, 4)
    assert parse_metis_filename("DeviceType.RTX_3090_tp1_bs8.json") == ("RTX_3090", 1, 8)
    assert parse_metis_filename("profile.json") is None
    assert match_device(["A100", "V100"], "A100-40") == "A100"
    assert match_device(["A10", "A100"], "A100-80") == "A100" and match_device(["A10", "A100"], "A10G") == "A10"
    assert match_device(["A100", "V100"], "H100") is None and match_device(["T4"], "anything") == "T4"


def test_metis_fixtures_parse():
    profiles = read_metis_dir(METIS)
    assert profiles.gpu_types == ["A100", "V100"]
    a100 = profiles.get("A100")
    assert a100.model == "tiny-gpt" and a100.num_units == 4
    assert a100.tp_degrees == [1, 2] and a100.microbatches(1) == [1, 2, 4] and a100.microbatches(2) == [1]
    m = a100.time(2, 1)  # A100 tp1 bs2: layer_compute_total_ms 0.6, 5.4, 5.4, 1.2; optimizer 6.0 ms
    assert m.units[1].fwd_s == pytest.approx(5.4e-3 / 3) and m.units[1].bwd_s == pytest.approx(5.4e-3 * 2 / 3)
    assert m.update_s == pytest.approx(6.0e-3)
    assert m.overhead_s == pytest.approx((13.2 - 12.6) * 1e-3)  # forward_backward_time_ms - sum of units
    mem = a100.memory_at(2)  # tp 2: parameters split over the TP group, memory MiB 5/10/10/15
    assert [u.params_bytes for u in mem.units] == [2000, 1000, 1000, 2000]
    assert mem.units[3].total_bytes == 15 * 2**20
    assert profiles.get("V100").memory == ()  # no parameter or memory lists in the V100 files
    renamed = read_metis_dir(METIS, device_names={"A100": "A100-40"})
    assert renamed.gpu_types == ["A100-40", "V100"]
    half = read_metis_dir(METIS, fwd_fraction=0.5).get("V100").time(1, 1).units[1]
    assert half.fwd_s == half.bwd_s == pytest.approx(4.5e-3)
    via_loader = load_profiles(METIS, "metis", "V100-16")  # 'V100' is the device V100-16 starts with
    assert via_loader.gpu_types == ["V100-16"] and via_loader.get("V100-16").time(2, 1).update_s == pytest.approx(0.012)


def test_metis_malformed_and_quirky_files(tmp_path):
    good = json.loads((METIS / "DeviceType.A100_tp1_bs1.json").read_text())
    doc = json.loads(json.dumps(good))
    del doc["execution_time"]["optimizer_time_ms"]
    path = _write(tmp_path / "m1" / "DeviceType.A100_tp1_bs1.json", doc)
    with pytest.raises(InstanceError) as err:
        read_metis_dir(path.parent)
    assert str(path) in str(err.value) and "execution_time.optimizer_time_ms" in str(err.value)
    doc = json.loads(json.dumps(good))
    doc["model"]["num_layers"] = 5
    with pytest.raises(InstanceError, match=r"model\.num_layers: says 5 layer units"):
        read_metis_file(_write(tmp_path / "m2" / "DeviceType.A100_tp1_bs1.json", doc))
    doc = json.loads(json.dumps(good))
    doc["execution_time"]["layer_compute_total_ms"][2] = -1
    with pytest.raises(InstanceError, match=r"layer_compute_total_ms\[2\]: expected a number >= 0"):
        read_metis_file(_write(tmp_path / "m3" / "DeviceType.A100_tp1_bs1.json", doc))
    with pytest.raises(InstanceError, match="no DeviceType"):
        read_metis_dir(_write(tmp_path / "m4" / "other.json", "{}").parent)
    # Metis' own samples list 9 memory entries for 10 layers: the memory list is dropped, with a warning
    doc = json.loads(json.dumps(good))
    doc["execution_memory"]["layer_memory_total_mb"] = [10, 20, 20]
    with pytest.warns(UserWarning, match="execution_memory.layer_memory_total_mb has 3 entries for 4 layer units"):
        _, _, memory, _ = read_metis_file(_write(tmp_path / "m5" / "DeviceType.A100_tp1_bs1.json", doc))
    assert memory.units[0].total_bytes is None and memory.units[0].params_bytes == 4000
    with pytest.raises(InstanceError, match="no Metis device matches GPU type 'H100'"):
        load_profiles(METIS, "metis", "H100")


# ---- hetplan format ------------------------------------------------------------------------------------
def test_hetplan_format_round_trip_and_errors(tmp_path):
    profiles = read_metis_dir(METIS)
    path = tmp_path / "p.json"
    profiles.to_json(path)
    assert ProfileSet.from_json(path) == profiles
    assert load_profiles(path, "hetplan", "A100").gpu_types == ["A100"]
    with pytest.raises(EstimatorError, match=r"p.json: no profile for GPU type 'H100'; the file has \['A100', 'V100'\]"):
        load_profiles(path, "hetplan", "H100")
    doc = profiles.to_dict()
    doc["profiles"][0]["times"][1]["bwd_s"] = doc["profiles"][0]["times"][1]["bwd_s"][:2]
    with pytest.raises(InstanceError, match=r"profiles\[0\]\.times\[1\]: one value per layer unit in each list, got "
                                            r"fwd_s 4, bwd_s 2$"):
        ProfileSet.from_dict(doc)
    doc = profiles.to_dict()  # a short fwd_s was blamed on bwd_s ("bwd_s: expected 3 values, got 4")
    doc["profiles"][0]["times"][1]["fwd_s"] = doc["profiles"][0]["times"][1]["fwd_s"][:3]
    with pytest.raises(InstanceError, match=r"times\[1\]: one value per layer unit in each list, got fwd_s 3, bwd_s 4$"):
        ProfileSet.from_dict(doc)
    doc = profiles.to_dict()
    doc["format"] = "sailor"
    with pytest.raises(InstanceError, match="unknown format 'sailor'"):
        ProfileSet.from_dict(doc)
    with pytest.raises(InstanceError, match="unknown profile format 'csv'"):
        load_profiles(path, "csv", "A100")
    with pytest.raises(InstanceError, match=r"repeated \(microbatch, tp\) measurements \[\(1, 1\)\]"):
        m = TimeMeasurement(1, 1, (UnitTime(1.0, 2.0),), 0.1)
        GpuProfile("X", (m, m))
    with pytest.raises(InstanceError, match="times must be finite, >= 0 and at most 86400 s"):
        GpuProfile("X", (TimeMeasurement(1, 1, (UnitTime(-1.0, 2.0),), 0.1),))
    # a unit of 1e300 s printed an inf iteration time; all units at 0 s divided by zero downstream
    with pytest.raises(InstanceError, match="times must be finite, >= 0 and at most 86400 s"):
        GpuProfile("X", (TimeMeasurement(1, 1, (UnitTime(1e300, 2.0),), 0.1),))
    with pytest.raises(InstanceError, match=r"microbatch 1, tp 1: every unit takes 0 s"):
        GpuProfile("X", (TimeMeasurement(1, 1, (UnitTime(0.0, 0.0), UnitTime(0.0, 0.0)), 0.1),))
    GpuProfile("X", (TimeMeasurement(1, 1, (UnitTime(0.0, 0.0), UnitTime(1e-6, 0.0)), 0.1),))  # one unit > 0
    ok = TimeMeasurement(1, 1, (UnitTime(1.0, 2.0),), 0.1)
    with pytest.raises(InstanceError, match=r"memory at microbatch 1, tp 1: memory figures must be finite and >= 0"):
        GpuProfile("X", (ok,), (MemoryMeasurement(1, 1, (UnitMemory(params_per_gpu=-5.0),)),))
    with pytest.raises(InstanceError, match=r"more than one profile for GPU types \['A100'\]"):
        profiles.merged(profiles.get("A100"))


def test_no_reference_data_copied_into_the_repository():
    """Sailor's files are read from ../shared; none may be committed (or left) inside the project."""
    forbidden = {"profile.json", "llm_info.json"}
    if shutil.which("git") and (REPO / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "--others", "--cached", "--exclude-standard"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.split()
        names = [Path(p).name for p in listed]
    else:
        names = [p.name for p in REPO.rglob("*.json")]
    bad = [n for n in names if n in forbidden or (n.startswith("multizone_bandwidths") and n.endswith(".json"))]
    assert bad == []


@pytest.mark.parametrize("change, pattern", [
    ({"links": {"intra_node": {"latency_s": 1e-5, "bandwidth_GBps": 10.0, "allreduce_bandwidth_GBps": 0.0}}},
     r"links\.intra_node: allreduce_bandwidth_GBps must be > 0 and allreduce_latency_s >= 0"),
    ({"links": {"intra_node": {"latency_s": 1e-5, "bandwidth_GBps": 10.0, "allreduce_latency_s": -1.0}}},
     r"links\.intra_node: allreduce_bandwidth_GBps must be > 0"),
    ({"optimizer_state_bytes_per_param": -12}, r"optimizer_state_bytes_per_param: expected a number >= 0, got -12"),
], ids=["all-reduce bandwidth 0", "all-reduce latency < 0", "negative optimizer state"])
def test_profile_figures_that_scored_plans_wrongly_are_refused(change, pattern):
    """Each was accepted and scored plans (negative memory in simulate's output)."""
    base = GpuProfile("X", (TimeMeasurement(1, 1, (UnitTime(1.0, 2.0),), 0.1),)).to_dict()
    with pytest.raises(InstanceError, match=pattern):
        GpuProfile.from_dict({**base, **change})
    GpuProfile.from_dict(base)  # the control reads


@pytest.mark.parametrize("fraction", ["half", True, 0.0, 1.0])
def test_metis_forward_fraction_of_the_wrong_kind_is_named(fraction):
    """`estimators.options.metis_fwd_fraction: half` raised TypeError at the comparison (exit 70)."""
    with pytest.raises(InstanceError, match=r"fwd_fraction: must lie strictly between 0 and 1"):
        read_metis_dir(METIS, fwd_fraction=fraction)
