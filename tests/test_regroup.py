"""Cluster launches that survive a node that never comes back (orchestration/regroup.py): compiled with
--min-nodes, torchrun's elastic rendezvous closes with the nodes left and the executor re-plans
for them, then resumes from the layer-wise checkpoint at the same global batch."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetplan.errors import PlanError
from hetplan.instance import load_instance
from hetplan.plan import load_plan, plan_from_dict as load_plan_dict, validate_plan
from hetplan.runtime import checkpoint
from hetplan.runtime.compile import CompileOptions, compile_plan
from hetplan.runtime.execute import model_config
from hetplan.runtime.reference import assemble_dump, reference_train
from hetplan.orchestration.regroup import assign, is_whole, replan_for
from hetplan.runtime.spec import LaunchSpec, build_spec, read_replan_file
from hetplan.runtime.targets import Resilience

BATCH = 8  # instances/elastic_small.yaml: global batch 8
TINY = dict(hidden_size=16, num_heads=2, ffn_hidden_size=32, vocab_size=32, seq_len=8)
TINY_FLAGS = ["--hidden", "16", "--heads", "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8"]


def start():
    """elastic_small: stage [0,2) on v-0 (two TP-1 replicas), stage [2,4) on a-0 (TP 2)."""
    inst = load_instance("elastic_small")
    return inst, validate_plan(inst, load_plan("elastic_small"))


def regrouping(ckpt: str = "/shared/ckpt", min_nodes: int = 1, **kw) -> CompileOptions:
    return CompileOptions(resilience=Resilience(ckpt, checkpoint_every=1, max_restarts=2, min_nodes=min_nodes), **kw)


# ---- what compile writes -------------------------------------------------------------------
def test_torchrun_lines_rendezvous_elastically_with_a_process_per_gpu(tmp_path):
    from torch.distributed.run import get_args_parser

    inst, plan = start()
    launch = compile_plan(inst, plan, "torchrun", regrouping())
    assert launch.spec.rendezvous.backend == "c10d"  # a static rendezvous cannot shrink
    assert "as few as 1 node:" in launch.files["README.md"] and "`replan.json`" in launch.files["README.md"]
    for line in launch.files["torchrun/commands.txt"].splitlines()[1:]:
        check, line = line.split(" && ")  # the checkpoint's pre-flight, then torchrun
        assert shlex.split(check)[:4] == ["python3", "-m", "hetplan.runtime.execute", "--check-only"]
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words[:words.index("torchrun")])
        args = get_args_parser().parse_args(words[words.index("torchrun") + 1:])
        node = inst.node_by_id[env["HETPLAN_NODE_ID"]]
        assert args.nnodes == "1:2" and args.rdzv_backend == "c10d"
        assert int(args.nproc_per_node) == node.num_gpus  # every GPU, not only the plan's
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(node.num_gpus)))
        rest = args.training_script_args
        assert rest[rest.index("--replan-file") + 1] == "../replan.json"
        assert args.module and args.training_script == "hetplan.orchestration.worker"  # the executor + re-planner
    again, plan_back = read_replan_file(_written(tmp_path, launch.files))
    assert again.cluster == inst.cluster and again.workload == inst.workload and plan_back == plan
    sbatch = compile_plan(inst, plan, "slurm", regrouping()).files["hetplan.sbatch"]
    assert "#SBATCH --no-kill" in sbatch and " --no-kill bash -c" in sbatch
    assert '--nnodes=1:2 ' in sbatch and '--replan-file "$SLURM_SUBMIT_DIR/replan.json"' in sbatch
    assert "-m hetplan.orchestration.worker " in sbatch
    plain = compile_plan(inst, plan, "slurm", CompileOptions(resilience=Resilience("/c"))).files
    assert "replan.json" not in plain and "--no-kill" not in plain["hetplan.sbatch"]
    assert "-m hetplan.runtime.execute " in plain["hetplan.sbatch"]  # no re-planning: the runtime alone


def test_the_runtime_alone_refuses_to_regroup_with_one_line(tmp_path):
    """The runtime does not import the planner: a --replan-file launch through
    `python -m hetplan.runtime.execute` (not the worker entry point) stops with a clear error."""
    inst, plan = start()
    launch = compile_plan(inst, plan, "torchrun", regrouping())
    spec_path = launch.spec.save(tmp_path / "launch_spec.json")
    replan = _written(tmp_path, launch.files)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29000 + os.getpid() % 1000), "LOCAL_RANK": "0",
           "HETPLAN_NODE_ID": launch.spec.nodes[0].node}
    out = subprocess.run([sys.executable, "-m", "hetplan.runtime.execute", "--spec", str(spec_path),
                          "--replan-file", str(replan), "--resume", str(tmp_path / "ckpt"), "--steps", "1"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "hetplan.orchestration.worker" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_regrouped_launch_refuses_a_checkpoint_of_another_model_before_the_rendezvous(tmp_path):
    """--replan-file skipped the checkpoint check: each rank would fail on loading it after the
    rendezvous and the re-plan (and torchrun restart it). The model is the spec's either way."""
    import json

    inst, plan = start()
    launch = compile_plan(inst, plan, "torchrun", regrouping())
    spec_path = launch.spec.save(tmp_path / "launch_spec.json")
    step = tmp_path / "ckpt" / "step_00000001"
    step.mkdir(parents=True)
    wider = launch.spec.model.hidden_size * 2
    (step / "meta.json").write_text(json.dumps({"format": 1, "iteration": 1, "model": {"hidden_size": wider},
                                                "optimizer": "adam", "tp_of_unit": {}}))
    out = subprocess.run([sys.executable, "-m", "hetplan.runtime.execute", "--spec", str(spec_path),
                          "--replan-file", str(_written(tmp_path, launch.files)), "--resume", str(tmp_path / "ckpt"),
                          "--steps", "2"], capture_output=True, text=True, timeout=120)  # no rendezvous env
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"holds a checkpoint of another model: hidden_size {wider}" in out.stderr and "--resume" in out.stderr


