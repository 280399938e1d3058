"""Renderers: a LaunchSpec -> the files one launch target needs (text, deterministic).

torchrun, slurm and kubernetes run hetplan's own executor, so they take any valid plan.
megatron and deepspeed hand the plan to those frameworks, which need the same TP and DP on every
stage and one microbatch size (DESIGN.md, "Conventions for launch specs"); `megatron_refusal` /
`deepspeed_refusal` return the specific reason a plan does not fit, or None. A uniform GPipe plan
is accepted there and launched as 1F1B, with a note (`notes`) in the files and in README.md.
"""
from __future__ import annotations

import base64
import json
import lzma
import re
import shlex
import posixpath
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import yaml

from hetplan.errors import RefusedError
from hetplan.runtime.spec import LaunchSpec, NodeSpec, dns_label

SPEC_FILE = "launch_spec.json"
REPLAN_FILE = "replan.json"  # orchestration/regroup.py: the instance and plan, for re-planning on the nodes left
README_FILE = "README.md"
EXECUTOR_MODULE = "hetplan.runtime.execute"
# Launches that re-plan at rendezvous (--min-nodes) run the executor with the re-planner plugged in:
# the runtime itself does not import the planner (orchestration/worker.py)
REGROUP_EXECUTOR_MODULE = "hetplan.orchestration.worker"
K8S_GPU_LABEL = "hetplan.io/gpu-type"  # node label the cluster admin sets to the GPU type name
K8S_ZONE_LABEL = "topology.kubernetes.io/zone"  # well-known label; cloud providers set it on every node
K8S_SPEC_DIR = "/etc/hetplan"
K8S_IMAGE = "hetplan-runtime:latest"  # built from the Dockerfile at the repository root
# Kubernetes stores an object in etcd only if its data is at most 1 MiB (ConfigMap docs). Below
# K8S_PLAIN_SPEC_BYTES the spec stays readable JSON; client-side `kubectl apply` also copies the
# whole object into an annotation limited to 256 KiB, hence the margin. Larger specs go xz-compressed.
K8S_CONFIGMAP_LIMIT = 1024 * 1024
K8S_PLAIN_SPEC_BYTES = 200_000
# Label values: at most 63 characters, alphanumeric at both ends, '-', '_', '.' inside
# (k8s.io/apimachinery/pkg/util/validation, IsValidLabelValue).
_K8S_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _node_file(node: NodeSpec) -> str:
    return f"node{node.node_rank}_{dns_label(node.node)}.sh"


def _q(value: object) -> str:
    """A shell word: node ids and hosts come from instance files and may hold any character."""
    return shlex.quote(str(value))


def _rendezvous_flags(spec: LaunchSpec, node: NodeSpec, master_addr: str) -> list[str]:
    rdzv = spec.rendezvous
    if rdzv.backend == "c10d":
        return ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{rdzv.master_port}", f"--rdzv-id={rdzv.rdzv_id}"]
    return [f"--node-rank={node.node_rank}", f"--master-addr={master_addr}", f"--master-port={rdzv.master_port}"]


@dataclass(frozen=True)
class Resilience:
    """A launch that survives worker failures: torchrun restarts every worker of the job up to
    `max_restarts` times (torch.distributed.elastic), and the executor resumes from the newest
    layer-wise checkpoint in `checkpoint_dir`, written every `checkpoint_every` steps. The
    folder must be shared by all nodes (NFS, a mounted bucket) and be the same path on each.

    `min_nodes` K below the plan's N nodes also survives a node that does not come back: torchrun
    runs `--nnodes=K:N` with c10d rendezvous and one process per GPU of each node, and the
    executor re-plans for the nodes that rendezvous (orchestration/regroup.py, `--replan-file`).
    `node_gpus` (node id -> GPUs on it) is filled in by `compile_plan` from the instance."""

    checkpoint_dir: str
    checkpoint_every: int = 1
    max_restarts: int = 3
    min_nodes: int | None = None
    node_gpus: tuple[tuple[str, int], ...] = ()

    @property
    def regroups(self) -> bool:
        return self.min_nodes is not None

    @cached_property
    def gpus_of(self) -> dict[str, int]:
        """`node_gpus` as a mapping (read once per node by every renderer)."""
        return dict(self.node_gpus)


