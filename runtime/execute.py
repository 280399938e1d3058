"""The executor: trains a heterogeneous plan on torch.distributed from a LaunchSpec.

    torchrun ... -m hetplan.runtime.execute --spec launch_spec.json [--steps N] [--hidden 64 ...]

Each process finds its row of the rank table (HETPLAN_SPEC_RANK; else HETPLAN_NODE_ID or
torchrun's GROUP_RANK plus LOCAL_RANK; else, with --single-host, RANK), tells the others which
row it took (so c10d rendezvous, which numbers nodes in arrival order, still works), creates the
spec's process groups, builds the layer units of its stage for its TP rank and trains:

* per iteration, the stage's GPipe or 1F1B action list; activations go forward and gradients
  backward between the TP leaders of consecutive stages, split by contiguous sample ranges
  (many-to-many when replica counts or shares differ), and are broadcast inside TP groups;
* after the last backward, gradients are synchronised per layer unit (gradsync.py) and the
  optimizer steps on local shards (SGD and Adam are element-wise, so sharded = unsharded);
* rank 0 prints and logs (JSON) per iteration the global-batch mean loss, the iteration time
  (slowest rank) and peak memory (torch.cuda.max_memory_allocated on CUDA, peak RSS on CPU);
* with RunOptions.measure (`--measure`), every rank also records per step its forward, backward,
  p2p-wait, sync and update times and its peak memory (runtime/probe.py), and each log row gets
  them per rank under "ranks" (runtime/measure.py compares them with the simulator).

With `--replan-file` (launches compiled with --min-nodes) one process runs per GPU, and when
nodes of the spec are missing the spec is re-planned for those present (orchestration/regroup.py,
started through `python -m hetplan.orchestration.worker`); a
process whose GPU the plan leaves idle waits for the others to finish.

gloo on CPU, NCCL when CUDA is present (device cuda:LOCAL_RANK).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from hetplan.errors import HetplanError, PlanError
from hetplan.runtime import checkpoint
from hetplan.runtime._forkserver import DIE_WITH_PARENT_ENV, die_with_parent
from hetplan.runtime.data import SyntheticTokens
from hetplan.runtime.gradsync import GradSync, plan_buckets
from hetplan.runtime.model import ModelConfig, StageModule, TPContext
from hetplan.runtime.probe import NULL_PROBE, NullProbe, StepProbe, step_record
from hetplan.runtime.schedule import stage_actions
from hetplan.runtime.spec import LaunchSpec, RankSpec, load_spec

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
MODEL_FIELDS = ("hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len", "tied_embeddings")


@dataclass(frozen=True)
class RunOptions:
    """How to run a spec; None falls back to the spec's own value."""

    steps: int = 10
    model: dict[str, Any] = field(default_factory=dict)  # overrides of MODEL_FIELDS (num_layers is the plan's)
    dtype: str = "float32"
    optimizer: str | None = None
    lr: float | None = None
    seed: int | None = None
    backend: str | None = None
    log_path: str | None = None
    dump_dir: str | None = None
    save_checkpoint: str | None = None
    load_checkpoint: str | None = None
    timeout_s: float = 300.0
    quiet: bool = False
    progress_dir: str | None = None  # each rank writes rank<r>.steps (steps completed) there
    measure: bool = False  # record per-rank step breakdowns (runtime/probe.py) into the log
    # Elastic runs (orchestration/elastic.py): a layer-wise checkpoint every `checkpoint_every` steps in
    # save_checkpoint/step_<iteration>/ (0: one checkpoint in save_checkpoint at the end); a file
    # holding N makes every rank stop, at the same step, once N iterations are done; each rank
    # touches progress_dir/rank<r>.hb every `heartbeat_s` seconds (0: no heartbeat).
    checkpoint_every: int = 0
    control_path: str | None = None
    heartbeat_s: float = 0.0
    # Cluster launches that survive a lost node (orchestration/regroup.py): the instance and plan to
    # re-plan from when the rendezvous brings fewer nodes, and the planner's time for it.
    replan_file: str | None = None
    replan_time_limit_s: float = 1.0


RANK_FILE_KINDS = ("steps", "hb", "ready")  # the files a worker writes per rank: rank<N>.<kind>


def rank_file(progress_dir: str | Path, spec_rank: int, kind: str) -> Path:
    """rank<N>.<kind> in `progress_dir`: the one naming of per-rank files (a launcher adds kinds of its
    own, runtime/local.py, and clears them all by this pattern)."""
    return Path(progress_dir) / f"rank{spec_rank}.{kind}"