def _written(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "replan.json"
    path.write_text(files["replan.json"])
    return path


@pytest.mark.parametrize("target,min_nodes,needle", [
    ("kubernetes", 1, "torchrun and slurm targets"),
    ("torchrun", 3, "the plan has 2 nodes"),
])
def test_compile_refuses_what_cannot_regroup(target, min_nodes, needle):
    inst, plan = start()
    with pytest.raises(PlanError, match=needle):
        compile_plan(inst, plan, target, regrouping(min_nodes=min_nodes))


def test_cli_min_nodes_needs_a_checkpoint_dir(tmp_path):
    out = subprocess.run(["hetplan", "compile", "elastic_small", "elastic_small", "-o", str(tmp_path / "o"),
                          "--min-nodes", "1"], capture_output=True, text=True)
    assert out.returncode != 0 and "--min-nodes needs --checkpoint-dir" in out.stderr
    assert "Traceback" not in out.stderr


# ---- the re-plan itself (no processes) -----------------------------------------------------
def test_replan_for_the_nodes_left_uses_only_their_gpus():
    inst, plan = start()
    spec = build_spec(inst, plan)
    everyone = [(r.node, r.gpu_index) for r in spec.ranks]
    assert is_whole(spec, everyone) and is_whole(spec, everyone + [("a-1", 0)])
    left = [("v-0", 0), ("v-0", 1)]
    assert not is_whole(spec, left)
    new, note = replan_for(spec, left, inst, plan, TINY, time_limit_s=0.3)
    assert {r.node for r in new.ranks} == {"v-0"} and "lost ['a-0']" in note
    assert new.batch.global_batch_size == spec.batch.global_batch_size
    arr = assign(new, left, me=1)
    assert sorted(arr.proc_of) == list(range(new.world_size))
    assert arr.spec_rank == next(r.rank for r in new.ranks if (r.node, r.gpu_index) == ("v-0", 1))


def test_replan_for_refuses_a_node_the_instance_lacks_and_gpus_without_processes():
    inst, plan = start()
    spec = build_spec(inst, plan)
    with pytest.raises(PlanError, match="not in instance"):
        replan_for(spec, [("v-0", 0), ("x-9", 0)], inst, plan, TINY)
    # a-0 came with only its first GPU's process: a plan that needs the second is refused
    try:
        new, _ = replan_for(spec, [("a-0", 0)], inst, plan, TINY, time_limit_s=0.3)
    except PlanError as exc:
        assert "run no process" in str(exc) or "no plan fits" in str(exc)
    else:
        assert {(r.node, r.gpu_index) for r in new.ranks} <= {("a-0", 0)}


# ---- a real two-node torchrun on this machine: one node is killed and never comes back -------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (torchrun starts its workers in sessions of their own)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _iteration(ckpt: Path) -> int:
    """The newest checkpoint's iteration (0: none yet); a folder pruned while read is retried."""
    while True:
        try:
            last = checkpoint.latest(ckpt)
            return 0 if last is None else checkpoint.read_meta(last)["iteration"]
        except (OSError, ValueError, PlanError):
            time.sleep(0.01)


def _agent(line: str, is_host: bool, extra: list[str]) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line.split(" && ")[-1])  # torchrun without the checkpoint's pre-flight
    at = words.index("torchrun")
    env = dict(w.split("=", 1) for w in words[:at])
    argv = words[at + 1:]
    # fast elastic timeouts for a test: the lost node's keep-alive expires after 2 s and the
    # round closes 3 s after the minimum is there; both agents are on 127.0.0.1, so say which
    # one hosts the rendezvous store
    conf = f"is_host={int(is_host)},last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=2"
    m = argv.index("-m")
    return env, [sys.executable, "-m", "torch.distributed.run", *argv[:m], f"--rdzv-conf={conf}", *argv[m:], *extra]