# torchrun shares its rendezvous TCPStore with the workers' init_process_group by default; after
# a restart the workers can then read the previous attempt's peer addresses and fail to connect
# (pytorch/pytorch#135712; seen here with gloo on torch 2.13). Not sharing it avoids that.
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _restart_env(res: Resilience | None) -> dict[str, str]:
    return dict(RESTART_ENV) if res else {}


def _restart_flags(res: Resilience | None) -> list[str]:
    return [f"--max-restarts={res.max_restarts}"] if res else []


def executor_module(resilience: Resilience | None) -> str:
    return REGROUP_EXECUTOR_MODULE if resilience and resilience.regroups else EXECUTOR_MODULE


def _resume_flags(res: Resilience | None, replan_path: str | None = None) -> list[str]:
    """`replan_path`: where the executor finds replan.json (only with re-planning)."""
    if not res:
        return []
    return (["--resume", res.checkpoint_dir, "--checkpoint-every", str(res.checkpoint_every)]
            + (["--replan-file", replan_path] if res.regroups else []))


def preflight_argv(spec_path: str, res: Resilience | None) -> list[str]:
    """The command a resilient launch runs on each node before torchrun: the executor's
    --check-only on the checkpoint it would resume from. torchrun restarts workers that exit 1 as
    it does any failure, so a checkpoint of another model would fail max_restarts + 1 times on
    every rank; checked first, it fails once, with its one line. Empty without resilience."""
    if not res:
        return []
    return ["python3", "-m", EXECUTOR_MODULE, "--check-only", "--spec", spec_path, "--resume", res.checkpoint_dir]


def _nnodes(spec: LaunchSpec, res: Resilience | None) -> str:
    n = spec.rendezvous.nnodes
    return f"{res.min_nodes}:{n}" if res and res.regroups else str(n)


def node_gpus(node: NodeSpec, res: Resilience | None) -> tuple[int, ...]:
    """The node's GPUs that get a process: the plan's, or with re-planning every GPU of the node
    (LOCAL_RANK = GPU index, so a new plan can use any of them)."""
    if res and res.regroups:
        return tuple(range(res.gpus_of[node.node]))
    return node.gpus


def torchrun_argv(spec: LaunchSpec, node: NodeSpec, spec_path: str, master_addr: str | None = None,
                  resilience: Resilience | None = None, replan_path: str | None = None) -> list[str]:
    """`replan_path` defaults to replan.json beside `spec_path`."""
    replan_path = replan_path or posixpath.join(posixpath.dirname(spec_path), REPLAN_FILE)
    return (["torchrun", f"--nnodes={_nnodes(spec, resilience)}",
             f"--nproc-per-node={len(node_gpus(node, resilience))}"]
            + _restart_flags(resilience)
            + _rendezvous_flags(spec, node, master_addr or spec.rendezvous.master_addr)
            + ["-m", executor_module(resilience), "--spec", spec_path] + _resume_flags(resilience, replan_path))


def _shell_words(words: list[str]) -> str:
    """' w1 w2 ...', each quoted unless it is a double-quoted shell expansion of ours."""
    return "".join(" " + _word(w) for w in words)


def _word(w: str) -> str:
    return w if w.startswith('"$') else _q(w)


def _multiline(argv: list[str]) -> str:
    """One flag (with its value) per line, for scripts people read; each word quoted as in
    `_shell_words` (a checkpoint folder may hold spaces), a flag=value whose value is one of our
    expansions ('--master-addr="${MASTER_ADDR:-host}"') left as it is."""
    def word(w: str) -> str:
        return w if '="$' in w else _word(w)

    lines, i = [], 0
    while i < len(argv):
        if argv[i].startswith("-") and "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            lines.append(f"{word(argv[i])} {word(argv[i + 1])}")
            i += 2
        else:
            lines.append(word(argv[i]))
            i += 1
    return " \\\n  ".join(lines)


def node_env(node: NodeSpec, res: Resilience | None = None) -> dict[str, str]:
    return {"HETPLAN_NODE_ID": node.node, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in node_gpus(node, res))}


