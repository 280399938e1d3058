"""Benchmark of operator scheduling on a multi-edge device graph (paper 004 sec. 3.2).

Prints one row per (case, back-end): DAG size, devices, model build time, solve time, status, gap,
greedy (HEFT) weighted makespan versus the solver's (re-timed by the replayer), then the
multi-edge versus single-link comparison and a bandwidth-drop re-schedule.

Cases: one transformer layer fwd+bwd (Llama-7B shapes, microbatch 1, seq 2048, fp16) on 2-8
heterogeneous devices cycling RTX-4090 / L20 / V100-16 (the GPUs of 004 sec. 4), whole operators
or split into 2 tensor shards with the all-reduce split into reduce-scatter + all-gather; and two
models (one layer each of OPT-350M, weight 2, and GPT-Neo-2.7B, weight 1) sharing 2-3 devices,
whole or in 2 shards with all-reduce operators.

Device graph: 4 GPUs per node. Inside a node every pair has PCIe (32 GB/s) plus, for two V100s,
NVLink (150 GB/s) that cannot run beside PCIe (004 sec. 3.1), otherwise a host-staged copy path
(12 GB/s, concurrent); across nodes InfiniBand (12.5 GB/s) and Ethernet (3 GB/s), concurrent.

    python benchmarks/opsched.py [--time-limit 15] [--backends highs,scip] [--quick]
"""
from __future__ import annotations

import argparse
import time

from hetplan.catalog import model_presets
from hetplan.orchestration.drivers.opsched import reschedule_after_bandwidth_change, solve_schedule
from hetplan.formulations.opsched_graph import Channel, Device, DeviceGraph, OpGraph, transformer_layer_dag
from hetplan.formulations.opsched_replay import replay
from hetplan.solvers import SolveOptions

GPU_CYCLE = ("RTX-4090", "L20", "V100-16")
GPUS_PER_NODE = 4


def cluster(n: int) -> DeviceGraph:
    devices = [Device.from_catalog(f"n{i // GPUS_PER_NODE}g{i % GPUS_PER_NODE}-{GPU_CYCLE[i % 3]}",
                                   GPU_CYCLE[i % 3], precision="fp16") for i in range(n)]

    def channels(a: Device, b: Device) -> list[Channel]:
        if a.name[:2] != b.name[:2]:  # different nodes
            return [Channel(name="ib", bandwidth_GBps=12.5, latency_s=2e-5),
                    Channel(name="eth", bandwidth_GBps=3.0, latency_s=5e-5)]
        if a.gpu_type == b.gpu_type == "V100-16":
            return [Channel(name="nvlink", bandwidth_GBps=150.0, latency_s=5e-6, concurrent=False),
                    Channel(name="pcie", bandwidth_GBps=16.0, latency_s=1e-5, concurrent=False)]
        return [Channel(name="pcie", bandwidth_GBps=32.0, latency_s=1e-5),
                Channel(name="host", bandwidth_GBps=12.0, latency_s=3e-5)]

    return DeviceGraph.mesh(devices, channels)


def cases(quick: bool) -> list[tuple[str, OpGraph, DeviceGraph]]:
    llama = model_presets()["Llama-7B"]
    whole = transformer_layer_dag(llama, precision="fp16")
    split = transformer_layer_dag(llama, precision="fp16", shards=2, split_allreduce=True)
    def two_models(shards: int) -> OpGraph:
        return OpGraph.merge([
            transformer_layer_dag(model_presets()["OPT-350M"], precision="fp16", model="opt350m", weight=2.0,
                                  prefix="opt.", shards=shards),
            transformer_layer_dag(model_presets()["GPT-Neo-2.7B"], precision="fp16", model="neo2.7b", weight=1.0,
                                  prefix="neo.", shards=shards),
        ])

    out = [("layer", whole, cluster(n)) for n in (2, 4, 8)]
    out += [("layer tp2 rs+ag", split, cluster(n)) for n in (3, 4, 8)]
    out += [("2 models w=2:1", two_models(1), cluster(n)) for n in (2, 3)]
    out += [("2 models tp2", two_models(2), cluster(n)) for n in (2, 3)]
    return out[::3] if quick else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=15.0, help="seconds per solve")
    ap.add_argument("--backends", default="highs,scip")
    ap.add_argument("--quick", action="store_true", help="a third of the cases")
    args = ap.parse_args()
    opts = SolveOptions(time_limit_s=args.time_limit, rel_gap=1e-4, threads=1)
    header = (f"{'case':<18}{'ops':>4}{'edges':>6}{'dev':>4}{'backend':>8}{'vars':>7}{'cons':>8}{'build s':>9}"
              f"{'solve s':>9}  {'status':<9}{'gap':>8}{'greedy ms':>11}{'solver ms':>11}{'gain':>7}")
    print(header)
    print("-" * len(header))
    for name, graph, devices in cases(args.quick):
        for backend in args.backends.split(","):
            res = solve_schedule(graph, devices, backend=backend, options=opts)
            s = res.solver
            gap = f"{s.gap:.2%}" if s.gap is not None else "-"
            gain = 1 - res.objective_s / res.incumbent_objective_s
            print(f"{name:<18}{len(graph.operators):>4}{len(graph.edges):>6}{len(devices.devices):>4}{backend:>8}"
                  f"{res.num_vars:>7}{res.num_constraints:>8}{res.build_s:>9.2f}{s.solve_s:>9.2f}  "
                  f"{s.status.value:<9}{gap:>8}{res.incumbent_objective_s * 1e3:>11.3f}"
                  f"{res.objective_s * 1e3:>11.3f}{gain:>7.1%}", flush=True)
    multi_edge_vs_single_link(opts)
    bandwidth_drop(opts)


