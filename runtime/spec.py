"""LaunchSpec: everything a process needs to run its part of a heterogeneous plan.

`build_spec(instance, plan)` turns a validated plan into one typed, JSON-serialisable object:

* rank table: one row per process (rank, node, local rank, GPU, stage, replica, TP rank,
  DP group, layer range, microbatch share and the sample range it takes of each global microbatch);
* process groups every rank creates in the same order: `tp.*` (one per replica with TP > 1),
  `grad.*` (gradient sync across the replicas that hold a layer unit), `p2p.*` (stage boundaries,
  one group per direction so NCCL puts forward and backward traffic on separate streams);
* gradient sync entries, one per layer unit held by more than one replica (AutoHet obs. 2, seed
  002 sec. III: layers are synchronised across exactly the replicas that hold them), plus one for
  tied embeddings when the embedding and the LM head live on different stages;
* p2p transfers between consecutive stages: which replica sends how many sequences to which,
  by contiguous sample ranges (Zorse sec. 4.2, seed 001);
* schedule (names as in torch.distributed.pipelining), batch and rendezvous settings.

Spec ranks are numbered node by node (nodes ordered by the first plan worker they host, local
ranks by plan worker order), which is what torchrun's static rendezvous assigns; the executor
still maps processes to spec ranks by node id and local rank, so c10d rendezvous works too.
`check_spec` re-checks the invariants on a spec read from disk.
"""
from __future__ import annotations

import ipaddress
import json
import lzma
import re
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetplan.errors import InstanceError, PlanError
from hetplan.instance import Instance, format_validation_error, instance_from_dict
from hetplan.plan import Plan, plan_from_dict, sample_ranges, validate_plan, workers

SPEC_FORMAT_VERSION = 1
_STRICT = ConfigDict(frozen=True, extra="forbid")
TIED_EMBEDDING_KEY = "0/wte"  # logical key of the word embedding, shared with the LM head when tied
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label (RFC 1123 sec. 2.1)
_XZ_MAGIC = b"\xfd7zXZ\x00"  # every .xz stream starts with these six bytes (xz file format 1.1.0, 2.1.1.1)


def dns_label(name: str, max_len: int = 63) -> str:
    """`name` as an RFC 1123 label, the form hostnames and Kubernetes object names take: lowercase
    letters, digits and '-', alphanumeric at both ends, at most `max_len` (<= 63) characters.
    Runs of other characters become one '-' ('US_Central1-A' -> 'us-central1-a')."""
    out = re.sub(r"[^a-z0-9]+", "-", name.lower())[:max_len].strip("-")
    return out or "x"


def _unique_label(name: str, taken: set[str]) -> str:
    """dns_label(name), with '-2', '-3', ... appended when another node already has that label
    (two ids may differ only in characters a label cannot hold)."""
    label, k = dns_label(name), 2
    while label in taken:
        suffix = f"-{k}"
        label = dns_label(name, 63 - len(suffix)) + suffix
        k += 1
    taken.add(label)
    return label


class RankSpec(BaseModel):
    """One row of the rank table: one process, one GPU."""

    model_config = _STRICT
    rank: int = Field(ge=0, description="global rank (node-contiguous, as torchrun assigns)")
    worker: int = Field(ge=0, description="index in hetplan.plan.workers() order (stage, replica, TP rank)")
    node: str
    node_rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    gpu_index: int = Field(ge=0, description="physical GPU index on the node")
    gpu_type: str
    zone: str
    stage: int = Field(ge=0)
    replica: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    tp_size: int = Field(ge=1)
    dp_group: str = Field(description="name of the stage's replica set")
    dp_rank: int = Field(ge=0)
    dp_size: int = Field(ge=1)
    layer_start: int = Field(ge=0)
    layer_end: int = Field(gt=0, description="exclusive")
    microbatch_share: int = Field(ge=1, description="sequences of each global microbatch")
    sample_start: int = Field(ge=0, description="first sequence of each global microbatch this replica takes")

    @property
    def is_tp_leader(self) -> bool:
        return self.tp_rank == 0