# ---- notes and README -------------------------------------------------------------------------
def notes(spec: LaunchSpec, target: str) -> list[str]:
    """What the launch does differently from the plan, said in the files and in README.md."""
    framework = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}.get(target)
    if framework is None or spec.schedule.name == "1F1B":
        return []
    p, m = spec.num_stages, spec.schedule.num_microbatches
    # Both schedules run the same microbatches through the same stages and step once on the same
    # accumulated gradients; 1F1B only reorders forwards and backwards (Narayanan et al. 2021).
    return [f"The plan's schedule is {spec.schedule.name}; {framework} runs 1F1B instead: the same {m} "
            f"microbatches and the same optimizer step per iteration (the same math), with at most "
            f"{min(p, m)} microbatches' activations held per stage instead of {m} (lower activation memory)."]


_HOW_TO_RUN = {
    "torchrun": "Run `torchrun/node<rank>_<node>.sh` on each node, or the node's line of `torchrun/commands.txt` "
                "from inside `torchrun/`.",
    "slurm": "Submit `sbatch hetplan.sbatch` from this directory (it reads `launch_spec.json` from here).",
    "kubernetes": "`kubectl create -f pytorchjob.yaml` with the Kubeflow training operator installed; the image "
                  "is built from the Dockerfile at the root of the hetplan repository.",
    "megatron": "Set MEGATRON_LM (a Megatron-LM checkout) and DATA_ARGS, then run `megatron/node<rank>_<node>.sh` "
                "on each node.",
    "deepspeed": "Set TRAIN_SCRIPT, then run `deepspeed/launch.sh` on the first node.",
}


def render_readme(spec: LaunchSpec, target: str, lines: list[str], resilience: Resilience | None = None) -> str:
    nodes = ", ".join(f"{n.node} ({n.nproc} x {n.gpu_type}, {n.zone})" for n in spec.nodes)
    out = [f"# hetplan launch: plan {spec.plan_name} on {spec.instance_name}, target {target}", "",
           f"{spec.world_size} ranks on {len(spec.nodes)} nodes: {nodes}. `{SPEC_FILE}` is the launch spec "
           f"(rank table, process groups, schedule).", "", _HOW_TO_RUN[target]]
    if resilience is not None:
        every = "every step" if resilience.checkpoint_every == 1 else f"every {resilience.checkpoint_every} steps"
        out += ["", f"Workers checkpoint to `{resilience.checkpoint_dir}` {every} "
                f"and torchrun restarts them up to {resilience.max_restarts} times; they resume from the newest "
                f"checkpoint (the folder must be shared by every node). Before torchrun starts, each node checks "
                f"that a checkpoint there was written for this model and optimizer "
                f"(`python3 -m {EXECUTOR_MODULE} --check-only`), so a wrong folder stops the launch once."]
    if resilience is not None and resilience.regroups:
        nodes = f"{resilience.min_nodes} node{'s' if resilience.min_nodes > 1 else ''}"
        out.append(f"Each node runs one process per GPU and the job goes on with as few as {nodes}: when nodes "
                   f"are missing from the rendezvous, the executor re-plans for those present from `{REPLAN_FILE}` (the instance and this plan) and resumes there. The node holding the "
                   f"rendezvous (node rank 0) must stay.")
    if lines:
        out += ["", "## Notes", "", *[f"- {line}" for line in lines]]
    return "\n".join(out) + "\n"


def _comment_lines(lines: list[str]) -> list[str]:
    return [f"# NOTE: {line}" for line in lines]


