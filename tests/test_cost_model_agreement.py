"""One cost model: the planner's figures against the simulator's, on tiny instances enumerated exhaustively.

The planner (`hetplan.planner.plan`) reports a bound and a gap proven on its own model
(`formulations/joint.py`); the plan it returns is scored by `simulate`. These tests hold the model
to the simulator, the reference:

  (a) on seeded random tiny instances, for both objectives, with and without a budget or a
      throughput floor: the reported bound is at most the simulator's optimum over the planner's
      modelled space (`_plan_enumerator`), and the returned plan is within the reported gap of it;
  (b) on plans of that space, the model's own evaluation (`joint.evaluate`, which scores the
      heuristics and the MILP's solutions) equals `simulate`;
  (c) one hand-built reproducer per known cause of disagreement (b), and per bound or limit check
      that is wrong on plans the model scores exactly;
  (d) `hetplan solve` does not crash when P can reach the number of layer units.

Many of them fail today (issue "One cost model"): those are marked xfail with the cause, to be
removed once the model is fixed. The reproducers (c, d) are strict: one that starts to pass fails
the suite until its mark goes. The seeded sweeps (a, b) are not strict (a time limit may bind on a
slow machine); the wider sweep runs with `pytest -m sweep`. The enumerator's own rules are checked against the
planner's (not xfail), so a failure here is the model's, not the reference's.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any

import pytest

from _plan_enumerator import TP_CHOICES, Scored, optimum, outer_choices, pools, score_space
from hetplan.errors import InfeasibleError
from hetplan.estimators import build_estimators
from hetplan.formulations import joint
from hetplan.instance import Instance, instance_from_dict
from hetplan.plan import Plan, Replica, Stage
from hetplan.planner import (Combo, PlannerOptions, PlannerResult, _quotas, _Tables, enumerate_combos, joint_inputs,
                             plan, with_sync_table)
from hetplan.simulator import SimulationReport, simulate

REL_TOL = 1e-6  # model vs simulator figures (b, c)
BOUND_TOL = 1e-9  # bound and gap (a)
GPU_TYPES = ("A100-40", "V100-16", "T4", "A10G", "H100")
NO_LATENCY = {"kind": "ethernet", "bandwidth_GBps": 12.5, "latency_s": 0.0}


# ---- instances ----------------------------------------------------------------------------------------
def random_instance(seed: int, max_gpus: int = 6, max_blocks: int = 3,
                    batches: tuple[int, ...] = (2, 4)) -> Instance:
    """2-3 GPU types, 2..max_gpus GPUs on 1-, 2- or 4-GPU nodes, in one zone, two zones of a region or
    two regions; OPT-350M cut to 2..max_blocks blocks."""
    rng = random.Random(seed)
    types = rng.sample(GPU_TYPES, rng.choice([2, 2, 3]))
    layout = rng.choice(["zone", "zone", "zone", "two_zones", "two_regions"])
    groups, total = [], 0
    for j, gpu in enumerate(types):
        per, count = rng.choice([1, 2, 2, 4]), rng.choice([1, 1, 2])
        while total + per * count > max_gpus and per * count > 1:  # within max_gpus, 1 GPU per type at least
            count, per = (count - 1, per) if count > 1 else (count, per // 2)
        total += per * count
        zone = {"two_zones": "r1-b", "two_regions": "r2-a"}.get(layout, "r1-a") if j % 2 else "r1-a"
        groups.append({"name": f"g{j}", "gpu_type": gpu, "gpus_per_node": per, "count": count, "zone": zone,
                       "price_per_gpu_hour_usd": round(rng.uniform(0.5, 4.0), 2)})
    return instance_from_dict({
        "name": f"tiny-{seed}", "cluster": {"node_groups": groups},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": rng.randint(2, max_blocks)}},
                     "global_batch_size": rng.choice(batches), "precision": "fp16", "flash_attention": True}})


def max_stages(instance: Instance) -> int:
    """U - 1: every P of the compact form (P = U has no plan there) without the KeyError of
    `test_solve_with_as_many_gpus_as_units` (the P = U choices crash the bounds)."""
    return instance.model_arch.num_units - 1


@functools.lru_cache(maxsize=None)
def scored(seed: int, sweep: str) -> tuple[Instance, list[Scored]]:
    inst = SWEEPS[sweep](seed)
    return inst, score_space(inst, max_stages=max_stages(inst))


# ---- the model's own evaluation of a plan -------------------------------------------------------------
class ModelView:
    """`joint.evaluate` of plans on the inputs the planner builds for their (P, b, D)."""

    def __init__(self, instance: Instance):
        self.instance = instance
        self.tables = _Tables(instance, build_estimators(instance))
        self.quotas = _quotas(instance, PlannerOptions())
        self.inputs: dict[tuple[int, int, int], joint.JointInputs] = {}

    def inputs_for(self, P: int, b: int, D: int) -> joint.JointInputs:
        if (P, b, D) not in self.inputs:
            inp = joint_inputs(self.instance, self.tables, self.quotas, Combo(P, b, D), "max_throughput", None, None,
                               TP_CHOICES)
            assert inp is not None, f"no pool holds a unit for P={P} b={b} D={D}"
            self.inputs[P, b, D] = with_sync_table(inp, self.tables)  # as the search uses them
        return self.inputs[P, b, D]

    def evaluate(self, p: Plan) -> dict[str, Any]:
        """The model's figures (T, cost, tau, c, sync, mu, egress, ...) of a plan of the modelled space."""
        D, b = len(p.stages[0].replicas), p.share(0, 0)
        inp = self.inputs_for(len(p.stages), b, D)
        index = {(q.gpu_type, q.zone, q.tp): k for k, q in enumerate(inp.pools)}
        counts = []
        for st in p.stages:
            row = [0] * inp.K
            for r in st.replicas:
                row[index[r.gpu_type, r.zone, r.tp]] += 1
            counts.append(tuple(row))
        ranges = tuple((st.layer_start, st.layer_end) for st in p.stages)
        return joint.evaluate(inp, joint.JointSolution(ranges, tuple(counts), 0.0, math.nan))


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


