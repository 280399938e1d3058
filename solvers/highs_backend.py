"""HiGHS back-end, driven directly through highspy (LP and MILP; linear models only).

The view's CSR rows go to HiGHS in one `addRows` call. A complete start goes in as a
`HighsSolution`, a partial one through the sparse `setSolution(k, index, value)` (HiGHS then fixes
the given integers and solves an LP for the rest). HiGHS uses a start only when it is feasible;
acceptance is read from its log:
  complete -> "MIP start solution is feasible"
  partial  -> "Attempting to find feasible solution by solving LP for user-supplied values of
              discrete variables" followed by "Model status : Optimal".
For a pure LP the start only seeds the simplex and HiGHS does not say whether it helped (None).
"""
from __future__ import annotations

import math
import os
import re
import threading
from time import perf_counter
from typing import Any, Callable

import numpy as np

from hetplan.errors import SolverError
from hetplan.files import stdout_fd_to
from hetplan.solvers.api import SolveOptions, Status
from hetplan.solvers.model_view import ModelView
from hetplan.solvers.registry import Backend, Capabilities, Outcome, Probe, RunRequest

_FULL_OK = "MIP start solution is feasible"
_PARTIAL_TRY = "Attempting to find feasible solution by solving LP for user-supplied values"
_MODEL_STATUS = re.compile(r"Model status\s*:\s*(.+)")

# HiGHS model status name -> our status when a solution exists / when none exists
_LIMIT_WORDS = {"kTimeLimit", "kIterationLimit", "kSolutionLimit", "kInterrupt", "kObjectiveBound",
                "kObjectiveTarget", "kMemoryLimit", "kHighsInterrupt"}


class HighsBackend(Backend):
    name = "highs"
    capabilities = Capabilities(integer=True, quadratic=False, nonlinear=False, warm_start=True,
                                partial_warm_start=True, dual_bound=True, parallel_solves=True)

    @classmethod
    def _detect(cls) -> Probe:
        try:
            import highspy
        except ImportError as exc:
            return Probe(False, None, f"highspy is not installed ({exc}); pip install highspy")
        h = _new_highs(highspy)
        return Probe(True, f"HiGHS {h.versionMajor()}.{h.versionMinor()}.{h.versionPatch()}", "linear models only")

    def run(self, view: ModelView, request: RunRequest) -> Outcome:
        import highspy

        if not view.is_linear:
            raise SolverError("HiGHS accepts linear models only; nonlinear in " + ", ".join(view.nonlinear_items()[:5]))
        t0 = perf_counter()
        h = _new_highs(highspy)
        _set_options(h, request, highspy)
        _pass_model(h, view, highspy)
        start_kind = _set_start(h, view, request, highspy)
        build_s = perf_counter() - t0
        t1 = perf_counter()
        try:
            _run_interruptible(h, request.options.interrupt)
        except Exception as exc:
            return Outcome(Status.ERROR, "exception", build_s=build_s, solve_s=perf_counter() - t1,
                           message=f"HiGHS failed: {exc}")
        solve_s = perf_counter() - t1
        outcome = _outcome(h, view, highspy, build_s, solve_s)
        h.setOptionValue("log_file", "")  # close the log file before reading it
        outcome.warm_start_accepted, line = _start_accepted(request.log_path, start_kind, view)
        if line:
            outcome.stats["warm_start_log_line"] = line
        if outcome.status is Status.ERROR:
            outcome.message += "".join(f"; {e}" for e in _error_lines(request.log_path))
        return outcome


_NEW_HIGHS = threading.Lock()  # the first Highs object is made once, even by solves in threads
_banner_written = False  # whether this process has made a Highs object (and HiGHS its banner)


def _new_highs(highspy: Any) -> Any:
    """A Highs object. HiGHS prints its banner on file descriptor 1 when a process makes its first
    one and never again (highspy 1.16; `tests/test_solvers.py` checks it), while stdout belongs to
    the caller (a table, JSON, a pipe), also outside the CLI: the first one is made with descriptor
    1 pointed at stderr, and only the first. The redirection is process-wide: whatever another
    thread wrote on stdout meanwhile went to stderr (measured: a test's child printed its one line
    there while two MILPs made their Highs objects in threads; `_Flight` probes the back-end, and so
    makes the first one, before it starts a thread)."""
    global _banner_written
    with _NEW_HIGHS:
        if _banner_written:
            return highspy.Highs()
        with stdout_fd_to(2):
            h = highspy.Highs()
        _banner_written = True
        return h


