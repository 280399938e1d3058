"""Nonsensical options and malformed Sailor plans, through the installed `hetplan` executable.

Each case once ran to exit 0 with nan/inf figures, reported a bad option as infeasibility, or ended
in an internal error (exit 70). Now each is refused with status 1 (bad input, README "Exit status")
and one `error:` line that names the option or the plan field; `replay` refuses its options before
any planning, so those cases return at once.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from test_cli_contract import error_lines, executable, run

REPO = Path(__file__).resolve().parents[1]
ELASTIC = str(REPO / "instances" / "elastic_small.yaml")
ELASTIC_PLAN = str(REPO / "instances" / "plans" / "elastic_small.json")
EVENTS = """events:
  - {kind: availability, time_s: 100, gpu_type: A100-40, zone: z-a, available_gpus: 2}
  - {kind: availability, time_s: 200, gpu_type: A100-40, zone: z-a, available_gpus: 4}
"""
BAD_INPUT = 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad_options")
    (d / "events.yaml").write_text(EVENTS)
    return d


def assert_refused(proc, needle: str) -> str:
    """Status 1, one `error:` line that contains `needle`, no traceback, no internal error."""
    lines = error_lines(proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == BAD_INPUT, (proc.returncode, proc.stderr, proc.stdout[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


# --- replay: (option, value, what the line says after "error: OPTION: ") ---
POSITIVE = "must be a positive finite number"
NON_NEGATIVE = "must be a finite number >= 0"
REPLAY_CASES = [
    ("--horizon", "nan", POSITIVE),
    ("--horizon", "inf", POSITIVE),
    ("--restart-s", "nan", NON_NEGATIVE),
    ("--fixed-latency", "-1", NON_NEGATIVE),
    ("--fixed-latency", "nan", NON_NEGATIVE),
    ("--move-penalty", "nan", NON_NEGATIVE),
    ("--notice-s", "-5", NON_NEGATIVE),
    ("--notice-s", "nan", NON_NEGATIVE),
    ("--checkpoint-interval", "nan", POSITIVE),
    ("--planner-time-limit", "nan", NON_NEGATIVE),
    ("--planner-time-limit", "inf", NON_NEGATIVE),
    # once a note "no plan fits ... (planner failed: ...)" with exit 0: a bad option read as infeasibility
    ("--initial-time-limit", "inf", NON_NEGATIVE),
    ("--initial-time-limit", "nan", NON_NEGATIVE),
]


@pytest.mark.parametrize("option, value, says", REPLAY_CASES, ids=[f"{o} {v}" for o, v, _ in REPLAY_CASES])
def test_replay_refuses_a_nonsensical_option_before_planning(folder, option, value, says):
    # --fixed-latency first, so that a case's own --fixed-latency (the last one given) is what is checked
    proc = run(executable(), ["replay", ELASTIC, "{d}/events.yaml", "--fixed-latency", "0.05", option, value],
               folder)
    assert_refused(proc, f"error: {option}: {says}, got {value}")
    assert proc.stdout == ""  # nothing replayed, no table printed


RUN_CASES = [("--time-scale", "nan", POSITIVE), ("--time-scale", "0", POSITIVE),
             ("--heartbeat-timeout", "-1", POSITIVE),
             ("--heartbeat-timeout", "0.01", "must be at least 1 s"),  # a healthy rank was read as hung
             ("--replan-time-limit", "inf", POSITIVE)]


@pytest.mark.parametrize("option, value, says", RUN_CASES, ids=[f"{o} {v}" for o, v, _ in RUN_CASES])
def test_run_refuses_a_nonsensical_option_before_starting(folder, option, value, says):
    proc = run(executable(), ["run", ELASTIC, ELASTIC_PLAN, "--local", "--elastic", "--checkpoint-dir", "{d}/ckpt",
                              option, value], folder)
    assert_refused(proc, f"error: {option}: {says}, got {value}")
    assert not (folder / "ckpt").exists()  # refused before the supervisor made anything


def test_replay_accepts_zero_where_zero_means_something(folder):
    """No restart cost, no notice, no planner run when a repair exists, free re-plans: all real choices."""
    args = ["replay", ELASTIC, "{d}/events.yaml", "--fixed-latency", "0", "--notice-s", "0", "--restart-s", "0",
            "--move-penalty", "0", "--planner-time-limit", "0", "--initial-time-limit", "0", "--strategies", "warm",
            "--json"]
    proc = run(executable(), args, folder)
    assert proc.returncode == 0, proc.stderr
    assert "nan" not in proc.stdout and "inf" not in proc.stdout.lower()
    assert json.loads(proc.stdout)["strategies"]["warm"]["total_samples"] > 0


# --- compile: --master-port and --out ---
@pytest.mark.parametrize("port", ["0", "-1", "70000"])
def test_compile_refuses_a_port_out_of_range(folder, port):
    proc = run(executable(), ["compile", ELASTIC, ELASTIC_PLAN, "-o", "{d}/out_port", "--master-port", port], folder)
    line = assert_refused(proc, "error: --master-port: ")
    assert "1..65535" in line and f"got {port}" in line
    assert not (folder / "out_port").exists()


def test_compile_accepts_the_highest_port(folder):
    proc = run(executable(), ["compile", ELASTIC, ELASTIC_PLAN, "-o", "{d}/out_65535", "--master-port", "65535"],
               folder)
    assert proc.returncode == 0, proc.stderr
    assert "65535" in (folder / "out_65535" / "launch_spec.json").read_text()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc, which refuses new folders")
def test_compile_names_out_when_the_folder_cannot_be_made(folder):
    """/proc passes the up-front check as root (it looks writable) and then refuses mkdir."""
    proc = run(executable(), ["compile", ELASTIC, ELASTIC_PLAN, "-o", "/proc/hetplan-nope"], folder)
    assert_refused(proc, "error: --out: ")


# --- malformed Sailor-format plans: (id, mutation of the valid plan, field path the line names) ---
def _pipe(plan: dict) -> dict:
    return plan["pipeline_list"][0]


SAILOR_CASES = [
    ("mbs 0", lambda p: p.update(mbs=0), "error: mbs: must be a positive integer, got 0"),
    ("mbs -4", lambda p: p.update(mbs=-4), "error: mbs: must be a positive integer, got -4"),
    ("mbs a string", lambda p: p.update(mbs="4"), "error: mbs: "),
    ("tmp_per_stage of ints", lambda p: _pipe(p).update(tmp_per_stage=[1, 2]),
     "error: pipeline_list[0].tmp_per_stage[0]: "),
    ("a stage without layers", lambda p: _pipe(p)["layers_per_stage"].__setitem__(1, []),
     "error: pipeline_list[0].layers_per_stage[1]: "),
    ("layers_per_stage a string", lambda p: _pipe(p).update(layers_per_stage="all"),
     "error: pipeline_list[0].layers_per_stage: "),
    ("num_stages disagrees", lambda p: _pipe(p).update(num_stages=3), "error: pipeline_list[0].num_stages: "),
    ("tp 0", lambda p: _pipe(p)["tmp_per_stage"][0][0].__setitem__(1, 0),
     "error: pipeline_list[0].tmp_per_stage[0][0][1]: "),
    ("dp of strings", lambda p: _pipe(p).update(dp=["8", "8"]), "error: pipeline_list[0].dp[0]: "),
    # checks of the plan it reads as, named as the file says it (they named stages[1].layer_start, ...)
    ("a layer gap", lambda p: _pipe(p)["layers_per_stage"][1].pop(0),
     "error: pipeline_list[0].layers_per_stage[1]: layer_start "),
    ("an unknown GPU", lambda p: _pipe(p)["tmp_per_stage"][0][0][0][0].__setitem__(0, "H100"),
     "error: pipeline_list[0].tmp_per_stage[0][0][0][0][0]: GPU type 'H100' is not in the cluster"),
    ("tp past a node", lambda p: _pipe(p)["tmp_per_stage"][1][0].__setitem__(1, 16),
     "error: pipeline_list[0].tmp_per_stage[1][0][1]: tp=16 exceeds the 4 GPUs of every A100-40 node in "),
]


@pytest.fixture(scope="module")
def sailor_plan(folder) -> dict:
    proc = run(executable(), ["export-plan", "a100_homogeneous", "a100_homogeneous", "-o", "{d}/sailor.json"],
               folder)
    assert proc.returncode == 0, proc.stderr
    return json.loads((folder / "sailor.json").read_text())


def test_a_valid_sailor_plan_is_read(folder, sailor_plan):
    """The control: the unmutated plan reads back, and export-plan writes it unchanged."""
    proc = run(executable(), ["export-plan", "a100_homogeneous", "{d}/sailor.json"], folder)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == sailor_plan


def test_export_says_what_sailors_format_drops(folder):
    """Sailor's format has no schedule and no nodes: a GPipe plan came back 1F1B (rank 0's peak 5.44
    -> 3.37 GB on one of helper-11's plans) and a plan's nodes were dropped, both without a word
    (46 of 78 exports were GPipe)."""
    proc = run(executable(), ["export-plan", "a100_homogeneous", "a100_homogeneous"], folder)  # the bundled plan: GPipe
    assert proc.returncode == 0 and error_lines(proc.stderr) == [
        "warning: Sailor's format has no schedule and Sailor runs 1F1B: this GPipe plan is read back as 1F1B"]
    bundled = Path(__file__).resolve().parents[1] / "instances" / "plans" / "a100_homogeneous.json"
    plan = json.loads(bundled.read_text())
    plan["schedule"] = "1F1B"
    plan["stages"][0]["replicas"][0]["node"] = "a100-0"
    (folder / "placed.json").write_text(json.dumps(plan))
    proc = run(executable(), ["export-plan", "a100_homogeneous", "{d}/placed.json"], folder)
    assert proc.returncode == 0 and error_lines(proc.stderr) == [
        "warning: Sailor's format names no nodes: the plan's nodes and GPUs are left out, and a reader places its "
        "replicas again (first fit)"], proc.stderr


# every case through export-plan; simulate reads plans the same way (`load_any_plan`), two cases show it
SAILOR_RUNS = [("export-plan", *c) for c in SAILOR_CASES] + [("simulate", *c) for c in SAILOR_CASES[:4:3]]


@pytest.mark.parametrize("command, name, mutate, needle", SAILOR_RUNS, ids=[f"{r[0]} {r[1]}" for r in SAILOR_RUNS])
def test_malformed_sailor_plan_names_the_field(folder, sailor_plan, command, name, mutate, needle):
    plan = copy.deepcopy(sailor_plan)
    mutate(plan)
    path = folder / f"{command}_{name.replace(' ', '_')}.json"
    path.write_text(json.dumps(plan))
    assert_refused(run(executable(), [command, "a100_homogeneous", str(path)], folder), needle)


def test_replay_names_an_unknown_strategy(folder):
    proc = run(executable(), ["replay", ELASTIC, "{d}/events.yaml", "--strategies", "warm,bogus"], folder)
    assert_refused(proc, "error: --strategies: unknown strategies ['bogus']; choose from warm, cold, static")
    proc = run(executable(), ["replay", ELASTIC, "{d}/events.yaml", "--strategies", ","], folder)
    assert_refused(proc, "error: --strategies: no strategy given; choose from")  # was "unknown strategies []"


@pytest.mark.parametrize("field, value", [("horizon_s", float("nan")), ("restart_s", float("inf")),
                                          ("notice_s", -1.0), ("fixed_latency_s", float("nan")),
                                          ("plan_horizon_s", 0.0)])
def test_replay_options_refuse_what_the_cli_refuses(field, value):
    """The library's own check, for callers that skip the CLI: nan passed its `< 0` tests."""
    from hetplan.errors import InstanceError
    from hetplan.orchestration.replay import ReplayOptions

    with pytest.raises(InstanceError, match=rf"replay\.{field}: must be a (positive finite|finite number >= 0)"):
        ReplayOptions(**{field: value})