def host_gpu_case() -> tuple[OpGraph, DeviceGraph]:
    """The hand-sized case of tests/test_opsched_model.py: two 10-GFLOP branches whose 40 MB
    inputs go host -> GPU over NVLink (10 GB/s) and PCIe (8 GB/s, concurrent)."""
    from hetplan.formulations.opsched_graph import DataEdge, Operator

    ops = (Operator(name="src", flops=1e9, mem_bytes=50e9), Operator(name="b0", flops=1e10),
           Operator(name="b1", flops=1e10), Operator(name="sink", flops=1e9, mem_bytes=50e9))
    edges = (DataEdge(src="src", dst="b0", size_bytes=4e7), DataEdge(src="src", dst="b1", size_bytes=4e7),
             DataEdge(src="b0", dst="sink", size_bytes=1e6), DataEdge(src="b1", dst="sink", size_bytes=1e6))
    devs = [Device(name="host", peak_tflops=1.0, efficiency=1.0, mem_bandwidth_GBps=1e3, memory_bytes=200e9),
            Device(name="gpu", peak_tflops=4.0, efficiency=1.0, mem_bandwidth_GBps=1e3, memory_bytes=40e9)]
    chans = [Channel(name="nvlink", bandwidth_GBps=10.0, latency_s=1e-5),
             Channel(name="pcie", bandwidth_GBps=8.0, latency_s=1e-5)]
    return OpGraph(operators=ops, edges=edges), DeviceGraph.mesh(devs, chans)


def multi_edge_vs_single_link(opts: SolveOptions) -> None:
    """Plan on the single-link abstraction (fastest channel per pair), replay on the real graph."""
    print("\nmulti-edge vs single-link: plan on each model, score on the real multi-edge graph")
    llama = model_presets()["Llama-7B"]
    for name, (graph, devices) in {
        "host+gpu toy (tests)": host_gpu_case(),
        "layer tp2 rs+ag, 3 dev": (transformer_layer_dag(llama, precision="fp16", shards=2, split_allreduce=True),
                                   cluster(3)),
    }.items():
        multi = solve_schedule(graph, devices, backend="highs", options=opts)
        single = solve_schedule(graph, devices.single_link(), backend="highs", options=opts)
        real = replay(single.schedule, graph, devices)
        moved = sum(multi.schedule.ops[v].device != single.schedule.ops[v].device for v in multi.schedule.ops)
        print(f"  {name:<24} multi-edge plan {multi.objective_s * 1e3:.3f} ms ({multi.solver.status.value}); "
              f"single-link plan promised {single.objective_s * 1e3:.3f} ms ({single.solver.status.value}), "
              f"on the real graph {real.objective_s * 1e3:.3f} ms; {moved} operator(s) placed differently")


def bandwidth_drop(opts: SolveOptions) -> None:
    print("\nbandwidth drop: the busiest channel falls to 1/10 of its bandwidth")
    llama = model_presets()["Llama-7B"]
    graph = transformer_layer_dag(llama, precision="fp16", shards=2, split_allreduce=True)
    devices = cluster(4)
    base = solve_schedule(graph, devices, backend="highs", options=opts)
    load: dict[tuple[str, str, str], float] = {}
    for t in base.schedule.transfers.values():
        key = (*sorted((t.src_device, t.dst_device)), t.channel)
        load[key] = load.get(key, 0.0) + t.end_s - t.start_s
    if not load:
        print("  the schedule uses no link; nothing to drop")
        return
    a, b, ch = max(load, key=load.get)
    old = next(c for c in devices.channels(a, b) if c.name == ch).bandwidth_GBps
    t0 = time.perf_counter()
    rep = reschedule_after_bandwidth_change(graph, devices, base.schedule, (a, b), ch, old / 10,
                                            backend="highs", options=opts)
    print(f"  {a} <-> {b} {ch}: {old:g} -> {old / 10:g} GB/s; before {rep.before_s * 1e3:.3f} ms, kept schedule "
          f"{rep.kept_s * 1e3:.3f} ms, re-scheduled {rep.rescheduled_s * 1e3:.3f} ms "
          f"({rep.saving:.1%} saved, greedy after {rep.greedy_after_s * 1e3:.3f} ms, "
          f"{rep.solver.status.value}, {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
