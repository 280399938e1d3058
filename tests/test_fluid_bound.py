"""`joint.fluid_gpu_seconds_s`, the work bound on the slowest stage per replica, against hand-computed
values and against the fluid LP it relaxes, solved by HiGHS."""
import random

import pyomo.environ as pyo
import pytest

from hetplan.formulations import joint
from hetplan.solvers import SolveOptions, solve


def fluid_lp(work: dict[str, list[float]], gpus: dict[str, int], max_gpus: int | None) -> float:
    """The least theta of the fluid LP (one replica, D = 1): shares f[l][g] >= 0 of unit l on type g
    summing to 1, sum_l f[l][g] c[g][l] <= u_g theta, u_g <= n_g, sum_g u_g <= max_gpus. Written with
    s = 1 / theta and f' = f s to be linear: maximise s."""
    m = pyo.ConcreteModel()
    G, L = sorted(work), range(len(next(iter(work.values()))))
    m.f = pyo.Var(L, G, domain=pyo.NonNegativeReals)  # GPU-seconds shares, scaled: f = share / theta
    m.u = pyo.Var(G, domain=pyo.NonNegativeReals)
    m.s = pyo.Var(domain=pyo.NonNegativeReals)  # 1 / theta
    m.cover = pyo.Constraint(L, rule=lambda m, l: sum(m.f[l, g] for g in G) == m.s)
    m.busy = pyo.Constraint(G, rule=lambda m, g: sum(m.f[l, g] * work[g][l] for l in L) <= m.u[g])
    m.have = pyo.Constraint(G, rule=lambda m, g: m.u[g] <= gpus[g])
    if max_gpus is not None:
        m.cap = pyo.Constraint(expr=sum(m.u[g] for g in G) <= max_gpus)
    m.obj = pyo.Objective(expr=m.s, sense=pyo.maximize)
    res = solve(m, backend="highs", options=SolveOptions(time_limit_s=30))
    assert res.status.value == "optimal"
    return 1 / pyo.value(m.s)


def test_hand_computed_values():
    work = {"fast": [1.0, 1.0], "slow": [3.0, 3.0]}  # C = 2 and 6: a slow GPU is a third of a fast one
    assert joint.fluid_gpu_seconds_s(work, {"fast": 2, "slow": 3}) == pytest.approx(1 / 1.5)
    assert joint.fluid_gpu_seconds_s(work, {"fast": 2, "slow": 3}, max_gpus=2) == pytest.approx(1.0)
    assert joint.fluid_gpu_seconds_s({"one": [0.5, 1.5]}, {"one": 4}) == pytest.approx(2.0 / 4)  # D W / N


def test_never_above_the_fluid_lp_and_equal_when_types_scale():
    rng = random.Random(7)
    for trial in range(40):
        types = [f"g{j}" for j in range(rng.randint(1, 4))]
        units = rng.randint(1, 6)
        base = [rng.uniform(0.1, 2.0) for _ in range(units)]
        scaled = trial % 2 == 0  # every type a multiple of one profile: the bound is the LP's optimum
        work = {g: [b * (s if scaled else rng.uniform(0.5, 2.0)) for b in base]
                for g, s in ((g, rng.uniform(0.5, 4.0)) for g in types)}
        gpus = {g: rng.randint(1, 16) for g in types}
        cap = rng.choice([None, rng.randint(1, 30)])
        truth = fluid_lp(work, gpus, cap)
        got = joint.fluid_gpu_seconds_s(work, gpus, cap)
        assert got <= truth * (1 + 1e-7), (trial, work, gpus, cap)
        if scaled:
            assert got == pytest.approx(truth, rel=1e-6), (trial, work, gpus, cap)
