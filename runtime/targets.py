"""Renderers: a LaunchSpec -> the files one launch target needs (text, deterministic).

torchrun, slurm and kubernetes run hetplan's own executor, so they take any valid plan.
megatron and deepspeed hand the plan to those frameworks, which need the same TP and DP on every
stage and one microbatch size (DESIGN.md, "Conventions for launch specs"); `megatron_refusal` /
`deepspeed_refusal` return the specific reason a plan does not fit, or None.
"""
from __future__ import annotations

import json
import shlex

import yaml

from hetplan.runtime.spec import LaunchSpec, NodeSpec

SPEC_FILE = "launch_spec.json"
EXECUTOR_MODULE = "hetplan.runtime.execute"
K8S_GPU_LABEL = "hetplan.io/gpu-type"  # node label the cluster admin sets to the GPU type name
K8S_SPEC_DIR = "/etc/hetplan"


def _node_file(node: NodeSpec) -> str:
    return f"node{node.node_rank}_{node.node}.sh"


def _rendezvous_flags(spec: LaunchSpec, node: NodeSpec, master_addr: str) -> list[str]:
    rdzv = spec.rendezvous
    if rdzv.backend == "c10d":
        return ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{rdzv.master_port}", f"--rdzv-id={rdzv.rdzv_id}"]
    return [f"--node-rank={node.node_rank}", f"--master-addr={master_addr}", f"--master-port={rdzv.master_port}"]


def torchrun_argv(spec: LaunchSpec, node: NodeSpec, spec_path: str, master_addr: str | None = None) -> list[str]:
    return (["torchrun", f"--nnodes={spec.rendezvous.nnodes}", f"--nproc-per-node={node.nproc}"]
            + _rendezvous_flags(spec, node, master_addr or spec.rendezvous.master_addr)
            + ["-m", EXECUTOR_MODULE, "--spec", spec_path])


def _multiline(argv: list[str]) -> str:
    """One flag (with its value) per line, for scripts people read."""
    lines, i = [], 0
    while i < len(argv):
        if argv[i].startswith("-") and "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            lines.append(f"{argv[i]} {argv[i + 1]}")
            i += 2
        else:
            lines.append(argv[i])
            i += 1
    return " \\\n  ".join(lines)


def node_env(node: NodeSpec) -> dict[str, str]:
    return {"HETPLAN_NODE_ID": node.node, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in node.gpus)}


