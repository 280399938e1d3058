"""Migration plans: which layer-wise checkpoint shards every rank of a new plan loads, from where.

AutoHet sec. IV (seed 002): checkpoints are written per layer unit and per TP shard (parameters and
optimizer states, `runtime/checkpoint.py` writes them as `unit_NNNN/tp{r}of{t}.pt`), kept in each
node's memory and local disk and replicated to remote (cloud) storage. After a plan change each
rank loads only the layers it needs, local copies first, then peers over the fast network, and only
what no surviving node holds from remote storage (sec. IV-C); a new TP shard is a slice of one
old shard (TP split, e.g. 2 -> 4) or the concatenation of several (TP merge, e.g. 2 -> 1).

Pieces (`hetplan.runtime.pieces.rank_pieces`): a rank with TP degree t, TP rank r, holding units [a, b) needs
per unit the fraction [r/t, (r+1)/t) of the unit's sharded tensors and all of its replicated
tensors (for tied embeddings the LM head's matrix is the embedding's, content unit 0). Bytes per
parameter are the checkpointed states of `estimators.analytic.state_bytes` (ZeRO paper sec. 3.1):
the training-precision parameters plus the optimizer states (mixed-precision Adam: 2 + 12 bytes);
gradients are not checkpointed. Parameter counts come from `estimators.model_stats.unit_params`.

Sources, in order of preference, for each piece a new rank needs:
  gpu     its own GPU already holds it (the old rank on the same (node, GPU)): nothing moves
  local   another old rank on the same node held it (host memory / local disk copy)
  peer    a surviving node holds it: sent over the network (fastest link first, then the least
          loaded sender), unless fetching the same bytes from storage would finish earlier given
          the transfers already assigned to the receiving and sending nodes
  remote  remote storage: the checkpoint files as written (the TP degree of each stage's replica 0)
Old ranks on nodes that failed or were preempted (or GPUs listed as lost) hold nothing.

Recovery time (every transfer runs at the stated rates; a node fetches each distinct piece once and
shares it among its GPUs):
  local_s[n]  = local bytes of node n / local_GBps
  in_s[n]     = sum over peer pieces of bytes / link bandwidth (src, n) + remote bytes of n / remote_GBps_per_node
  out_s[n]    = sum over pieces n sends of bytes / link bandwidth
  recovery_s  = max( max_n max(local_s[n], in_s[n], out_s[n]), remote bytes in total / remote_total_GBps )
The baseline "everyone downloads from remote storage" (Varuna-style, AutoHet sec. V-C) fetches every
piece of every node from remote: remote_only_s = max( max_n bytes_n / remote_GBps_per_node, total / remote_total_GBps ).
Defaults are AutoHet's measured figures (sec. V-C): NVMe checkpoint loading at 3500 MB/s, cloud
storage at 1200 MB/s. ZeRO stages > 0 are not modelled (states are taken as replicated over DP).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable

from hetplan.cluster_state import ClusterState
from hetplan.errors import PlanError
from hetplan.estimators.analytic import state_bytes
from hetplan.estimators.base import Endpoint
from hetplan.estimators.network import AlphaBetaComm
from hetplan.instance import Instance
from hetplan.plan import Plan, validate_plan, workers
from hetplan.estimators.model_stats import unit_params
from hetplan.runtime.pieces import Piece, rank_pieces

SOURCES = ("gpu", "local", "peer", "remote")


@dataclass(frozen=True)
class MigrationOptions:
    local_GBps: float = 3.5  # AutoHet sec. V-C: NVMe SSD end-to-end checkpoint loading, 3500 MB/s
    remote_GBps_per_node: float = 1.2  # AutoHet sec. V-C: cloud storage bandwidth, 1200 MB/s
    remote_total_GBps: float | None = None  # the storage service's aggregate limit; None: none
    use_peers: bool = True  # False: local copies or remote storage only

    def __post_init__(self) -> None:
        for name in ("local_GBps", "remote_GBps_per_node"):
            if getattr(self, name) <= 0:
                raise PlanError(f"{name} must be positive, got {getattr(self, name)}", f"migration.{name}")
        if self.remote_total_GBps is not None and self.remote_total_GBps <= 0:
            raise PlanError("remote_total_GBps must be positive or None", "migration.remote_total_GBps")


@dataclass(frozen=True)
class ShardFile:
    """One file of the layer-wise checkpoint: a unit's TP shard (replicated tensors in every file)."""

    unit: int
    tp: int
    tp_rank: int
    param_bytes: float
    optimizer_bytes: float

    @property
    def path(self) -> str:
        return f"unit_{self.unit:04d}/tp{self.tp_rank}of{self.tp}.pt"

    @property
    def nbytes(self) -> float:
        return self.param_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class Fetch:
    """A piece of state one new rank loads: [lo, hi) of a unit's sharded tensors, or its replicated
    tensors, from a source holding [source_lo, source_hi) of it."""

    rank: int
    node: str
    gpu: int
    unit: int  # content unit (a tied LM head's matrix is unit 0's)
    part: str  # sharded | replicated
    lo: Fraction
    hi: Fraction
    nbytes: float
    source: str  # gpu | local | peer | remote
    source_node: str | None
    source_gpu: int | None
    source_lo: Fraction
    source_hi: Fraction
    file: str | None = None  # remote: the checkpoint file read