class NodeSpec(BaseModel):
    model_config = _STRICT
    node: str
    node_rank: int = Field(ge=0)
    hostname: str
    gpu_type: str
    zone: str
    gpus: tuple[int, ...] = Field(description="physical GPU indices in local-rank order (CUDA_VISIBLE_DEVICES)")
    ranks: tuple[int, ...] = Field(description="global ranks in local-rank order")

    @property
    def nproc(self) -> int:
        return len(self.ranks)


class ProcessGroupSpec(BaseModel):
    model_config = _STRICT
    name: str
    kind: Literal["tp", "grad", "p2p"]
    ranks: tuple[int, ...] = Field(min_length=2)


class HolderSpec(BaseModel):
    """A replica that holds the parameters of a sync entry; `ranks` in TP-rank order."""

    model_config = _STRICT
    stage: int
    replica: int
    tp_size: int
    ranks: tuple[int, ...]


class GradSyncSpec(BaseModel):
    """Gradient all-reduce of some layer units' parameters across the replicas holding them.

    mode `sharded`: every holder has the same TP degree, so TP rank k of each holder reduces its
    shards with the TP ranks k of the others (`groups[k]`). mode `gather`: TP degrees differ, so
    each holder gathers full gradients on its TP rank 0, the leaders reduce (`groups[0]`) and
    scatter the shards back.
    """

    model_config = _STRICT
    name: str
    units: tuple[int, ...]
    params: tuple[str, ...] = Field(default=(), description="'unit/name' keys; empty = all params of `units`")
    exclude: tuple[str, ...] = Field(default=(), description="'unit/name' keys synced by another entry")
    holders: tuple[HolderSpec, ...] = Field(min_length=2)
    mode: Literal["sharded", "gather"]
    groups: tuple[str, ...]


class TransferSpec(BaseModel):
    """Sequences of each global microbatch moved from stage `src_stage` to `src_stage + 1`.

    Forward: activations of `sequences` rows starting at `src_offset` in the sender's share go to
    rows starting at `dst_offset` of the receiver's share; backward moves their gradients back.
    """

    model_config = _STRICT
    src_stage: int
    src_replica: int
    dst_replica: int
    src_rank: int = Field(description="TP leader of the sending replica")
    dst_rank: int = Field(description="TP leader of the receiving replica")
    sequences: int = Field(ge=1)
    src_offset: int = Field(ge=0)
    dst_offset: int = Field(ge=0)


class ScheduleSpec(BaseModel):
    model_config = _STRICT
    name: Literal["GPipe", "1F1B"]  # torch.distributed.pipelining schedule names
    num_microbatches: int = Field(ge=1)


class BatchSpec(BaseModel):
    model_config = _STRICT
    global_batch_size: int = Field(ge=1)
    global_microbatch: int = Field(ge=1, description="sequences flowing through every stage per pipeline step")
    accumulation_steps: int = Field(ge=1)


class RendezvousSpec(BaseModel):
    model_config = _STRICT
    backend: Literal["static", "c10d"] = "static"
    master_addr: str
    master_port: int = Field(ge=1, le=65535)
    rdzv_endpoint: str
    rdzv_id: str
    nnodes: int = Field(ge=1)


class ModelSpec(BaseModel):
    """The trained architecture; the executor may shrink it (tests) but keeps num_layers."""

    model_config = _STRICT
    name: str = "custom"
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    ffn_hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=2)
    seq_len: int = Field(ge=1)
    tied_embeddings: bool = True

    @property
    def num_units(self) -> int:
        return self.num_layers + 2


class TrainingSpec(BaseModel):
    model_config = _STRICT
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(default=1e-3, gt=0)
    seed: int = 0
    precision: Literal["fp16", "bf16", "fp32"] = Field(default="bf16", description="the plan's precision")
    zero_stage: int = Field(default=0, ge=0, le=3)
    backend: Literal["auto", "gloo", "nccl"] = "auto"