# ---- torchrun ---------------------------------------------------------------------------------
def render_torchrun(spec: LaunchSpec) -> dict[str, str]:
    files = {}
    lines = [f"# hetplan launch of plan {spec.plan_name} on {spec.instance_name}: {spec.world_size} ranks on "
             f"{len(spec.nodes)} nodes; one line per node (environment + command), run from this directory"]
    for node in spec.nodes:
        env = node_env(node)
        argv = torchrun_argv(spec, node, SPEC_FILE)
        lines.append(" ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(argv))
        ranks = f"{node.ranks[0]}-{node.ranks[-1]}" if node.nproc > 1 else str(node.ranks[0])
        master = spec.rendezvous.master_addr
        body = [
            "#!/usr/bin/env bash",
            f"# hetplan plan {spec.plan_name}: node {node.node} (node rank {node.node_rank} of {len(spec.nodes)}), "
            f"{node.gpu_type} in {node.zone}, ranks {ranks}.",
            f"# Run on host {node.hostname}; MASTER_ADDR overrides the rendezvous host ({master}).",
            "set -euo pipefail",
            'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        ]
        body += [f"export {k}={v}" for k, v in env.items()]
        spec_arg = '"${HETPLAN_SPEC:-$here/../' + SPEC_FILE + '}"'
        argv = torchrun_argv(spec, node, spec_arg, '"${MASTER_ADDR:-' + master + '}"')
        body.append("exec " + _multiline(argv) + ' "$@"')
        files[f"torchrun/{_node_file(node)}"] = "\n".join(body) + "\n"
    files["torchrun/commands.txt"] = "\n".join(lines) + "\n"
    return files


# ---- slurm ------------------------------------------------------------------------------------
def render_slurm(spec: LaunchSpec, pin_hosts: bool = False) -> dict[str, str]:
    """`pin_hosts`: hostnames were given, so ask Slurm for exactly those nodes."""
    n = len(spec.nodes)
    port = spec.rendezvous.master_port
    cases = [f'  {node.hostname}) NODE_ID={node.node}; NPROC={node.nproc}; GPUS={",".join(map(str, node.gpus))} ;;'
             for node in spec.nodes]
    fallback = [f"      {node.node_rank}) NODE_ID={node.node}; NPROC={node.nproc}; "
                f"GPUS={','.join(map(str, node.gpus))} ;;" for node in spec.nodes]
    types = ", ".join(f"{node.hostname}: {node.nproc} x {node.gpu_type}" for node in spec.nodes)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=hetplan-{spec.plan_name}",
        f"#SBATCH --nodes={n}",
        f"#SBATCH --ntasks={n}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --nodelist={','.join(node.hostname for node in spec.nodes)}"] if pin_hosts else []),
        "#SBATCH --exclusive",
        f"# hetplan plan {spec.plan_name} on {spec.instance_name}: {spec.world_size} ranks ({types}).",
        "# One torchrun per node; c10d rendezvous on the first allocated host, so node ranks may come",
        "# in any order: every task names its plan node (HETPLAN_NODE_ID) and the executor maps ranks.",
        "set -euo pipefail",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_PORT={port}",
        f'export HETPLAN_SPEC="${{HETPLAN_SPEC:-$SLURM_SUBMIT_DIR/{SPEC_FILE}}}"',
        "read -r -d '' TASK <<'EOF' || true",
        'case "$(hostname -s)" in',
        *cases,
        "  *)",
        '    echo "hetplan: host $(hostname -s) is not named in the plan; using SLURM_NODEID=$SLURM_NODEID" >&2',
        '    case "$SLURM_NODEID" in',
        *fallback,
        '      *) echo "hetplan: no plan node for SLURM_NODEID=$SLURM_NODEID" >&2; exit 1 ;;',
        "    esac ;;",
        "esac",
        'export HETPLAN_NODE_ID="$NODE_ID" CUDA_VISIBLE_DEVICES="$GPUS"',
        f'exec torchrun --nnodes={n} --nproc-per-node="$NPROC" --rdzv-backend=c10d '
        f'--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="hetplan-$SLURM_JOB_ID" '
        f'-m {EXECUTOR_MODULE} --spec "$HETPLAN_SPEC"',
        "EOF",
        f'srun --nodes={n} --ntasks={n} --ntasks-per-node=1 bash -c "$TASK"',
    ]
    return {"hetplan.sbatch": "\n".join(lines) + "\n"}


# ---- kubernetes (Kubeflow PyTorchJob) ---------------------------------------------------------
def kubernetes_refusal(spec: LaunchSpec) -> str | None:
    """A PyTorchJob gives all Worker pods one template: nodes after the first must be alike."""
    workers = {(n.gpu_type, n.nproc) for n in spec.nodes[1:]}
    if len(workers) > 1:
        return (f"Kubeflow PyTorchJob gives every Worker pod one template, but nodes after the master differ "
                f"in (GPU type, processes): {sorted(workers)}; use the torchrun or slurm target")
    return None