@dataclass(frozen=True)
class RankLoad:
    rank: int
    node: str
    gpu: int
    stage: int
    tp: int
    tp_rank: int
    layer_start: int
    layer_end: int
    ops: dict[int, str]  # content unit -> keep | copy | split | merge (how its sharded part is built)
    fetches: tuple[Fetch, ...]

    @property
    def moved(self) -> bool:
        return any(f.source != "gpu" for f in self.fetches)

    def bytes_by_source(self) -> dict[str, float]:
        out = {s: 0.0 for s in SOURCES}
        for f in self.fetches:
            out[f.source] += f.nbytes
        return out


@dataclass(frozen=True)
class MigrationPlan:
    files: tuple[ShardFile, ...]  # the old plan's checkpoint layout
    ranks: tuple[RankLoad, ...]
    bytes_by_source: dict[str, float]  # moved once per node ("gpu": bytes that stay in place)
    node_s: dict[str, float]
    recovery_s: float
    remote_only_bytes: float
    remote_only_s: float
    options: MigrationOptions = field(default_factory=MigrationOptions)

    @property
    def moved_ranks(self) -> int:
        return sum(1 for r in self.ranks if r.moved)

    @property
    def speedup_vs_remote(self) -> float:
        return self.remote_only_s / self.recovery_s if self.recovery_s > 0 else float("inf")

    def summary(self) -> dict[str, Any]:
        return {"recovery_s": self.recovery_s, "remote_only_s": self.remote_only_s,
                "bytes_by_source": self.bytes_by_source, "remote_only_bytes": self.remote_only_bytes,
                "moved_ranks": self.moved_ranks, "ranks": len(self.ranks), "checkpoint_files": len(self.files),
                "checkpoint_bytes": sum(f.nbytes for f in self.files)}


# ---- sizes ----------------------------------------------------------------------------------------
class _Sizes:
    def __init__(self, instance: Instance):
        wl = instance.workload
        sb = state_bytes(wl.precision, wl.optimizer)
        self.param_b, self.opt_b = sb.param, sb.optimizer
        self.arch = instance.model_arch

    def params(self, unit: int, part: str) -> int:
        p = unit_params(self.arch, unit)
        return p.sharded if part == "sharded" else p.replicated

    def piece_bytes(self, unit: int, part: str, lo: Fraction, hi: Fraction) -> float:
        return float(self.params(unit, part) * (hi - lo) * (self.param_b + self.opt_b))


def checkpoint_layout(instance: Instance, plan: Plan) -> list[ShardFile]:
    """The files `runtime.checkpoint` writes for a placed plan: replica 0 of every stage, one file
    per (unit, TP rank); a tied LM head's matrix is saved once, with unit 0."""
    sizes = _Sizes(instance)
    arch = instance.model_arch
    head = arch.num_units - 1
    out = []
    for st in plan.stages:
        t = st.replicas[0].tp
        for u in range(st.layer_start, st.layer_end):
            p = unit_params(arch, u)
            sharded = 0 if (arch.tied_embeddings and u == head and head != 0) else p.sharded
            n = sharded / t + p.replicated
            for r in range(t):
                out.append(ShardFile(u, t, r, n * sizes.param_b, n * sizes.opt_b))
    return out