# ---- torchrun ---------------------------------------------------------------------------------
def render_torchrun(spec: LaunchSpec, resilience: Resilience | None = None) -> dict[str, str]:
    files = {}
    lines = [f"# hetplan launch of plan {spec.plan_name} on {spec.instance_name}: {spec.world_size} ranks on "
             f"{len(spec.nodes)} nodes; one line per node (environment + command). Run each line from this "
             f"directory (torchrun/): the spec is ../{SPEC_FILE}"]
    for node in spec.nodes:
        env = node_env(node, resilience) | _restart_env(resilience)
        argv = torchrun_argv(spec, node, f"../{SPEC_FILE}", resilience=resilience)
        check = preflight_argv(f"../{SPEC_FILE}", resilience)
        lines.append((shlex.join(check) + " && " if check else "")
                     + " ".join(f"{k}={_q(v)}" for k, v in env.items()) + " " + shlex.join(argv))
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
        body += [f"export {k}={_q(v)}" for k, v in env.items()]
        spec_arg = '"${HETPLAN_SPEC:-$here/../' + SPEC_FILE + '}"'
        argv = torchrun_argv(spec, node, spec_arg, '"${MASTER_ADDR:-' + master + '}"', resilience,
                             '"$here/../' + REPLAN_FILE + '"')
        check = preflight_argv(spec_arg, resilience)
        if check:
            body.append(_shell_words(check).strip() + ' "$@"')
        body.append("exec " + _multiline(argv) + ' "$@"')
        files[f"torchrun/{_node_file(node)}"] = "\n".join(body) + "\n"
    files["torchrun/commands.txt"] = "\n".join(lines) + "\n"
    return files


# ---- slurm ------------------------------------------------------------------------------------
def render_slurm(spec: LaunchSpec, pin_hosts: bool = False, resilience: Resilience | None = None) -> dict[str, str]:
    """`pin_hosts`: hostnames were given, so ask Slurm for exactly those nodes."""
    n = len(spec.nodes)
    port = spec.rendezvous.master_port
    regroups = bool(resilience and resilience.regroups)
    replan_path = '"$SLURM_SUBMIT_DIR/' + REPLAN_FILE + '"'

    def task(node: NodeSpec) -> str:
        gpus = node_gpus(node, resilience)
        return f"NODE_ID={_q(node.node)}; NPROC={len(gpus)}; GPUS={','.join(map(str, gpus))} ;;"

    cases = [f"  {_q(node.hostname)}) {task(node)}" for node in spec.nodes]
    fallback = [f"      {node.node_rank}) {task(node)}" for node in spec.nodes]
    types = ", ".join(f"{node.hostname}: {node.nproc} x {node.gpu_type}" for node in spec.nodes)
    job_name = "hetplan-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.plan_name)  # one word in #SBATCH
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={n}",
        f"#SBATCH --ntasks={n}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --nodelist={','.join(node.hostname for node in spec.nodes)}"] if pin_hosts else []),
        "#SBATCH --exclusive",
        # a node that fails does not end the job: the others re-plan without it (orchestration/regroup.py)
        *(["#SBATCH --no-kill"] if regroups else []),
        f"# hetplan plan {spec.plan_name} on {spec.instance_name}: {spec.world_size} ranks ({types}).",
        "# One torchrun per node; c10d rendezvous on the first allocated host, so node ranks may come",
        "# in any order: every task names its plan node (HETPLAN_NODE_ID) and the executor maps ranks.",
        "set -euo pipefail",
        # Assigned apart from `export` so that a failing scontrol stops the script (shellcheck SC2155);
        # sed reads every line where head would exit early and, under pipefail, fail on scontrol's SIGPIPE.
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
        "export MASTER_ADDR",
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
        *[f"export {k}={v}" for k, v in _restart_env(resilience).items()],
        *([_shell_words(preflight_argv('"$HETPLAN_SPEC"', resilience)).strip() + " || exit 1"] if resilience else []),
        f'exec torchrun --nnodes={_nnodes(spec, resilience)} --nproc-per-node="$NPROC" '
        f'{"".join(f + " " for f in _restart_flags(resilience))}'
        f'--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="hetplan-$SLURM_JOB_ID" '
        f'-m {executor_module(resilience)} --spec "$HETPLAN_SPEC"'
        f'{_shell_words(_resume_flags(resilience, replan_path))}',
        "EOF",
        f'srun --nodes={n} --ntasks={n} --ntasks-per-node=1{" --no-kill" if regroups else ""} bash -c "$TASK"',
    ]
    return {"hetplan.sbatch": "\n".join(lines) + "\n"}