def progress_path(progress_dir: str | Path, spec_rank: int) -> Path:
    """Steps a rank has completed, so a launcher can say when a rank died (runtime/local.py)."""
    return rank_file(progress_dir, spec_rank, "steps")


def heartbeat_path(progress_dir: str | Path, spec_rank: int) -> Path:
    """Touched by a rank's heartbeat thread: a stopped or wedged process stops touching it."""
    return rank_file(progress_dir, spec_rank, "hb")


def ready_path(progress_dir: str | Path, spec_rank: int) -> Path:
    """Written once a rank has built its stage and loaded its checkpoint: {"load_s", "ready_at"}."""
    return rank_file(progress_dir, spec_rank, "ready")


def steps_log_path(progress_dir: str | Path) -> Path:
    """The reporter appends one JSON row per finished step (a killed run keeps its rows)."""
    return Path(progress_dir) / "steps.jsonl"


def start_heartbeat(progress_dir: str | Path, spec_rank: int, interval_s: float) -> None:
    """A daemon thread that touches heartbeat_path every `interval_s`; it dies with the process
    and stops with it (SIGSTOP), which is what a supervisor watching the file needs to see."""
    import threading

    path = heartbeat_path(progress_dir, spec_rank)

    def beat() -> None:
        while True:
            path.touch()
            time.sleep(interval_s)

    threading.Thread(target=beat, name="hetplan-heartbeat", daemon=True).start()


NEVER = 2**62  # control-file value: no stop (or hold) requested


def read_control(control_path: str | Path | None) -> tuple[int, int]:
    """The control file's (stop, hold): "N" or "N K". Every rank stops after the step that
    completes iteration N, and waits after the step that completes iteration K until the file
    names another K (a supervisor injects a fault there, so the fault lands at that boundary and
    not a few steps later). Absent or caught mid-write: neither."""
    try:
        fields = [int(x) for x in Path(control_path).read_text().split()] if control_path else []
    except (OSError, ValueError):
        fields = []
    if len(fields) == 1:
        return fields[0], NEVER
    return (fields[0], fields[1]) if len(fields) == 2 else (NEVER, NEVER)


def write_control(control_path: Path, stop: int | None = None, hold: int | None = None) -> None:
    """Set the stop and / or the hold (one left None keeps the file's), atomically: a rank never
    reads half a file, which would read as "no hold"."""
    old_stop, old_hold = read_control(control_path)
    tmp = control_path.with_name(control_path.name + ".tmp")
    tmp.write_text(f"{old_stop if stop is None else stop} {old_hold if hold is None else hold}\n")
    os.replace(tmp, control_path)


def stop_requested(control_path: str | None, iterations_done: int) -> bool:
    """True once the control file asks to stop at or before `iterations_done` iterations."""
    return iterations_done >= read_control(control_path)[0]


def wait_while_held(control_path: str | None, iterations_done: int, limit_s: float) -> None:
    """Wait while the control file holds the ranks at `iterations_done` (at most `limit_s`: a
    supervisor that went away does not keep the job waiting forever)."""
    deadline = time.monotonic() + limit_s
    while read_control(control_path)[1] == iterations_done and time.monotonic() < deadline:
        time.sleep(0.005)


def model_config(spec: LaunchSpec, overrides: dict[str, Any]) -> ModelConfig:
    unknown = sorted(set(overrides) - set(MODEL_FIELDS))
    if unknown:
        raise PlanError(f"unknown model overrides {unknown}; allowed: {list(MODEL_FIELDS)} "
                        f"(num_layers follows the plan's layer units)", "model")
    base = {k: getattr(spec.model, k) for k in ("num_layers", *MODEL_FIELDS)}
    cfg = ModelConfig(**{**base, **{k: v for k, v in overrides.items() if v is not None}})
    cfg.check({r.tp_size for r in spec.ranks})
    return cfg


def check_checkpoint(spec: LaunchSpec, opts: RunOptions, root: Path, option: str, warn: bool = True) -> None:
    """Refuse, before any rank starts, a checkpoint at `root` that another model or optimizer than
    `opts` wrote (checkpoint.check_meta): every rank would fail on loading it, and be restarted.
    `warn`: say when it holds another dtype than the run's (a conversion, allowed)."""
    if not (root / checkpoint.META).exists():  # the load says so, as a rank's failure
        return
    meta = checkpoint.read_meta(root)
    optimizer = opts.optimizer or spec.training.optimizer  # as Trainer picks it
    checkpoint.check_meta(meta, root, asdict(model_config(spec, opts.model)), optimizer, option)
    note = checkpoint.dtype_note(meta, root, opts.dtype)
    if warn and note:
        warnings.warn(note, stacklevel=2)