# ---- the plan -------------------------------------------------------------------------------------
@dataclass
class _Holder:
    node: str
    gpu: int | None  # None: remote storage
    lo: Fraction
    hi: Fraction
    file: str | None = None


def migration_plan(instance: Instance, old_plan: Plan | None, new_plan: Plan, state: ClusterState | None = None,
                   lost_gpus: Iterable[tuple[str, int]] = (), options: MigrationOptions | None = None) -> MigrationPlan:
    """How every rank of `new_plan` gets its state after `old_plan` ran (see the module docstring).

    `state`: GPUs down in it have lost what they held, and its network gives the peer links
    (default: everything up, the instance's network). `old_plan` None: a fresh start, everything
    comes from remote storage."""
    opts = options or MigrationOptions()
    view = state.instance_view() if state is not None else instance
    if state is not None and state.instance.name != instance.name:
        raise PlanError(f"state belongs to instance {state.instance.name!r}, not {instance.name!r}", "state")
    new_plan = validate_plan(view, new_plan)
    arch = view.model_arch
    sizes = _Sizes(view)
    comm = AlphaBetaComm(view.cluster.network)
    nodes = view.node_by_id
    lost = set(lost_gpus)
    holders: dict[tuple[int, str], list[_Holder]] = {}
    remote: dict[tuple[int, str], list[_Holder]] = {}
    files: list[ShardFile] = []
    if old_plan is not None:
        old_plan = validate_plan(view, old_plan)
        files = checkpoint_layout(view, old_plan)
        for w in workers(view, old_plan):
            if (w.node_id, w.local_gpu) in lost or (state is not None and state.gpus_up.get(w.node_id, 0) <= w.local_gpu):
                continue
            st, rep = old_plan.stages[w.stage], old_plan.stages[w.stage].replicas[w.replica]
            for c, part, lo, hi in rank_pieces(arch, st.layer_start, st.layer_end, rep.tp, w.tp_rank):
                holders.setdefault((c, part), []).append(_Holder(w.node_id, w.local_gpu, lo, hi))
        for f in files:
            lo, hi = Fraction(f.tp_rank, f.tp), Fraction(f.tp_rank + 1, f.tp)
            remote.setdefault((f.unit, "replicated"), []).append(_Holder("remote", None, Fraction(0), Fraction(1), f.path))
            if arch.tied_embeddings and f.unit == arch.num_units - 1 and f.unit != 0:
                continue  # the head's matrix lives in unit 0's files
            remote.setdefault((f.unit, "sharded"), []).append(_Holder("remote", None, lo, hi, f.path))
    else:
        for st in new_plan.stages:  # a fresh start reads a checkpoint laid out like the new plan
            t = st.replicas[0].tp
            for u in range(st.layer_start, st.layer_end):
                for r in range(t):
                    path = ShardFile(u, t, r, 0, 0).path
                    c = 0 if (arch.tied_embeddings and u == arch.num_units - 1) else u
                    remote.setdefault((c, "sharded"), []).append(
                        _Holder("remote", None, Fraction(r, t), Fraction(r + 1, t), path))
                    remote.setdefault((u, "replicated"), []).append(_Holder("remote", None, Fraction(0), Fraction(1), path))

    loads = _Loads()

    def link_GBps(a: str, b: str) -> float:
        na, nb = nodes[a], nodes[b]
        return comm.link(Endpoint(na.zone, na.region, a, na.intra_node),
                         Endpoint(nb.zone, nb.region, b, nb.intra_node)).bandwidth_GBps

    ranks = []
    need: dict[str, set[Piece]] = {}  # distinct pieces per node, for the remote-only baseline
    for w in workers(view, new_plan):
        st, rep = new_plan.stages[w.stage], new_plan.stages[w.stage].replicas[w.replica]
        fetches: list[Fetch] = []
        pieces = rank_pieces(arch, st.layer_start, st.layer_end, rep.tp, w.tp_rank)
        need.setdefault(w.node_id, set()).update(pieces)
        for piece in sorted(pieces):
            fetches += _cover(w, piece, holders.get(piece[:2], []), remote.get(piece[:2], []), sizes, opts,
                              loads, link_GBps)
        ops = _ops(fetches)
        ranks.append(RankLoad(w.rank, w.node_id, w.local_gpu, w.stage, rep.tp, w.tp_rank, st.layer_start,
                              st.layer_end, ops, tuple(fetches)))
    need_b = {n: sum(sizes.piece_bytes(*p) for p in ps) for n, ps in need.items()}
    return _timed(files, ranks, need_b, opts, link_GBps)


