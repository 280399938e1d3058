"""MILPs solving side by side: the solver layer's interrupt, the planner's `_Flight` of MILP threads
and its CPU-time limit, and a search with two MILPs at once against one at a time."""
from __future__ import annotations

import math
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyomo.environ as pyo
import pytest

from conftest import DEFAULT_SIGINT, communicate_or_stacks, dumps_stacks
from hetplan.orchestration.planner import PlannerOptions, plan
from hetplan.orchestration.planner import search as S
from hetplan.solvers import SolveOptions, Status, solve
from hetplan.solvers.registry import backend_class

sys.path.insert(0, str(Path(__file__).parent))
from test_planner import tiny_three_types  # noqa: E402


def market_split(seed: int, rows: int = 4, cols: int = 32) -> pyo.ConcreteModel:
    """Cornuejols and Dawande's market split instances: sum_j a_ij x_j = floor(sum_j a_ij / 2) with
    a_ij in 0..99, binary x. Branch and bound takes far longer than these tests on them."""
    rng = random.Random(seed)
    a = [[rng.randrange(100) for _ in range(cols)] for _ in range(rows)]
    m = pyo.ConcreteModel()
    m.x = pyo.Var(range(cols), domain=pyo.Binary)
    m.s = pyo.Var(range(rows), range(2), domain=pyo.NonNegativeReals)  # slack up / down
    m.row = pyo.Constraint(range(rows), rule=lambda m, i: sum(a[i][j] * m.x[j] for j in range(cols))
                           + m.s[i, 0] - m.s[i, 1] == sum(a[i]) // 2)
    m.obj = pyo.Objective(expr=sum(m.s[i, k] for i in range(rows) for k in range(2)))
    return m


def test_highs_says_it_solves_side_by_side_and_the_others_do_not():
    assert backend_class("highs").capabilities.parallel_solves
    assert not backend_class("scip").capabilities.parallel_solves


def test_an_interrupt_stops_a_highs_solve_in_another_thread_as_a_limit_does():
    """Two market-split solves, each in a thread with a 60 s limit; the interrupt stops both,
    which report a limit status (the plan found so far, if any) and HiGHS's interrupt."""
    stop = threading.Event()
    results: list = []

    def work(seed: int) -> None:
        results.append(solve(market_split(seed), backend="highs",
                             options=SolveOptions(time_limit_s=60, interrupt=stop.is_set,
                                                  diagnose_infeasible=False)))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    assert len(results) == 2
    for res in results:
        assert res.status in (Status.FEASIBLE, Status.TIME_LIMIT_NO_SOLUTION), res.status
        assert "interrupt" in res.termination.lower(), res.termination


def test_the_cpu_budget_counts_the_asking_threads_time_from_its_first_question(monkeypatch):
    clock = iter([10.0, 10.5, 12.9, 13.1, 13.1])
    monkeypatch.setattr(S.time, "thread_time", lambda: next(clock))
    stop = threading.Event()
    budget = S._CpuBudget(3.0, stop)
    assert [budget(), budget(), budget(), budget()] == [False, False, False, True]  # 0, 0.5, 2.9, 3.1 s
    stop.set()
    assert S._CpuBudget(3.0, stop)()  # the search stops: at once


def test_a_lifted_flight_lets_its_milps_run_past_their_own_limit_until_the_search_stops(monkeypatch):
    """`_Flight.lift` (the search has nothing left but its running MILPs): their CPU budgets no
    longer stop them; the search's stop still does."""
    clock = iter([0.0, 2.0, 5.0, 50.0, 50.0])
    monkeypatch.setattr(S.time, "thread_time", lambda: next(clock))
    flight = S._Flight(2)
    budget = S._CpuBudget(3.0, flight.stop, flight.unbounded)
    assert [budget(), budget(), budget()] == [False, False, True]  # 0, 2, 5 s of a 3 s budget
    flight.lift()
    assert not budget()  # 50 s
    flight.stop.set()
    assert budget()


def test_a_free_slot_solves_again_a_milp_stopped_at_its_limit_while_another_still_runs(monkeypatch):
    """`_Search._finish`: with nothing queued, one MILP running and one slot free, the unfinished
    choice of least bound solves again at once (not after the running MILP, which here ends only
    once it has started), the next one when a slot frees; one within the gap of the incumbent is
    closed with its bound, not solved."""
    from hetplan.formulations import joint
    from hetplan.orchestration.planner.helper import _Refiner
    from hetplan.orchestration.planner.options import ComboRecord

    resumed: list = []
    started = threading.Event()

    def fake_solve(rec, inp, found, best, objective, milp, limit_s, deadline, lb=None, interrupt=None, target=None):
        resumed.append((rec.P, lb, limit_s, target))
        started.set()
        return None  # nothing in the choice beats its cutoff

    monkeypatch.setattr(S, "_solve_choice", fake_solve)
    search = S._Search.__new__(S._Search)
    search.queue, search.dp_runs_left, search.objective, search.milp = [], 0, "max_throughput", None
    search.opts, search.deadline = PlannerOptions(rel_gap=0.01), joint.Deadline.after(60)
    search.refiner = _Refiner(None, "max_throughput", None, None, None)
    search.out = out = S._Outcome([], None)
    out.lead = out.best = (10.0, None, None)  # target 9.9
    out.unfinished = [S._ChoiceResult(bound, ComboRecord(P, 1, 1, bound, "solved:time_limit_no_solution"), None,
                                      None, None) for P, bound in ((5, 9.5), (6, 9.95), (4, 9.0))]
    search.flight = S._Flight(2)
    running_saw_resume: list = []
    search.flight.launch(lambda interrupt: running_saw_resume.append(started.wait(timeout=20)), 5.0)
    search._finish()
    assert running_saw_resume == [True]
    assert resumed == [(4, 9.0, math.inf, 9.9), (5, 9.5, math.inf, 9.9)]
    assert not out.unfinished and out.open_bounds == [9.95] and not search.flight.threads


def test_a_flight_hands_back_results_and_raises_a_jobs_failure_in_the_search():
    flight = S._Flight(2)
    seen: list = []

    def ok(value, interrupt):
        seen.append(interrupt)
        return value

    def fails(interrupt):
        raise ValueError("broken MILP")

    flight.launch(lambda interrupt: ok(1, interrupt), 5.0)
    assert flight.collect(block=True) == [1]
    assert isinstance(seen[0], S._CpuBudget) and seen[0].limit_s == 5.0
    flight.launch(lambda interrupt: ok(2, interrupt), 5.0)
    flight.launch(fails, 5.0)
    assert flight.full()
    got: list = []
    with pytest.raises(ValueError, match="broken MILP"):
        while flight.threads:
            got += flight.collect(block=True)
    flight.close()
    assert not flight.threads


def test_closing_a_flight_stops_its_running_solves():
    flight = S._Flight(2)
    for seed in (3, 4):
        flight.launch(lambda interrupt, seed=seed: solve(
            market_split(seed), backend="highs",
            options=SolveOptions(time_limit_s=60, interrupt=interrupt, diagnose_infeasible=False)), 60.0)
    time.sleep(0.5)
    threads = list(flight.threads)
    flight.close()
    assert not any(t.is_alive() for t in threads) and not flight.threads


@pytest.mark.parametrize("objective", ["max_throughput", "min_cost"])
def test_two_milps_at_once_prove_what_one_at_a_time_proves(objective, monkeypatch):
    """rel_gap 0 sends choices to their MILPs; each search's plan is within the other's bound (both
    bounds hold on the same space), and the two at once solve their MILPs in threads, two at a time."""
    opts = dict(max_stages=3, time_limit_s=120, rel_gap=0.0, workers=1, objective=objective)
    one = plan(tiny_three_types(), PlannerOptions(concurrent_milps=1, **opts))
    launched, most = [], [0]
    launch = S._Flight.launch
    both = threading.Barrier(2, timeout=30)  # the first MILP ends only once the second has started

    def counted(flight, job, limit_s, stale=None):
        def held(interrupt):
            if len(launched) <= 2:
                try:
                    both.wait()
                except threading.BrokenBarrierError:
                    pass
            return job(interrupt=interrupt)

        launched.append(job)
        launch(flight, held, limit_s, stale)
        most[0] = max(most[0], len(flight.threads))

    monkeypatch.setattr(S._Flight, "launch", counted)
    two = plan(tiny_three_types(), PlannerOptions(concurrent_milps=2, **opts))
    assert len(launched) == two.combos_solved and most[0] == 2
    for res in (one, two):
        assert res.status == "complete" and res.combos_solved >= 2, (res.status, res.combos_solved)
    tol = 1e-6
    assert two.model_objective >= one.bound * (1 - tol) and one.model_objective >= two.bound * (1 - tol)
    assert two.model_objective == pytest.approx(one.model_objective, rel=1e-4)


WAITING = """
import sys
sys.path.insert(0, {tests!r})
from test_concurrent_milps import market_split
from hetplan.orchestration.planner import search as S
from hetplan.solvers import SolveOptions, solve

flight = S._Flight(2, lambda: S._parallel_solves("highs"))  # as the search makes it
assert flight.slots == 2  # read before any launch, as the search does
for seed in (5, 6):
    flight.launch(lambda interrupt, seed=seed: solve(market_split(seed), backend="highs", options=SolveOptions(
        time_limit_s=60, interrupt=interrupt, diagnose_infeasible=False)), 60.0)
print("waiting", flush=True)
try:
    flight.collect(block=True)  # where the search waits when both slots are taken
except KeyboardInterrupt:
    flight.close()
    sys.exit(3)
"""


def test_sigint_interrupts_a_wait_on_solves_side_by_side():
    """Ctrl-C while the search waits for its MILPs: KeyboardInterrupt at once, and `close` stops
    both solves (a HiGHS thread alive at interpreter exit would abort the process: no exit 3)."""
    proc = subprocess.Popen([sys.executable, "-c", DEFAULT_SIGINT + WAITING.format(tests=str(Path(__file__).parent))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dumps_stacks())
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = communicate_or_stacks(proc, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err


def test_the_milp_gap_reaches_the_search_target_from_the_cutoff():
    """g = 1 - target / cutoff: a MILP stopped at a plan at the cutoff with d >= cutoff (1 - g)
    has d >= target; within [rel_gap / 10, rel_gap]; rel_gap / 2 with no cutoff or target."""
    milp = S._MilpSettings("highs", True, 0.01)
    assert S._milp_gap(milp, None, None) == S._milp_gap(milp, 2.0, None) == 0.005
    assert S._milp_gap(milp, 2.0, 2.0 * 0.996) == pytest.approx(0.004)
    assert S._milp_gap(milp, 2.0, 2.0 * 0.99) == pytest.approx(0.01)
    assert S._milp_gap(milp, 2.0, 1.5) == 0.01  # the search's gap at most
    assert S._milp_gap(milp, 2.0, 2.0) == pytest.approx(0.001)  # target at the cutoff: no exact proof
    assert S._milp_gap(S._MilpSettings("highs", True, 0.0), 2.0, 1.9) == 0.0


def test_a_stale_cutoff_is_a_fall_of_the_target_below_the_milps_cutoff():
    """`_cutoff` is what `_solve_choice` cuts at (the lead's objective or the target, the lesser);
    `_stale` says a MILP is better solved again once the target falls STALE_DROP below it."""
    assert S._cutoff(None, None) is None and S._cutoff((10.0, None, None), None) == 10.0
    assert S._cutoff((10.0, None, None), 9.9) == 9.9 and S._cutoff(None, 9.9) == 9.9
    assert S.STALE_DROP == 0.005
    assert not S._stale(10.0, None) and not S._stale(10.0, 9.96)  # no target; 0.4 % lower
    assert S._stale(10.0, 9.94) and S._stale(None, 5.0)  # 0.6 % lower; a first target


def test_a_stale_cutoff_stops_a_running_milp_and_its_result_says_so():
    """A MILP in a flight whose cutoff goes stale stops at HiGHS's next callback and its result is
    marked stale (the search then queues its choice again); stopped by `close` it is not."""
    from hetplan.orchestration.planner.options import ComboRecord

    def job(seed, interrupt):
        res = solve(market_split(seed), backend="highs",
                    options=SolveOptions(time_limit_s=60, interrupt=interrupt, diagnose_infeasible=False))
        return S._ChoiceResult(0.0, ComboRecord(seed, 1, 1, 0.0, res.termination), None, None, None)

    fallen = threading.Event()
    flight = S._Flight(2)
    flight.launch(lambda interrupt: job(5, interrupt), 60.0, stale=fallen.is_set)
    time.sleep(0.5)
    fallen.set()
    (got,) = flight.collect(block=True)
    assert got.stale and "interrupt" in got.record.status.lower()
    flight.launch(lambda interrupt: job(6, interrupt), 60.0, stale=lambda: False)
    time.sleep(0.5)
    threads = list(flight.threads)
    flight.stop.set()
    for t in threads:
        t.join(timeout=30)
    (got,) = flight.collect(block=True)
    assert not got.stale and "interrupt" in got.record.status.lower()


@pytest.mark.parametrize("objective", ["max_throughput", "min_cost"])
def test_a_choice_stopped_at_a_stale_cutoff_is_solved_again_and_keeps_one_record(objective, monkeypatch):
    """Every choice's first MILP stops at once as if its cutoff were stale (the tiny MILPs end before
    HiGHS's first callback, so the stop is the job's): each goes back in the queue and is solved
    again from there, with the target of then, not once the queue is empty; the search ends as the
    one without stops does (same plan, bounds that hold on each other's plan), with one record and
    one count per choice."""
    opts = dict(max_stages=3, time_limit_s=120, rel_gap=0.0, workers=1, objective=objective, concurrent_milps=2)
    plain = plan(tiny_three_types(), PlannerOptions(**opts))
    launch = S._Flight.launch
    launched: list = []

    def stale_first(flight, job, limit_s, stale=None):
        rec, inp = job.args[:2]  # _solve_choice(rec, inp, ...)
        first = all(r is not rec for r, _ in launched)
        launched.append((rec, flight.unbounded.is_set()))

        def stopped_at_once(interrupt):  # what a MILP stopped at its first callback gives
            rec.status = "solved:time_limit_no_solution"
            return S._ChoiceResult(rec.lower_bound, rec, inp, None, None, stale=True)
        launch(flight, stopped_at_once if first else job, limit_s, stale)

    monkeypatch.setattr(S._Flight, "launch", stale_first)
    stopped = plan(tiny_three_types(), PlannerOptions(**opts))
    solved = [r for r in stopped.records if r.status.startswith("solved")]
    assert stopped.status == "complete" and len(launched) > stopped.combos_solved >= 2
    assert len({(r.P, r.b, r.D) for r in solved}) == len(solved) == stopped.combos_solved
    assert all(r.status != "solved:time_limit_no_solution" for r in solved)
    assert not any(lifted for _, lifted in launched)  # solved again from the queue, not after it (`_finish`)
    tol = 1e-6
    assert stopped.model_objective >= plain.bound * (1 - tol) and plain.model_objective >= stopped.bound * (1 - tol)
    assert stopped.model_objective == pytest.approx(plain.model_objective, rel=1e-4)
