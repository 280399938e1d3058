"""Profile-based estimators: ProfileTimeEstimator ("profile") and SailorNetworkComm ("sailor_poly").

Expected values are computed by hand from the fixture / reference numbers quoted next to them.
Fixtures (tests/fixtures/metis, see its README): A100 tp1 unit 1 fwd+bwd = 3.0 / 5.4 / 10.2 ms at
microbatch 1 / 2 / 4; tp2 only at microbatch 1 (1.8 ms); Metis times are split 1/3 fwd, 2/3 bwd.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from hetplan.catalog import LinkSpec
from hetplan.errors import EstimatorError
from hetplan.estimators.base import CommEstimator, Endpoint, LayerTime, TimeEstimator
from hetplan.estimators.profile_time import ProfileTimeEstimator
from hetplan.estimators.sailor_network import SailorNetworkComm
from hetplan.importers.metis import read_metis_dir
from hetplan.importers.sailor import (read_intra_node_bandwidths, read_homo_network_coeffs, read_sailor_profile,
                                      read_zone_bandwidths, sailor_instance_dict)
from hetplan.instance import instance_from_dict, load_instance
from hetplan.profiles import GpuProfile, ProfileSet, TimeMeasurement, UnitTime

METIS = Path(__file__).resolve().parent / "fixtures" / "metis"


def sailor_dir() -> Path:
    shared = Path(os.environ.get("HETPLAN_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
    return shared / "reference" / "sailor"


SAILOR = sailor_dir()
needs_sailor = pytest.mark.skipif(not (SAILOR / "profiles").is_dir(), reason=f"Sailor reference data absent ({SAILOR})")


def ms(fwd_bwd_ms: float) -> LayerTime:
    """A Metis fixture's combined time in ms -> the LayerTime the importer makes (1/3 fwd, 2/3 bwd)."""
    return LayerTime(fwd_bwd_ms * 1e-3 / 3, fwd_bwd_ms * 1e-3 * 2 / 3)


def close(got: LayerTime, want: LayerTime) -> bool:
    return got.fwd_s == pytest.approx(want.fwd_s, rel=1e-12, abs=1e-15) and \
        got.bwd_s == pytest.approx(want.bwd_s, rel=1e-12, abs=1e-15)


@pytest.fixture(scope="module")
def metis_profiles() -> ProfileSet:
    return read_metis_dir(METIS)


# ---- ProfileTimeEstimator: microbatch rules ------------------------------------------------------------
def test_is_a_time_estimator(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles)
    assert isinstance(est, TimeEstimator) and est.name == "profile"


def test_exact_where_measured(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles)
    assert close(est.layer_time("A100", 1, 2, 1), ms(5.4))
    assert close(est.layer_time("A100", 0, 4, 1), ms(1.2))
    assert close(est.layer_time("A100", 3, 1, 2), ms(0.4))


def test_linear_interpolation_and_extrapolation(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles)
    # b = 3 between 2 and 4: 5.4 + (10.2 - 5.4) * (3 - 2) / (4 - 2) = 7.8 ms
    assert close(est.layer_time("A100", 1, 3, 1), ms(7.8))
    # b = 8 beyond 4, line through (2, 5.4) and (4, 10.2): 10.2 + 2.4 * (8 - 4) = 19.8 ms
    assert close(est.layer_time("A100", 1, 8, 1), ms(19.8))
    # V100 measured at 1 and 2 only (9.0, 17.4 ms): b = 3 -> 17.4 + 8.4 = 25.8 ms
    assert close(est.layer_time("V100", 2, 3, 1), ms(25.8))
    # tp 2 measured at b = 1 only (1.8 ms): proportional, b = 3 -> 5.4 ms
    assert close(est.layer_time("A100", 1, 3, 2), ms(5.4))