@dataclass
class _Loads:
    """Seconds of network transfer already assigned per receiving / sending node, and the pieces
    each node already fetched (a node fetches a piece once for all its GPUs)."""

    in_s: dict[str, float] = field(default_factory=dict)
    out_s: dict[str, float] = field(default_factory=dict)
    fetched: dict[tuple, tuple[str, str | None, int | None, Fraction, Fraction, str | None]] = field(default_factory=dict)


def _sweep(todo: list[tuple[Fraction, Fraction]], group: list[_Holder]):
    """Cover the segments `todo` with the holders in order: [(holder, x, y)], segments left."""
    taken = []
    for h in group:
        rest = []
        for a, b in todo:
            x, y = max(a, h.lo), min(b, h.hi)
            if x >= y:
                rest.append((a, b))
                continue
            taken.append((h, x, y))
            rest += [seg for seg in ((a, x), (y, b)) if seg[0] < seg[1]]
        todo = rest
    return taken, todo


def _cover(w, piece: Piece, held: list[_Holder], remote: list[_Holder], sizes: _Sizes, opts: MigrationOptions,
           loads: _Loads, link_GBps) -> list[Fetch]:
    c, part, lo, hi = piece
    n = w.node_id

    def fetch(h_node, h_gpu, h_lo, h_hi, h_file, x, y, source) -> Fetch:
        return Fetch(w.rank, n, w.local_gpu, c, part, x, y, sizes.piece_bytes(c, part, x, y), source,
                     h_node, h_gpu, h_lo, h_hi, h_file)

    gpu = [h for h in held if h.node == n and h.gpu == w.local_gpu]
    whole = next((h for h in gpu if h.lo <= lo and hi <= h.hi), None)
    if whole is not None:
        return [fetch(whole.node, whole.gpu, whole.lo, whole.hi, None, lo, hi, "gpu")]
    out: list[Fetch] = []
    taken, todo = _sweep([(lo, hi)], gpu)
    out += [fetch(h.node, h.gpu, h.lo, h.hi, None, x, y, "gpu") for h, x, y in taken]
    taken, todo = _sweep(todo, [h for h in held if h.node == n and h.gpu != w.local_gpu])
    out += [fetch(h.node, h.gpu, h.lo, h.hi, None, x, y, "local") for h, x, y in taken]
    # over the network: pieces this node already fetched for another of its GPUs come along
    rest = []
    for x, y in todo:
        prev = loads.fetched.get((n, c, part, x, y))
        if prev is None:
            rest.append((x, y))
        else:
            src, s_node, s_gpu, s_lo, s_hi, s_file = prev
            out.append(fetch(s_node, s_gpu, s_lo, s_hi, s_file, x, y, src))
    todo = rest
    if todo and opts.use_peers:
        peers = [h for h in held if h.node != n]
        peers.sort(key=lambda h: (-link_GBps(h.node, n), loads.out_s.get(h.node, 0.0), h.node, h.gpu))
        taken, left = _sweep(todo, peers)
        # the peers' plan against fetching the same bytes from storage: keep what finishes first
        secs = [(h, x, y, sizes.piece_bytes(c, part, x, y) / (link_GBps(h.node, n) * 1e9)) for h, x, y in taken]
        t_in = loads.in_s.get(n, 0.0) + sum(s for *_, s in secs)
        t_out = max((loads.out_s.get(h.node, 0.0) + s for h, *_, s in secs), default=0.0)
        by_storage = loads.in_s.get(n, 0.0) + sum(sizes.piece_bytes(c, part, x, y) for _, x, y, _ in secs) / (
            opts.remote_GBps_per_node * 1e9)
        if secs and max(t_in, t_out) <= by_storage:
            for h, x, y, sec in secs:
                out.append(fetch(h.node, h.gpu, h.lo, h.hi, None, x, y, "peer"))
                loads.in_s[n] = loads.in_s.get(n, 0.0) + sec
                loads.out_s[h.node] = loads.out_s.get(h.node, 0.0) + sec
                loads.fetched[(n, c, part, x, y)] = ("peer", h.node, h.gpu, h.lo, h.hi, None)
            todo = left
    if todo:
        taken, todo = _sweep(todo, remote)
        for h, x, y in taken:
            f = fetch(None, None, h.lo, h.hi, h.file, x, y, "remote")
            out.append(f)
            loads.in_s[n] = loads.in_s.get(n, 0.0) + f.nbytes / (opts.remote_GBps_per_node * 1e9)
            loads.fetched[(n, c, part, x, y)] = ("remote", None, None, h.lo, h.hi, h.file)
    if todo:
        raise PlanError(f"rank {w.rank} needs unit {c} ({part} [{lo}, {hi})) but no GPU, node or checkpoint file "
                        f"holds it", "migration")
    return sorted(out, key=lambda f: (f.lo, f.source))


