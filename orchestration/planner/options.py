"""What a caller gives the joint planner and gets back: options, outer choices, records, the result."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from hetplan.errors import PlanError, check_count, check_counts, check_number
from hetplan.plan import Plan
from hetplan.simulator import SimulationReport


TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class PlannerOptions:
    backend: str | None = None  # None: HiGHS for the linear model, SCIP when `linearize` is False
    objective: str | None = None  # override the instance's objective kind
    max_cost_usd: float | None = None  # override / add constraints
    min_iters_per_s: float | None = None
    time_limit_s: float = 60.0  # whole search
    # one outer choice's MILP (CPU seconds of its thread when MILPs solve side by side); its bound
    # enters the reported bound
    combo_time_limit_s: float = 10.0
    rel_gap: float = 0.01  # on the simulated objective, as far as the model can prove (PlannerResult.status)
    max_stages: int = 16
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    tp_choices: tuple[int, ...] = TP_CHOICES
    linearize: bool = True  # False keeps rate x T bilinear (SCIP solves it as an MINLP)
    available: dict[tuple[str, str], int] | None = None  # (gpu type, zone) -> GPUs available now
    heuristic_choices: int = 8  # choices (most promising first) the stage DP heuristic runs on first
    heuristic_degrees: int = 3  # then, of the other data-parallel degrees, this many (least medium bound first)
    climb_runs: int = 12  # then heuristic runs of the local search over the neighbouring choices (`_climb`)
    workers: int = 2  # processes refining bounds (2: a forked helper works ahead of the search; 1: none)
    concurrent_milps: int = 2  # choices' MILPs solving at once, each in a thread (HiGHS); 1: one after another
    # a complete search whose simulated gap is above rel_gap solves the choices below its target again,
    # simulating what their MILPs find (`search._beyond_the_model`); False: the model's own gap stands
    beyond_model: bool = True

    def __post_init__(self) -> None:
        """Refuse what the search would divide by, loop on or silently read as something else (an
        unknown objective searched for throughput; microbatch size 0 divided by zero), naming the
        field as planner.<field>."""
        if self.objective not in (None, "max_throughput", "min_cost"):
            raise PlanError(f"unknown objective {self.objective!r}; use max_throughput or min_cost", "planner.objective")
        for name in ("max_cost_usd", "min_iters_per_s", "time_limit_s", "combo_time_limit_s"):
            check_number(getattr(self, name), f"planner.{name}", error=PlanError)
        gap = self.rel_gap
        if not (isinstance(gap, (int, float)) and math.isfinite(gap) and 0 <= gap < 1):
            got = f"{gap:g}" if isinstance(gap, (int, float)) else repr(gap)
            raise PlanError(f"must be a relative gap in [0, 1), got {got}", "planner.rel_gap")
        for name, least in (("max_stages", 1), ("heuristic_choices", 0), ("heuristic_degrees", 0),
                            ("climb_runs", 0), ("workers", 1), ("concurrent_milps", 1)):
            check_count(getattr(self, name), f"planner.{name}", least=least, error=PlanError)
        check_counts(self.microbatch_sizes, "planner.microbatch_sizes", error=PlanError)
        check_counts(self.tp_choices, "planner.tp_choices", error=PlanError)
        for key, count in (self.available or {}).items():
            if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
                raise PlanError(f"keys are (GPU type, zone) pairs, got {key!r}", "planner.available")
            check_count(count, f"planner.available[{key!r}]", least=0, error=PlanError)


@dataclass(frozen=True)
class Combo:
    P: int
    b: int
    D: int


@dataclass
class ComboRecord:
    P: int
    b: int
    D: int
    lower_bound: float
    status: str  # pruned_bound | no_pools | greedy_only | solved:<status> | infeasible | skipped_time
    objective: float | None = None
    bound: float | None = None
    build_s: float = 0.0
    solve_s: float = 0.0
    # the simulator refused a plan of this choice's MILP and the choice was not searched in full
    # without it (`_Search._past_refusals`): its other plans are neither found nor ruled out
    refusals_open: bool = False


@dataclass
class PlannerResult:
    plan: Plan
    report: SimulationReport  # the simulator's figures for the plan
    objective_kind: str
    # the plan's iteration time (s) or cost (USD) as the simulator scores it: what `bound` bounds
    # and `gap` measures (the name is historical: the search keeps plans by this figure)
    model_objective: float
    bound: float  # proven lower bound on the simulated objective of every plan in the modelled space
    gap: float
    greedy_objective: float | None  # the best heuristic plan (greedy or stage DP) found in the search
    greedy_report: SimulationReport | None
    combos_total: int
    combos_pruned: int
    combos_solved: int
    build_s: float
    solve_s: float
    wall_s: float
    backend: str
    records: list[ComboRecord] = field(default_factory=list)
    # "complete": every outer choice was settled (solved, pruned or ruled out): `gap`, against the
    # simulated objective, is within rel_gap unless a MILP failed, or, where the simulator rates the
    # plan more than rel_gap above the model's best plan, and past the model (`beyond_model`) choices
    # were left open (`open_past_model`), what was proven; "time_limit": the limit stopped the search
    # first, the plan is the best found by then and `bound` / `gap` what had been proven
    status: str = "complete"
    # the planner's model's own figure for the returned plan (`joint.evaluate`): at most
    # model_objective, below it where the model relaxes the simulator
    model_estimate: float | None = None
    plan_source: str = "milp"  # "heuristic": a heuristic found the returned plan (no MILP beat it)
    # past the model (`PlannerOptions.beyond_model`): the outer choices left holding plans the model
    # rates under the target that were not all simulated (a MILP's limit, too many plans left out at
    # once, the deadline); None where the search did not go past the model
    open_past_model: int | None = None

    def summary(self) -> dict:
        return {"objective": self.objective_kind, "status": self.status, "model_objective": self.model_objective,
                "model_estimate": self.model_estimate, "plan_source": self.plan_source,
                "open_past_model": self.open_past_model,
                "bound": self.bound, "gap": self.gap, "greedy_objective": self.greedy_objective,
                "combos_total": self.combos_total, "combos_pruned": self.combos_pruned, "combos_solved": self.combos_solved,
                "build_s": self.build_s, "solve_s": self.solve_s, "wall_s": self.wall_s, "backend": self.backend,
                "simulated": {k: v for k, v in self.report.summary().items() if k not in ("ranks",)}}


@dataclass(frozen=True)
class SearchProgress:
    """Where a running search stands: the one argument of `plan(progress=...)`."""

    done: int  # outer choices settled (solved, pruned, ruled out, skipped; while preparing: prepared)
    total: int  # outer choices enumerated
    what: str  # the phase, or the choice (P, b, D) being worked on
    incumbent: float | None  # the best plan so far as the simulator scores it (s or USD per iteration)
    bound: float | None  # the proven lower bound so far over the modelled space
    gap: float | None  # (incumbent - bound) / incumbent, when both exist
    elapsed_s: float