def _one_unit(*points: tuple[int, float]) -> ProfileTimeEstimator:
    times = tuple(TimeMeasurement(b, 1, (UnitTime(t, 2 * t),), 0.1) for b, t in points)
    return ProfileTimeEstimator(ProfileSet((GpuProfile("G", times),)))


def test_linear_extrapolation_stays_within_what_a_gpu_can_do():
    """Beyond the measurements, time grows with the microbatch and time per sample does not."""
    # t(2) = 1.0 s, t(4) = 4.0 s: the line gives t(1) = 1.0 - 1.5 = -0.5 s; t(1) >= t(2) / 2 = 0.5 s
    est = _one_unit((2, 1.0), (4, 4.0))
    assert est.layer_time("G", 0, 1, 1) == LayerTime(0.5, 1.0)
    assert est.layer_time("G", 0, 3, 1) == LayerTime(2.5, 5.0)  # midway: (1 + 4) / 2, as measured around it
    assert est.layer_time("G", 0, 6, 1) == LayerTime(6.0, 12.0)  # the line: 4 + 1.5 x 2 = 7 > 4 x 6 / 4 = 6
    # noise: microbatch 2 ran faster than 1 (2.0 -> 1.0 s); the line gives t(4) = -1 s; t(4) >= t(2) = 1 s
    # (it put a CPU profile's microbatch 4 at 0 s, and the planner divided by it)
    est = _one_unit((1, 2.0), (2, 1.0))
    assert est.layer_time("G", 0, 4, 1) == LayerTime(1.0, 2.0)
    est = _one_unit((2, 1.0), (4, 1.5))  # within the band: the line itself
    assert est.layer_time("G", 0, 1, 1) == LayerTime(0.75, 1.5) and est.layer_time("G", 0, 8, 1) == LayerTime(2.5, 5.0)


def test_power_of_two_decomposition(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles, decomposition="power_of_two")
    # AutoHet eq. (5): t(3) = t(2) + t(1) = 5.4 + 3.0 = 8.4 ms (linear would give 7.8)
    assert close(est.layer_time("A100", 1, 3, 1), ms(8.4))
    assert close(est.layer_time("A100", 1, 5, 1), ms(10.2 + 3.0))
    assert close(est.layer_time("A100", 1, 6, 1), ms(10.2 + 5.4))
    assert close(est.layer_time("A100", 1, 7, 1), ms(10.2 + 5.4 + 3.0))
    # 8 is not measured: estimated linearly (19.8 ms, as above); 12 = 8 + 4 -> 19.8 + 10.2 = 30.0 ms
    assert close(est.layer_time("A100", 1, 8, 1), ms(19.8))
    assert close(est.layer_time("A100", 1, 12, 1), ms(30.0))
    assert close(est.layer_time("A100", 1, 4, 1), ms(10.2))  # measured values stay exact


@needs_sailor
def test_rules_on_real_sailor_profile():
    profile = read_sailor_profile(SAILOR / "profiles/OPT-350/A100-40/profile.json")
    linear = ProfileTimeEstimator(ProfileSet((profile,)))
    binary = ProfileTimeEstimator(ProfileSet((profile,)), decomposition="power_of_two")
    # unit 1, tp 1: mbs 1 [0.002786, 0.005906], 2 [0.004599, 0.011627], 4 [0.008593, 0.022721],
    # 8 [0.016615, 0.044968]
    assert linear.layer_time("A100-40", 1, 1, 1) == LayerTime(0.002786, 0.005906)
    assert close(linear.layer_time("A100-40", 1, 3, 1), LayerTime(0.006596, 0.017174))
    assert close(binary.layer_time("A100-40", 1, 3, 1), LayerTime(0.007385, 0.017533))
    assert close(binary.layer_time("A100-40", 1, 12, 1), LayerTime(0.025208, 0.067689))
    # 16 beyond 8: 0.016615 + 2 * (0.016615 - 0.008593) = 0.032659; bwd 0.044968 + 2 * 0.022247 = 0.089462
    assert close(linear.layer_time("A100-40", 1, 16, 1), LayerTime(0.032659, 0.089462))