# ---- the planner against the enumerated optimum (a) ---------------------------------------------------
@dataclass(frozen=True)
class Run:
    objective: str
    max_cost: float | None = None
    min_its: float | None = None


def solve(inst: Instance, run: Run) -> PlannerResult:
    """The planner in one process (the helper changes nothing but the wall time) with P < U."""
    return plan(inst, PlannerOptions(objective=run.objective, max_cost_usd=run.max_cost, min_iters_per_s=run.min_its,
                                     workers=1, time_limit_s=60, max_stages=max_stages(inst)))


def runs(items: list[Scored]) -> list[Run]:
    """Both objectives, alone and with a limit that binds: a budget halfway (geometrically) between
    the cheapest plan's cost and the fastest plan's, a floor halfway between their throughputs.
    When one plan is both, the limits get 50 % slack: a limit equal to a plan's own figure tests the
    planner's rounding (`test_limits_are_checked_with_the_simulators_tolerance`), not its model."""
    cheapest = min(items, key=lambda s: s.cost_usd)
    fastest = min(items, key=lambda s: s.iteration_time_s)
    if cheapest.cost_usd < fastest.cost_usd and fastest.iteration_time_s < cheapest.iteration_time_s:
        budget = math.sqrt(cheapest.cost_usd * fastest.cost_usd)
        floor = 1 / math.sqrt(cheapest.iteration_time_s * fastest.iteration_time_s)
    else:
        budget, floor = 1.5 * cheapest.cost_usd, 1 / (1.5 * fastest.iteration_time_s)
    return [Run("max_throughput"), Run("min_cost"), Run("max_throughput", max_cost=budget),
            Run("min_cost", min_its=floor)]