def _ops(fetches: list[Fetch]) -> dict[int, str]:
    """keep: its GPU holds the shard; copy: one old shard as is; split: a slice of one old shard;
    merge: several old shards concatenated."""
    out = {}
    by_unit: dict[int, list[Fetch]] = {}
    for f in fetches:
        if f.part == "sharded":
            by_unit.setdefault(f.unit, []).append(f)
    for u, fs in by_unit.items():
        if len(fs) > 1:
            out[u] = "merge"
        elif fs[0].source == "gpu" and (fs[0].lo, fs[0].hi) == (fs[0].source_lo, fs[0].source_hi):
            out[u] = "keep"
        elif (fs[0].lo, fs[0].hi) == (fs[0].source_lo, fs[0].source_hi):
            out[u] = "copy"
        else:
            out[u] = "split"
    return out


def _timed(files: list[ShardFile], ranks: list[RankLoad], need_b: dict[str, float], opts: MigrationOptions,
           link_GBps) -> MigrationPlan:
    by_source = {s: 0.0 for s in SOURCES}
    local_b: dict[str, float] = {}
    in_s: dict[str, float] = {}
    out_s: dict[str, float] = {}
    remote_total = 0.0
    seen = set()
    for r in ranks:
        for f in r.fetches:
            if f.source == "gpu":
                by_source["gpu"] += f.nbytes
                continue
            key = (f.node, f.unit, f.part, f.lo, f.hi, f.source, f.source_node)
            if key in seen:
                continue  # this node already fetched the piece for another of its GPUs
            seen.add(key)
            by_source[f.source] += f.nbytes
            if f.source == "local":
                local_b[f.node] = local_b.get(f.node, 0.0) + f.nbytes
            elif f.source == "peer":
                s = f.nbytes / (link_GBps(f.source_node, f.node) * 1e9)
                in_s[f.node] = in_s.get(f.node, 0.0) + s
                out_s[f.source_node] = out_s.get(f.source_node, 0.0) + s
            else:
                in_s[f.node] = in_s.get(f.node, 0.0) + f.nbytes / (opts.remote_GBps_per_node * 1e9)
                remote_total += f.nbytes
    node_s = {}
    for n in set(local_b) | set(in_s) | set(out_s):
        node_s[n] = max(local_b.get(n, 0.0) / (opts.local_GBps * 1e9), in_s.get(n, 0.0), out_s.get(n, 0.0))
    recovery = max(node_s.values(), default=0.0)
    all_remote = sum(need_b.values())
    remote_only = max((b / (opts.remote_GBps_per_node * 1e9) for b in need_b.values()), default=0.0)
    if opts.remote_total_GBps is not None:
        recovery = max(recovery, remote_total / (opts.remote_total_GBps * 1e9))
        remote_only = max(remote_only, all_remote / (opts.remote_total_GBps * 1e9))
    return MigrationPlan(tuple(files), tuple(ranks), by_source, node_s, recovery, all_remote, remote_only, opts)