class LaunchSpec(BaseModel):
    model_config = _STRICT
    format_version: int = SPEC_FORMAT_VERSION
    plan_name: str
    instance_name: str
    world_size: int = Field(ge=1)
    nodes: tuple[NodeSpec, ...]
    ranks: tuple[RankSpec, ...]
    process_groups: tuple[ProcessGroupSpec, ...]
    grad_sync: tuple[GradSyncSpec, ...]
    transfers: tuple[TransferSpec, ...]
    schedule: ScheduleSpec
    batch: BatchSpec
    rendezvous: RendezvousSpec
    model: ModelSpec
    training: TrainingSpec

    # ---- views --------------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return 1 + max(r.stage for r in self.ranks)

    def stage_ranks(self, stage: int) -> list[RankSpec]:
        return [r for r in self.ranks if r.stage == stage]

    def replica_ranks(self, stage: int, replica: int) -> list[RankSpec]:
        """Ranks of one replica in TP-rank order."""
        return sorted((r for r in self.ranks if r.stage == stage and r.replica == replica), key=lambda r: r.tp_rank)

    def replicas(self, stage: int) -> list[RankSpec]:
        """TP leaders of a stage's replicas, in replica order."""
        return sorted((r for r in self.ranks if r.stage == stage and r.tp_rank == 0), key=lambda r: r.replica)

    def stage_of_unit(self, unit: int) -> int:
        for r in self.ranks:
            if r.layer_start <= unit < r.layer_end:
                return r.stage
        raise PlanError(f"layer unit {unit} is on no stage", "ranks")

    def group(self, name: str) -> ProcessGroupSpec:
        for g in self.process_groups:
            if g.name == name:
                return g
        raise PlanError(f"unknown process group {name!r}", "process_groups")

    def node(self, node_id: str) -> NodeSpec:
        for n in self.nodes:
            if n.node == node_id:
                return n
        raise PlanError(f"node {node_id!r} is not in this launch (has {[n.node for n in self.nodes]})", "nodes")

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text; `indent=None` gives the compact form (about 40 % of the indented size)."""
        return self.model_dump_json(indent=indent)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path


def load_spec(path: str | Path) -> LaunchSpec:
    """Read a spec file (JSON, or xz-compressed JSON as the kubernetes target ships large specs)
    and check its invariants; PlanError names the offending field."""
    path = Path(path)
    if not path.exists():
        raise PlanError(f"launch spec not found: {path}")
    raw = path.read_bytes()
    try:
        text = lzma.decompress(raw, format=lzma.FORMAT_XZ) if raw.startswith(_XZ_MAGIC) else raw
    except lzma.LZMAError as exc:
        raise PlanError(f"launch spec {path} starts like an xz file but does not decompress: {exc}") from None
    try:
        spec = LaunchSpec.model_validate_json(text)
    except ValidationError as exc:
        raise PlanError(format_validation_error(exc), str(path)) from None
    check_spec(spec)
    return spec


# ---- building ---------------------------------------------------------------------------------
def build_spec(instance: Instance, plan: Plan, *, hosts: dict[str, str] | None = None,
               master_port: int = 29500, rendezvous: Literal["static", "c10d"] = "static",
               rdzv_id: str | None = None, training: TrainingSpec | None = None) -> LaunchSpec:
    """Validate and place the plan, then derive the launch spec; raises PlanError on any violation."""
    placed = validate_plan(instance, plan)
    batch = instance.workload.global_batch_size
    if placed.global_microbatch * placed.num_microbatches != batch:  # only batch_rounding ceil gets here
        raise PlanError(f"'ceil' (Sailor's rule) overshoots the global batch: {placed.num_microbatches} "
                        f"x {placed.global_microbatch} = {placed.num_microbatches * placed.global_microbatch} sequences "
                        f"for {batch}, and the executor trains the batch exactly; choose a microbatch and data-"
                        f"parallel degree that divide {batch}", "batch_rounding")
    rows = workers(instance, placed)
    hosts = dict(hosts or {})
    nodes, rank_of_worker = _order_nodes(instance, rows, hosts)
    unknown = sorted(set(hosts) - {n.node for n in nodes})
    if unknown:
        raise PlanError(f"hosts given for nodes the plan does not use: {unknown}", "hosts")
    for node_id, host in sorted(hosts.items()):
        _check_host(node_id, host)
    ranks = _rank_table(placed, rows, nodes, rank_of_worker)
    arch = instance.model_arch
    model = ModelSpec(name=arch.name, num_layers=arch.num_layers, hidden_size=arch.hidden_size,
                      num_heads=arch.num_heads, ffn_hidden_size=arch.ffn_hidden_size,
                      vocab_size=arch.vocab_size, seq_len=arch.seq_len, tied_embeddings=arch.tied_embeddings)
    ranks_by_replica = _ranks_by_replica(ranks)
    groups, grad_sync = _grad_sync(placed, model, ranks_by_replica)
    tp_groups = [ProcessGroupSpec(name=f"tp.s{s}.r{r}", kind="tp", ranks=tuple(rs))
                 for (s, r), rs in sorted(ranks_by_replica.items()) if len(rs) > 1]
    p2p_groups, transfers = _transfers(placed, ranks_by_replica)
    master = nodes[0].hostname
    if training is None:
        training = TrainingSpec(optimizer=instance.workload.optimizer, precision=instance.workload.precision,
                                zero_stage=instance.workload.zero_stage)
    spec = LaunchSpec(
        plan_name=plan.name or "plan", instance_name=instance.name, world_size=len(ranks),
        nodes=tuple(nodes), ranks=tuple(ranks), process_groups=tuple(tp_groups + groups + p2p_groups),
        grad_sync=tuple(grad_sync), transfers=tuple(transfers),
        schedule=ScheduleSpec(name=plan.schedule, num_microbatches=plan.num_microbatches),
        batch=BatchSpec(global_batch_size=instance.workload.global_batch_size,
                        global_microbatch=placed.global_microbatch, accumulation_steps=plan.num_microbatches),
        rendezvous=RendezvousSpec(backend=rendezvous, master_addr=master, master_port=master_port,
                                  rdzv_endpoint=f"{master}:{master_port}",
                                  rdzv_id=rdzv_id or f"hetplan-{plan.name or 'plan'}", nnodes=len(nodes)),
        model=model, training=training,
    )
    check_spec(spec)
    return spec


def _check_host(node_id: str, host: str) -> None:
    """A given host must be an IP address or a hostname of RFC 1123 labels: scripts put it in
    shell case patterns, hostfiles and torchrun's --master-addr."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if len(host) > 253 or not all(DNS_LABEL.match(part) for part in host.lower().split(".")):
        raise PlanError(f"host {host!r} of node {node_id} is neither an IP address nor a hostname (labels of "
                        f"letters, digits and '-', separated by '.')", f"hosts.{node_id}")