def planner_findings(seed: int, sweep: str, which: tuple[int, ...]) -> list[str]:
    """What breaks the planner's promise on this instance, one line per run of `runs` picked by `which`."""
    inst, items = scored(seed, sweep)
    out = []
    for run in (runs(items)[i] for i in which):
        best = optimum(items, run.objective, run.max_cost, run.min_its)
        assert best is not None, f"{run}: no enumerated plan meets the limit"  # `runs` picks limits some plan meets
        try:
            res = solve(inst, run)
        except InfeasibleError as exc:
            out.append(f"{run}: planner says infeasible ({exc}), optimum {best.objective(run.objective):.6g}")
            continue
        got = res.report.cost_per_iteration_usd if run.objective == "min_cost" else res.report.iteration_time_s
        opt = best.objective(run.objective)
        if res.bound > opt * (1 + BOUND_TOL):
            out.append(f"{run}: bound {res.bound:.6g} > optimum {opt:.6g} (+{100 * (res.bound / opt - 1):.2f} %)")
        # gap = (model objective - bound) / model objective, so a valid bound gives got (1 - gap) <= optimum
        if got * (1 - res.gap) > opt * (1 + BOUND_TOL):
            out.append(f"{run}: plan {got:.6g} = {got / opt:.3f} x optimum {opt:.6g} with gap {res.gap:.4f}")
        if res.report.constraint_violations:
            out.append(f"{run}: returned plan breaks {res.report.constraint_violations}")
    return out


def model_findings(seed: int, sweep: str, samples: int = 30) -> list[str]:
    """Plans of the space (a seeded sample) where `joint.evaluate` differs from `simulate`."""
    inst, items = scored(seed, sweep)
    view = ModelView(inst)
    out = []
    for s in random.Random(seed).sample(items, min(samples, len(items))):
        ev = view.evaluate(s.plan)
        if rel(ev["T"], s.iteration_time_s) > REL_TOL or rel(ev["cost"], s.cost_usd) > REL_TOL:
            out.append(f"P{s.P} b{s.b} D{s.D}: T model {ev['T']:.6g} sim {s.iteration_time_s:.6g}, "
                       f"cost model {ev['cost']:.6g} sim {s.cost_usd:.6g}")
    return out


SWEEPS = {
    "fast": lambda seed: random_instance(seed),
    "slow": lambda seed: random_instance(seed, max_gpus=8, max_blocks=4, batches=(2, 4, 8)),
}
FAST_SEEDS = range(50)
SLOW_SEEDS = range(1000, 1030)

# Seeds that fail today (measured when this file was written), each with its cause: the tests of
# section (c) name them. The model-evaluation test (b) fails on every seed.
_MIXED = ("a stage mixing pools is timed with single-pool all-reduce tables (NVLink) while its replicas sit on "
          "two nodes: the model finds it fast, the simulator does not; plan outside the gap "
          "(test_allreduce_of_a_stage_mixing_gpu_types)")
_TIED_TP = ("the tied-embedding all-reduce divides by the least TP of all pools, not of the end stages: the model "
            "overrates the optimum; bound above it (test_tied_allreduce_divides_by_the_end_stages_tp)")
_TIED_LATENCY = ("the tied-embedding ring runs over a link whose latency is folded into its bandwidth at one "
                 "boundary message: the model overrates the optimum by ~5 % of that all-reduce; bound above it "
                 "(test_ring_over_a_link_keeps_its_latency)")
_ULP = ("the strong bottleneck bound skips the optimum's stage time, 1 ulp below Hall's candidate: the choice "
        "P1 b4 D1 is ruled out under the floor; bound and plan 3 % above the optimum "
        "(test_strong_bottleneck_bound_keeps_the_stage_time_it_rounds_past)")