@pytest.mark.parametrize("event, needle", [
    ("{kind: availability, time_s: 100, gpu_type: H100, zone: z-a, available_gpus: 2}",
     "events[2]: H100 in zone z-a is not in the cluster"),
    ("{kind: preemption, time_s: 100, effective_s: 130, gpu_type: A100-40, zone: mars, available_gpus: 0}",
     "events[2]: A100-40 in zone mars is not in the cluster"),
    ("{kind: failure, time_s: 100, node: zz-9}", "events[2].node: unknown node 'zz-9'"),
    ("{kind: bandwidth, time_s: 100, link: zone_pair, zones: [z-a, mars], bandwidth_GBps: 1}",
     "events[2].zones: zones ['mars'] not in the cluster"),
    # the instance's own events refused these; an events file's passed (and 1e300 s printed 300 digits)
    ("{kind: bandwidth, time_s: 100, link: inter_zone, bandwidth_GBps: 1e-300}",
     "events[2]: bandwidth_GBps: 1e-300 GB/s is outside [1e-06, 1e+06], the range hetplan accepts"),
    ("{kind: availability, time_s: 1e300, gpu_type: A100-40, zone: z-a, available_gpus: 2}",
     "events[2]: time_s: 1e+300 s is outside [0, 1e+09]"),
], ids=["availability", "preemption", "failure", "bandwidth", "1e-300 GB/s", "at 1e300 s"])
def test_replay_names_the_events_file_and_the_event(folder, event, needle):
    """These were refused only when the replay reached them, as `events.availability`: no file, no index."""
    (folder / "bad_events.yaml").write_text(EVENTS + f"  - {event}\n")
    proc = run(executable(), ["replay", ELASTIC, "{d}/bad_events.yaml", "--fixed-latency", "0.05"], folder)
    line = assert_refused(proc, needle)
    assert "bad_events.yaml" in line


