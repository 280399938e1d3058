"""Benchmark of the formulations of issue 4: one table per formulation.

    python benchmarks/formulations.py            # everything (a few minutes on 2 cores)
    python benchmarks/formulations.py --only device_grouping --sizes 16 24 32 64 512

Columns: instance size, build s, solve s, status, gap, greedy objective vs the optimum.
Device grouping runs on the AutoHet cluster mix (A100-80, H800, H20 in 8-GPU nodes, node types
round robin; AutoHet seed 002 sec. V) with GPT-3 6.7B, global batch 32, microbatch 2 (K = 16);
compute and memory come from the analytic estimators. AutoHet reports SCIP planning times of
1.23, 5.72, 16.96 and 159.12 s for 16, 24, 32 and 64 GPUs (sec. V-D).
"""
from __future__ import annotations

import argparse
import random
import sys
from time import perf_counter

from hetplan.estimators.registry import build_estimators
from hetplan.formulations import cluster_partition as cp
from hetplan.formulations import device_grouping as dg
from hetplan.formulations import layer_partition as lp
from hetplan.formulations import stage_parallelism as sp
from hetplan.instance import instance_from_dict, load_instance
from hetplan.orchestration.drivers import cluster_partition as cp_driver, device_grouping as dg_driver
from hetplan.solvers import SolveOptions, solve