PLANNER_XFAIL: dict[int, str] = {
    6: _MIXED, 8: _TIED_TP, 17: _TIED_LATENCY, 19: _ULP, 23: _ULP, 39: _TIED_LATENCY, 49: _TIED_LATENCY,
    1000: _MIXED, 1001: _TIED_TP, 1005: _ULP, 1008: _TIED_LATENCY, 1012: _TIED_TP,
    1017: _TIED_TP + "; " + _TIED_LATENCY, 1025: _ULP,
    1026: _TIED_TP + "; " + _TIED_LATENCY + " (across zones); boundaries on one node (T4 PCIe is slower than the "
          "network: test_boundary_between_stages_on_one_node)",
    1029: _ULP,
}
MODEL_XFAIL_REASON = "joint.evaluate differs from simulate on most plans: every cause of section (c)"


def _planner_params(seeds) -> list:
    def marked(seed: int):
        if seed not in PLANNER_XFAIL:
            return seed
        reason = PLANNER_XFAIL[seed]
        return pytest.param(seed, marks=pytest.mark.xfail(strict=False, raises=AssertionError, reason=reason))
    return [marked(s) for s in seeds]


@pytest.mark.parametrize("seed", _planner_params(FAST_SEEDS))
def test_planner_bound_and_gap_hold_against_enumeration(seed: int) -> None:
    # two runs per instance keep the file fast: one per objective, alternating plain and limited
    which = (0, 1) if seed % 2 == 0 else (2, 3)
    findings = planner_findings(seed, "fast", which)
    assert not findings, "\n".join(findings)


@pytest.mark.sweep
@pytest.mark.parametrize("seed", _planner_params(SLOW_SEEDS))
def test_planner_bound_and_gap_hold_against_enumeration_larger(seed: int) -> None:
    findings = planner_findings(seed, "slow", (0, 1, 2, 3))
    assert not findings, "\n".join(findings)


@pytest.mark.xfail(strict=False, raises=AssertionError, reason=MODEL_XFAIL_REASON)
@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_model_evaluation_equals_simulation(seed: int) -> None:
    findings = model_findings(seed, "fast")
    assert not findings, f"{len(findings)} plans differ:\n" + "\n".join(findings[:10])