TINY = ["--hidden", "16", "--heads", "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8"]
LOCAL_CASES = [("launch", ["--lr", "inf"], "error: --lr: must be a positive finite number, got inf"),
               ("measure", ["--lr", "1e308", "--lr", "nan"], "error: --lr: must be a positive finite number, got nan"),
               ("launch", ["--hidden", "0"], "error: --hidden: must be at least 1, got 0"),
               ("measure", ["--seq-len", "-1"], "error: --seq-len: must be at least 1, got -1"),
               ("measure", ["--warmup", "5"], "error: --warmup: warmup 5 must be at least 0 and below the 2 steps"),
               # once each rank failed on a 25.6 GB allocation (exit 3): profile's ceilings hold here too
               ("launch", ["--hidden", "99999998"], "error: --hidden: 99999998 is above the ceiling of 131,072")]


@pytest.mark.parametrize("command, extra, needle", LOCAL_CASES, ids=[f"{c} {' '.join(e)}" for c, e, _ in LOCAL_CASES])
def test_local_runs_refuse_a_nonsensical_model_or_rate(folder, command, extra, needle):
    """--lr inf trained to a nan loss with exit 0; --hidden 0 was taken as "not given" and the full
    OPT-350M ran on the CPU for 95 s. Both are refused before a rank starts."""
    proc = run(executable(), [command, ELASTIC, ELASTIC_PLAN, "--local", "--steps", "2", *TINY, *extra], folder)
    assert_refused(proc, needle)