# ---- ProfileTimeEstimator: errors --------------------------------------------------------------------
def test_missing_gpu_or_tp_or_unit_is_named(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles)
    with pytest.raises(EstimatorError, match=r"no profile for GPU type 'H100'; profiles exist for \['A100', 'V100'\]"):
        est.layer_time("H100", 1, 1, 1)
    with pytest.raises(EstimatorError, match=r"A100 was not profiled at TP degree 4; measured TP degrees: \[1, 2\]"):
        est.layer_time("A100", 1, 1, 4)
    with pytest.raises(EstimatorError, match=r"V100 was not profiled at TP degree 2; measured TP degrees: \[1\]"):
        est.update_time_s("V100", range(0, 4), 2, 1)
    with pytest.raises(EstimatorError, match=r"layer unit 4 out of range 0\.\.3"):
        est.layer_time("A100", 4, 1, 1)
    with pytest.raises(EstimatorError, match="microbatch must be >= 1"):
        est.layer_time("A100", 1, 0, 1)
    with pytest.raises(EstimatorError, match="decomposition must be one of"):
        ProfileTimeEstimator(metis_profiles, decomposition="binary")


# ---- ProfileTimeEstimator: update time -----------------------------------------------------------------
def test_update_by_parameter_share(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles)
    # A100 tp1 optimizer 6.0, 6.0, 6.2 ms -> whole model 6.0667 ms; params bytes 4000/2000/2000/4000
    whole = (6.0 + 6.0 + 6.2) / 3 * 1e-3
    assert est.update_time_s("A100", range(0, 4), 1, 1) == pytest.approx(whole)
    assert est.update_time_s("A100", range(1, 3), 1, 1) == pytest.approx(whole * 4000 / 12000)
    assert est.update_time_s("A100", range(3, 4), 1, 8) == pytest.approx(whole / 3)  # no ZeRO: dp ignored
    zero = ProfileTimeEstimator(metis_profiles, zero_stage=1)
    assert zero.update_time_s("A100", range(3, 4), 1, 8) == pytest.approx(whole / 3 / 8)


def test_update_by_unit_count_without_memory_info(metis_profiles):
    est = ProfileTimeEstimator(metis_profiles)
    # V100 files carry no parameter lists: 12.0 ms x 1 of 4 units
    assert est.update_time_s("V100", range(0, 1), 1, 1) == pytest.approx(3.0e-3)
    assert est.update_share("V100", range(1, 4), 1) == 0.75


@needs_sailor
def test_update_share_from_sailor_llm_info():
    import json

    profile = read_sailor_profile(SAILOR / "profiles/OPT-350/A100-40/profile.json",
                                  llm_info=SAILOR / "model/llm_info.json")
    est = ProfileTimeEstimator(ProfileSet((profile,)))
    info = json.loads((SAILOR / "model/llm_info.json").read_text())["OPT-350"]["2"]
    params = [info[str(u)]["params_floats"] for u in range(26)]
    assert params[1] == 6301184  # tp 2 block
    assert est.update_share("A100-40", range(1, 25), 2) == pytest.approx(sum(params[1:25]) / sum(params))
    # whole-model update at tp 2 (mbs 1/2/4/8 give 0.0015..0.00152 s) times the blocks' share
    upd = [m.update_s for m in profile.times if m.tp == 2]
    assert est.update_time_s("A100-40", range(1, 25), 2, 1) == pytest.approx(
        sum(upd) / len(upd) * sum(params[1:25]) / sum(params))