# ---- the enumerator mirrors the planner's space (not xfail: these keep the reference honest) ----------
@pytest.mark.parametrize("seed", range(0, 50, 7))
def test_enumerator_outer_choices_and_pools_are_the_planners(seed: int) -> None:
    inst = random_instance(seed)
    opts = PlannerOptions(max_stages=max_stages(inst))
    combos = [(c.P, c.b, c.D) for c in enumerate_combos(inst, _quotas(inst, opts), opts)]
    assert outer_choices(inst, max_stages=max_stages(inst)) == combos
    mine = [(p.gpu_type, p.zone, p.tp) for p in pools(inst)]
    view = ModelView(inst)
    for P, b, D in combos[:: max(1, len(combos) // 5)]:
        theirs = [(p.gpu_type, p.zone, p.tp) for p in view.inputs_for(P, b, D).pools]
        # the planner drops the pools that cannot hold one unit; the order of the rest is the same
        assert [k for k in mine if k in theirs] == theirs


@pytest.mark.parametrize("seed", range(0, 50, 5))
def test_planner_plan_lies_in_the_enumerated_space(seed: int) -> None:
    inst, items = scored(seed, "fast")
    keys = {plan_key(s.plan) for s in items}
    for run in runs(items):
        try:
            res = solve(inst, run)
        except InfeasibleError:  # a wrong "infeasible" is a finding of the bound-and-gap tests
            continue
        assert plan_key(res.report.plan) in keys, run


def plan_key(p: Plan) -> tuple:
    """A placed plan as the space lists it: batch split, layer ranges, replicas in order with their nodes."""
    return (p.num_microbatches, p.schedule, tuple((st.layer_start, st.layer_end, tuple(
        (r.gpu_type, r.tp, r.zone, r.node, r.gpus, r.microbatch_share) for r in st.replicas)) for st in p.stages))


# ---- (c) one reproducer per cause: model figure vs simulator figure ---------------------------------
def tiny(groups: list[dict], layers: int = 2, batch: int = 2, tied: bool = True,
         network: dict | None = None) -> Instance:
    overrides: dict[str, Any] = {"num_layers": layers}
    if not tied:
        overrides["tied_embeddings"] = False
    return instance_from_dict({
        "name": "repro", "cluster": {"node_groups": groups, "network": network or {}},
        "workload": {"model": {"preset": "OPT-350M", "overrides": overrides}, "global_batch_size": batch,
                     "precision": "fp16", "flash_attention": True}})


def group(name: str, gpu: str, per_node: int, count: int = 1, zone: str = "r1-a") -> dict:
    return {"name": name, "gpu_type": gpu, "gpus_per_node": per_node, "count": count, "zone": zone,
            "price_per_gpu_hour_usd": 1.0}


def pipeline(stages: list[tuple[int, int, list[tuple[str, int, str]]]], b: int, m: int) -> Plan:
    """(layer_start, layer_end, [(gpu type, tp, zone), ...]) per stage; every replica takes b."""
    return Plan(num_microbatches=m, micro_batch_size=b, stages=tuple(
        Stage(layer_start=s, layer_end=e, replicas=tuple(Replica(gpu_type=g, tp=t, zone=z, microbatch_share=b)
                                                         for g, t, z in reps)) for s, e, reps in stages))


def both(instance: Instance, p: Plan) -> tuple[dict, SimulationReport]:
    rep = simulate(instance, p)
    assert not rep.oom_ranks
    return ModelView(instance).evaluate(rep.plan), rep


def assert_close(model: float, sim: float, what: str) -> None:
    assert rel(model, sim) <= REL_TOL, f"{what}: model {model:.6g} s, simulator {sim:.6g} s ({model / sim:.3f} x)"


A100, V100, H100, T4, A10G = "A100-40", "V100-16", "H100", "T4", "A10G"


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="boundary on one node: the model times every boundary of a zone on the "
                   "inter-node link (planner._Tables.effective_link pairs distinct nodes), first fit put both stages "
                   "on one node and the simulator uses its NVLink")
def test_boundary_between_stages_on_one_node() -> None:
    inst = tiny([group("h", H100, 2)], tied=False, network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 2, [(H100, 1, "r1-a")]), (2, 4, [(H100, 1, "r1-a")])], 1, 2))
    assert_close(ev["c"][0], rep.stages[0].send_fwd_s + rep.stages[0].send_bwd_s, "boundary 0 -> 1")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="tied all-reduce with the end stages on one node: joint._tied_s rings over "
                   "the inter-node link, the simulator over the node's NVLink")
def test_tied_allreduce_of_end_stages_on_one_node() -> None:
    inst = tiny([group("a", A100, 2), group("v", V100, 1)], network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 2, [(A100, 1, "r1-a")]), (2, 3, [(V100, 1, "r1-a")]),
                                   (3, 4, [(A100, 1, "r1-a")])], 1, 2))
    assert_close(ev["sync"][0], rep.stages[0].sync_s, "stage 0 all-reduce (the tied embedding alone, D = 1)")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="joint._tied_s divides the tied gradient by the least TP of all pools "
                   "(min(p.tp for p in inp.pools)), the simulator by the least TP of the end stages' replicas")
def test_tied_allreduce_divides_by_the_end_stages_tp() -> None:
    inst = tiny([group("a", A100, 2, count=2)], network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 2, [(A100, 2, "r1-a")]), (2, 4, [(A100, 2, "r1-a")])], 1, 2))
    assert_close(ev["sync"][0], rep.stages[0].sync_s, "stage 0 all-reduce (the tied embedding alone, D = 1)")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="joint._tied_s is a flat ring over 2 D members; the communication "
                   "estimator takes the faster of the flat and the hierarchical ring over the actual nodes")
