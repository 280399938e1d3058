"""`_hall_counts` (the positions of stage pipelines that can each get D replicas at once) against
enumeration: an upper bound on the true count on every random case, and the count itself with one
position (P = 1), where it is exact."""
import itertools
from types import SimpleNamespace

import numpy as np

from hetplan.formulations import joint
from hetplan.formulations.joint.bounds.bottleneck import _CoverableTables, _hall_counts


def _served(S: tuple[int, ...], tp: np.ndarray, gpus: list[int], D: int, max_gpus: int | None) -> bool:
    """Whether positions S can each get D replicas: per position, replicas per type (the type's
    smallest eligible TP there, inf if none), within each type's GPUs and max_gpus."""
    T = len(gpus)
    per_position = []
    for j in S:
        options = []
        for x in itertools.product(range(D + 1), repeat=T):
            if sum(x) == D and all(n == 0 or np.isfinite(tp[g, j]) for g, n in enumerate(x)):
                options.append([0 if n == 0 else int(tp[g, j]) * n for g, n in enumerate(x)])
        per_position.append(options)
    for pick in itertools.product(*per_position):
        used = [sum(p[g] for p in pick) for g in range(T)]
        if all(u <= n for u, n in zip(used, gpus)) and (max_gpus is None or sum(used) <= max_gpus):
            return True
    return not S


def _case(seed: int):
    rnd = np.random.default_rng(seed)
    T, P, D = int(rnd.integers(1, 4)), int(rnd.integers(1, 4)), int(rnd.integers(1, 4))
    names = ["A", "B", "C"][:T]
    pools = [joint.Pool(g, "z", "r", t, 0, 1.0) for g in names
             for t in sorted(rnd.choice([1, 2, 4], size=int(rnd.integers(1, 4)), replace=False))]
    gpus = {g: int(rnd.integers(0, 13)) for g in names}
    caps = rnd.integers(-1, 4, size=(len(pools), P))
    max_gpus = None if rnd.random() < 0.5 else int(rnd.integers(1, 20))
    tab = _CoverableTables(block_s=np.ones(len(pools)), extra_s=np.zeros((len(pools), P)),
                           by_mem=np.zeros((len(pools), P)), tp=np.array([p.tp for p in pools], dtype=np.int64),
                           gpus=gpus, pools_of_type={g: np.array([k for k, p in enumerate(pools) if p.gpu_type == g])
                                                     for g in names})
    return SimpleNamespace(D=D, max_gpus=max_gpus, pools=tuple(pools), _cache={}), tab, caps


def test_hall_counts_bound_the_positions_served_and_are_exact_with_one():
    checked = exact_cases = 0
    for seed in range(400):
        inp, tab, caps = _case(seed)
        levels = np.unique(caps[caps > 0])[::-1]
        if levels.size == 0:
            continue
        counts = _hall_counts(inp, tab, caps, levels)
        # the counts kept per inputs (by each level's TP matrix) answer the same levels again
        assert np.array_equal(_hall_counts(inp, tab, caps, levels[::-1])[::-1], counts)
        names = list(tab.pools_of_type)
        for v, count in zip(levels, counts):
            tp = np.array([[min((tab.tp[k] for k in tab.pools_of_type[g] if caps[k, j] >= v), default=np.inf)
                            for j in range(caps.shape[1])] for g in names])
            truth = max(len(S) for r in range(caps.shape[1] + 1) for S in itertools.combinations(range(caps.shape[1]), r)
                        if _served(S, tp, [tab.gpus[g] for g in names], inp.D, inp.max_gpus))
            assert count >= truth, (seed, v, count, truth)
            if caps.shape[1] == 1:
                assert count == truth, (seed, v, count, truth)
                exact_cases += 1
            checked += 1
    assert checked >= 300 and exact_cases >= 80, (checked, exact_cases)