# ---- ProfileTimeEstimator.from_instance ----------------------------------------------------------------
def _tiny_instance(tmp_path: Path, num_layers: int = 2, gpus=("A100-40",), options=None) -> Path:
    doc = {
        "name": "tiny",
        "cluster": {"node_groups": [{"name": g.lower(), "gpu_type": g, "gpus_per_node": 2, "count": 1, "zone": "z-a",
                                     "price_per_gpu_hour_usd": 1.0} for g in gpus]},
        "workload": {"model": {"arch": {"num_layers": num_layers, "hidden_size": 64, "num_heads": 4,
                                        "ffn_hidden_size": 256, "vocab_size": 1000, "seq_len": 128}},
                     "global_batch_size": 8, "precision": "fp16", "zero_stage": 1,
                     "profiles": [{"gpu_type": "A100-40", "path": os.path.relpath(METIS, tmp_path), "format": "metis"}]},
        "estimators": {"time": "profile", "options": options or {}},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_from_instance_reads_profiles_relative_to_the_instance(tmp_path):
    inst = load_instance(_tiny_instance(tmp_path, options={"profile": {"decomposition": "power_of_two"}}))
    est = ProfileTimeEstimator.from_instance(inst, inst.estimators.options)
    assert est.decomposition == "power_of_two" and est.profiles.gpu_types == ["A100-40"]
    assert close(est.layer_time("A100-40", 1, 2, 1), ms(5.4))
    assert close(est.layer_time("A100-40", 1, 3, 1), ms(8.4))
    whole = (6.0 + 6.0 + 6.2) / 3 * 1e-3  # zero_stage 1 in the instance: sharded over dp = 2
    assert est.update_time_s("A100-40", range(0, 4), 1, 2) == pytest.approx(whole / 2)


def test_from_instance_errors(tmp_path):
    inst = load_instance(_tiny_instance(tmp_path, num_layers=3))
    with pytest.raises(EstimatorError, match=r"has 4 layer units, the model custom has 5"):
        ProfileTimeEstimator.from_instance(inst, {})
    inst = load_instance(_tiny_instance(tmp_path, gpus=("A100-40", "V100-16")))
    with pytest.raises(EstimatorError, match=r"no profile for GPU types \['V100-16'\].*covers \['A100-40'\]"):
        ProfileTimeEstimator.from_instance(inst, {})


@needs_sailor
def test_from_instance_on_a_sailor_scenario():
    inst = instance_from_dict(sailor_instance_dict(SAILOR, "OPT-350"))
    est = ProfileTimeEstimator.from_instance(inst, inst.estimators.options)
    assert est.layer_time("A100-40", 1, 1, 1) == LayerTime(0.002786, 0.005906)  # profile.json "1"/"1"/"1"
    # V100-16 "1" -> "1" -> "1" read from the file directly
    v100 = read_sailor_profile(SAILOR / "profiles/OPT-350/V100-16/profile.json")
    assert est.layer_time("V100-16", 5, 2, 4) == LayerTime(*[getattr(v100.time(2, 4).units[5], f)
                                                             for f in ("fwd_s", "bwd_s")])
    assert est.profiles.get("A100-40").memory_at(1).units[1].params_per_gpu == 12596224


# ---- SailorNetworkComm ---------------------------------------------------------------------------------
NVLINK = LinkSpec(kind="nvlink", bandwidth_GBps=300, latency_s=5e-6)
LAT = {"inter_node": 1e-5, "inter_zone": 1e-4, "inter_region": 1e-2}


def ep(node: str | None, zone: str = "us-central1-a") -> Endpoint:
    return Endpoint(zone=zone, region=zone.rsplit("-", 1)[0], node_id=node, intra_node=NVLINK)


@pytest.fixture(scope="module")
def comm() -> SailorNetworkComm:
    if not (SAILOR / "network").is_dir():
        pytest.skip(f"Sailor reference data absent ({SAILOR})")
    nodes = {"a0": ("A100-40", 4), "a1": ("A100-40", 4), "a8": ("A100-40", 8), "a3": ("A100-40", 3),
             "v0": ("V100-16", 4), "vw": ("V100-16", 4), "ga": ("GH-96", 4), "e0": ("A100-40", 4), "e1": ("A100-40", 4)}
    return SailorNetworkComm(read_zone_bandwidths(SAILOR / "network/multizone_bandwidths_het.json"),
                             intra_fits=read_intra_node_bandwidths(SAILOR / "network/intra_node_bandwidths.json"),
                             homo_fits=read_homo_network_coeffs(SAILOR / "network/network_coeffs_all_homo.json"),
                             nodes=nodes, latency_s=LAT)


def test_comm_is_a_comm_estimator(comm):
    assert isinstance(comm, CommEstimator) and comm.name == "sailor_poly"


def test_p2p_same_zone_by_hand(comm):
    # (us-central1-a, A100-40, 4) -> same: [[-0.03667895496478979, 0.4773282044079026, 4.5592610071684785], 6.0359e9]
    # 4 MB, x = 2: -0.14671582 + 0.95465641 + 4.55926101 = 5.3672016 GB/s
    bw = (-0.03667895496478979 * 4 + 0.4773282044079026 * 2 + 4.5592610071684785) * 1e9
    assert bw == pytest.approx(5.3672016e9)
    assert comm.p2p_time_s(ep("a0"), ep("a1"), 4e6) == pytest.approx(1e-5 + 4e6 / bw, rel=1e-12)
    # 8-GPU VM: rounded down to the 4-GPU fit; 3-GPU VM: to the 2-GPU fit
    assert comm.p2p_time_s(ep("a8"), ep("a1"), 4e6) == comm.p2p_time_s(ep("a0"), ep("a1"), 4e6)
    # count 2: [[-0.007196511652909052, 0.2316852991952904, 2.1127137995063974], ...] at x = 2 (dst count 4 -> 4)
    bw2 = (-0.007196511652909052 * 4 + 0.2316852991952904 * 2 + 2.1127137995063974) * 1e9
    assert comm.p2p_time_s(ep("a3"), ep("a1"), 4e6) == pytest.approx(1e-5 + 4e6 / bw2, rel=1e-12)


def test_p2p_across_regions_and_link(comm):
    src, dst = ep("a0"), ep("vw", "us-west1-b")
    # (us-central1-a, A100-40, 4) -> (us-west1-b, V100-16, 4):
    # [[-0.00040892143365698735, 0.05616116161616258, 0.3759738417601813], 1091637396.6324494]
    # 64 MB, x = 6: -0.01472117 + 0.33696697 + 0.37597384 = 0.69821964 GB/s
    bw = (-0.00040892143365698735 * 36 + 0.05616116161616258 * 6 + 0.3759738417601813) * 1e9
    assert bw == pytest.approx(0.69821964e9)
    assert comm.p2p_time_s(src, dst, 64e6) == pytest.approx(1e-2 + 64e6 / bw, rel=1e-12)
    link = comm.link(src, dst)
    # the fit peaks above its 1.0916 GB/s cap (vertex x = 68.7), so the link's bandwidth is the cap
    assert link == LinkSpec(kind="wan", bandwidth_GBps=1091637396.6324494 / 1e9, latency_s=1e-2)
    assert comm.link(ep("a0"), ep("a1", "us-central1-b")).latency_s == 1e-4  # inter-zone class


def test_allreduce_ring_by_hand(comm):
    members = [ep("a0"), ep("a1"), ep("v0")]
    # ring links a0->a1 (A100 4 -> A100 4), a1->v0 and v0->a0 (A100 <-> V100, same fit
    # [[-0.008450897567554275, 0.32345407867588116, 3.446937175278422], 5.787e9]); 32 MB, x = 5:
    a100 = (-0.03667895496478979 * 25 + 0.4773282044079026 * 5 + 4.5592610071684785) * 1e9  # 6.02893 GB/s
    mixed = (-0.008450897567554275 * 25 + 0.32345407867588116 * 5 + 3.446937175278422) * 1e9  # 4.85294 GB/s
    assert mixed < a100 < 6035913051.04673
    want = 2 * 2 / 3 * 32e6 / mixed + 2 * 2 * 1e-5
    assert comm.allreduce_time_s(members, 32e6) == pytest.approx(want, rel=1e-12)
    assert comm.allreduce_time_s(members[:1], 32e6) == 0.0
    sizes = [0.0, 1e4, 32e6, 4e9]
    for group in (members, members[:1], [ep("a0")] * 3 + [ep("v0")] * 2):
        assert comm.allreduce_times_s(group, sizes) == [comm.allreduce_time_s(group, n) for n in sizes]


def test_intra_node_uses_the_intra_fit_or_the_link(comm):
    # A100-40 "2": [[0.80818532, 16.40103598, 32.98046678], 2.4888e11]; 64 MB, x = 6 -> 160.4815 GB/s
    bw = (0.80818532 * 36 + 16.40103598 * 6 + 32.98046678) * 1e9
    assert comm.p2p_time_s(ep("a0"), ep("a0"), 64e6) == pytest.approx(5e-6 + 64e6 / bw, rel=1e-12)
    no_intra = SailorNetworkComm(comm.zone_fits, nodes=comm.nodes, latency_s=LAT)
    assert no_intra.p2p_time_s(ep("a0"), ep("a0"), 64e6) == pytest.approx(5e-6 + 64e6 / 300e9)
    assert no_intra.link(ep("a0"), ep("a0")) == NVLINK


def test_missing_pairs_fall_back_or_fail_clearly(comm):
    # GH-96 appears only inside us-central1-a in the het table
    with pytest.raises(EstimatorError, match=r"\('us-central1-a', 'GH-96', 4, 'us-central1-b', 'A100-40', 4\).*"
                                             r"reaches zones \['us-central1-a'\]"):
        comm.p2p_time_s(ep("ga"), ep("a1", "us-central1-b"), 1e6)
    # a zone the table lacks, both ends in it: network_coeffs_all_homo "inter" A100-40 "4"
    homo = comm.homo_fits[("inter", "A100-40", 4)]
    assert comm.p2p_time_s(ep("e0", "europe-west4-a"), ep("e1", "europe-west4-a"), 8e6) == pytest.approx(
        1e-5 + 8e6 / homo.bandwidth_Bps(8e6))
    with pytest.raises(EstimatorError, match="cannot tell the GPU type"):
        comm.p2p_time_s(ep(None), ep("a1"), 1e6)
    default = SailorNetworkComm(comm.zone_fits, default_gpu_type="A100-40", latency_s=LAT)
    one = comm.zone_fits[("us-central1-a", "A100-40", 1, "us-central1-a", "A100-40", 1)]
    assert default.p2p_time_s(ep(None), ep(None), 4e6) == pytest.approx(1e-5 + 4e6 / one.bandwidth_Bps(4e6))


@needs_sailor
def test_comm_from_instance_on_a_sailor_scenario():
    inst = instance_from_dict(sailor_instance_dict(SAILOR, "OPT-350", zones=["us-central1-a"]))
    comm = SailorNetworkComm.from_instance(inst, inst.estimators.options)
    n0, n1 = inst.nodes[0], inst.nodes[1]
    assert (n0.gpu_type, n0.num_gpus, n1.gpu_type) == ("A100-40", 4, "A100-40")
    a = Endpoint(n0.zone, n0.region, n0.node_id, n0.intra_node)
    b = Endpoint(n1.zone, n1.region, n1.node_id, n1.intra_node)
    # 256 MB lies past the 4-GPU fit's vertex and its peak exceeds the cap: 6035913051.04673 B/s;
    # latency: the instance's default inter_node latency, 2e-5 s
    assert comm.p2p_time_s(a, b, 256e6) == pytest.approx(2e-5 + 256e6 / 6035913051.04673, rel=1e-12)
    with pytest.raises(EstimatorError, match="option 'bandwidth_file'"):
        SailorNetworkComm.from_instance(inst, {})