def test_tied_allreduce_is_hierarchical_over_two_nodes() -> None:
    inst = tiny([group("a", A100, 2, count=2)], batch=4, network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 2, [(A100, 1, "r1-a")] * 2), (2, 4, [(A100, 1, "r1-a")] * 2)], 1, 2))
    assert_close(ev["sync"][0], rep.stages[0].sync_s, "stage 0 all-reduce (own + tied)")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="a stage mixing pools gets the slowest of single-pool table entries "
                   "(planner._Tables.sync_s packs D replicas of one pool on its own nodes: NVLink); the simulator "
                   "rings over the actual members, here across two nodes")
def test_allreduce_of_a_stage_mixing_gpu_types() -> None:
    inst = tiny([group("a", A100, 2), group("v", V100, 2)], tied=False, network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 4, [(A100, 1, "r1-a"), (V100, 1, "r1-a")])], 1, 1))
    assert_close(ev["sync"][0], rep.stages[0].sync_s, "stage 0 all-reduce")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="first fit splits stage 1 over two nodes (stage 0 took 3 of node 0's 4 "
                   "GPUs); the all-reduce table packs a stage's replicas from the zone's first node")
def test_allreduce_of_a_stage_split_over_nodes_by_first_fit() -> None:
    inst = tiny([group("a", A100, 4, count=2)], batch=3, tied=False, network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 2, [(A100, 1, "r1-a")] * 3), (2, 4, [(A100, 1, "r1-a")] * 3)], 1, 1))
    assert_close(ev["sync"][1], rep.stages[1].sync_s, "stage 1 all-reduce")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="planner._Tables.effective_link turns one boundary message's time into a "
                   "bandwidth with zero latency; rings over it (a stage spanning zones, the tied embedding) "
                   "then pay the latency per boundary-sized chunk of the gradient")
def test_ring_over_a_link_keeps_its_latency() -> None:
    inst = tiny([group("a", A100, 1, zone="r1-a"), group("b", A100, 1, zone="r1-b")], tied=False)
    ev, rep = both(inst, pipeline([(0, 4, [(A100, 1, "r1-a"), (A100, 1, "r1-b")])], 1, 1))
    assert_close(ev["sync"][0], rep.stages[0].sync_s, "stage 0 all-reduce across two zones")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="a stage spanning zones puts every boundary transfer across zones "
                   "(dz >= span, egress on all D transfers); the simulator pairs replicas by sample range and "
                   "here each pair stays in its zone")
def test_boundary_of_stages_spanning_zones_pairs_within_zones() -> None:
    inst = tiny([group("a", A100, 1, count=2, zone="r1-a"), group("b", A100, 1, count=2, zone="r1-b")], tied=False,
                network={"inter_node": NO_LATENCY, "inter_zone": {"kind": "ethernet", "bandwidth_GBps": 5.0,
                                                                  "latency_s": 0.0}})
    ev, rep = both(inst, pipeline([(0, 2, [(A100, 1, "r1-a"), (A100, 1, "r1-b")]),
                                   (2, 4, [(A100, 1, "r1-a"), (A100, 1, "r1-b")])], 1, 1))
    assert_close(ev["c"][0], rep.stages[0].send_fwd_s + rep.stages[0].send_bwd_s, "boundary 0 -> 1")
    assert_close(ev["egress"], rep.egress_cost_usd, "egress USD")


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="the model's stage time is the slowest replica's fwd + bwd "
                   "(step_s = LayerTime.total_s); the simulator adds the slowest forward and the slowest backward, "
                   "which differ when a stage mixes GPU types or TP degrees")
def test_straggler_forward_and_backward_come_from_different_replicas() -> None:
    inst = tiny([group("a", A10G, 1), group("t", T4, 4)], tied=False, network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 4, [(A10G, 1, "r1-a"), (T4, 4, "r1-a")])], 1, 1))
    assert_close(ev["tau"][0], rep.stages[0].fwd_s + rep.stages[0].bwd_s, "stage 0 step")


