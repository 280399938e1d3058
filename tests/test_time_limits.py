"""Time limits, bounds that fail at once, and signals: the planner as a user meets it.

Wall-clock checks use the planner's promise, wall <= 1.1 x limit + 1 s, on searches the old code
ran for 10-40 times their limit. Signal tests start the installed `hetplan` executable (or a small
script) in its own session, wait until the helper process exists (the search is then under way),
signal, and check the exit, stderr and that no helper survives.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import DEFAULT_SIGINT, communicate_or_stacks, dumps_stacks
from hetplan.errors import InfeasibleError
from hetplan.estimators import build_estimators
from hetplan.instance import instance_from_dict, load_instance
from hetplan.orchestration.planner import PlannerOptions, plan
from hetplan.orchestration.planner.search import _floor
from hetplan.orchestration.planner.inputs import _quotas, _Tables
from test_planner import tiny

REPO = Path(__file__).resolve().parents[1]
TWO_CORES = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2
needs_helper = pytest.mark.skipif(not (TWO_CORES and Path("/proc").is_dir()),
                                  reason="the helper process needs two cores; child processes are read from /proc")


def within_limit(wall_s: float, limit_s: float) -> bool:
    return wall_s <= 1.1 * limit_s + 1.0


# ---- time limits ------------------------------------------------------------------------------------
def test_a_small_limit_holds_on_ten_thousand_gpus():
    """10,000 GPUs of five types in five zones: 774 outer choices to prepare, stage DPs over large
    quotas; the old code took 15-19 s under a 1 s limit. The global batch is cut to 64 sequences so
    the plans have at most 1,024 replicas: simulating a plan of thousands of replicas takes
    seconds by itself (`plan.redistribution` is quadratic in the replicas of two stages). A 2 s
    limit: with 1 s the preparation ends at 0.6 s and the first plan comes at the deadline (1.00 s,
    measured alone and beside three busy processes), and once, in a CI run beside the other tests'
    worker, none came (NoPlanInTimeError, a documented answer, but not what this test checks)."""
    data = yaml.safe_load((REPO / "instances" / "large_5type_10k.yaml").read_text())
    data["workload"]["global_batch_size"] = 64
    inst = instance_from_dict(data)
    t0 = time.perf_counter()
    res = plan(inst, PlannerOptions(time_limit_s=2.0))
    wall = time.perf_counter() - t0
    assert within_limit(wall, 2.0), wall
    assert res.status == "time_limit"  # a documented partial result: best plan so far, bound so far
    assert not res.report.oom_ranks
    assert 0 < res.bound <= res.model_objective and 0 <= res.gap < 1
    assert len(res.records) == res.combos_total  # every choice has its fate (most: skipped_time)


def test_progress_reports_incumbent_bound_and_gap_at_most_ten_times_a_second():
    # a search that completes (about 2 s alone): zorse_4type_2region under a 2 s limit reported no bound
    # before the limit twice in the full suite (session 65: 2 workers, each planner with its helper)
    seen = []
    res = plan(load_instance("a100_v100_one_zone"), PlannerOptions(time_limit_s=60.0), progress=seen.append)
    assert res.status == "complete"
    assert seen and seen[-1].what == "done" and seen[-1].done == seen[-1].total == res.combos_total
    assert seen[-1].incumbent == res.model_objective and seen[-1].bound == res.bound
    assert seen[-1].gap == pytest.approx(res.gap)
    assert any(s.bound is not None for s in seen[:-2])  # the bound moves during the search
    # the incumbent is the simulator's figure throughout (the heuristics' phase too): it never rises
    incumbents = [s.incumbent for s in seen if s.incumbent is not None]
    assert all(b <= a for a, b in zip(incumbents, incumbents[1:])), incumbents
    times = [s.elapsed_s for s in seen if s.what not in ("simulating the plan", "done")]
    assert all(b - a >= 0.099 for a, b in zip(times, times[1:]))  # throttled (the last two are forced)


# ---- limits out of reach ----------------------------------------------------------------------------
@pytest.mark.parametrize("option, value, words", [
    ("max_cost_usd", 1e-9, ("planner.max_cost_usd: 1e-09 USD is below the least cost of any plan",)),
    ("min_iters_per_s", 1e6, ("planner.min_iters_per_s: 1e+06 it/s is above the most any plan reaches",)),
])
def test_a_limit_beyond_every_plan_fails_at_once(option, value, words, monkeypatch):
    """Found from the layer times before any outer choice is built (the old code searched the
    whole 60 s and then asked for more time): the choices' preparation must not start."""
    import hetplan.orchestration.planner.search as search

    def no_choice(*args, **kwargs):
        raise AssertionError("an outer choice was prepared")
    monkeypatch.setattr(search, "_prepare", no_choice)
    inst = load_instance("large_5type_10k")
    with pytest.raises(InfeasibleError) as err:
        plan(inst, PlannerOptions(time_limit_s=60, **{option: value}))
    message = str(err.value)
    assert all(w in message for w in words) and len(message.splitlines()) == 1
    figure = float(message.split(", ")[1].split()[0])  # the least cost / the most throughput any plan has
    assert figure > (value if option == "max_cost_usd" else 0) and (option == "max_cost_usd" or figure < value)