def _order_nodes(instance: Instance, rows, hosts: dict[str, str]):
    """Nodes ordered by the first worker they host; local ranks in worker order."""
    by_node: dict[str, list] = {}
    for w in rows:
        by_node.setdefault(w.node_id, []).append(w)
    order = sorted(by_node, key=lambda n: by_node[n][0].rank)
    nodes, rank_of_worker, next_rank = [], {}, 0
    # Node ids come from group names ('A100_US_Central1-A-0'): not always valid hostnames.
    taken = {hosts[n] for n in order if n in hosts}
    labels = {n: hosts[n] if n in hosts else _unique_label(n, taken) for n in order}
    for node_rank, node_id in enumerate(order):
        ws = by_node[node_id]
        ranks = tuple(range(next_rank, next_rank + len(ws)))
        for w, r in zip(ws, ranks):
            rank_of_worker[w.rank] = r
        next_rank += len(ws)
        node = instance.node_by_id[node_id]
        nodes.append(NodeSpec(node=node_id, node_rank=node_rank, hostname=labels[node_id],
                              gpu_type=node.gpu_type, zone=node.zone,
                              gpus=tuple(w.local_gpu for w in ws), ranks=ranks))
    return nodes, rank_of_worker


def _rank_table(plan: Plan, rows, nodes: list[NodeSpec], rank_of_worker: dict[int, int]) -> list[RankSpec]:
    node_of = {n.node: n for n in nodes}
    # per stage, not per row: a row per GPU times a share per replica is quadratic in the GPUs
    starts_of = [[a for a, _ in sample_ranges(plan.shares(s))] for s in range(len(plan.stages))]
    out = []
    for w in rows:
        stage = plan.stages[w.stage]
        rep = stage.replicas[w.replica]
        starts = starts_of[w.stage]
        node = node_of[w.node_id]
        rank = rank_of_worker[w.rank]
        out.append(RankSpec(
            rank=rank, worker=w.rank, node=w.node_id, node_rank=node.node_rank,
            local_rank=node.ranks.index(rank), gpu_index=w.local_gpu, gpu_type=w.gpu_type, zone=w.zone,
            stage=w.stage, replica=w.replica, tp_rank=w.tp_rank, tp_size=rep.tp,
            dp_group=f"stage{w.stage}", dp_rank=w.replica, dp_size=len(stage.replicas),
            layer_start=stage.layer_start, layer_end=stage.layer_end,
            microbatch_share=plan.share(w.stage, w.replica), sample_start=starts[w.replica]))
    return sorted(out, key=lambda r: r.rank)