def test_a_lost_node_that_never_returns_is_replanned_away(tmp_path):
    inst, plan = start()
    port = _free_port()
    out, ckpt, dump = tmp_path / "launch", tmp_path / "ckpt", tmp_path / "params"
    launch = compile_plan(inst, plan, "torchrun", regrouping(
        str(ckpt), hosts={"v-0": "127.0.0.1", "a-0": "127.0.0.1"}, master_port=port))
    for rel, text in launch.files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    steps = 10
    extra = ["--steps", str(steps), "--dtype", "float64", "--optimizer", "adam", "--lr", "0.01",
             "--dump-params", str(dump), "--replan-time-limit", "0.3", *TINY_FLAGS]
    lines = launch.files["torchrun/commands.txt"].splitlines()[1:]
    procs, logs = {}, {}
    for k, line in enumerate(lines):  # node rank 0 (v-0) hosts the rendezvous: a-0 is the one lost
        env, argv = _agent(line, k == 0, extra)
        node = env["HETPLAN_NODE_ID"]
        logs[node] = (tmp_path / f"{node}.log").open("w")
        procs[node] = subprocess.Popen(argv, cwd=out / "torchrun", stdout=logs[node], stderr=subprocess.STDOUT,
                                       env={**os.environ, **env, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                                       start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while _iteration(ckpt) < 3:  # a checkpoint of iteration 3, then node a-0 goes away for good
            assert all(p.poll() is None for p in procs.values()) and time.monotonic() < deadline
            time.sleep(0.05)
        victim, killed_at = procs["a-0"].pid, time.monotonic()
        done_before = _iteration(ckpt)
        for pid in [victim, *_descendants(victim)]:
            os.kill(pid, signal.SIGKILL)
        while _iteration(ckpt) <= done_before:
            assert procs["v-0"].poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        print(f"node lost -> next checkpoint on the re-planned launch: {time.monotonic() - killed_at:.1f} s")
        rc = procs["v-0"].wait(timeout=240)
    finally:
        for p in procs.values():
            if p.poll() is None:
                for pid in [p.pid, *_descendants(p.pid)]:
                    os.kill(pid, signal.SIGKILL)
        for f in logs.values():
            f.close()
    text = (tmp_path / "v-0.log").read_text()
    assert rc == 0, text[-4000:]
    assert "lost ['a-0']: re-planned" in text
    # the run ended on the re-planned spec: every dumped rank sits on v-0
    ranks = [torch.load(p, weights_only=False)["rank"] for p in dump.glob("rank*.pt")]
    assert ranks and {r["node"] for r in ranks} == {"v-0"}
    spec = LaunchSpec.model_validate_json((out / "launch_spec.json").read_text())
    ref = reference_train(model_config(spec, TINY), global_batch_size=BATCH, steps=steps, optimizer="adam", lr=1e-2)
    params = assemble_dump(dump)
    assert set(params) == set(ref.params)
    for key, full in ref.params.items():
        for holder, value in params[key].items():
            assert (value - full).abs().max().item() < 1e-5, (key, holder)


# ---- a GPU the plan leaves idle: its process builds the groups, then waits for the end -----
def _regrouped_process(p: int, member: tuple[str, int], store: str, spec_path: str, replan: str, dump: str) -> None:
    import torch.distributed as dist

    from hetplan.orchestration.regroup import arrange
    from hetplan.runtime.execute import RunOptions, _run_regrouped, use_arranger
    from hetplan.runtime.spec import load_spec

    use_arranger(arrange)  # what the entry point of regrouping launches does (orchestration/worker.py)

    os.environ.update(HETPLAN_NODE_ID=member[0], LOCAL_RANK=str(member[1]), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=p, world_size=3)
    try:
        opts = RunOptions(steps=3, model=TINY, dtype="float64", optimizer="adam", lr=1e-2, dump_dir=dump,
                          quiet=True, replan_file=replan)
        _run_regrouped(load_spec(spec_path), opts, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def test_a_process_without_a_rank_waits_and_the_others_train(tmp_path):
    import multiprocessing

    inst, _ = start()
    plan = load_plan_dict({"name": "both_on_v0", "instance": "elastic_small", "schedule": "1F1B",
                           "num_microbatches": 2, "micro_batch_size": 4, "stages": [
                               {"layer_start": 0, "layer_end": 2, "replicas": [
                                   {"gpu_type": "V100-16", "tp": 1, "node": "v-0", "gpus": [1]}]},
                               {"layer_start": 2, "layer_end": 4, "replicas": [
                                   {"gpu_type": "V100-16", "tp": 1, "node": "v-0", "gpus": [0]}]}]})
    spec = build_spec(inst, plan)
    spec_path = spec.save(tmp_path / "launch_spec.json")
    (tmp_path / "replan.json").write_text(compile_plan(inst, plan, "torchrun", regrouping()).files["replan.json"])
    # process 0 runs on a-0, which this plan leaves idle; processes 1 and 2 hold the ranks
    members = [("a-0", 0), ("v-0", 0), ("v-0", 1)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_regrouped_process, args=(p, m, str(tmp_path / "store"), str(spec_path),
                                                          str(tmp_path / "replan.json"), str(tmp_path / "params")))
             for p, m in enumerate(members)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(timeout=180)
    assert [pr.exitcode for pr in procs] == [0, 0, 0]
    ref = reference_train(model_config(spec, TINY), global_batch_size=BATCH, steps=3, optimizer="adam", lr=1e-2)
    params = assemble_dump(tmp_path / "params")
    assert set(params) == set(ref.params)
    for key, full in ref.params.items():
        for holder, value in params[key].items():
            assert (value - full).abs().max().item() < 1e-5, (key, holder)


@pytest.mark.parametrize("content", ['{"iteration": 3, "pla', "[1, 2]", "\udcff"])
def test_a_truncated_checkpoint_names_the_folder_option(tmp_path, content):
    """A meta.json cut short (a crash mid-write) ended `run` in a JSONDecodeError (exit 70)."""
    from hetplan.errors import PlanError

    step = tmp_path / "step_3"
    step.mkdir()
    (step / checkpoint.META).write_text(content, errors="surrogateescape")
    with pytest.raises(PlanError, match=r"--checkpoint-dir: .*meta.* is not a checkpoint's metadata"):
        checkpoint.read_meta(step)