@pytest.mark.parametrize("field, value, flag", [("max_cost_per_iteration_usd", 1e-9, "--max-cost"),
                                               ("min_throughput_iters_per_s", 1e6, "--min-throughput")])
def test_a_limit_out_of_reach_is_named_where_it_was_given(tmp_path, field, value, flag):
    """The refusal named `max_cost_per_iteration_usd:` whether the budget came from the instance or
    from --max-cost; now the instance's constraint, or the flag."""
    from test_cli_contract import executable

    data = yaml.safe_load((REPO / "instances" / "a100_homogeneous.yaml").read_text())
    data.setdefault("constraints", {})[field] = value
    path = tmp_path / "limited.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InfeasibleError) as err:
        plan(load_instance(path), PlannerOptions(time_limit_s=10))
    assert err.value.field == f"constraints.{field}"
    proc = subprocess.run([executable(), "solve", "a100_homogeneous", flag, f"{value:g}"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {flag}: {value:g} "), proc.stderr


def test_the_floor_is_below_solved_plans_and_their_budget_is_accepted():
    """The bounds behind the early failure are valid: below the cost and time of plans the search
    solves (within 1 %), and a budget equal to the cheapest plan's cost, or a floor equal to the
    fastest plan's throughput, is searched and met, not refused."""
    opts = PlannerOptions(max_stages=3, time_limit_s=60)
    cheapest = plan(tiny("min_cost"), opts)
    fastest = plan(tiny(), opts)
    inst = tiny()
    floor = _floor(inst, _Tables(inst, build_estimators(inst)), _quotas(inst, opts), opts)
    assert 0 < floor.least_cost_usd <= cheapest.model_objective
    assert 0 < floor.least_time_s <= fastest.model_objective
    budget_usd = cheapest.model_objective * (1 + 1e-9)  # (the planner compares limits without a tolerance)
    budget = plan(tiny(), PlannerOptions(max_stages=3, time_limit_s=60, max_cost_usd=budget_usd))
    assert budget.status == "complete" and budget.report.cost_per_iteration_usd <= cheapest.model_objective * (1 + 1e-6)
    floor_its = 1 / (fastest.model_objective * (1 + 1e-9))
    quick = plan(tiny("min_cost"), PlannerOptions(max_stages=3, time_limit_s=60, min_iters_per_s=floor_its))
    assert quick.status == "complete" and quick.report.iters_per_s >= floor_its * (1 - 1e-6)


# ---- signals ----------------------------------------------------------------------------------------
def children(pid: int) -> set[int]:
    try:
        import psutil
    except ImportError:
        try:
            return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
        except OSError:
            return set()
    try:
        return {c.pid for c in psutil.Process(pid).children()}
    except psutil.Error:
        return set()


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_and_signal(cmd: list[str], sig: int, group: bool = False) -> tuple[subprocess.CompletedProcess, float, set]:
    """Start `cmd` in its own session; once its helper process exists (the search is under way)
    and half a second more, send `sig` (to the whole process group with `group`, as Ctrl-C in a
    terminal does). (finished process, seconds from the signal to the exit, helper pids seen)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True, env=dumps_stacks())
    helpers: set[int] = set()
    t0 = time.monotonic()
    while not helpers and time.monotonic() - t0 < 40 and proc.poll() is None:
        helpers |= children(proc.pid)
        time.sleep(0.02)
    assert helpers, f"no helper process appeared (exit {proc.poll()})"
    time.sleep(0.5)
    helpers |= children(proc.pid)
    sent = time.monotonic()
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    try:
        out, err = communicate_or_stacks(proc, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.monotonic() - sent, helpers


def helpers_gone(helpers: set[int]) -> bool:
    deadline = time.monotonic() + 1.0
    while any(alive(h) for h in helpers) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(alive(h) for h in helpers)


LONG_SOLVE = ["solve", "zorse_4type_2region", "--time-limit", "120"]  # heuristics alone take over 30 s


@needs_helper
@pytest.mark.parametrize("sig, code, group", [(signal.SIGINT, 130, False), (signal.SIGINT, 130, True),
                                               (signal.SIGTERM, 143, False)])
def test_a_signal_stops_the_solve_and_its_helper(sig, code, group, tmp_path):
    """SIGINT to the main process, Ctrl-C to the process group (the helper ignores it: no second
    traceback) and SIGTERM: exit within 2 s with 130 / 143, one line on stderr, the old output
    file left alone, and no helper left."""
    exe = Path(sys.executable).with_name("hetplan")
    if not exe.exists():
        exe = Path(shutil.which("hetplan") or pytest.skip("the hetplan executable is not installed"))
    out = tmp_path / "plan.json"
    out.write_text("old\n")
    done, after_s, helpers = start_and_signal([str(exe), *LONG_SOLVE, "-o", str(out)], sig, group)
    assert after_s < 2.0, after_s
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert out.read_text() == "old\n"
    assert helpers_gone(helpers)


LIBRARY = """
import sys
from hetplan.instance import load_instance
from hetplan.orchestration.planner import PlannerOptions, SearchTerminated, plan

try:
    plan(load_instance("zorse_4type_2region"), PlannerOptions(time_limit_s=120))
except SearchTerminated:
    sys.exit(3)
"""


@needs_helper
def test_sigterm_reaches_a_library_caller_as_search_terminated():
    """Without a SIGTERM handler of the caller's, the search raises SearchTerminated (a
    KeyboardInterrupt) so the caller can clean up, and the helper is stopped first."""
    done, after_s, helpers = start_and_signal([sys.executable, "-c", LIBRARY], signal.SIGTERM)
    assert done.returncode == 3 and after_s < 2.0, (done.returncode, after_s, done.stderr)
    assert helpers_gone(helpers)


BLOCKED = """
import os, sys, time
import hetplan.orchestration.planner as planner
from hetplan.orchestration.planner import helper as H, inputs as I, steps as S
from hetplan.estimators import build_estimators
from hetplan.formulations import joint
sys.path.insert(0, {tests!r})
from test_planner import tiny

MAIN = os.getpid()
refine = H._refine


def endless(*args):  # the helper's step never ends: the main process waits on the pipe
    if os.getpid() != MAIN:
        time.sleep(600)
    return refine(*args)


H._refine = endless  # what the helper's loop calls
inst, opts = tiny(), planner.PlannerOptions()
tables = I._Tables(inst, build_estimators(inst))
combo = planner.Combo(2, 1, 1)
inp = planner.joint_inputs(inst, tables, I._quotas(inst, opts), combo, "max_throughput", None, None, (1, 2))
helper = H._Helper.start({{combo: inp}}, tables, "max_throughput", None, None, joint.Deadline.after(600))
step = S._Step(combo, 0, 0.0, None, False)
helper.add([(step, inp)])
while not helper.computing(step):
    helper.wait()
try:
    helper.wait()  # blocked in the pipe read until the signal
except KeyboardInterrupt:
    helper.close()
    sys.exit(3)
"""


@needs_helper
def test_sigint_interrupts_a_wait_on_the_helper():
    done, after_s, helpers = start_and_signal(
        [sys.executable, "-c", DEFAULT_SIGINT + BLOCKED.format(tests=str(REPO / "tests"))], signal.SIGINT)
    assert done.returncode == 3 and after_s < 1.0, (done.returncode, after_s, done.stderr)
    assert helpers_gone(helpers)