def _pod(spec: LaunchSpec, node: NodeSpec, image: str) -> dict:
    # Pods take their node rank from Kubeflow's RANK (master 0, worker i -> i + 1); static
    # rendezvous then gives GROUP_RANK = node rank, which the executor maps to the plan's node.
    cmd = (f"torchrun --nnodes={len(spec.nodes)} --nproc-per-node={node.nproc} --node-rank=$RANK "
           f"--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m {EXECUTOR_MODULE} "
           f"--spec {K8S_SPEC_DIR}/{SPEC_FILE}")
    return {"replicas": None, "restartPolicy": "OnFailure", "template": {"spec": {
        "nodeSelector": {K8S_GPU_LABEL: node.gpu_type},
        "containers": [{
            "name": "pytorch", "image": image, "command": ["bash", "-c", cmd],
            "resources": {"limits": {"nvidia.com/gpu": node.nproc}},
            "volumeMounts": [{"name": "hetplan-spec", "mountPath": K8S_SPEC_DIR},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [{"name": "hetplan-spec", "configMap": {"name": f"hetplan-{_k8s_name(spec.plan_name)}-spec"}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }}}


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the spec JSON) as literal blocks, so the manifest stays readable."""


def _str_repr(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_repr)


def _k8s_name(name: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return out or "plan"


def render_kubernetes(spec: LaunchSpec, image: str = "hetplan-runtime:latest") -> dict[str, str]:
    name = _k8s_name(spec.plan_name)
    master = _pod(spec, spec.nodes[0], image)
    master["replicas"] = 1
    replica_specs = {"Master": master}
    if len(spec.nodes) > 1:
        worker = _pod(spec, spec.nodes[1], image)
        worker["replicas"] = len(spec.nodes) - 1
        replica_specs["Worker"] = worker
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"hetplan-{name}-spec"},
                  "data": {SPEC_FILE: spec.to_json() + "\n"}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": f"hetplan-{name}"},
           "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": replica_specs}}
    header = (f"# hetplan plan {spec.plan_name}: {spec.world_size} ranks; Master = node {spec.nodes[0].node}"
              + (f", Workers = {', '.join(n.node for n in spec.nodes[1:])}" if len(spec.nodes) > 1 else "")
              + f".\n# Nodes must carry the label {K8S_GPU_LABEL}=<GPU type>.\n")
    text = header + yaml.dump_all([config_map, job], Dumper=_LiteralDumper, sort_keys=False, width=120)
    return {"pytorchjob.yaml": text}


# ---- Megatron-LM ------------------------------------------------------------------------------
def _uniform(spec: LaunchSpec) -> tuple[int, int, int] | str:
    """(tp, dp, micro batch) if every stage has the same degrees and shares, else the reason."""
    tps = {(r.stage, r.replica): r.tp_size for r in spec.ranks}
    if len(set(tps.values())) > 1:
        return (f"replicas have different TP degrees {sorted(set(tps.values()))} "
                f"(per stage/replica: {dict(sorted(tps.items()))})")
    dps = [len(spec.replicas(s)) for s in range(spec.num_stages)]
    if len(set(dps)) > 1:
        return f"stages have different numbers of replicas (DP) {dps}"
    shares = sorted({r.microbatch_share for r in spec.ranks})
    if len(shares) > 1:
        return f"replicas have uneven microbatch shares {shares}"
    return tps[(0, 0)], dps[0], shares[0]


def _rank_order_refusal(spec: LaunchSpec, framework: str) -> str | None:
    """Frameworks place stage-major (rank = (stage * DP + replica) * TP + tp): the plan's placement
    survives only if every node holds a contiguous run of plan workers."""
    if any(r.worker != r.rank for r in spec.ranks):
        moved = [f"{r.node}:{r.gpu_index}" for r in spec.ranks if r.worker != r.rank]
        return (f"{framework} places ranks stage-major, node by node, but this plan interleaves stages across "
                f"nodes (GPUs {moved} would change role); place each node's GPUs on consecutive replicas")
    return None


def megatron_refusal(spec: LaunchSpec) -> str | None:
    if spec.schedule.name != "1F1B":
        return f"Megatron-LM runs 1F1B (optionally interleaved), not {spec.schedule.name}"
    uniform = _uniform(spec)
    if isinstance(uniform, str):
        return f"Megatron-LM needs the same TP and DP on every stage and one micro batch size: {uniform}"
    return _rank_order_refusal(spec, "Megatron-LM")


def _blocks_per_stage(spec: LaunchSpec) -> list[int]:
    head = spec.model.num_units - 1
    out = []
    for s in range(spec.num_stages):
        r = spec.replicas(s)[0]
        out.append(sum(1 for u in range(r.layer_start, r.layer_end) if 1 <= u < head))
    return out


def megatron_args(spec: LaunchSpec) -> list[str]:
    tp, dp, micro = _uniform(spec)  # type: ignore[misc]
    m, p = spec.model, spec.num_stages
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(p),
            "--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--num-attention-heads", str(m.num_heads), "--ffn-hidden-size", str(m.ffn_hidden_size),
            "--seq-length", str(m.seq_len), "--max-position-embeddings", str(m.seq_len),
            "--micro-batch-size", str(micro), "--global-batch-size", str(spec.batch.global_batch_size)]
    blocks = _blocks_per_stage(spec)
    middle = blocks[1:-1]
    even = p == 1 or (len(set(blocks)) == 1)
    if not even:
        if p >= 2 and blocks[0] > 0 and blocks[-1] > 0 and len(set(middle)) <= 1 and all(middle):
            args += ["--decoder-first-pipeline-num-layers", str(blocks[0]),
                     "--decoder-last-pipeline-num-layers", str(blocks[-1])]
        else:  # Megatron-core layout string: E = embedding, t = block, L = loss (head), | = stage
            stages = [("E" if s == 0 else "") + (f"t*{b}" if b else "") + ("," if s == p - 1 and b else "")
                      + ("L" if s == p - 1 else "") for s, b in enumerate(blocks)]
            args += ["--pipeline-model-parallel-layout", "|".join(stages)]
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    precision = spec.training.precision
    if precision in ("fp16", "bf16"):
        args.append(f"--{precision}")
    if spec.training.zero_stage >= 1:
        args.append("--use-distributed-optimizer")  # shards optimizer state over DP (ZeRO-1)
    args += ["--lr", str(spec.training.lr), "--seed", str(spec.training.seed)]
    return args


def render_megatron(spec: LaunchSpec) -> dict[str, str]:
    args = megatron_args(spec)
    pairs, i = [], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            pairs.append(args[i])
            i += 1
    files = {"megatron/args.json": json.dumps(args, indent=2) + "\n",
             "megatron/args.txt": "\n".join(pairs) + "\n"}
    for node in spec.nodes:
        master = spec.rendezvous.master_addr
        body = ["#!/usr/bin/env bash",
                f"# Megatron-LM for plan {spec.plan_name}: node {node.node} (node rank {node.node_rank}), "
                f"{node.gpu_type}.",
                "# MEGATRON_LM: checkout of Megatron-LM; DATA_ARGS: --data-path / --tokenizer-* for your corpus.",
                "set -euo pipefail",
                'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
                f"export CUDA_VISIBLE_DEVICES={','.join(map(str, node.gpus))}",
                f"exec torchrun --nnodes={len(spec.nodes)} --nproc-per-node={node.nproc} --node-rank={node.node_rank} "
                f"--master-addr=\"${{MASTER_ADDR:-{master}}}\" --master-port={spec.rendezvous.master_port} \\",
                '  "${MEGATRON_LM:?set MEGATRON_LM}/pretrain_gpt.py" $(cat "$here/args.txt") ${DATA_ARGS:-} "$@"']
        files[f"megatron/{_node_file(node)}"] = "\n".join(body) + "\n"
    return files


# ---- DeepSpeed --------------------------------------------------------------------------------
def deepspeed_uniform_parts(num_items: int, num_parts: int) -> list[int]:
    """Stage boundaries of DeepSpeed PipelineModule(partition_method='uniform'): equal chunks,
    the first (num_items mod num_parts) parts one item larger (deepspeed.runtime.utils)."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, extra = divmod(num_items, num_parts)
    return [p * chunk + min(p, extra) for p in range(num_parts + 1)]


def deepspeed_refusal(spec: LaunchSpec) -> str | None:
    if spec.schedule.name != "1F1B":
        return f"DeepSpeed's pipeline engine runs its own 1F1B-style schedule, not {spec.schedule.name}"
    uniform = _uniform(spec)
    if isinstance(uniform, str):
        return f"DeepSpeed needs the same DP on every stage and one micro batch size: {uniform}"
    tp = uniform[0]
    if tp != 1:
        return f"DeepSpeed alone has no tensor parallelism (plan uses TP={tp}); use the megatron target"
    p = spec.num_stages
    if p > 1:
        starts = [spec.replicas(s)[0].layer_start for s in range(p)] + [spec.model.num_units]
        uniform_parts = deepspeed_uniform_parts(spec.model.num_units, p)
        if starts != uniform_parts:
            return (f"DeepSpeed's PipelineModule cannot take an explicit layer list per stage: the plan's stage "
                    f"boundaries {starts} differ from partition_method='uniform' {uniform_parts}")
        if spec.training.zero_stage > 1:
            return (f"DeepSpeed pipeline parallelism supports ZeRO stage 0 or 1, the plan asks for "
                    f"{spec.training.zero_stage}")
    return _rank_order_refusal(spec, "DeepSpeed")


def deepspeed_config(spec: LaunchSpec) -> dict:
    _, dp, micro = _uniform(spec)  # type: ignore[misc]
    accumulation = spec.batch.accumulation_steps
    config: dict = {
        "train_batch_size": micro * accumulation * dp,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": spec.training.zero_stage},
        "optimizer": {"type": "Adam" if spec.training.optimizer == "adam" else "SGD",
                      "params": {"lr": spec.training.lr}},
        "steps_per_print": 10,
    }
    if spec.training.precision == "fp16":
        config["fp16"] = {"enabled": True}
    elif spec.training.precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def render_deepspeed(spec: LaunchSpec) -> dict[str, str]:
    p = spec.num_stages
    pipeline = {"num_stages": p, "partition_method": "uniform",
                "layers": ["embedding"] + [f"block{u}" for u in range(1, spec.model.num_units - 1)] + ["head"],
                "parts": deepspeed_uniform_parts(spec.model.num_units, p),
                "tied_embeddings": spec.model.tied_embeddings}
    hostfile = "".join(f"{n.hostname} slots={n.nproc}\n" for n in spec.nodes)
    include = "@".join(f"{n.hostname}:{','.join(map(str, n.gpus))}" for n in spec.nodes)
    launch = ["#!/usr/bin/env bash",
              f"# DeepSpeed for plan {spec.plan_name}: {spec.world_size} GPUs, {p} pipeline stages.",
              "# TRAIN_SCRIPT builds PipelineModule(layers, num_stages, partition_method='uniform')",
              "# with the layers of pipeline.json.",
              "set -euo pipefail",
              'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
              f'exec deepspeed --hostfile "$here/hostfile" --include "{include}" '
              f'--master_addr "${{MASTER_ADDR:-{spec.rendezvous.master_addr}}}" '
              f'--master_port {spec.rendezvous.master_port} \\',
              '  "${TRAIN_SCRIPT:?set TRAIN_SCRIPT}" --deepspeed --deepspeed_config "$here/ds_config.json" "$@"']
    return {"deepspeed/ds_config.json": json.dumps(deepspeed_config(spec), indent=2) + "\n",
            "deepspeed/pipeline.json": json.dumps(pipeline, indent=2) + "\n",
            "deepspeed/hostfile": hostfile,
            "deepspeed/launch.sh": "\n".join(launch) + "\n"}
