"""Re-plan inside the executor when an elastic rendezvous brings back fewer nodes than the plan.

A cluster launch compiled with `--min-nodes K` (runtime/targets.py) runs torchrun with
`--nnodes=K:N` and c10d rendezvous, one process per GPU of each node (LOCAL_RANK = the GPU's
index), and hands the executor `--replan-file replan.json`: the instance and the compiled plan.
When a node dies, its peers' collectives fail, torchrun restarts the survivors, and the
rendezvous closes with the nodes still there (once the dead node's keep-alive has expired and
the last call has passed). Then every process of the new round:

1. tells the others its node (HETPLAN_NODE_ID) and GPU (LOCAL_RANK): `gather_members`;
2. keeps the spec when every rank of it has its (node, GPU) process; otherwise process 0
   re-plans (orchestration/replan.py: warm from the compiled plan, every instance node that did not come
   marked failed) and broadcasts the new launch spec, or the reason there is none;
3. takes the rank of the spec on its (node, GPU), or none (a GPU the plan leaves idle).

The executor then resumes from the newest layer-wise checkpoint, which loads into any plan (TP
split and merge), so training goes on at the same global batch. A node that comes back joins
the rendezvous, torchrun restarts every node, and step 2 finds the compiled plan whole again.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import torch.distributed as dist

from hetplan.errors import HetplanError, PlanError
from hetplan.instance import Instance
from hetplan.plan import Plan
from hetplan.runtime.spec import LaunchSpec, build_spec, read_replan_file

Member = tuple[str, int]  # (node id, GPU index on the node) of one process


def runnable_tp(instance: Instance, model: dict[str, Any], choices: Iterable[int]) -> tuple[int, ...]:
    """The TP degrees the model that really runs (the instance's, with the run's overrides of
    heads, FFN width and vocabulary) can be split by: a plan the executor refuses is no plan."""
    arch = instance.model_arch
    sizes = [model.get("num_heads", arch.num_heads), model.get("ffn_hidden_size", arch.ffn_hidden_size),
             model.get("vocab_size", arch.vocab_size)]
    return tuple(t for t in choices if all(v % t == 0 for v in sizes)) or (1,)


def gather_members() -> list[Member]:
    """Every process's (node, GPU), indexed by process rank."""
    me: Member = (os.environ.get("HETPLAN_NODE_ID", ""), int(os.environ.get("LOCAL_RANK", "0")))
    if not me[0]:
        raise PlanError("a re-planning launch needs HETPLAN_NODE_ID on every node (the scripts set it)",
                        "environment")
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    members = [(str(n), int(g)) for n, g in everyone]
    seen: set[Member] = set()
    for m in members:
        if m in seen:
            raise PlanError(f"two processes claim GPU {m[1]} of node {m[0]} (HETPLAN_NODE_ID set twice?)", "nodes")
        seen.add(m)
    return members


def is_whole(spec: LaunchSpec, members: Iterable[Member]) -> bool:
    """Every rank of `spec` has the process of its (node, GPU)."""
    here = set(members)
    return all((r.node, r.gpu_index) in here for r in spec.ranks)