# ---- process identity and groups --------------------------------------------------------------
def identify(spec: LaunchSpec, single_host: bool = False) -> int:
    """The spec rank of this process, from the environment torchrun / the launcher sets."""
    env = os.environ
    if "HETPLAN_SPEC_RANK" in env:
        return int(env["HETPLAN_SPEC_RANK"])
    if single_host:
        return int(env.get("RANK", "0"))
    if "HETPLAN_NODE_ID" in env or "GROUP_RANK" in env:
        if "HETPLAN_NODE_ID" in env:
            node = spec.node(env["HETPLAN_NODE_ID"])
        else:
            k = int(env["GROUP_RANK"])
            if not 0 <= k < len(spec.nodes):
                raise PlanError(f"GROUP_RANK {k} but the spec has {len(spec.nodes)} nodes", "nodes")
            node = spec.nodes[k]
        local = int(env.get("LOCAL_RANK", "0"))
        if not 0 <= local < node.nproc:
            raise PlanError(f"LOCAL_RANK {local} but node {node.node} runs {node.nproc} processes "
                            f"(torchrun --nproc-per-node must be {node.nproc})", f"nodes.{node.node}")
        return node.ranks[local]
    if spec.world_size == 1:
        return 0
    raise PlanError("cannot tell which rank this process is: set HETPLAN_NODE_ID (per node) or run under "
                    "torchrun with a static node rank", "environment")


@dataclass
class World:
    spec: LaunchSpec
    me: RankSpec
    proc_of: list[int]  # spec rank -> process rank
    groups: dict[str, Any]
    tp: TPContext
    device: torch.device
    group: Any = None  # the spec's ranks (None: every process, the default group)

    @property
    def is_reporter(self) -> bool:
        return self.me.rank == 0