def _run_interruptible(h: Any, interrupt: Callable[[], bool] | None = None) -> None:
    """`h.run()` in a worker thread while this one waits. Python runs signal handlers in the main
    thread only, between bytecodes, so a Ctrl-C (KeyboardInterrupt; SIGTERM where a handler turns
    it into one) during `h.run()` on the main thread would act only when the solve ends, at its
    time limit seconds later. Here the handler runs at once; HiGHS is asked to stop at its next
    interrupt callback (measured on a planner MILP: 71 in 4 s, at most 0.76 s apart), and the
    exception goes on once it has stopped (a HiGHS thread still running at interpreter exit aborts
    the process). A solve's outcome is the same either way. It stops likewise when `interrupt()`,
    asked at the callbacks in the thread that runs HiGHS, says so (several solves at once: the
    search's own stop and limits). HiGHS keeps a task scheduler per thread that runs it and refuses
    a solve asking for other `threads` than that scheduler has: a thread of its own per solve
    takes any `threads`."""
    stop, done = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def on_callback(event: Any) -> None:
        if stop.is_set() or (interrupt is not None and interrupt()):
            event.interrupt()

    def work() -> None:
        try:
            h.run()
        except BaseException as exc:  # noqa: BLE001  re-raised in the caller's thread
            failure.append(exc)
        finally:
            reset = getattr(type(h), "resetThreadScheduler", None)
            if reset is not None:  # this thread's share of HiGHS's task scheduler goes with it, its
                reset(os.name != "nt")  # worker threads joined (highspy detaches them: a Windows deadlock)
            done.set()

    h.cbSimplexInterrupt += on_callback
    h.cbIpmInterrupt += on_callback
    h.cbMipInterrupt += on_callback
    runner = threading.Thread(target=work, name="highs-run", daemon=True)
    runner.start()
    try:
        done.wait()  # Event.wait returns to the interpreter when a signal arrives
        runner.join()  # HiGHS has stopped: its thread ends at once
    except BaseException:
        stop.set()
        _wait_through_ctrl_c(done, runner)
        raise
    if failure:
        raise failure[0]


def _wait_through_ctrl_c(done: threading.Event, runner: threading.Thread) -> None:
    """Until HiGHS has stopped (`done`) and its thread has ended: a thread of HiGHS's still running
    when the interpreter exits aborts the process. A second Ctrl-C meanwhile is ignored: HiGHS is
    stopping already."""
    while not done.is_set() or runner.is_alive():
        try:
            done.wait()
            runner.join()
        except KeyboardInterrupt:
            pass


def _error_lines(log_path: str) -> list[str]:
    try:
        with open(log_path, errors="replace") as fh:
            return [line.strip() for line in fh if line.startswith("ERROR")][:3]
    except OSError:
        return []