def test_model_matches_simulator_where_no_cause_applies() -> None:
    """Control for (c): one stage per node, TP 1 everywhere, no latency: the model is exact."""
    inst = tiny([group("a", A100, 1, count=2)], network={"inter_node": NO_LATENCY})
    ev, rep = both(inst, pipeline([(0, 2, [(A100, 1, "r1-a")]), (2, 4, [(A100, 1, "r1-a")])], 1, 2))
    assert_close(ev["T"], rep.iteration_time_s, "iteration time")
    assert_close(ev["cost"], rep.cost_per_iteration_usd, "cost")


# ---- (c') the bounds and limits on plans the model scores exactly --------------------------------------
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="joint._hall_theta_s builds candidate stage times "
                   "as n x step[k][2] + position extras, 1 ulp above the class table's prefix sum of the same "
                   "units; joint._bottleneck_lower_bound_s keeps only class times >= Hall's and so skips the "
                   "H100 TP 2 stage (0.0064585 s): the strong bound jumps to the next class (H100 TP 1, 0.01137 s), "
                   "cost_lower_bound_dp_usd finds no theta under the floor's cap and the choice P1 b4 D1 is "
                   "ruled infeasible")
def test_strong_bottleneck_bound_keeps_the_stage_time_it_rounds_past() -> None:
    inst = tiny([group("h", H100, 2)], layers=3, batch=4)
    p = pipeline([(0, 5, [(H100, 2, "r1-a")])], 4, 1)
    ev, rep = both(inst, p)
    assert_close(ev["T"], rep.iteration_time_s, "iteration time (exact here)")
    inp = ModelView(inst).inputs_for(1, 4, 1)
    assert joint.bottleneck_lower_bound_s(inp, exact=True) <= ev["theta"] * (1 + BOUND_TOL), "bottleneck bound"
    # the planner's consequence: min cost under 100 it/s returns P1 b2 D1 (4.041e-6 USD, gap 0)
    # instead of this plan (3.925e-6 USD, 141.6 it/s); at 140 it/s it raises InfeasibleError
    res = plan(inst, PlannerOptions(objective="min_cost", min_iters_per_s=100, workers=1, max_stages=4))
    assert res.bound <= rep.cost_per_iteration_usd * (1 + BOUND_TOL), f"bound {res.bound:.6g}"


# C8, fixed: the planner compared limits with no tolerance while the simulator accepted 1e-9
# relative; both now read instance.relaxed_limits (the planner relaxes them once, at its start).
def test_limits_are_checked_with_the_simulators_tolerance() -> None:
    inst = tiny([group("h", H100, 1)], layers=2, batch=1)  # one GPU: P1 b1 D1 is the only plan
    rep = simulate(inst, pipeline([(0, 4, [(H100, 1, "r1-a")])], 1, 1))
    floor = rep.iters_per_s * (1 + 1e-12)
    assert rep.iters_per_s >= floor * (1 - 1e-9)  # the simulator's rule (simulator._with_violations)
    res = plan(inst, PlannerOptions(objective="min_cost", min_iters_per_s=floor, workers=1, max_stages=3))
    assert res.report.iteration_time_s == pytest.approx(rep.iteration_time_s, rel=REL_TOL)


# ---- (d) the crash --------------------------------------------------------------------------------------
# It crashed: P = U (every unit its own stage) is enumerated (planner.enumerate_combos: P up to
# min(U, max_stages)) but the compact form has no stage-0 block count for it, and
# joint._make_extra_lower_bound looked up pair (0, 1): KeyError. planner._prepare_one now records
# such a choice as infeasible.
def test_solve_with_as_many_gpus_as_units() -> None:
    # 2 blocks -> U = 4 units; 4 GPUs allow P x D = 4 x 1
    inst = tiny([group("a", A100, 4)], batch=1)
    res = plan(inst, PlannerOptions(workers=1, time_limit_s=30))
    assert res.plan.stages