def table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    print(f"\n## {title}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


def _fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    return str(x)


def autohet_instance(num_gpus: int, model: str = "GPT-3-6.7B", batch: int = 32, **workload):
    types = ["A100-80", "H800", "H20"]
    nodes = [0, 0, 0]
    for i in range(num_gpus // 8):
        nodes[i % 3] += 1
    groups = [dict(name=t.lower().replace("-", ""), gpu_type=t, gpus_per_node=8, count=c, zone="dc-a",
                   price_per_gpu_hour_usd=2.0) for t, c in zip(types, nodes) if c]
    return instance_from_dict(dict(name=f"autohet_{num_gpus}", cluster=dict(node_groups=groups),
                                   workload=dict(model=model, global_batch_size=batch, precision="bf16",
                                                 **workload)))


# ---- device grouping ----------------------------------------------------------------------------
def bench_device_grouping(sizes: list[int], counts_limit_s: float, per_gpu_limit_s: float) -> None:
    rows = []
    for n in sizes:
        inst = autohet_instance(n)
        inputs = dg.inputs_from_instance(inst, build_estimators(inst), microbatch=2)
        g = dg.greedy(inputs)
        variants = [("patterns", None)]
        if n <= 64:
            variants.append(("counts", counts_limit_s))
        for variant, limit in variants:
            sol = dg_driver.optimize(inputs, variant=variant, time_limit_s=limit)
            rows.append([n, variant, inputs.max_groups, sol.models_solved, sol.build_s, sol.solve_s, sol.total_s,
                         "optimal" if sol.proven_optimal else "open", sol.gap, g.objective if g else None,
                         sol.objective, sol.grouping.num_groups if sol.grouping else None,
                         (g.objective / sol.objective) if g and sol.objective else None])
        if n <= 16:
            t0 = perf_counter()
            model = dg.build_per_gpu(inputs)
            build_s = perf_counter() - t0
            res = solve(model, backend="scip", warm_start=dg.warm_start(model, g),
                        options=SolveOptions(time_limit_s=per_gpu_limit_s, rel_gap=0.0))
            obj = res.objective * inputs.g_max if res.objective is not None else None
            rows.append([n, "per_gpu", inputs.max_groups, 1, build_s, res.solve_s, build_s + res.solve_s,
                         res.status.value, res.gap, g.objective, obj, dg.decode(model).num_groups
                         if res.status.has_solution else None, g.objective / obj if obj else None])
    table("device grouping (AutoHet eq. 3; objective = #groups x min effective compute, microbatches/s)",
          ["GPUs", "variant", "k_max", "models", "build_s", "solve_s", "total_s", "status", "gap",
           "greedy", "optimum", "groups", "greedy/opt"], rows)


# ---- cluster partitioning -----------------------------------------------------------------------
def zoned_graph(n: int, seed: int) -> cp.ClusterGraph:
    """n 8-GPU nodes in 3 zones: 100 Gb/s-class links inside a zone, 1-10 GB/s across (x 64 GPU pairs)."""
    rng = random.Random(seed)
    zone = [rng.randint(0, 2) for _ in range(n)]
    w = {}
    for u in range(n):
        for v in range(u + 1, n):
            bw = rng.choice([12.5, 25.0]) if zone[u] == zone[v] else rng.choice([1.0, 5.0, 10.0])
            w[(u, v)] = 64 * bw
    return cp.ClusterGraph(tuple(f"n{i}" for i in range(n)), tuple(8 for _ in range(n)), w)


def random_graph(n: int, seed: int) -> cp.ClusterGraph:
    rng = random.Random(seed)
    w = {(u, v): float(rng.choice([0, 1, 2, 5, 10])) for u in range(n) for v in range(u + 1, n)}
    return cp.ClusterGraph(tuple(f"v{i}" for i in range(n)), tuple(1 for _ in range(n)), w)


def bench_cluster_partition(sizes: list[int], study_graphs: int) -> None:
    rows = []
    for n in sizes:
        for kind, graph in (("zoned", zoned_graph(n, n)), ("random", random_graph(n, n))):
            t0 = perf_counter()
            cp.split(graph)
            split_s = perf_counter() - t0
            t0 = perf_counter()
            results = cp_driver.solve_all_k(graph, backend="highs", options=SolveOptions(rel_gap=0.0, time_limit_s=30))
            total_s = perf_counter() - t0
            ratios = [r.split_ratio for r in results if r.split_ratio is not None]
            worst = max(results, key=lambda r: r.split_ratio or 1.0)
            rows.append([n, kind, split_s, total_s, max(r.solve_s for r in results),
                         "all optimal" if all(r.status == "optimal" for r in results) else "some open",
                         sum(1 for x in ratios if x > 1 + 1e-9), max(ratios), worst.k,
                         worst.split.cut_GBps, worst.exact.cut_GBps if worst.exact else None])
    table("cluster partitioning (Zorse sec. 4.3.2): SPLIT vs exact min-k-cut for every k",
          ["vertices", "graph", "split_s", "milp_all_k_s", "max_solve_s", "status", "k_split_worse",
           "worst_ratio", "at_k", "split_cut", "exact_cut"], rows)
    # how often SPLIT misses on random small graphs (exhaustive truth)
    worse = total = 0
    worst = 1.0
    for seed in range(study_graphs):
        rng = random.Random(seed)
        g = random_graph(rng.randint(4, 7), seed)
        parts = cp.split(g)
        for k in range(2, g.size):
            exact = cp.min_k_cut_exhaustive(g, k).cut_GBps
            total += 1
            ratio = parts[k - 1].cut_GBps / exact if exact > 0 else (1.0 if parts[k - 1].cut_GBps == 0 else float("inf"))
            worse += ratio > 1 + 1e-9
            worst = max(worst, ratio)
    table("SPLIT on random graphs of 4-7 vertices, weights in {0,1,2,5,10} (exhaustive truth)",
          ["graphs", "(graph, k) cases", "split suboptimal", "worst ratio"],
          [[study_graphs, total, worse, worst]])


# ---- layer partitioning ------------------------------------------------------------------------
def bench_layer_partition() -> None:
    rows = []
    inst = load_instance("a100_v100_one_zone")
    est = build_estimators(inst)
    A, V, Z = "A100-40", "V100-16", "us-central1-a"
    cases = [
        ("2 stages, V+A mixed stage", [[lp.ReplicaChoice(V, 1, Z), lp.ReplicaChoice(A, 1, Z)],
                                       [lp.ReplicaChoice(A, 1, Z), lp.ReplicaChoice(A, 1, Z)]], 4),
        ("3 stages, 2 replicas each", [[lp.ReplicaChoice(V, 1, Z), lp.ReplicaChoice(V, 1, Z)],
                                       [lp.ReplicaChoice(V, 1, Z), lp.ReplicaChoice(A, 1, Z)],
                                       [lp.ReplicaChoice(A, 1, Z), lp.ReplicaChoice(A, 1, Z)]], 4),
        ("4 stages, V,V,A,A", [[lp.ReplicaChoice(V, 1, Z)], [lp.ReplicaChoice(V, 1, Z)],
                               [lp.ReplicaChoice(A, 1, Z)], [lp.ReplicaChoice(A, 1, Z)]], 2),
        ("8 stages, V x4 then A x4", [[lp.ReplicaChoice(V, 1, Z)]] * 4 + [[lp.ReplicaChoice(A, 1, Z)]] * 4, 2),
    ]
    for name, stages, G in cases:
        inputs = lp.inputs_from_instance(inst, est, stages, global_microbatch=G)
        g = lp.greedy(inputs)
        t0 = perf_counter()
        model = lp.build(inputs)
        build_s = perf_counter() - t0
        res = solve(model, warm_start=lp.warm_start(model, g) if g.fits_memory else None,
                    options=SolveOptions(rel_gap=0.0, time_limit_s=60))
        opt = lp.decode(model) if res.status.has_solution else None
        count = None
        if len(stages) <= 3:
            best, count = lp.enumerate_all(inputs)
            assert best is None or opt is None or abs(best.iteration_s - opt.iteration_s) <= 1e-6 * best.iteration_s
        rows.append([name, inputs.num_units, len(stages), build_s, res.solve_s, res.status.value, res.gap,
                     res.nodes, count, g.iteration_s if g.fits_memory else "OOM",
                     opt.iteration_s if opt else None,
                     (g.iteration_s / opt.iteration_s) if opt and g.fits_memory else None])
    table("layer partitioning (OPT-350M on A100-40 / V100-16; objective = 1F1B iteration s)",
          ["pipeline", "units", "P", "build_s", "solve_s", "status", "gap", "nodes", "exhaustive",
           "greedy_s", "optimum_s", "greedy/opt"], rows)


# ---- per-stage parallelism -----------------------------------------------------------------------
def bench_stage_parallelism() -> None:
    rows = []
    inst = load_instance("a100_v100_one_zone")
    U = inst.model_arch.num_units
    cases = [("OPT-350M, V100 | A100, G=8", inst,
              [sp.StageDevices((("v100-0", "V100-16", 4), ("v100-1", "V100-16", 4)), 0, U // 2),
               sp.StageDevices((("a100-0", "A100-40", 4), ("a100-1", "A100-40", 4)), U // 2, U)], 8)]
    big = autohet_instance(32, model="Llama-13B", batch=64)
    U2 = big.model_arch.num_units
    node = {n.node_id: n for n in big.nodes}
    ids = list(node)
    cuts = [0, U2 // 4, U2 // 2, 3 * U2 // 4, U2]
    cases.append(("Llama-13B, 4 nodes x 8 (A100,H800,H20,A100), G=8", big,
                  [sp.StageDevices(((ids[i], node[ids[i]].gpu_type, 8),), cuts[i], cuts[i + 1]) for i in range(4)], 8))
    huge = autohet_instance(32, model="Llama-33B", batch=64, recompute="full", flash_attention=True)
    U3 = huge.model_arch.num_units
    ids3 = [n.node_id for n in huge.nodes]
    types3 = {n.node_id: n.gpu_type for n in huge.nodes}
    cuts3 = [0, U3 // 4, U3 // 2, 3 * U3 // 4, U3]
    cases.append(("Llama-33B (full recompute), 4 x 8 GPUs, G=4", huge,
                  [sp.StageDevices(((ids3[i], types3[ids3[i]], 8),), cuts3[i], cuts3[i + 1]) for i in range(4)], 4))
    for name, instance, stages, G in cases:
        inputs = sp.inputs_from_instance(instance, build_estimators(instance), stages, global_microbatch=G)
        g = sp.greedy(inputs)
        t0 = perf_counter()
        model = sp.build(inputs)
        build_s = perf_counter() - t0
        res = solve(model, warm_start=sp.warm_start(model, g) if g.fits_memory else None,
                    options=SolveOptions(rel_gap=0.0, time_limit_s=60))
        opt = sp.decode(model) if res.status.has_solution else None
        t0 = perf_counter()
        ex = sp.enumerate_all(inputs) if len(stages) <= 2 else None
        ex_s = perf_counter() - t0 if ex else None
        space = 1
        for s_ in range(len(stages)):
            space *= len(sp.stage_options(inputs, s_))  # feasible configurations per stage, multiplied
        rows.append([name, len(stages), g.steps, res.nodes, space, ex_s, build_s, res.solve_s,
                     res.status.value, res.gap, g.iteration_s if g.fits_memory else "OOM",
                     opt.iteration_s if opt else None, (g.iteration_s / opt.iteration_s) if opt and g.fits_memory else None,
                     " ".join(f"{c.tp}x{c.dp}" for c in opt.stages) if opt else None])
    table("per-stage parallelism (Metis + OOM-first seed 003; objective = 1F1B iteration s)",
          ["case", "P", "greedy_steps", "milp_nodes", "exhaustive_space", "exhaustive_s", "build_s", "solve_s",
           "status", "gap", "greedy_s", "optimum_s", "greedy/opt", "opt TPxDP"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["device_grouping", "cluster_partition", "layer_partition", "stage_parallelism"])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 24, 32, 64, 512])
    ap.add_argument("--counts-limit-s", type=float, default=60.0)
    ap.add_argument("--per-gpu-limit-s", type=float, default=30.0)
    ap.add_argument("--graph-sizes", type=int, nargs="*", default=[6, 8, 10])
    ap.add_argument("--study-graphs", type=int, default=300)
    args = ap.parse_args()
    t0 = perf_counter()
    if args.only in (None, "device_grouping"):
        bench_device_grouping(args.sizes, args.counts_limit_s, args.per_gpu_limit_s)
    if args.only in (None, "cluster_partition"):
        bench_cluster_partition(args.graph_sizes, args.study_graphs)
    if args.only in (None, "layer_partition"):
        bench_layer_partition()
    if args.only in (None, "stage_parallelism"):
        bench_stage_parallelism()
    print(f"\n(total {perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