# ---- kubernetes (Kubeflow PyTorchJob) ---------------------------------------------------------
def kubernetes_refusal(spec: LaunchSpec) -> str | None:
    """A PyTorchJob gives all Worker pods one template, so one nodeSelector: nodes after the first
    must be alike in GPU type, processes and zone; GPU types and zones must be label values."""
    workers = {(n.gpu_type, n.nproc, n.zone) for n in spec.nodes[1:]}
    if len(workers) > 1:
        return (f"Kubeflow PyTorchJob gives every Worker pod one template, but nodes after the master differ "
                f"in (GPU type, processes, zone): {sorted(workers)}; use the torchrun or slurm target")
    bad = sorted({v for n in spec.nodes for v in (n.gpu_type, n.zone) if not _K8S_LABEL_VALUE.match(v)})
    if bad:
        return (f"{bad} cannot be Kubernetes label values (node selectors {K8S_GPU_LABEL}, {K8S_ZONE_LABEL}): at "
                f"most 63 characters, letters, digits, '-', '_', '.', alphanumeric at both ends")
    return None


class _K8sNames(NamedTuple):
    job: str  # PyTorchJob; the operator names its pods and Services '<job>-master-0', '<job>-worker-<i>'
    config_map: str
    spec_key: str  # ConfigMap key = file name under K8S_SPEC_DIR in the pods


def _k8s_names(spec: LaunchSpec, compressed: bool) -> _K8sNames:
    """The training operator requires the job name to be an RFC 1035 label (webhook
    validatePyTorchJob, pkg/webhooks/pytorch/pytorchjob_webhook.go) and derives pod and Service
    names from it, which must be labels too: the longest, '<job>-worker-<last>', must fit in 63
    characters. The 'hetplan-' prefix makes every name start with a letter."""
    longest_pod = f"-worker-{max(len(spec.nodes) - 2, 0)}"
    job = "hetplan-" + dns_label(spec.plan_name, 63 - len("hetplan-") - len(longest_pod))
    return _K8sNames(job, f"{job}-spec", SPEC_FILE + (".xz" if compressed else ""))