def _map_ranks(spec: LaunchSpec, spec_rank: int, device: torch.device) -> list[int]:
    mine = torch.tensor([spec_rank], dtype=torch.int64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    claimed = [int(t.item()) for t in everyone]
    if sorted(claimed) != list(range(spec.world_size)):
        raise PlanError(f"processes claimed spec ranks {claimed}; each of 0..{spec.world_size - 1} must be taken "
                        f"once (is HETPLAN_NODE_ID / --nproc-per-node right on every node?)", "ranks")
    proc_of = [0] * spec.world_size
    for proc, r in enumerate(claimed):
        proc_of[r] = proc
    return proc_of


def setup_world(spec: LaunchSpec, spec_rank: int | None, device: torch.device,
                proc_of: list[int] | None = None) -> World | None:
    """`proc_of` None: one process per spec rank, which tell each other their rank. Given (a
    re-planned launch, orchestration/regroup.py), processes may outnumber the ranks: those without a
    rank (`spec_rank` None) create the groups with the others and get None."""
    if proc_of is None:
        if dist.get_world_size() != spec.world_size:
            raise PlanError(f"{dist.get_world_size()} processes started, the spec needs {spec.world_size}",
                            "world_size")
        proc_of = _map_ranks(spec, spec_rank, device)
    everyone = len(proc_of) == dist.get_world_size()
    group = None if everyone else dist.new_group(sorted(proc_of))
    groups: dict[str, Any] = {}
    # Every process creates every group, in spec order (torch.distributed requires it); rank
    # order is kept so that group rank == TP rank inside TP groups.
    for g in spec.process_groups:
        handle = dist.new_group([proc_of[r] for r in g.ranks], sort_ranks=False)
        if spec_rank in g.ranks:
            groups[g.name] = handle
    if spec_rank is None:
        return None
    me = spec.ranks[spec_rank]
    tp = TPContext(me.tp_size, me.tp_rank, groups.get(f"tp.s{me.stage}.r{me.replica}"))
    if tp.active and dist.get_rank(tp.group) != me.tp_rank:
        raise PlanError(f"rank {spec_rank}: TP group rank {dist.get_rank(tp.group)} != tp_rank {me.tp_rank}",
                        "process_groups")
    return World(spec, me, proc_of, groups, tp, device, group)


# ---- the pipeline -----------------------------------------------------------------------------
class Pipeline:
    """Runs one stage replica's schedule for one iteration."""

    def __init__(self, world: World, module: StageModule, data: SyntheticTokens, cfg: ModelConfig,
                 dtype: torch.dtype, probe: NullProbe = NULL_PROBE):
        spec, me = world.spec, world.me
        self.world, self.module, self.data, self.cfg, self.dtype = world, module, data, cfg, dtype
        self.probe = probe
        self.num_stages = spec.num_stages
        self.first, self.last = me.stage == 0, me.stage == spec.num_stages - 1
        self.leader = me.tp_rank == 0
        # pieces of this replica's share: from the previous stage (inbound), to the next (outbound)
        self.inbound = sorted((t for t in spec.transfers
                               if t.src_stage == me.stage - 1 and t.dst_replica == me.replica),
                              key=lambda t: t.dst_offset)
        self.outbound = sorted((t for t in spec.transfers if t.src_stage == me.stage and t.src_replica == me.replica),
                               key=lambda t: t.src_offset)
        g = world.groups
        self.in_fwd, self.in_bwd = g.get(f"p2p.s{me.stage - 1}.fwd"), g.get(f"p2p.s{me.stage - 1}.bwd")
        self.out_fwd, self.out_bwd = g.get(f"p2p.s{me.stage}.fwd"), g.get(f"p2p.s{me.stage}.bwd")
        self.actions = stage_actions(spec.schedule.name, spec.num_stages, me.stage, spec.schedule.num_microbatches)
        self.loss_scale = 1.0 / spec.batch.global_batch_size
        self._pending: list[tuple[Any, torch.Tensor]] = []

    def _shape(self, n: int) -> tuple[int, int, int]:
        return (n, self.cfg.seq_len, self.cfg.hidden_size)

    def _tokens(self, iteration: int, m: int) -> torch.Tensor:
        me, g = self.world.me, self.world.spec.batch.global_microbatch
        start = m * g + me.sample_start
        return self.data.batch(iteration, start, start + me.microbatch_share).to(self.world.device)

    def _recv(self, moves, offset_of, peer_of, group, tag: int) -> torch.Tensor:
        """Leader receives the pieces of its share from its peers; TP ranks get a broadcast copy."""
        buf = torch.empty(self._shape(self.world.me.microbatch_share), dtype=self.dtype, device=self.world.device)
        if self.leader:
            for t in moves:
                lo = offset_of(t)
                piece = torch.empty(self._shape(t.sequences), dtype=self.dtype, device=self.world.device)
                dist.recv(piece, src=self.world.proc_of[peer_of(t)], group=group, tag=tag)
                buf[lo: lo + t.sequences] = piece
        if self.world.tp.active:
            dist.broadcast(buf, group=self.world.tp.group, group_src=0)
        return buf

    def _send(self, value: torch.Tensor, moves, offset_of, peer_of, group, tag: int) -> None:
        if not self.leader:
            return
        for t in moves:
            lo = offset_of(t)
            piece = value[lo: lo + t.sequences].detach().contiguous()
            work = dist.isend(piece, dst=self.world.proc_of[peer_of(t)], group=group, tag=tag)
            self._pending.append((work, piece))

    def run(self, iteration: int) -> float:
        """One iteration's forwards and backwards; returns this rank's loss contribution."""
        inputs, outputs, loss_sum = {}, {}, 0.0
        probe = self.probe
        for kind, m in self.actions:
            if kind == "F":
                x, out = self._forward(iteration, m)
                if self.last:
                    if self.leader:
                        loss_sum += float(out.detach())
                else:
                    with probe.timed("p2p_wait_s"):
                        self._send(out, self.outbound, lambda t: t.src_offset, lambda t: t.dst_rank, self.out_fwd, m)
                inputs[m], outputs[m] = x, out
            else:
                x, out = inputs.pop(m), outputs.pop(m)
                self._backward(out, m)
                if not self.first:
                    with probe.timed("p2p_wait_s"):
                        self._send(x.grad, self.inbound, lambda t: t.dst_offset, lambda t: t.src_rank, self.in_bwd, m)
        with probe.timed("p2p_wait_s"):
            for work, _ in self._pending:
                work.wait()
        self._pending.clear()
        return loss_sum

    def _forward(self, iteration: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Microbatch m's input (tokens or received activations) and the stage's output."""
        probe = self.probe
        if self.first:
            with probe.timed("data_s"):
                x = self._tokens(iteration, m)[:, :-1]
        else:
            with probe.timed("p2p_wait_s"):
                x = self._recv(self.inbound, lambda t: t.dst_offset, lambda t: t.src_rank, self.in_fwd, m)
            x.requires_grad_(True)
        with probe.timed("data_s"):
            labels = self._tokens(iteration, m)[:, 1:] if self.last else None
        with probe.timed("forward_s"), probe.saving():
            out = self.module(x, labels, self.loss_scale)
        probe.sample_memory()
        return x, out

    def _backward(self, out: torch.Tensor, m: int) -> None:
        probe = self.probe
        if self.last:
            with probe.timed("backward_s"):
                out.backward()
        else:
            with probe.timed("p2p_wait_s"):
                grad = self._recv(self.outbound, lambda t: t.src_offset, lambda t: t.dst_rank, self.out_bwd, m)
            with probe.timed("backward_s"):
                torch.autograd.backward(out, grad)
        probe.sample_memory()


# ---- training loop ----------------------------------------------------------------------------
def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise PlanError(f"unknown optimizer {name!r}; use adam or sgd", "optimizer")


class Trainer:
    def __init__(self, world: World, opts: RunOptions):
        spec, me = world.spec, world.me
        if opts.dtype not in DTYPES:
            raise PlanError(f"unknown dtype {opts.dtype!r}; use one of {sorted(DTYPES)}", "dtype")
        self.world, self.opts = world, opts
        self.cfg = model_config(spec, opts.model)
        self.seed = spec.training.seed if opts.seed is None else opts.seed
        self.optimizer_name = opts.optimizer or spec.training.optimizer
        dtype = DTYPES[opts.dtype]
        self.module = StageModule(self.cfg, me.layer_start, me.layer_end, world.tp, self.seed, dtype, world.device)
        self.params = self.module.logical_params()
        self.optimizer = _make_optimizer(self.optimizer_name, [p for _, p in self.params],
                                         spec.training.lr if opts.lr is None else opts.lr)
        self.sync = GradSync(me, plan_buckets(spec, me, self.params), world.groups, world.tp)
        data = SyntheticTokens(self.cfg.vocab_size, self.cfg.seq_len, self.seed)
        self.probe = (StepProbe(world.device, [p for _, p in self.params], self.optimizer) if opts.measure
                      else NULL_PROBE)
        self.pipeline = Pipeline(world, self.module, data, self.cfg, dtype, self.probe)
        # spec rank -> its place in world.group, whose ranks follow the sorted process ranks
        slot = {p: i for i, p in enumerate(sorted(world.proc_of))}
        self.slot_of_rank = [slot[p] for p in world.proc_of]
        self.start_iteration = 0
        t0 = time.perf_counter()
        if opts.load_checkpoint:
            self.start_iteration = checkpoint.load_rank(Path(opts.load_checkpoint), world.tp, self.params,
                                                        self.optimizer)
        if opts.progress_dir:
            ready_path(opts.progress_dir, me.rank).write_text(json.dumps(
                {"load_s": time.perf_counter() - t0, "ready_at": time.time(), "pid": os.getpid()}) + "\n")

    def step(self, iteration: int) -> list[float]:
        """[time_s, peak_mem_bytes, loss], then the probe's STEP_FIELDS when measuring."""
        probe = self.probe
        probe.begin_step()
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.pipeline.run(iteration)
        with probe.timed("sync_s"):
            self.sync.sync()
        with probe.timed("update_s"):
            self.optimizer.step()
        probe.sample_memory()
        if self.world.device.type == "cuda":
            torch.cuda.synchronize(self.world.device)
        elapsed_s = time.perf_counter() - t0
        return [elapsed_s, float(_peak_memory_bytes(self.world.device)), loss, *probe.end_step(elapsed_s)]

    def _gather_stats(self, values: list[float]) -> list[list[float]]:
        """`step`'s values of every spec rank (all ranks send the same number)."""
        mine = torch.tensor(values, dtype=torch.float64, device=self.world.device)
        group = self.world.group
        allv = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(allv, mine, group=group)
        return [allv[slot].tolist() for slot in self.slot_of_rank]

    def train(self) -> dict[str, Any]:
        spec, opts = self.world.spec, self.opts
        steps = []
        for k in range(opts.steps):
            iteration = self.start_iteration + k
            # the stop flag rides on the step's all_gather: every rank sees every rank's flag, so
            # all stop after the same step although each read the control file at its own time
            stats = self._gather_stats(self.step(iteration) + [float(stop_requested(opts.control_path, iteration + 1))])
            stop = any(s.pop() for s in stats)
            row = {"step": k + 1, "iteration": iteration, "loss": sum(s[2] for s in stats),
                   "time_s": max(s[0] for s in stats), "peak_mem_bytes": [int(s[1]) for s in stats]}
            if opts.measure:
                row["ranks"] = [step_record(s[3:], r) for r, s in enumerate(stats)]
            steps.append(row)
            last = stop or k + 1 == opts.steps
            if opts.checkpoint_every and ((k + 1) % opts.checkpoint_every == 0 or last):
                # before the progress file says the step is done: a launcher that reads N may
                # count on checkpoint N (a rank killed after its last step loses nothing)
                self._checkpoint(checkpoint.step_dir(Path(opts.save_checkpoint), iteration + 1), iteration + 1)
            self._report(row, k)
            if stop:
                break
            if k + 1 < opts.steps:
                wait_while_held(opts.control_path, iteration + 1, opts.timeout_s)
        self._finish(self.start_iteration + len(steps))
        log = {"plan": spec.plan_name, "instance": spec.instance_name, "world_size": spec.world_size,
               "schedule": spec.schedule.name, "num_microbatches": spec.schedule.num_microbatches,
               "global_batch_size": spec.batch.global_batch_size, "model": asdict(self.cfg),
               "dtype": opts.dtype, "optimizer": self.optimizer_name,
               "backend": dist.get_backend(), "device": str(self.world.device),
               "process_rank_of_spec_rank": self.world.proc_of, "steps": steps,
               "ranks": [{"rank": r.rank, "node": r.node, "gpu_type": r.gpu_type, "stage": r.stage,
                          "replica": r.replica, "tp_rank": r.tp_rank} for r in spec.ranks]}
        if self.world.is_reporter and opts.log_path:
            Path(opts.log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(opts.log_path).write_text(json.dumps(log, indent=2) + "\n")
        return log

    def _report(self, row: dict[str, Any], k: int) -> None:
        """Progress file (after the step's checkpoint: a launcher reading N knows checkpoint N is
        complete), the reporter's step row and its console line."""
        opts, spec = self.opts, self.world.spec
        if self.world.is_reporter and opts.progress_dir:
            with steps_log_path(opts.progress_dir).open("a") as f:
                f.write(json.dumps({"iteration": row["iteration"], "loss": row["loss"], "time_s": row["time_s"]}) + "\n")
        if opts.progress_dir:
            progress_path(opts.progress_dir, self.world.me.rank).write_text(f"{k + 1}\n")
        if self.world.is_reporter and not opts.quiet:
            print(f"[hetplan] step {k + 1}/{opts.steps} loss {row['loss']:.6f} time {row['time_s']:.3f} s "
                  f"peak mem {max(row['peak_mem_bytes']) / 2**20:.1f} MiB (max over {spec.world_size} ranks)",
                  flush=True)

    def _finish(self, iteration: int) -> None:
        me, opts = self.world.me, self.opts
        if opts.dump_dir:
            d = Path(opts.dump_dir)
            d.mkdir(parents=True, exist_ok=True)
            torch.save({"rank": me.model_dump(), "params": {i.key: p.detach().cpu() for i, p in self.params},
                        "shard_dims": {i.key: i.shard_dim for i, _ in self.params}}, d / f"rank{me.rank}.pt")
        if opts.save_checkpoint and not opts.checkpoint_every:  # periodic ones are taken in train()
            self._checkpoint(Path(opts.save_checkpoint), iteration)

    def _checkpoint(self, root: Path, iteration: int) -> None:
        """Replica 0 of each stage writes its shards; the reporter writes meta.json last, once
        every rank has written (a folder without it is incomplete)."""
        me = self.world.me
        t0 = time.perf_counter()
        if self.world.is_reporter:  # a step written again (after a damaged one): incomplete until the end
            (root / checkpoint.META).unlink(missing_ok=True)
        if me.replica == 0:
            checkpoint.save_rank(root, me.layer_start, me.layer_end, self.world.tp, self.params, self.optimizer)
        dist.barrier(group=self.world.group)
        if self.world.is_reporter:
            tp_of_unit: dict[int, int] = {}
            for s in range(self.world.spec.num_stages):
                lead = self.world.spec.replicas(s)[0]
                tp_of_unit.update({u: lead.tp_size for u in range(lead.layer_start, lead.layer_end)})
            checkpoint.write_meta(root, iteration, asdict(self.cfg), self.optimizer_name, tp_of_unit,
                                  save_s=time.perf_counter() - t0, dtype=self.opts.dtype,
                                  files=checkpoint.shard_sizes(root))
            if self.opts.checkpoint_every:
                checkpoint.prune(root.parent, keep=2)
        dist.barrier(group=self.world.group)


def run_worker(spec: LaunchSpec, opts: RunOptions, *, spec_rank: int | None = None, init_method: str | None = None,
               process_rank: int | None = None, single_host: bool = False) -> dict[str, Any]:
    """Initialise torch.distributed (env:// unless `init_method`), train, tear down."""
    backend = opts.backend or spec.training.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=opts.timeout_s)}
    if init_method is not None:
        kwargs.update(init_method=init_method, rank=process_rank, world_size=spec.world_size)
    if opts.heartbeat_s > 0 and opts.progress_dir and spec_rank is not None:
        start_heartbeat(opts.progress_dir, spec_rank, opts.heartbeat_s)  # alive from before the rendezvous
    dist.init_process_group(backend, **kwargs)
    try:
        if opts.replan_file:
            return _run_regrouped(spec, opts, device)
        rank = identify(spec, single_host) if spec_rank is None else spec_rank
        if opts.heartbeat_s > 0 and opts.progress_dir and spec_rank is None:
            start_heartbeat(opts.progress_dir, rank, opts.heartbeat_s)
        world = setup_world(spec, rank, device)
        return Trainer(world, opts).train()
    finally:
        dist.destroy_process_group()


# A process the re-planned launch leaves idle waits in a barrier for the others to finish
# training; its group's timeout must outlast the run (gloo: barrier has no timeout of its own).
IDLE_WAIT = timedelta(days=30)


# How a launch with --replan-file re-plans for the nodes present: (spec, replan file, model
# overrides, time limit s) -> an arrangement (orchestration/regroup.py `Arrangement`). The runtime
# does not import the planner; orchestration/worker.py, the entry point of such launches, sets it.
Arranger = Callable[[LaunchSpec, str, dict, float], Any]
_arranger: Arranger | None = None


def use_arranger(arrange: Arranger | None) -> None:
    global _arranger
    _arranger = arrange


def _run_regrouped(spec: LaunchSpec, opts: RunOptions, device: torch.device) -> dict[str, Any]:
    """A launch compiled with --min-nodes: re-plan for the nodes present (orchestration/regroup.py)."""
    if _arranger is None:
        raise PlanError("--replan-file re-plans, which needs the planner: start this launch with "
                        "`python -m hetplan.orchestration.worker` (the launch files of `hetplan compile "
                        "--min-nodes` do)", "--replan-file")
    arr = _arranger(spec, opts.replan_file, opts.model, opts.replan_time_limit_s)
    if arr.note and dist.get_rank() == 0 and not opts.quiet:
        print(f"[hetplan] {arr.note}", flush=True)
    waiter = dist.new_group(backend="gloo", timeout=IDLE_WAIT) if arr.has_idle else None
    world = setup_world(arr.spec, arr.spec_rank, device, arr.proc_of)
    log = Trainer(world, opts).train() if world is not None else {}
    if waiter is not None:
        dist.barrier(group=waiter)
    return log


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hetplan.runtime.execute", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, help="launch_spec.json written by `hetplan compile`")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--hidden", dest="hidden_size", type=int)
    p.add_argument("--heads", dest="num_heads", type=int)
    p.add_argument("--ffn", dest="ffn_hidden_size", type=int)
    p.add_argument("--vocab", dest="vocab_size", type=int)
    p.add_argument("--seq-len", dest="seq_len", type=int)
    p.add_argument("--untied", dest="tied_embeddings", action="store_const", const=False,
                   help="separate LM head weight (default: the spec's tied_embeddings)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--optimizer", choices=["adam", "sgd"])
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--backend", choices=["gloo", "nccl"])
    p.add_argument("--log-json", dest="log", help="JSON log written by rank 0")
    p.add_argument("--dump-params", help="directory: every rank saves its parameter shards at the end")
    p.add_argument("--save-checkpoint", help="directory for a layer-wise checkpoint at the end")
    p.add_argument("--load-checkpoint", help="layer-wise checkpoint to start from")
    p.add_argument("--single-host", action="store_true", help="all ranks on this host: spec rank = RANK")
    p.add_argument("--collective-timeout", dest="timeout", type=float, default=300.0,
                   help="seconds before a collective gives up")
    p.add_argument("--progress-dir", help="directory: every rank writes rank<r>.steps, its completed steps")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="with --save-checkpoint or --resume: a checkpoint every N steps in DIR/step_<iteration>/")
    p.add_argument("--resume", metavar="DIR",
                   help="fault-tolerant run: start from the newest complete checkpoint in DIR (if any), write one "
                        "every --checkpoint-every steps (default 1) there, stop at iteration --steps; a restart "
                        "(torchrun --max-restarts, a requeued job) goes on where the last checkpoint left off")
    p.add_argument("--control-file", help="file holding N [K]: every rank stops after the step that completes "
                                          "iteration N, and waits after iteration K until K changes (written by "
                                          "a supervisor)")
    p.add_argument("--heartbeat", type=float, default=0.0,
                   help="seconds between touches of <progress-dir>/rank<r>.hb (0: none)")
    p.add_argument("--replan-file", help="replan.json written by `hetplan compile --min-nodes`: when nodes of the "
                                         "spec are missing from the rendezvous, re-plan for those present")
    p.add_argument("--replan-time-limit", type=float, default=1.0, help="seconds for that re-plan's planner")
    p.add_argument("--measure", action="store_true",
                   help="log per rank and step the forward/backward/p2p/sync/update times and peak memory")
    p.add_argument("--check-only", action="store_true",
                   help="check the spec, the model options and the checkpoint the run would start from, then "
                        "exit without training (exit 1 with the reason): the pre-flight of compiled launch files, "
                        "so that torchrun does not restart ranks that cannot start")
    return p