def _ranks_by_replica(ranks: list[RankSpec]) -> dict[tuple[int, int], list[int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for r in sorted(ranks, key=lambda r: (r.stage, r.replica, r.tp_rank)):
        out.setdefault((r.stage, r.replica), []).append(r.rank)
    return out


def _holders(plan: Plan, stages: list[int], ranks_by_replica) -> tuple[HolderSpec, ...]:
    return tuple(HolderSpec(stage=s, replica=j, tp_size=rep.tp, ranks=tuple(ranks_by_replica[(s, j)]))
                 for s in stages for j, rep in enumerate(plan.stages[s].replicas))


def _sync_groups(prefix: str, holders: tuple[HolderSpec, ...]):
    """Process groups for one holder set: per TP rank if degrees agree, else TP leaders only."""
    degrees = {h.tp_size for h in holders}
    if len(degrees) == 1:
        t = degrees.pop()
        groups = [ProcessGroupSpec(name=f"{prefix}.tp{k}", kind="grad", ranks=tuple(h.ranks[k] for h in holders))
                  for k in range(t)]
        return "sharded", groups
    return "gather", [ProcessGroupSpec(name=f"{prefix}.leaders", kind="grad", ranks=tuple(h.ranks[0] for h in holders))]


def _grad_sync(plan: Plan, model: ModelSpec, ranks_by_replica):
    groups: list[ProcessGroupSpec] = []
    entries: list[GradSyncSpec] = []
    head = model.num_units - 1
    stage_of = {u: i for i, s in enumerate(plan.stages) for u in range(s.layer_start, s.layer_end)}
    tied_across = model.tied_embeddings and stage_of[0] != stage_of[head]
    for i, stage in enumerate(plan.stages):
        if len(stage.replicas) < 2:
            continue  # a unit held by one replica needs no sync
        holders = _holders(plan, [i], ranks_by_replica)
        mode, gs = _sync_groups(f"grad.s{i}", holders)
        groups += gs
        for u in range(stage.layer_start, stage.layer_end):
            exclude = (TIED_EMBEDDING_KEY,) if (u == 0 and tied_across) else ()
            entries.append(GradSyncSpec(name=f"unit{u}", units=(u,), exclude=exclude, holders=holders,
                                        mode=mode, groups=tuple(g.name for g in gs)))
    if tied_across:
        # Megatron keeps tied embeddings on first and last stage in sync by all-reducing the
        # word-embedding gradient between them; here across every replica of both stages.
        holders = _holders(plan, [stage_of[0], stage_of[head]], ranks_by_replica)
        mode, gs = _sync_groups("grad.tied", holders)
        groups += gs
        entries.append(GradSyncSpec(name="tied_embedding", units=(0, head), params=(TIED_EMBEDDING_KEY,),
                                    holders=holders, mode=mode, groups=tuple(g.name for g in gs)))
    return groups, entries


def _transfers(plan: Plan, ranks_by_replica):
    groups, transfers = [], []
    for s in range(len(plan.stages) - 1):
        src = sample_ranges(plan.shares(s))
        dst = sample_ranges(plan.shares(s + 1))
        for i, j, lo, hi in _overlaps(src, dst):
            transfers.append(TransferSpec(
                src_stage=s, src_replica=i, dst_replica=j, src_rank=ranks_by_replica[(s, i)][0],
                dst_rank=ranks_by_replica[(s + 1, j)][0], sequences=hi - lo,
                src_offset=lo - src[i][0], dst_offset=lo - dst[j][0]))
        leaders = sorted({ranks_by_replica[(s, i)][0] for i in range(len(src))}
                         | {ranks_by_replica[(s + 1, j)][0] for j in range(len(dst))})
        for direction in ("fwd", "bwd"):
            groups.append(ProcessGroupSpec(name=f"p2p.s{s}.{direction}", kind="p2p", ranks=tuple(leaders)))
    return groups, transfers


def _overlaps(src: list[tuple[int, int]], dst: list[tuple[int, int]]) -> Iterator[tuple[int, int, int, int]]:
    """(i, j, lo, hi) for every non-empty overlap of src[i] and dst[j], two contiguous partitions of
    one range, in (i, j) order: one merge pass instead of all pairs (10^6 pairs at 2 048 GPUs)."""
    i = j = 0
    while i < len(src) and j < len(dst):
        lo, hi = max(src[i][0], dst[j][0]), min(src[i][1], dst[j][1])
        if hi > lo:
            yield i, j, lo, hi
        if src[i][1] <= dst[j][1]:
            i += 1
        else:
            j += 1


# ---- invariants -------------------------------------------------------------------------------
def check_spec(spec: LaunchSpec) -> None:
    """Invariants a launch relies on; PlanError names the first violated one."""
    _check_world(spec)
    _check_layers(spec)
    _check_batch(spec)
    # One index of the rank table for the per-replica checks: spec.replica_ranks scans every row,
    # which made these checks quadratic (minutes at 2 048 ranks).
    rows_of = _replica_rows(spec)
    _check_tp(spec, rows_of)
    _check_groups(spec, rows_of)
    _check_transfers(spec)


def _replica_rows(spec: LaunchSpec) -> dict[tuple[int, int], list[RankSpec]]:
    """(stage, replica) -> its rows in TP-rank order, as spec.replica_ranks gives them."""
    out: dict[tuple[int, int], list[RankSpec]] = {}
    for r in sorted(spec.ranks, key=lambda r: (r.stage, r.replica, r.tp_rank)):
        out.setdefault((r.stage, r.replica), []).append(r)
    return out


def _check_world(spec: LaunchSpec) -> None:
    if len(spec.ranks) != spec.world_size:
        raise PlanError(f"world_size {spec.world_size} but the rank table has {len(spec.ranks)} rows", "world_size")
    numbers = sorted(r.rank for r in spec.ranks)
    if numbers != list(range(spec.world_size)):
        raise PlanError(f"ranks must be 0..{spec.world_size - 1} exactly once, got {numbers}", "ranks")
    seen: set[tuple[str, int]] = set()
    for r in spec.ranks:
        if (r.node, r.gpu_index) in seen:
            raise PlanError(f"GPU {r.node}:{r.gpu_index} is used by two ranks", f"ranks[{r.rank}].gpu_index")
        seen.add((r.node, r.gpu_index))
    node_ranks = sorted(n.node_rank for n in spec.nodes)
    if node_ranks != list(range(len(spec.nodes))) or spec.rendezvous.nnodes != len(spec.nodes):
        raise PlanError(f"node ranks {node_ranks} / nnodes {spec.rendezvous.nnodes} do not match "
                        f"the {len(spec.nodes)} nodes", "nodes")
    rows_of_node: dict[str, list[RankSpec]] = {}
    for r in spec.ranks:
        rows_of_node.setdefault(r.node, []).append(r)
    for n in spec.nodes:
        rows = sorted(rows_of_node.get(n.node, []), key=lambda r: r.local_rank)
        if tuple(r.rank for r in rows) != n.ranks or tuple(r.gpu_index for r in rows) != n.gpus:
            raise PlanError(f"node {n.node} lists ranks {n.ranks} / GPUs {n.gpus} but the rank table places "
                            f"{[r.rank for r in rows]} / {[r.gpu_index for r in rows]} there", f"nodes.{n.node}")
        if [r.local_rank for r in rows] != list(range(len(rows))):
            raise PlanError(f"local ranks on node {n.node} must be 0..{len(rows) - 1}", f"nodes.{n.node}")
    if sum(n.nproc for n in spec.nodes) != spec.world_size:
        raise PlanError(f"nodes run {sum(n.nproc for n in spec.nodes)} processes, world_size is "
                        f"{spec.world_size}", "world_size")


def _stage_ranges(spec: LaunchSpec) -> list[tuple[int, int]]:
    out = []
    for s in range(spec.num_stages):
        rows = spec.stage_ranks(s)
        if not rows:
            raise PlanError(f"stage {s} has no ranks (stages must be numbered 0..{spec.num_stages - 1})", "ranks")
        rngs = {(r.layer_start, r.layer_end) for r in rows}
        if len(rngs) != 1:
            raise PlanError(f"ranks of stage {s} disagree on its layer range: {sorted(rngs)}", f"stage {s}")
        out.append(rngs.pop())
    return out


def _check_layers(spec: LaunchSpec) -> None:
    expected = 0
    for s, (a, b) in enumerate(_stage_ranges(spec)):
        if a != expected or b <= a:
            raise PlanError(f"stage {s} holds layer units [{a}, {b}) but must start at {expected}: every "
                            f"layer unit must be on exactly one stage", f"stage {s}.layer_start")
        expected = b
    if expected != spec.model.num_units:
        raise PlanError(f"stages cover layer units [0, {expected}) but the model has {spec.model.num_units} "
                        f"(embedding + {spec.model.num_layers} blocks + head)", "model.num_layers")


def _check_batch(spec: LaunchSpec) -> None:
    b = spec.batch
    if b.accumulation_steps != spec.schedule.num_microbatches:
        raise PlanError(f"accumulation_steps {b.accumulation_steps} != schedule.num_microbatches "
                        f"{spec.schedule.num_microbatches}", "batch.accumulation_steps")
    for s in range(spec.num_stages):
        leaders = spec.replicas(s)
        shares = [r.microbatch_share for r in leaders]
        if [r.replica for r in leaders] != list(range(len(leaders))):
            raise PlanError(f"replicas of stage {s} must be numbered 0..{len(leaders) - 1}", f"stage {s}")
        if sum(shares) != b.global_microbatch:
            raise PlanError(f"microbatch shares of stage {s} sum to {sum(shares)}, the global microbatch is "
                            f"{b.global_microbatch}", f"stage {s}.microbatch_share")
        starts = [a for a, _ in sample_ranges(shares)]
        for r in spec.stage_ranks(s):
            if r.sample_start != starts[r.replica] or r.microbatch_share != shares[r.replica]:
                raise PlanError(f"rank {r.rank} takes samples from {r.sample_start} (share {r.microbatch_share}); "
                                f"contiguous ranges give {starts[r.replica]} (share {shares[r.replica]})",
                                f"ranks[{r.rank}].sample_start")
    if b.global_microbatch * b.accumulation_steps != b.global_batch_size:
        raise PlanError(f"sum of microbatch shares {b.global_microbatch} x accumulation {b.accumulation_steps} = "
                        f"{b.global_microbatch * b.accumulation_steps} != global batch {b.global_batch_size}",
                        "batch.global_batch_size")


def _check_tp(spec: LaunchSpec, rows_of: dict[tuple[int, int], list[RankSpec]]) -> None:
    for s in range(spec.num_stages):
        for leader in spec.replicas(s):
            rows = rows_of[(s, leader.replica)]
            nodes = sorted({r.node for r in rows})
            if len(nodes) != 1:
                raise PlanError(f"TP group of stage {s} replica {leader.replica} spans nodes {nodes}: TP stays "
                                f"inside one node", f"ranks[{rows[0].rank}].node")
            if [r.tp_rank for r in rows] != list(range(len(rows))) or any(r.tp_size != len(rows) for r in rows):
                raise PlanError(f"stage {s} replica {leader.replica} has TP ranks {[r.tp_rank for r in rows]} "
                                f"with tp_size {[r.tp_size for r in rows]}", f"ranks[{rows[0].rank}].tp_rank")
        dp = {r.dp_size for r in spec.stage_ranks(s)}
        if dp != {len(spec.replicas(s))}:
            raise PlanError(f"stage {s} has {len(spec.replicas(s))} replicas but dp_size says {sorted(dp)}",
                            f"stage {s}.dp_size")


def _check_groups(spec: LaunchSpec, rows_of: dict[tuple[int, int], list[RankSpec]]) -> None:
    names = [g.name for g in spec.process_groups]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"process group names repeated: {dupes}", "process_groups")
    for g in spec.process_groups:
        bad = [r for r in g.ranks if not 0 <= r < spec.world_size]
        if bad or len(set(g.ranks)) != len(g.ranks):
            raise PlanError(f"group {g.name} has ranks {g.ranks} (world size {spec.world_size})",
                            f"process_groups.{g.name}")
    known = set(names)
    for e in spec.grad_sync:
        for name in e.groups:
            if name not in known:
                spec.group(name)  # raises, naming the unknown group
        for h in e.holders:
            rows = rows_of.get((h.stage, h.replica), [])
            if tuple(r.rank for r in rows) != h.ranks:
                raise PlanError(f"holder stage {h.stage} replica {h.replica} lists ranks {h.ranks}, the rank "
                                f"table has {[r.rank for r in rows]}", f"grad_sync.{e.name}")
            for u in e.units:
                if not rows[0].layer_start <= u < rows[0].layer_end and not e.params:
                    raise PlanError(f"stage {h.stage} does not hold layer unit {u}", f"grad_sync.{e.name}")


def _check_transfers(spec: LaunchSpec) -> None:
    g = spec.batch.global_microbatch
    for s in range(spec.num_stages - 1):
        moves = [t for t in spec.transfers if t.src_stage == s]
        src = {r.replica: r for r in spec.replicas(s)}
        dst = {r.replica: r for r in spec.replicas(s + 1)}
        covered = [0] * g
        for t in moves:
            a, b = src.get(t.src_replica), dst.get(t.dst_replica)
            if a is None or b is None or (t.src_rank, t.dst_rank) != (a.rank, b.rank):
                raise PlanError(f"transfer {t.src_replica}->{t.dst_replica} after stage {s} names unknown "
                                f"replicas or non-leader ranks", "transfers")
            lo_a, lo_b = a.sample_start + t.src_offset, b.sample_start + t.dst_offset
            if (lo_a != lo_b or t.src_offset + t.sequences > a.microbatch_share
                    or t.dst_offset + t.sequences > b.microbatch_share):
                raise PlanError(f"transfer {t.src_replica}->{t.dst_replica} after stage {s} does not move the "
                                f"same contiguous samples", "transfers")
            for k in range(lo_a, lo_a + t.sequences):
                covered[k] += 1
        if covered != [1] * g:
            raise PlanError(f"transfers after stage {s} must move every sequence of the global microbatch exactly "
                            f"once (counts {covered})", "transfers")


# ---- re-planning launches (orchestration/regroup.py) ----------------------------------------------
def replan_document(instance: Instance, plan: Plan) -> str:
    """The contents of replan.json: the instance without its events (the executor re-plans for
    the nodes that are there, not for a trace) and the plan the launch was compiled from."""
    inst = instance.model_dump(mode="json")
    inst.pop("events", None)
    return json.dumps({"instance": inst, "plan": plan.model_dump(mode="json")}, indent=1) + "\n"


def read_replan_file(path: str | Path) -> tuple[Instance, Plan]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        return instance_from_dict(data["instance"], base_dir=str(path.parent)), plan_from_dict(data["plan"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InstanceError(f"cannot read the re-plan file {path}: {exc}", "--replan-file") from None
