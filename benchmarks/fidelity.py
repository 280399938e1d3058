"""Predicted vs measured: the simulator, fed a profile measured here, against runs of the executor.

    python benchmarks/fidelity.py                 # profile this machine, then measure every plan
    python benchmarks/fidelity.py --profile P.yaml --steps 12 --json

1. `hetplan profile` measures the runtime's own model (runtime/model.py) on this CPU: per layer unit
   forward / backward time, optimizer step, parameter and saved-activation bytes, the TP
   collectives, and the loopback p2p link (one torch thread per process).
2. An instance on one emulated 2-"GPU" node of the profiled device type (`CPU-1thread`, defined by
   the profile) uses the estimators `time: profile`, `memory: profile` and `comm: alpha_beta` (its
   intra-node link: the profile's measured p2p fit).
3. Each plan runs with `hetplan.runtime.measure.measure_plan` (the executor of `hetplan launch
   --local` with its probe on); the table puts the median iteration time and the peak accounted
   memory of the ranks beside the simulator's figures.

Setting (document it with any number taken from here): a 2-core machine, one torch thread per rank,
plans with at most 2 ranks busy at once, nothing else running (other load inflates every measured
part, and the profile's medians with it). Memory on CPU is accounted, not sampled from the OS:
parameters + gradients + optimizer state + tensors saved for backward (runtime/probe.py, the same
definition as the profiler's activation bytes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hetplan.instance import load_instance
from hetplan.plan import Plan, Replica, Stage
from hetplan.runtime.measure import measure_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import print_rows  # noqa: E402

# A 4-block GPT small enough for 2 CPU cores, large enough for block times of tens of ms.
ARCH = {"name": "fidelity-gpt", "family": "gpt", "num_layers": 4, "hidden_size": 256, "num_heads": 8,
        "ffn_hidden_size": 1024, "vocab_size": 2048, "seq_len": 128, "tied_embeddings": True}
GLOBAL_BATCH = 8
DEVICE = "CPU-1thread"
ZONE = "local-a"
MBS = "1,2,3,4"  # every share the plans below use is measured (no interpolation)


def profile(out: Path) -> Path:
    arch = out / "arch.yaml"
    arch.write_text(yaml.safe_dump(ARCH, sort_keys=False))
    path = out / "profile.yaml"
    exe = shutil.which("hetplan") or "hetplan"
    subprocess.run([exe, "profile", "--model", str(arch), "--mbs", MBS, "--tp", "1,2", "--threads", "1",
                    "--gpu-type", DEVICE, "--warmup", "3", "--repeats", "7", "-o", str(path)], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def write_instance(out: Path, profile_path: Path) -> Path:
    data = {
        "name": "fidelity-cpu",
        "cluster": {"node_groups": [{"name": "local", "gpu_type": DEVICE, "gpus_per_node": 2, "count": 1,
                                     "zone": ZONE, "price_per_gpu_hour_usd": 0.0}]},
        "workload": {"model": {"arch": ARCH}, "global_batch_size": GLOBAL_BATCH, "precision": "fp32",
                     "optimizer": "adam",
                     "profiles": [{"gpu_type": DEVICE, "path": str(profile_path.resolve()), "format": "hetplan"}]},
        "estimators": {"time": "profile", "memory": "profile", "comm": "alpha_beta"},
    }
    path = out / "instance.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _rep(tp: int = 1, share: int | None = None) -> Replica:
    return Replica(gpu_type=DEVICE, tp=tp, zone=ZONE, microbatch_share=share)


def plans() -> list[Plan]:
    U = ARCH["num_layers"] + 2
    whole = (Stage(layer_start=0, layer_end=U, replicas=(_rep(),)),)
    halves = (Stage(layer_start=0, layer_end=U // 2, replicas=(_rep(),)),
              Stage(layer_start=U // 2, layer_end=U, replicas=(_rep(),)))
    skewed = (Stage(layer_start=0, layer_end=2, replicas=(_rep(),)),
              Stage(layer_start=2, layer_end=U, replicas=(_rep(),)))
    return [
        Plan(name="1 stage, TP 1, mbs 2 x 4", num_microbatches=4, micro_batch_size=2, stages=whole),
        Plan(name="1 stage, TP 2, mbs 2 x 4", num_microbatches=4, micro_batch_size=2,
             stages=(Stage(layer_start=0, layer_end=U, replicas=(_rep(tp=2),)),)),
        Plan(name="2 stages 3+3, 1F1B, mbs 2 x 4", num_microbatches=4, micro_batch_size=2, stages=halves),
        Plan(name="2 stages 3+3, GPipe, mbs 2 x 4", schedule="GPipe", num_microbatches=4, micro_batch_size=2,
             stages=halves),
        Plan(name="2 stages 2+4, 1F1B, mbs 1 x 8", num_microbatches=8, micro_batch_size=1, stages=skewed),
        Plan(name="1 stage, DP 2, shares 3+1 x 2", num_microbatches=2,
             stages=(Stage(layer_start=0, layer_end=U, replicas=(_rep(share=3), _rep(share=1))),)),
    ]


def row(plan: Plan, res: Any) -> dict[str, Any]:
    m, s, e = res.measured, res.simulated, res.relative_error
    return {"plan": plan.name, "schedule": plan.schedule,
            "measured_iteration_time_s": m["iteration_time_s"], "simulated_iteration_time_s": s["iteration_time_s"],
            "iteration_time_error": e["iteration_time_s"],
            "measured_peak_memory_bytes": m["peak_memory_bytes"],
            "simulated_peak_memory_bytes": s["peak_memory_bytes"], "peak_memory_error": e["peak_memory_bytes"],
            "parts": {k: {"measured": m[k], "simulated": s[k], "error": e[k]} for k in m},
            "steps_used": res.steps_used}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("plan", "meas it s", "sim it s", "err", "meas peak MiB", "sim peak MiB", "err", "pipeline err",
            "sync err", "update err")
    table = [(r["plan"], f"{r['measured_iteration_time_s']:.3f}", f"{r['simulated_iteration_time_s']:.3f}",
              _pct(r["iteration_time_error"]), f"{r['measured_peak_memory_bytes'] / 2**20:.1f}",
              f"{r['simulated_peak_memory_bytes'] / 2**20:.1f}", _pct(r["peak_memory_error"]),
              _pct(r["parts"]["pipeline_s"]["error"]), _pct(r["parts"]["sync_s"]["error"]),
              _pct(r["parts"]["update_s"]["error"])) for r in rows]
    print_rows(head, table)
    within = sum(abs(r["iteration_time_error"]) <= 0.15 and abs(r["peak_memory_error"]) <= 0.15 for r in rows)
    print(f"\nwithin 15 % on both iteration time and peak memory: {within} of {len(rows)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", type=Path, help="use this profile (hetplan format) instead of measuring one")
    ap.add_argument("--out", type=Path, help="keep the profile, instance and run logs here (default: temp)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", help="comma-separated plan numbers (1-based)")
    ap.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of the table")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="hetplan-fidelity-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.profile is None:
        print(f"profiling this machine into {out} ...", file=sys.stderr, flush=True)
    prof = args.profile or profile(out)
    inst = load_instance(write_instance(out, prof))
    chosen = plans()
    if args.only:
        chosen = [chosen[int(i) - 1] for i in args.only.split(",")]
    rows = []
    for k, plan in enumerate(chosen):
        res = measure_plan(inst, plan, steps=args.steps, warmup=args.warmup, out_dir=out / f"run{k}")
        rows.append(row(plan, res))
        print(f"  {plan.name}: measured {rows[-1]['measured_iteration_time_s']:.3f} s, simulated "
              f"{rows[-1]['simulated_iteration_time_s']:.3f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