def _resume_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """--resume DIR: the RunOptions fields that continue the run from DIR's newest checkpoint
    (None: every iteration up to --steps is already done)."""
    if not args.resume:
        return {"steps": args.steps, "save_checkpoint": args.save_checkpoint,
                "load_checkpoint": args.load_checkpoint, "checkpoint_every": args.checkpoint_every}
    if args.save_checkpoint or args.load_checkpoint:
        raise PlanError("--resume replaces --save-checkpoint and --load-checkpoint", "--resume")
    last = checkpoint.latest(Path(args.resume))
    if _says_warnings(args):
        for d, why in checkpoint.damaged(Path(args.resume)):
            warnings.warn(f"{d} is damaged ({why}); resuming from {last.name if last else 'the start'}", stacklevel=2)
    start = checkpoint.read_meta(last)["iteration"] if last is not None else 0
    if start >= args.steps:
        return None
    return {"steps": args.steps - start, "save_checkpoint": args.resume,
            "load_checkpoint": str(last) if last is not None else None, "checkpoint_every": args.checkpoint_every or 1}


def _says_warnings(args: argparse.Namespace) -> bool:
    """Whether this process says the checkpoint's warnings: the pre-flight (--check-only), or else
    rank 0, so that a launch prints each once and not once per rank."""
    return args.check_only or os.environ.get("RANK", "0") == "0"