def replan_for(spec: LaunchSpec, members: list[Member], instance: Instance, plan: Plan,
               model: dict[str, Any], time_limit_s: float = 1.0) -> tuple[LaunchSpec, str]:
    """A launch spec for the nodes present (warm re-plan from `plan`) and a line saying what
    changed. Nodes of the instance with no process are failed; a present node's GPUs without a
    process (it was started with fewer) are refused afterwards with the reason."""
    from hetplan.cluster_state import ClusterState, NodeFailure
    from hetplan.orchestration.replan import ReplanOptions, replan

    t0 = time.perf_counter()
    present = {n for n, _ in members}
    unknown = sorted(present - set(instance.node_by_id))
    if unknown:
        raise PlanError(f"nodes {unknown} joined but are not in instance {instance.name!r}", "HETPLAN_NODE_ID")
    state = ClusterState.initial(instance)
    for node in instance.nodes:
        if node.node_id not in present:
            state = state.apply(NodeFailure(time_s=0.0, node=node.node_id))
    opts = ReplanOptions(planner_time_limit_s=time_limit_s,
                         tp_choices=runnable_tp(instance, model, ReplanOptions().tp_choices))
    res = replan(instance, plan, state, opts)
    if res.plan is None:
        raise PlanError(f"no plan fits the nodes present ({sorted(present)}): {'; '.join(res.notes)}", "nodes")
    lost = sorted({r.node for r in spec.ranks} - present)
    tag = (f"without-{lost[0]}" if len(lost) == 1 else f"without-{len(lost)}-nodes") if lost else "regrouped"
    new_plan = res.plan.model_copy(update={"name": f"{spec.plan_name}-{tag}"})
    hosts = {n.node: n.hostname for n in spec.nodes}
    used = {rep.node for st in new_plan.stages for rep in st.replicas if rep.node}
    new = build_spec(instance, new_plan, hosts={k: v for k, v in hosts.items() if k in used},
                     master_port=spec.rendezvous.master_port, rendezvous=spec.rendezvous.backend,
                     rdzv_id=spec.rendezvous.rdzv_id, training=spec.training)
    missing = sorted({(r.node, r.gpu_index) for r in new.ranks} - set(members))
    if missing:
        raise PlanError(f"the re-plan uses GPUs that run no process: {missing[:4]}; start one process per GPU on "
                        f"each node (the launch scripts of `hetplan compile --min-nodes` do)", "nodes")
    return new, (f"nodes present {_few(sorted(present))}, lost {_few(lost)}: re-planned in "
                 f"{time.perf_counter() - t0:.2f} s to {new.world_size} ranks in {new.num_stages} stages "
                 f"(plan {new.plan_name})")


def _few(names: list[str], k: int = 4) -> str:
    """A list for a log line: the first `k` names, then how many more."""
    return str(names) if len(names) <= k else f"{names[:k]} and {len(names) - k} more"


@dataclass(frozen=True)
class Arrangement:
    spec: LaunchSpec
    spec_rank: int | None  # None: this process's GPU is idle under `spec`
    proc_of: list[int]  # spec rank -> process rank
    note: str = ""  # what re-planning did ("" when the spec was kept)

    @property
    def has_idle(self) -> bool:
        return len(self.proc_of) < dist.get_world_size()


def assign(spec: LaunchSpec, members: list[Member], me: int) -> Arrangement:
    """Spec rank r runs on the process of (r.node, r.gpu_index); `me` is this process's rank."""
    index = {m: p for p, m in enumerate(members)}
    proc_of = [index[(r.node, r.gpu_index)] for r in spec.ranks]
    mine = next((r.rank for r in spec.ranks if (r.node, r.gpu_index) == members[me]), None)
    return Arrangement(spec, mine, proc_of)


def arrange(spec: LaunchSpec, replan_file: str | Path, model: dict[str, Any],
            time_limit_s: float = 1.0) -> Arrangement:
    """Steps 1-3 of the module docstring; every process calls it after init_process_group."""
    members = gather_members()
    if is_whole(spec, members):
        return assign(spec, members, dist.get_rank())
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            instance, plan = read_replan_file(replan_file)
            new, note = replan_for(spec, members, instance, plan, model, time_limit_s)
            payload[0] = {"spec": new.to_json(), "note": note}
        except HetplanError as exc:
            payload[0] = {"error": str(exc)}
    dist.broadcast_object_list(payload, src=0)
    if "error" in payload[0]:
        raise PlanError(f"cannot go on with the nodes present: {payload[0]['error']}", "nodes")
    new = LaunchSpec.model_validate_json(payload[0]["spec"])
    return replace(assign(new, members, dist.get_rank()), note=payload[0]["note"])
