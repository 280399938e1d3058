"""Solver layer: every available back-end against brute force, warm starts proven from solver logs,
time limits, infeasibility diagnosis, clear errors, and the verbose-SCIP hang.

Back-ends that are not installed (gurobi here) are skipped, not failed.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pyomo.environ as pyo
import pytest
from pyomo.common.collections import ComponentMap

from hetplan.errors import InfeasibleError, SolverError
from hetplan.solvers import (
    SolveOptions,
    Status,
    backend_names,
    describe_backends,
    diagnose_infeasibility,
    get_backend,
    solve,
    values_of,
)
from hetplan.solvers.registry import backend_class

ALL_BACKENDS = backend_names()


def _require(name: str) -> None:
    cls = backend_class(name)
    if not cls.available():
        pytest.skip(f"back-end {name} not available: {cls.probe().note}")


@pytest.fixture(params=ALL_BACKENDS)
def backend(request) -> str:
    _require(request.param)
    return request.param


# ---------------------------------------------------------------------------------------------
# Small models with brute-force optima
# ---------------------------------------------------------------------------------------------

def knapsack_data(n: int = 12, seed: int = 3):
    rng = np.random.default_rng(seed)
    w = rng.integers(5, 40, n).tolist()
    v = rng.integers(5, 40, n).tolist()
    return w, v, int(sum(w) * 0.4)


def knapsack(n: int = 12, seed: int = 3) -> pyo.ConcreteModel:
    w, v, cap = knapsack_data(n, seed)
    m = pyo.ConcreteModel()
    m.I = pyo.RangeSet(0, n - 1)
    m.x = pyo.Var(m.I, domain=pyo.Binary)
    m.cap = pyo.Constraint(expr=sum(w[i] * m.x[i] for i in m.I) <= cap)
    m.obj = pyo.Objective(expr=sum(v[i] * m.x[i] for i in m.I), sense=pyo.maximize)
    return m


def knapsack_brute(n: int = 12, seed: int = 3) -> float:
    w, v, cap = knapsack_data(n, seed)
    best = 0
    for pick in itertools.product((0, 1), repeat=n):
        if sum(a * b for a, b in zip(w, pick)) <= cap:
            best = max(best, sum(a * b for a, b in zip(v, pick)))
    return best


def knapsack_greedy(m: pyo.ConcreteModel, n: int = 12, seed: int = 3) -> tuple[ComponentMap, float]:
    """Best ratio first; the textbook heuristic, always feasible."""
    w, v, cap = knapsack_data(n, seed)
    start, load, value = ComponentMap(), 0, 0
    for i in sorted(range(n), key=lambda i: -v[i] / w[i]):
        take = int(load + w[i] <= cap)
        load += take * w[i]
        value += take * v[i]
        start[m.x[i]] = take
    return start, value


def assignment_cost(n: int = 5, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 50, (n, n))


def assignment(n: int = 5, seed: int = 7) -> pyo.ConcreteModel:
    c = assignment_cost(n, seed)
    m = pyo.ConcreteModel()
    m.W = pyo.RangeSet(0, n - 1)
    m.x = pyo.Var(m.W, m.W, domain=pyo.Binary)
    m.one_task = pyo.Constraint(m.W, rule=lambda m, i: sum(m.x[i, j] for j in m.W) == 1)
    m.one_worker = pyo.Constraint(m.W, rule=lambda m, j: sum(m.x[i, j] for i in m.W) == 1)
    m.obj = pyo.Objective(expr=sum(int(c[i, j]) * m.x[i, j] for i in m.W for j in m.W))
    return m


def assignment_brute(n: int = 5, seed: int = 7) -> float:
    c = assignment_cost(n, seed)
    return min(sum(c[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))


FL = dict(fixed=[30, 22, 27], cap=[9, 7, 10], demand=[3, 2, 4, 3, 2, 3],
          cost=[[4, 7, 3, 8, 6, 5], [6, 2, 5, 4, 7, 3], [5, 6, 6, 2, 3, 7]])


def facility_location() -> pyo.ConcreteModel:
    """Single-source capacitated facility location (3 sites, 6 customers)."""
    F, C = range(3), range(6)
    m = pyo.ConcreteModel()
    m.open = pyo.Var(F, domain=pyo.Binary)
    m.serve = pyo.Var(F, C, domain=pyo.Binary)
    m.served = pyo.Constraint(C, rule=lambda m, c: sum(m.serve[f, c] for f in F) == 1)
    m.capacity = pyo.Constraint(F, rule=lambda m, f: sum(FL["demand"][c] * m.serve[f, c] for c in C)
                                <= FL["cap"][f] * m.open[f])
    m.obj = pyo.Objective(expr=sum(FL["fixed"][f] * m.open[f] for f in F)
                          + sum(FL["cost"][f][c] * m.serve[f, c] for f in F for c in C))
    return m


def facility_brute() -> float:
    best = math.inf
    for assign in itertools.product(range(3), repeat=6):  # customer -> site; a site opens iff used
        load = [0, 0, 0]
        for c, f in enumerate(assign):
            load[f] += FL["demand"][c]
        if any(load[f] > FL["cap"][f] for f in range(3)):
            continue
        cost = sum(FL["fixed"][f] for f in set(assign)) + sum(FL["cost"][f][c] for c, f in enumerate(assign))
        best = min(best, cost)
    return best


def minlp() -> pyo.ConcreteModel:
    """Integer x, y, z in [0, 5]: a bilinear constraint, an exp constraint, a product in the objective."""
    m = pyo.ConcreteModel()
    m.x = pyo.Var(domain=pyo.Integers, bounds=(0, 5))
    m.y = pyo.Var(domain=pyo.Integers, bounds=(0, 5))
    m.z = pyo.Var(domain=pyo.Integers, bounds=(0, 5))
    m.bilinear = pyo.Constraint(expr=m.x * m.y >= 6)
    m.budget = pyo.Constraint(expr=pyo.exp(0.3 * m.x) + m.y + m.z <= 9)
    m.obj = pyo.Objective(expr=4 * m.x + 3 * m.y - 2 * m.z + m.x * m.z)
    return m


def minlp_brute() -> float:
    best = math.inf
    for x, y, z in itertools.product(range(6), repeat=3):
        if x * y >= 6 and math.exp(0.3 * x) + y + z <= 9:
            best = min(best, 4 * x + 3 * y - 2 * z + x * z)
    return best


MILPS = {
    "knapsack": (knapsack, knapsack_brute),
    "assignment": (assignment, assignment_brute),
    "facility_location": (facility_location, facility_brute),
}


def assert_loaded_solution_feasible(m: pyo.ConcreteModel, tol: float = 1e-6) -> None:
    """The values written back into the model satisfy every bound, integrality and constraint."""
    for v in m.component_data_objects(pyo.Var):
        assert v.value is not None, v.name
        if v.lb is not None:
            assert v.value >= v.lb - tol, v.name
        if v.ub is not None:
            assert v.value <= v.ub + tol, v.name
        if v.is_integer():
            assert v.value == round(v.value), v.name
    for c in m.component_data_objects(pyo.Constraint, active=True):
        body = pyo.value(c.body)
        if c.has_lb():
            assert body >= pyo.value(c.lower) - tol, c.name
        if c.has_ub():
            assert body <= pyo.value(c.upper) + tol, c.name


# ---------------------------------------------------------------------------------------------
# Optima: every back-end agrees with brute force
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(MILPS))
def test_milp_optimum_matches_brute_force(backend, kind):
    build, brute = MILPS[kind]
    m = build()
    r = solve(m, backend)
    assert r.status is Status.OPTIMAL
    assert r.backend == backend
    assert r.objective == pytest.approx(brute(), abs=1e-6)
    assert r.bound == pytest.approx(r.objective, rel=1.1e-4)  # default rel_gap 1e-4
    assert r.gap is not None and r.gap <= 1e-4 + 1e-9
    assert_loaded_solution_feasible(m)
    assert pyo.value(m.obj) == pytest.approx(r.objective, abs=1e-6)
    assert r.nodes is not None and r.nodes >= 0
    assert r.build_s >= 0 and r.solve_s >= 0


def test_minlp_optimum_matches_brute_force_or_is_refused(backend):
    m = minlp()
    cls = get_backend(backend)
    if not cls.capabilities.nonlinear:
        with pytest.raises(SolverError) as err:
            solve(m, backend)
        msg = str(err.value)
        assert "'bilinear'" in msg and "'budget'" in msg and "'obj'" in msg
        return
    r = solve(m, backend)
    assert r.status is Status.OPTIMAL
    assert r.objective == pytest.approx(minlp_brute(), abs=1e-6)
    assert_loaded_solution_feasible(m)
    assert pyo.value(m.obj) == pytest.approx(r.objective, abs=1e-6)


def test_highs_refuses_nonlinear_naming_the_component():
    _require("highs")
    m = pyo.ConcreteModel()
    m.x = pyo.Var(bounds=(0, 4))
    m.y = pyo.Var(bounds=(0, 4))
    m.linear_part = pyo.Constraint(expr=m.x + m.y <= 6)
    m.rate_times_time = pyo.Constraint(expr=m.x * m.y >= 2)
    m.obj = pyo.Objective(expr=m.x + m.y)
    with pytest.raises(SolverError, match=r"constraint 'rate_times_time'") as err:
        solve(m, "highs")
    assert "linear_part" not in str(err.value)


def test_default_backend_is_highs_for_linear_and_scip_for_nonlinear():
    _require("highs")
    _require("scip")
    assert solve(knapsack()).backend == "highs"
    assert solve(minlp()).backend == "scip"


@pytest.mark.parametrize("seed", [11, 12])
def test_scip_and_highs_agree_on_larger_knapsack(seed):
    _require("highs")
    _require("scip")
    opts = SolveOptions(rel_gap=0.0)
    a = solve(knapsack(40, seed), "scip", opts)
    b = solve(knapsack(40, seed), "highs", opts)
    assert a.status is b.status is Status.OPTIMAL
    assert a.objective == pytest.approx(b.objective, abs=1e-6)


def test_lp_hand_computed(backend):
    # max 3x + 2y s.t. x + y <= 4, x + 3y <= 6, x <= 3  -> vertex (3, 1), value 11
    m = pyo.ConcreteModel()
    m.x = pyo.Var(bounds=(0, 3))
    m.y = pyo.Var(bounds=(0, None))
    m.a = pyo.Constraint(expr=m.x + m.y <= 4)
    m.b = pyo.Constraint(expr=m.x + 3 * m.y <= 6)
    m.obj = pyo.Objective(expr=3 * m.x + 2 * m.y, sense=pyo.maximize)
    r = solve(m, backend)
    assert r.status is Status.OPTIMAL
    assert r.objective == pytest.approx(11.0)
    assert (pyo.value(m.x), pyo.value(m.y)) == pytest.approx((3.0, 1.0))


def test_ranged_rows_fixed_vars_params_and_constants(backend):
    m = pyo.ConcreteModel()
    m.p = pyo.Param(initialize=2.0, mutable=True)
    m.x = pyo.Var(bounds=(0, 10))
    m.y = pyo.Var(bounds=(0, 10))
    m.f = pyo.Var(initialize=3.0)
    m.f.fix()
    m.ranged = pyo.Constraint(expr=pyo.inequality(1, m.x + m.f, 6))  # 0 <= x <= 3
    m.link = pyo.Constraint(expr=m.x + 1 <= m.p * m.y)  # y >= (x + 1) / 2
    m.obj = pyo.Objective(expr=-3 * m.x + m.y + m.f + 5)
    r = solve(m, backend)
    # x = 3, y = 2: -9 + 2 + 3 + 5 = 1
    assert r.objective == pytest.approx(1.0)
    assert (pyo.value(m.x), pyo.value(m.y)) == pytest.approx((3.0, 2.0))
    assert pyo.value(m.f) == 3.0  # a fixed variable is never touched


def test_no_objective_is_a_feasibility_problem(backend):
    m = facility_location()
    m.obj.deactivate()
    r = solve(m, backend)
    assert r.status is Status.OPTIMAL and r.objective == 0.0
    assert_loaded_solution_feasible(m)


def test_unbounded(backend):
    m = pyo.ConcreteModel()
    m.x = pyo.Var(domain=pyo.Integers)
    m.y = pyo.Var(bounds=(0, None))
    m.c = pyo.Constraint(expr=m.x - m.y <= 3)
    m.obj = pyo.Objective(expr=m.x + m.y, sense=pyo.maximize)
    r = solve(m, backend)
    assert r.status is Status.UNBOUNDED
    assert r.objective is None and not r.status.has_solution
    with pytest.raises(SolverError):
        r.require_solution()


def test_integer_values_are_written_back_as_ints(backend):
    m = knapsack()
    solve(m, backend)
    assert all(isinstance(m.x[i].value, int) for i in m.I)


# ---------------------------------------------------------------------------------------------
# Warm starts: checked first, consumption proven from the solver's own log / statistics
# ---------------------------------------------------------------------------------------------

def _log(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def test_scip_consumes_a_full_start():
    _require("scip")
    m = knapsack()
    start, greedy_value = knapsack_greedy(m)
    r = solve(m, "scip", warm_start=start)
    assert r.warm_start_given and r.warm_start_accepted is True
    assert r.warm_start_objective == pytest.approx(greedy_value)
    log = _log(r.log_path)
    hit = re.search(r"(\d+)/\d+ feasible solution given by solution candidate storage, new primal bound (\S+)", log)
    assert hit and int(hit.group(1)) == 1
    assert float(hit.group(2)) == pytest.approx(greedy_value)  # SCIP's first incumbent is our start
    assert r.stats["first_primal_bound"] == pytest.approx(greedy_value)
    assert r.objective == pytest.approx(knapsack_brute())


def test_scip_full_start_sets_continuous_vars_and_the_objective_auxiliary():
    _require("scip")
    m = pyo.ConcreteModel()
    m.n = pyo.Var(domain=pyo.Integers, bounds=(0, 4))
    m.t = pyo.Var(bounds=(0, 4))
    m.cover = pyo.Constraint(expr=m.n + m.t >= 3)
    m.obj = pyo.Objective(expr=(m.n - 1.3) ** 2 + pyo.exp(m.t / 2) + m.n * m.t)
    start = ComponentMap([(m.n, 3), (m.t, 0.25)])
    expected = (3 - 1.3) ** 2 + math.exp(0.125) + 0.75
    r = solve(m, "scip", warm_start=start)
    assert r.warm_start_accepted is True
    assert r.warm_start_objective == pytest.approx(expected)
    # without the auxiliary set, SCIP would see objective 0 for the start and refuse it
    assert r.stats["first_primal_bound"] == pytest.approx(expected)
    brute = min((n - 1.3) ** 2 + math.exp(t / 2) + n * t
                for n in range(5) for t in np.linspace(0, 4, 4001) if n + t >= 3 - 1e-12)
    assert r.objective == pytest.approx(brute, abs=1e-3)
    assert r.objective <= brute + 1e-6


def test_highs_consumes_a_full_start():
    _require("highs")
    m = knapsack()
    start, greedy_value = knapsack_greedy(m)
    r = solve(m, "highs", warm_start=start)
    assert r.warm_start_accepted is True
    log = _log(r.log_path)
    # HiGHS <= 1.15 writes "feasible, objective value is", 1.16 "feasible: objective value is"
    hit = re.search(r"MIP start solution is feasible[,:] objective value is (\S+)", log)
    assert hit and float(hit.group(1)) == pytest.approx(greedy_value)
    assert r.objective == pytest.approx(knapsack_brute())


@pytest.mark.parametrize("name,evidence", [("scip", r"found by completesol heuristic.*objective value (\S+)"),
                                           ("highs", r"MIP start solution is feasible[,:] objective value is (\S+)")])
def test_partial_start_is_completed_by_the_solver(name, evidence):
    _require(name)
    m = facility_location()
    # sites 0 and 2 open; customers 0-4 assigned (loads 7/9 and 7/10); customer 5 left to the solver
    start = ComponentMap([(m.open[0], 1), (m.open[1], 0), (m.open[2], 1)])
    for c, site in enumerate([0, 0, 2, 2, 0]):
        for f in range(3):
            start[m.serve[f, c]] = int(f == site)
    r = solve(m, name, warm_start=start)
    assert r.warm_start_accepted is True
    # the only completion: customer 5 (demand 3) fits site 2 only; 30 + 27 fixed + 4+7+6+2+6+7 = 89
    hit = re.search(evidence, _log(r.log_path))
    assert hit and float(hit.group(1)) == pytest.approx(89.0)
    assert "partial warm start (18/21 variables)" in r.message
    assert r.objective == pytest.approx(facility_brute())


def test_scip_says_why_it_ignored_a_partial_start():
    _require("scip")
    m = facility_location()
    start = ComponentMap([(m.open[0], 1), (m.open[1], 0), (m.open[2], 1)])  # 18 of 21 unknown
    r = solve(m, "scip", warm_start=start)
    assert r.warm_start_accepted is False
    assert "ignore partial solution" in r.message and "unknown rate" in r.message
    assert r.objective == pytest.approx(facility_brute())


def test_values_of_builds_a_start_from_the_model():
    _require("highs")
    m = knapsack()
    start, greedy_value = knapsack_greedy(m)
    for var, val in start.items():
        var.set_value(val)
    r = solve(m, "highs", warm_start=values_of(m))
    assert r.warm_start_accepted is True and r.warm_start_objective == pytest.approx(greedy_value)


def test_infeasible_start_is_reported_not_dropped(backend):
    m = knapsack()
    w, v, cap = knapsack_data()
    start = ComponentMap((m.x[i], 1) for i in m.I)  # everything in the bag: over capacity
    r = solve(m, backend, warm_start=start)
    assert r.warm_start_given and r.warm_start_accepted is False
    (viol,) = r.warm_start_violations
    assert (viol.kind, viol.name, viol.group) == ("constraint", "cap", "cap")
    assert viol.value == pytest.approx(sum(w))
    assert viol.amount == pytest.approx(sum(w) - cap)
    assert "cap" in r.message and f"by {sum(w) - cap:g}" in r.message
    assert r.status is Status.OPTIMAL and r.objective == pytest.approx(knapsack_brute())


def test_start_bound_and_integrality_violations_are_listed():
    _require("highs")
    m = knapsack()
    start, _ = knapsack_greedy(m)
    start[m.x[0]] = 0.5
    start[m.x[1]] = 2
    r = solve(m, "highs", warm_start=start)
    kinds = {(v.kind, v.name) for v in r.warm_start_violations}
    assert ("integrality", "x[0]") in kinds
    assert ("bound", "x[1]") in kinds
    bound = next(v for v in r.warm_start_violations if v.kind == "bound")
    assert bound.amount == pytest.approx(1.0) and bound.upper == 1.0


def test_nonlinear_start_violation_amount_is_exact():
    _require("scip")
    m = minlp()
    start = ComponentMap([(m.x, 1), (m.y, 2), (m.z, 0)])  # x*y = 2 < 6
    r = solve(m, "scip", warm_start=start)
    viol = {v.name: v for v in r.warm_start_violations}
    assert viol["bilinear"].value == pytest.approx(2.0) and viol["bilinear"].amount == pytest.approx(4.0)
    assert "budget" not in viol  # exp(0.3) + 2 <= 9 holds


def test_unchecked_infeasible_start_goes_to_scip_which_refuses_it():
    _require("scip")
    m = knapsack()
    start = ComponentMap((m.x[i], 1) for i in m.I)
    r = solve(m, "scip", warm_start=start, check_warm_start=False)
    assert r.warm_start_violations == ()
    assert r.warm_start_accepted is False
    assert "did not use the warm start" in r.message
    assert "0/1 feasible solution given by solution candidate storage" in _log(r.log_path) or \
        "feasible solution given by solution candidate storage" not in _log(r.log_path)


def test_warm_start_key_errors():
    _require("highs")
    m = knapsack()
    with pytest.raises(SolverError, match="indexed Var"):
        solve(m, "highs", warm_start=[(m.x, 1)])
    with pytest.raises(SolverError, match="not a number"):
        solve(m, "highs", warm_start=[(m.x[0], "one")])


# ---------------------------------------------------------------------------------------------
# Limits: a hard instance returns the incumbent, its bound and gap
# ---------------------------------------------------------------------------------------------

def market_split(m_: int = 4, n: int = 30, seed: int = 0) -> pyo.ConcreteModel:
    """Cornuejols-Dawande market split, slack form: trivially feasible, very hard to prove."""
    rng = np.random.default_rng(seed)
    A = rng.integers(0, 100, size=(m_, n))
    b = A.sum(1) // 2
    m = pyo.ConcreteModel()
    m.I, m.J = range(m_), range(n)
    m.x = pyo.Var(m.J, domain=pyo.Binary)
    m.over = pyo.Var(m.I, bounds=(0, None))
    m.under = pyo.Var(m.I, bounds=(0, None))
    m.split = pyo.Constraint(m.I, rule=lambda m, i: sum(int(A[i, j]) * m.x[j] for j in m.J)
                             + m.under[i] - m.over[i] == int(b[i]))
    m.obj = pyo.Objective(expr=sum(m.over[i] + m.under[i] for i in m.I))
    return m


def test_time_limit_returns_incumbent_bound_and_gap(backend):
    m = market_split()
    r = solve(m, backend, SolveOptions(time_limit_s=1.0))
    assert r.status is Status.FEASIBLE
    assert "time" in r.termination.lower()
    assert r.objective is not None and r.objective > 0
    assert r.bound is not None and r.bound <= r.objective + 1e-9
    assert r.gap == pytest.approx(abs(r.objective - r.bound) / abs(r.objective))
    assert r.gap > 0
    assert pyo.value(m.obj) == pytest.approx(r.objective, abs=1e-6)
    assert_loaded_solution_feasible(m)


@pytest.mark.parametrize("name,option", [("scip", {"limits/nodes": 1}), ("highs", {"mip_max_nodes": 1})])
def test_native_options_pass_through_and_win(name, option):
    _require(name)
    r = solve(market_split(), name, SolveOptions(time_limit_s=30, solver_options=option))
    assert r.status is Status.FEASIBLE
    assert r.nodes is not None and r.nodes <= 2


def test_thread_count_may_change_between_solves(backend):
    # HiGHS refuses a solve asking for other `threads` than its thread's task scheduler has; the
    # back-end runs each solve in a thread of its own, whose scheduler ends with it
    for threads in (1, 2, None, 1):
        r = solve(knapsack(), backend, SolveOptions(threads=threads, seed=threads or 0))
        assert r.status is Status.OPTIMAL, (threads, r.message)
        assert r.objective == pytest.approx(knapsack_brute())


def test_log_path_option_writes_there_and_starts_fresh(backend, tmp_path):
    path = tmp_path / "sub" / "solve.log"
    m = knapsack()
    start, _ = knapsack_greedy(m)
    solve(m, backend, SolveOptions(log_path=str(path)), warm_start=start)
    first = path.stat().st_size
    assert first > 0
    # a second solve into the same file (no start) must not find the first run's start evidence
    r = solve(m, backend, SolveOptions(log_path=str(path)))
    assert r.log_path == str(path)
    text = _log(str(path))
    assert "solution candidate storage" not in text and "MIP start solution" not in text


def test_wide_coefficient_range_is_flagged():
    _require("highs")
    m = pyo.ConcreteModel()
    m.x = pyo.Var(bounds=(0, 1))
    m.on = pyo.Var(domain=pyo.Binary)
    m.big_m = pyo.Constraint(expr=m.x <= 1e11 * m.on)
    m.need = pyo.Constraint(expr=m.x >= 0.5)
    m.obj = pyo.Objective(expr=m.x + m.on)
    r = solve(m, "highs")
    assert r.objective == pytest.approx(1.5)
    assert "constraint 'big_m'" in r.message and "numerical trouble" in r.message


# ---------------------------------------------------------------------------------------------
# Infeasibility: a status, and the diagnosis names the conflicting constraints
# ---------------------------------------------------------------------------------------------

def infeasible_model() -> pyo.ConcreteModel:
    m = pyo.ConcreteModel()
    m.S = pyo.RangeSet(0, 4)
    m.x = pyo.Var(m.S, bounds=(0, None))
    m.z = pyo.Var(bounds=(0, 10))
    m.demand = pyo.Constraint(expr=m.x[1] + m.x[2] >= 10)  # needs 10 ...
    m.cap = pyo.Constraint(m.S, rule=lambda m, s: m.x[s] <= 3 + s)  # ... but x1 + x2 <= 4 + 5
    m.budget = pyo.Constraint(expr=sum(m.x[s] for s in m.S) + m.z <= 100)  # slack
    m.other = pyo.Constraint(expr=m.z >= 1)
    m.obj = pyo.Objective(expr=sum(m.x[s] for s in m.S) + m.z)
    return m


def _feasible_without(m: pyo.ConcreteModel, name: str, backend: str) -> bool:
    c = m.find_component(name)
    c.deactivate()
    try:
        return solve(m, backend, SolveOptions(diagnose_infeasible=False)).status is Status.OPTIMAL
    finally:
        c.activate()


def test_infeasible_model_names_the_conflict(backend):
    m = infeasible_model()
    r = solve(m, backend)
    assert r.status is Status.INFEASIBLE and r.objective is None
    assert set(r.conflict) == {"demand", "cap[1]", "cap[2]"}
    assert set(r.conflict_groups) == {"demand", "cap"}
    assert "demand" in r.message and "cap[1]" in r.message
    # independent check that the set is irreducible: dropping any member makes the model feasible
    for name in r.conflict:
        assert _feasible_without(m, name, backend), name
    with pytest.raises(InfeasibleError, match="demand"):
        r.require_solution()


def test_diagnose_integrality_conflict_and_feasible_model(backend):
    m = pyo.ConcreteModel()
    m.n = pyo.Var(domain=pyo.Integers, bounds=(0, 10))
    m.y = pyo.Var(bounds=(0, 5))
    m.half = pyo.Constraint(expr=2 * m.n == 3)  # no integer n
    m.unrelated = pyo.Constraint(expr=m.y >= 1)
    d = diagnose_infeasibility(m, backend)
    assert d.infeasible is True and d.constraints == ("half",) and d.irreducible
    m.half.deactivate()
    d = diagnose_infeasibility(m, backend)
    assert d.infeasible is False and d.constraints == ()


def test_diagnosis_budget_leaves_the_answer_undecided(backend):
    d = diagnose_infeasibility(infeasible_model(), backend, total_time_limit_s=0.0)
    assert d.infeasible is None and not d.irreducible and d.checks == 0
    assert "undecided" in d.message


def test_large_infeasible_model_points_to_diagnose(backend):
    m = infeasible_model()
    r = solve(m, backend, SolveOptions(diagnose_max_rows=2))
    assert r.status is Status.INFEASIBLE and r.conflict == ()
    assert "diagnose_infeasibility" in r.message


def test_trivially_infeasible_bounds_are_named():
    _require("highs")
    m = pyo.ConcreteModel()
    m.x = pyo.Var(bounds=(5, 2))
    m.c = pyo.Constraint(expr=m.x >= 0)
    m.obj = pyo.Objective(expr=m.x)
    r = solve(m, "highs")
    assert r.status is Status.INFEASIBLE and r.conflict == ("x",)
    assert "lower bound 5 > upper bound 2" in r.message


# ---------------------------------------------------------------------------------------------
# Errors with messages a user can act on
# ---------------------------------------------------------------------------------------------

def test_unknown_and_unavailable_backends():
    with pytest.raises(SolverError, match="unknown solver back-end 'cplex'"):
        solve(knapsack(), "cplex")
    for row in describe_backends():
        if not row.available:
            with pytest.raises(SolverError, match=f"'{row.name}' is not available"):
                solve(knapsack(), row.name)


def test_bad_options_and_models_raise_clear_errors():
    _require("highs")
    _require("scip")
    with pytest.raises(SolverError, match="time_limit_s"):
        solve(knapsack(), "highs", SolveOptions(time_limit_s=-1))
    with pytest.raises(SolverError, match="foo/bar"):
        solve(knapsack(), "scip", SolveOptions(solver_options={"foo/bar": 1}))
    with pytest.raises(SolverError, match="no_such_option"):
        solve(knapsack(), "highs", SolveOptions(solver_options={"no_such_option": 1}))
    m = knapsack()
    m.obj2 = pyo.Objective(expr=m.x[0])
    with pytest.raises(SolverError, match="several active objectives"):
        solve(m, "highs")
    m = pyo.ConcreteModel()
    m.x = pyo.Var(bounds=(0, 1))
    m.bad = pyo.Constraint(expr=float("nan") * m.x <= 1)
    with pytest.raises(SolverError, match=r"numerical trouble.*'x'.*constraint 'bad'"):
        solve(m, "highs")
    m = pyo.ConcreteModel()
    m.x = pyo.Var([1, 2], bounds=(0, 1))
    m.sos = pyo.SOSConstraint(var=m.x, sos=1)
    with pytest.raises(SolverError, match="'sos' is a SOSConstraint"):
        solve(m, "scip")
    with pytest.raises(SolverError, match="Pyomo model"):
        solve(object(), "highs")


# ---------------------------------------------------------------------------------------------
# Registry and CLI
# ---------------------------------------------------------------------------------------------

def test_describe_backends_matches_what_is_installed():
    rows = {r.name: r for r in describe_backends()}
    assert {"scip", "highs", "gurobi"} <= set(rows)
    assert rows["scip"].available == (importlib.util.find_spec("pyscipopt") is not None)
    assert rows["highs"].available == (importlib.util.find_spec("highspy") is not None)
    if importlib.util.find_spec("gurobipy") is None:
        assert not rows["gurobi"].available and "not installed" in rows["gurobi"].note
    if rows["scip"].available:
        import pyscipopt

        assert pyscipopt.__version__ in rows["scip"].version
        assert rows["scip"].capabilities.nonlinear
    if rows["highs"].available:
        import highspy

        h = highspy.Highs()
        assert f"{h.versionMajor()}.{h.versionMinor()}.{h.versionPatch()}" in rows["highs"].version
        assert not rows["highs"].capabilities.nonlinear


def test_cli_solvers_command_table_and_json():
    import typer
    from typer.testing import CliRunner

    from hetplan.orchestration.solvers_cli import register

    app = typer.Typer()
    register(app)

    @app.command("other")
    def other() -> None:  # a second command so typer keeps sub-command names
        pass

    out = CliRunner().invoke(app, ["solvers", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [r["name"] for r in rows] == [r.name for r in describe_backends()]
    assert all(set(r) == {"name", "available", "version", "capabilities", "note"} for r in rows)
    table = CliRunner().invoke(app, ["solvers"])
    assert table.exit_code == 0 and "scip" in table.output and "gurobi" in table.output


# ---------------------------------------------------------------------------------------------
# A long verbose SCIP solve under a stdout pipe does not hang
# ---------------------------------------------------------------------------------------------

def test_verbose_scip_solve_under_captured_stdout_does_not_hang():
    """Pyomo's fd capture drains SCIP's output through a pipe read by a Python thread; with a GIL-holding
    optimize() that deadlocks once the pipe (64 KiB) is full. The child must finish, with > 64 KiB logged."""
    _require("scip")
    code = textwrap.dedent("""
        import io, os, sys
        sys.path.insert(0, {tests!r})
        from pyomo.common.tee import capture_output
        from test_solvers import market_split
        from hetplan.solvers import SolveOptions, solve
        buf = io.StringIO()
        # one log line per node for 3000 nodes: several times the 64 KiB pipe buffer, whatever the CPU speed
        opts = SolveOptions(time_limit_s=60, verbose=True, solver_options={{"display/freq": 1, "limits/nodes": 3000}})
        with capture_output(buf, capture_fd=True):
            r = solve(market_split(), "scip", opts)
        print(len(buf.getvalue()), os.path.getsize(r.log_path), r.status.value)
    """).format(tests=str(__import__("pathlib").Path(__file__).parent))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    captured, logged, status = proc.stdout.split()
    assert int(captured) > 4 * 64 * 1024 and int(logged) > 4 * 64 * 1024
    assert status == "feasible"  # stopped by the node limit with an incumbent


def test_highs_writes_its_banner_once_per_process_and_never_on_stdout():
    """`highs_backend._new_highs` points stdout at stderr for a process's first Highs object only,
    since HiGHS prints its banner then and never again: later objects, made directly and in another
    thread, write nothing on stdout, and the banner is on stderr."""
    _require("highs")
    code = textwrap.dedent("""
        import threading, highspy
        from hetplan.solvers.highs_backend import _new_highs
        _new_highs(highspy)
        print("first", flush=True)
        highspy.Highs()
        _new_highs(highspy)
        t = threading.Thread(target=highspy.Highs)
        t.start(); t.join()
        print("later", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "first\nlater\n"
    assert "HiGHS" in proc.stderr