def _warning_line(message, *_args, **_kw) -> None:
    """A warning as one line, as the errors below (Python's adds the file, line and source)."""
    print(f"hetplan: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    if os.environ.get(DIE_WITH_PARENT_ENV) == "1":  # started by torchrun's agent for `launch --local`
        die_with_parent()
    args = _parser().parse_args(argv)
    warnings.showwarning = _warning_line
    overrides = {k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k, None) is not None}
    try:
        run = _resume_options(args)
    except HetplanError as exc:
        print(f"hetplan: error: {exc}", file=sys.stderr)
        return 1
    if run is None:
        if not args.check_only:  # the ranks say it
            print(f"hetplan: {args.resume} already holds iteration {args.steps}; nothing to train", file=sys.stderr)
        return 0
    opts = RunOptions(**run, model=overrides, dtype=args.dtype, optimizer=args.optimizer, lr=args.lr,
                      seed=args.seed, backend=args.backend, log_path=args.log, dump_dir=args.dump_params,
                      timeout_s=args.timeout, progress_dir=args.progress_dir, measure=args.measure,
                      control_path=args.control_file, heartbeat_s=args.heartbeat,
                      replan_file=args.replan_file, replan_time_limit_s=args.replan_time_limit)
    try:
        spec = load_spec(args.spec)
        if opts.load_checkpoint:  # a regrouped launch (--replan-file) trains the same model and optimizer
            check_checkpoint(spec, opts, Path(opts.load_checkpoint), "--resume" if args.resume else "--load-checkpoint",
                             warn=_says_warnings(args))
        if args.check_only:
            model_config(spec, opts.model)
            return 0
        run_worker(spec, opts, single_host=args.single_host)
    except HetplanError as exc:
        print(f"hetplan: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