def _pod(spec: LaunchSpec, node: NodeSpec, image: str, names: _K8sNames, resilience: Resilience | None) -> dict:
    # Pods take their node rank from Kubeflow's RANK (master 0, worker i -> i + 1); static
    # rendezvous then gives GROUP_RANK = node rank, which the executor maps to the plan's node.
    spec_path = f"{K8S_SPEC_DIR}/{names.spec_key}"
    check = "".join(_q(a) + " " for a in preflight_argv(spec_path, resilience))
    cmd = (f"{check + '&& ' if check else ''}{''.join(f'{k}={v} ' for k, v in _restart_env(resilience).items())}"
           f"torchrun --nnodes={len(spec.nodes)} --nproc-per-node={node.nproc} "
           f"{''.join(f + ' ' for f in _restart_flags(resilience))}--node-rank=$RANK "
           f"--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m {executor_module(resilience)} "
           f"--spec {spec_path}{''.join(' ' + _q(a) for a in _resume_flags(resilience))}")
    return {"replicas": None, "restartPolicy": "OnFailure", "template": {"spec": {
        "nodeSelector": {K8S_GPU_LABEL: node.gpu_type, K8S_ZONE_LABEL: node.zone},
        "containers": [{
            "name": "pytorch", "image": image, "command": ["bash", "-c", cmd],
            "resources": {"limits": {"nvidia.com/gpu": node.nproc}},
            "volumeMounts": [{"name": "hetplan-spec", "mountPath": K8S_SPEC_DIR},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [{"name": "hetplan-spec", "configMap": {"name": names.config_map}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }}}


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the spec JSON) as literal blocks, so the manifest stays readable."""


def _str_repr(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_repr)


def spec_config_map(spec: LaunchSpec) -> tuple[dict, _K8sNames]:
    """The ConfigMap that carries the spec: readable JSON while small, else xz-compressed compact
    JSON in binaryData (the executor's load_spec reads both). The rank table and the holder lists
    of the gradient-sync entries repeat across megabytes; xz's 8 MiB dictionary finds those
    repeats (gzip's 32 KiB window does not): 2 048 ranks take some 30 kB."""
    text = spec.to_json() + "\n"
    compressed = len(text.encode()) > K8S_PLAIN_SPEC_BYTES
    names = _k8s_names(spec, compressed)
    config_map: dict = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": names.config_map}}
    if not compressed:
        config_map["data"] = {names.spec_key: text}
        return config_map, names
    blob = base64.b64encode(lzma.compress(spec.to_json(indent=None).encode(), format=lzma.FORMAT_XZ, preset=6))
    if len(blob) > K8S_CONFIGMAP_LIMIT:
        raise RefusedError(f"the launch spec of {spec.world_size} ranks takes {len(blob)} bytes compressed, over the "
                        f"{K8S_CONFIGMAP_LIMIT} bytes of a Kubernetes ConfigMap; use the torchrun or slurm target",
                        "target")
    config_map["binaryData"] = {names.spec_key: blob.decode("ascii")}
    return config_map, names


def render_kubernetes(spec: LaunchSpec, image: str = K8S_IMAGE, resilience: Resilience | None = None) -> dict[str, str]:
    config_map, names = spec_config_map(spec)
    master = _pod(spec, spec.nodes[0], image, names, resilience)
    master["replicas"] = 1
    replica_specs = {"Master": master}
    if len(spec.nodes) > 1:
        worker = _pod(spec, spec.nodes[1], image, names, resilience)
        worker["replicas"] = len(spec.nodes) - 1
        replica_specs["Worker"] = worker
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": names.job},
           "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": replica_specs}}
    header = (f"# hetplan plan {spec.plan_name}: {spec.world_size} ranks; Master = node {spec.nodes[0].node}"
              + (f", Workers = {', '.join(n.node for n in spec.nodes[1:])}" if len(spec.nodes) > 1 else "")
              + f".\n# Nodes must carry the labels {K8S_GPU_LABEL}=<GPU type> and {K8S_ZONE_LABEL}=<zone>.\n")
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
    """A uniform GPipe plan is not refused: Megatron runs it as 1F1B (see `notes`)."""
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


def _megatron_script(spec: LaunchSpec, node: NodeSpec, tp: int) -> str:
    master = spec.rendezvous.master_addr
    body = ["#!/usr/bin/env bash",
            f"# Megatron-LM for plan {spec.plan_name}: node {node.node} (node rank {node.node_rank}), "
            f"{node.gpu_type}.",
            "# MEGATRON_LM: checkout of Megatron-LM; DATA_ARGS: --data-path / --tokenizer-* for your corpus",
            "# (split on whitespace, never glob-expanded).",
            *_comment_lines(notes(spec, "megatron")),
            "set -euo pipefail",
            'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
            f"export CUDA_VISIBLE_DEVICES={','.join(map(str, node.gpus))}"]
    if tp > 1:
        # Megatron's validate_args (megatron/training/arguments.py) asserts this with TP > 1: kernels
        # then queue in launch order, which its TP communication overlap relies on.
        body.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    body += [
        # One argument per line; mapfile keeps each line one word and never globs it (layout
        # strings such as Et*4 would otherwise expand against files in the working directory).
        'mapfile -t args < "$here/args.txt"',
        'read -r -a data_args <<< "${DATA_ARGS:-}"',
        f"exec torchrun --nnodes={len(spec.nodes)} --nproc-per-node={node.nproc} --node-rank={node.node_rank} "
        f"--master-addr=\"${{MASTER_ADDR:-{master}}}\" --master-port={spec.rendezvous.master_port} \\",
        '  "${MEGATRON_LM:?set MEGATRON_LM}/pretrain_gpt.py" "${args[@]}" "${data_args[@]}" "$@"']
    return "\n".join(body) + "\n"


def render_megatron(spec: LaunchSpec) -> dict[str, str]:
    args = megatron_args(spec)
    tp = _uniform(spec)[0]  # type: ignore[index]
    files = {"megatron/args.json": json.dumps(args, indent=2) + "\n",
             "megatron/args.txt": "\n".join(args) + "\n"}
    for node in spec.nodes:
        files[f"megatron/{_node_file(node)}"] = _megatron_script(spec, node, tp)
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
    """A uniform GPipe plan is not refused: DeepSpeed's pipeline engine runs it as 1F1B (see `notes`)."""
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
              *_comment_lines(notes(spec, "deepspeed")),
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