def _set_options(h: Any, request: RunRequest, highspy: Any) -> None:
    o: SolveOptions = request.options
    opts: dict[str, Any] = {
        "output_flag": True,
        "log_to_console": bool(o.verbose and not request.quiet),
        "log_file": request.log_path,
        "mip_rel_gap": float(o.rel_gap),
        "mip_abs_gap": float(o.abs_gap),
        "random_seed": int(o.seed),
    }
    if o.time_limit_s is not None:
        opts["time_limit"] = float(o.time_limit_s)
    if o.threads is not None:
        opts["threads"] = int(o.threads)
    opts.update(o.solver_options)  # native options last: they override the common ones
    for key, value in opts.items():
        try:
            status = h.setOptionValue(key, value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise SolverError(f"HiGHS rejected option {key}={value!r}: {exc}") from exc
        if status != highspy.HighsStatus.kOk:
            raise SolverError(f"HiGHS rejected option {key}={value!r} (unknown name or value out of range)")


def _pass_model(h: Any, view: ModelView, highspy: Any) -> None:
    n = view.n_vars
    inf = highspy.kHighsInf
    h.addVars(n, np.where(np.isfinite(view.var_lb), view.var_lb, -inf), np.where(np.isfinite(view.var_ub), view.var_ub, inf))
    ints = np.flatnonzero(view.var_integer).astype(np.int32)
    if len(ints):
        h.changeColsIntegrality(len(ints), ints, np.full(len(ints), highspy.HighsVarType.kInteger.value, dtype=np.uint8))
    obj = view.objective
    if obj is not None:
        cost = np.zeros(n)
        np.add.at(cost, obj.cols, obj.coefs)
        h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
        h.changeObjectiveOffset(obj.constant)
        if obj.maximize:
            h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    if view.n_rows:
        status = h.addRows(view.n_rows, np.where(np.isfinite(view.row_lb), view.row_lb, -inf),
                           np.where(np.isfinite(view.row_ub), view.row_ub, inf), len(view.data),
                           view.indptr[:-1].astype(np.int32), view.indices.astype(np.int32), view.data)
        if status == highspy.HighsStatus.kError:
            raise SolverError("HiGHS refused the constraint matrix (numerical trouble: a huge or tiny coefficient?)")


def _set_start(h: Any, view: ModelView, request: RunRequest, highspy: Any) -> str | None:
    start = request.start
    if start is None:
        return None
    x = start.values
    if start.complete:
        sol = highspy.HighsSolution()
        sol.col_value = x.tolist()
        sol.value_valid = True
        h.setSolution(sol)
        return "full" if view.has_integers else "lp"
    given = np.flatnonzero(~np.isnan(x))
    h.setSolution(len(given), given.astype(np.int32), x[given].astype(float))
    return "partial" if view.has_integers else "lp"


def _start_accepted(log_path: str, kind: str | None, view: ModelView) -> tuple[bool | None, str]:
    if kind is None or kind == "lp":
        return None, ""
    try:
        with open(log_path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None, ""
    if not text.strip():
        return None, ""  # logging switched off by a native option
    for line in text.splitlines():
        if line.startswith(_FULL_OK):
            return True, line.strip()
    pos = text.find(_PARTIAL_TRY)
    if pos >= 0:
        match = _MODEL_STATUS.search(text, pos)
        if match and match.group(1).strip() == "Optimal":
            return True, f"{_PARTIAL_TRY} ... Model status: Optimal"
    return False, ""


def _outcome(h: Any, view: ModelView, highspy: Any, build_s: float, solve_s: float) -> Outcome:
    ms = h.getModelStatus()
    word = ms.name
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    objective = float(info.objective_function_value) if has_sol else None
    mip = view.has_integers
    bound: float | None = None
    if mip:
        b = float(info.mip_dual_bound)
        bound = b if math.isfinite(b) and abs(b) < highspy.kHighsInf else None
    elif ms == highspy.HighsModelStatus.kOptimal:
        bound = objective
    nodes = int(info.mip_node_count) if mip else 0
    nodes = nodes if nodes >= 0 else None  # -1 when HiGHS never started the search
    values = np.asarray(h.getSolution().col_value, dtype=float) if has_sol else None
    stats = {"simplex_iterations": int(info.simplex_iteration_count), "model_status": h.modelStatusToString(ms)}
    message = ""
    if ms == highspy.HighsModelStatus.kOptimal:
        status = Status.OPTIMAL
    elif ms == highspy.HighsModelStatus.kInfeasible:
        status = Status.INFEASIBLE
    elif ms == highspy.HighsModelStatus.kUnbounded:
        status = Status.UNBOUNDED
    elif ms == highspy.HighsModelStatus.kUnboundedOrInfeasible:
        return Outcome(Status.INFEASIBLE, word, nodes=nodes, build_s=build_s, solve_s=solve_s, stats=stats,
                       infeasible_or_unbounded=True)
    elif ms == highspy.HighsModelStatus.kModelEmpty:
        status, objective, bound = Status.OPTIMAL, (view.objective.constant if view.objective else 0.0), None
        bound = objective
        values = np.clip(np.zeros(view.n_vars), view.var_lb, view.var_ub)
    elif word in _LIMIT_WORDS:
        status = Status.FEASIBLE if has_sol else Status.TIME_LIMIT_NO_SOLUTION
        if word == "kMemoryLimit":
            message = "HiGHS stopped at its memory limit"
    else:
        status = Status.ERROR
        message = f"HiGHS stopped with model status '{h.modelStatusToString(ms)}' (numerical trouble or a solver error)"
        if has_sol:
            status = Status.FEASIBLE
    if status in (Status.INFEASIBLE, Status.UNBOUNDED, Status.ERROR):
        objective, bound, values = None, None, None
    if view.objective is None and objective is not None:
        objective, bound = 0.0, 0.0
    return Outcome(status, word, objective=objective, bound=bound, nodes=nodes, values=values,
                   build_s=build_s, solve_s=solve_s, stats=stats, message=message)
