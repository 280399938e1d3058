"""hetplan's sailor preset against Sailor's simulator on the golden records: per figure, how many
values were compared, the largest and the 95th-percentile relative error, and the fits verdicts.

The records (../shared/reference/sailor/golden/sailor_simulator_golden.json, its README gives the
fields) are plans scored by Sailor's `runtime_simulator.py` at eth-easl/sailor cf2c8e3. Each plan is
read with `plan_from_sailor` on the instance `sailor_instance_dict(..., preset="sailor")` of its
cluster and scored by `hetplan.simulator.simulate` (the sailor iteration model). The same
comparisons, held to 1e-9, are tests/test_sailor_fidelity.py::test_golden_record.

    HETPLAN_SHARED_DIR=../shared python benchmarks/sailor_golden.py [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from hetplan.estimators import build_estimators
from hetplan.importers.sailor import sailor_instance_dict
from hetplan.importers.sailor_plan import plan_from_sailor
from hetplan.instance import instance_from_dict
from hetplan.simulator import simulate

REPO = Path(__file__).resolve().parents[1]


def rel(ours: float, theirs: float) -> float:
    return 0.0 if ours == theirs else abs(ours - theirs) / max(abs(theirs), 1e-12)


def compare(ref: Path, records: list[dict]) -> tuple[dict[str, list[float]], int]:
    """Relative errors per figure, and how many records have the same fits verdict."""
    errors: dict[str, list[float]] = {}
    same_fits, clusters = 0, {}
    for rec in records:
        if rec["cluster_id"] not in clusters:
            counts = {tuple(key.rsplit("_", 1)): n for key, n in rec["cluster"].items()}
            inst = instance_from_dict(sailor_instance_dict(ref, rec["model"], gpu_counts=counts, preset="sailor",
                                                           name=rec["cluster_id"]))
            clusters[rec["cluster_id"]] = (inst, build_estimators(inst))
        inst, est = clusters[rec["cluster_id"]]
        plan = plan_from_sailor(rec["plan"], inst)
        r = simulate(inst, plan, est)
        same_fits += (not r.oom_ranks) == rec["fits"]
        whole = {"iteration time": (r.iteration_time_s, rec["iteration_time_s"]),
                 "T_pp": (r.pipeline_s + r.update_s, rec["T_pp_s"]), "T_sync": (r.sync_s, rec["T_sync_s"]),
                 "comm cost / iter": (r.egress_cost_usd, rec["comm_cost_usd_per_iter"]),
                 "cost / iter": (r.cost_per_iteration_usd, rec["cost_usd_per_iter"])}
        for name, (ours, theirs) in whole.items():
            errors.setdefault(name, []).append(rel(ours, theirs))
        for s, stage in enumerate(rec["stages"]):
            mine = r.stages[s]
            for name, ours, key in (("per-stage compute", mine.fwd_s + mine.bwd_s, "compute_s"),
                                    ("per-stage p2p", mine.p2p_s, "p2p_comm_s"),
                                    ("per-stage update", mine.update_s, "update_s")):
                errors.setdefault(name, []).append(rel(ours, stage[key]))
            for tp, nbytes in stage["mem_bytes_by_tp"].items():
                rank = next(x for x in r.ranks if x.stage == s and plan.stages[s].replicas[x.replica].tp == int(tp))
                errors.setdefault("memory per stage & TP", []).append(rel(rank.memory.total_bytes, nbytes))
    return errors, same_fits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = ap.parse_args(argv)
    ref = Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared")) / "reference" / "sailor"
    path = ref / "golden" / "sailor_simulator_golden.json"
    if not path.is_file():
        print(f"no golden records at {path}", file=sys.stderr)
        return 2
    records = json.loads(path.read_text())["records"]
    errors, same_fits = compare(ref, records)
    rows = [{"figure": name, "n": len(v), "max_rel": max(v), "p95_rel": float(np.percentile(v, 95))}
            for name, v in errors.items()]
    if args.json:
        print(json.dumps({"records": len(records), "same_fits": same_fits, "figures": rows}, indent=2))
        return 0
    print(f"{'figure':<24} {'n':>6} {'max rel.':>10} {'p95':>10}")
    for row in rows:
        print(f"{row['figure']:<24} {row['n']:>6} {row['max_rel']:>10.2g} {row['p95_rel']:>10.2g}")
    print(f"fits verdict: the same on {same_fits} of {len(records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
