"""Run a plan on this machine: one process per rank on localhost, gloo on CPU.

`launch_local(instance, plan, steps, model_overrides)` compiles the plan to a LaunchSpec and
starts every rank either as a forkserver child (method "processes": cheap to start, errors come
back with their traceback) or through a real `torchrun --standalone` subprocess running
`python -m hetplan.runtime.execute` (method "torchrun": the entry point a cluster uses).
Nodes of the plan are emulated: all ranks share this host, each keeps its row of the rank table.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from hetplan.errors import RunFailedError
from hetplan.instance import Instance, load_instance
from hetplan.plan import Plan, load_plan
from hetplan.runtime._forkserver import DIE_WITH_PARENT_ENV, PARENT_ENV, die_with_parent
from hetplan.runtime.execute import (RANK_FILE_KINDS, RunOptions, heartbeat_path, progress_path, rank_file, run_worker,
    steps_log_path)
from hetplan.runtime.spec import LaunchSpec, build_spec, load_spec


class LaunchError(RunFailedError):
    """A local launch failed: a rank raised, died or timed out; the message carries its error."""


@dataclass(frozen=True)
class LocalRunResult:
    losses: list[float]
    times_s: list[float]
    peak_mem_bytes: list[int]  # per spec rank, at the last step
    log: dict[str, Any]
    out_dir: Path
    spec: LaunchSpec
    # measure=True: per step, per spec rank, the probe's record (runtime/probe.py STEP_FIELDS)
    rank_steps: list[list[dict[str, Any]]] = field(default_factory=list)

    @property
    def dump_dir(self) -> Path:
        return self.out_dir / "params"


def _as_instance(instance: Instance | str | Path) -> Instance:
    return instance if isinstance(instance, Instance) else load_instance(instance)


def _as_plan(plan: Plan | str | Path) -> Plan:
    return plan if isinstance(plan, Plan) else load_plan(plan)


def _local_env() -> dict[str, str]:
    # Loopback only: the sandbox (and many laptops) cannot route to their own hostname.
    return {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def _started_path(out_dir: Path, rank: int) -> Path:
    """Written by a rank's first line of hetplan code: a rank that exits without it never got past
    multiprocessing's bootstrap (the missing `if __name__ == '__main__':` guard)."""
    return rank_file(out_dir, rank, "pid")


def _child(spec_path: str, opts: RunOptions, rank: int, init_method: str, err_path: str, threads: int,
           launcher: int) -> None:
    die_with_parent()  # the forkserver: gone when the launcher is (runtime/_forkserver.py)
    if not _alive(launcher):  # both went before this rank got here: it would wait alone in the rendezvous
        os._exit(1)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked in the forkserver (_start_forkserver)
    try:
        _started_path(Path(err_path).parent, rank).write_text(f"{os.getpid()}\n")
        os.environ.update(_local_env())
        import torch

        torch.set_num_threads(threads)
        run_worker(load_spec(spec_path), opts, spec_rank=rank, init_method=init_method, process_rank=rank)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises LaunchError
        try:
            Path(err_path).write_text(traceback.format_exc())
        except OSError:  # the launcher was stopped and removed its folder: nobody to report to
            pass
        sys.exit(1)


LAUNCHER_KINDS = ("err", "pid")  # the per-rank files this launcher writes beside the worker's own
RANK_FILE = re.compile(rf"rank\d+\.({'|'.join(LAUNCHER_KINDS + RANK_FILE_KINDS)})")  # what a local run writes per rank


def clear_rank_files(out_dir: Path) -> None:
    """Remove every rank's files an earlier run left in `out_dir` (a folder reused for a run of fewer
    ranks kept rank 2..5's error and progress files beside the new run's 2 ranks, helper-11's F7)."""
    for path in out_dir.glob("rank*"):
        if RANK_FILE.fullmatch(path.name):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: alive
        pass
    return True


def steps_done(out_dir: Path, world_size: int) -> int:
    """Steps every rank has completed, from the ranks' progress files (0 before the first)."""
    return min((rank_steps_done(out_dir, r) for r in range(world_size)), default=0)


def rank_steps_done(out_dir: Path, rank: int) -> int:
    """Steps one rank has completed, from its progress file (0 before the first)."""
    try:
        return int(progress_path(out_dir, rank).read_text())
    except (OSError, ValueError):  # not written yet, or caught (or killed) between truncate and write
        return 0


def _start_forkserver() -> None:
    """Start the forkserver (if not running) with PARENT_ENV naming this process; the variable is
    removed at once, so no other child of this process (a `hetplan` it runs) reads it. SIGINT is
    blocked meanwhile: the forkserver inherits the mask across exec and keeps it, so a Ctrl-C before
    it leaves this process group (its interpreter's start: over 0.5 s on a loaded machine) is no
    KeyboardInterrupt there either; here it waits, pending, until the mask is restored."""
    from multiprocessing import forkserver, resource_tracker

    # the forkserver starts the resource tracker first, and that unblocks SIGINT when it has spawned
    # it (multiprocessing/resource_tracker.py): started before, it leaves the mask alone
    resource_tracker.ensure_running()
    os.environ[PARENT_ENV] = str(os.getpid())
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.environ.pop(PARENT_ENV, None)


class LocalWorkers:
    """One forkserver child per spec rank on this host, started at construction. A launcher
    polls it (`failed`, `finished`, `heartbeat_age_s`), can signal one rank (`signal`) and must
    `close` it (kills what is left, reaps, removes the rendezvous file)."""

    def __init__(self, spec: LaunchSpec, spec_path: Path, opts: RunOptions, out_dir: Path, threads: int = 1):
        ctx = mp.get_context("forkserver")
        # torch.optim imports torch._dynamo on first use (seconds): pay it once in the server, in a
        # process group of its own (runtime/_forkserver.py: out of reach of the terminal's Ctrl-C)
        ctx.set_forkserver_preload(["hetplan.runtime._forkserver", "hetplan.runtime.execute", "torch._dynamo"])
        _start_forkserver()
        self.spec, self.opts, self.out_dir = spec, opts, out_dir
        # absolute: in file://run/store the first word would be read as a host name (rendezvous hangs)
        self.store = out_dir.resolve() / f"store-{os.getpid()}-{time.monotonic_ns()}"
        errs = [rank_file(out_dir, r, "err") for r in range(spec.world_size)]
        # rank 0 appends its steps: a folder reused (run's segment_000 of an earlier run) kept the
        # earlier rows, and `run --json` reported their losses as this run's
        steps_log_path(out_dir).unlink(missing_ok=True)
        clear_rank_files(out_dir)
        self.procs = [ctx.Process(target=_child, args=(str(spec_path), opts, r, f"file://{self.store}", str(errs[r]),
                                                       threads, os.getpid()))
                      for r in range(spec.world_size)]
        self.started_at = time.monotonic()
        try:
            for proc in self.procs:
                proc.start()
        except BaseException:  # Ctrl-C while starting them: the caller never gets to close()
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def codes(self) -> list[int | None]:
        return [proc.exitcode for proc in self.procs]

    def failed(self) -> list[int]:
        return [r for r, code in enumerate(self.codes()) if code not in (None, 0)]

    def finished(self) -> bool:
        """Every rank exited with 0."""
        return all(code == 0 for code in self.codes())

    def failure_message(self) -> str:
        return _failure_message(self.spec, self.opts, self.failed(), self.codes(), self.out_dir)

    def heartbeat_age_s(self) -> list[float | None]:
        """Seconds since each rank's last heartbeat; None before its first one."""
        now, ages = time.time(), []
        for r in range(self.spec.world_size):
            try:
                ages.append(now - heartbeat_path(self.out_dir, r).stat().st_mtime)
            except OSError:
                ages.append(None)
        return ages

    def signal(self, rank: int, sig: int) -> None:
        os.kill(self.procs[rank].pid, sig)

    def close(self) -> None:
        started = [proc for proc in self.procs if proc.pid is not None]
        for proc in started:
            if proc.exitcode is None:
                proc.kill()  # SIGKILL: a stopped (SIGSTOP) process would never act on SIGTERM
        for proc in started:
            proc.join(timeout=10)
        self.store.unlink(missing_ok=True)


def _run_processes(spec: LaunchSpec, spec_path: Path, opts: RunOptions, out_dir: Path, timeout_s: float,
                   threads: int, on_progress: Callable[[int], None] | None = None) -> None:
    workers = LocalWorkers(spec, spec_path, opts, out_dir, threads)
    deadline = time.monotonic() + timeout_s
    reported = 0
    try:
        while any(code is None for code in workers.codes()):
            if on_progress is not None and (done := steps_done(out_dir, spec.world_size)) > reported:
                reported = done
                on_progress(done)
            if workers.failed():
                raise LaunchError(workers.failure_message())
            if time.monotonic() > deadline:
                raise LaunchError(f"local launch did not finish within {timeout_s:.0f} s")
            time.sleep(0.05)
        if workers.failed():
            raise LaunchError(workers.failure_message())
        if on_progress is not None and (done := steps_done(out_dir, spec.world_size)) > reported:
            on_progress(done)  # the last steps may end between two polls
    finally:
        workers.close()


def _failure_message(spec: LaunchSpec, opts: RunOptions, failed: list[int], codes: list[int | None],
                     out_dir: Path) -> str:
    """One line on the rank that explains the failure. A rank killed by a signal comes first: the
    others then fail on broken connections, which says nothing of the cause. Next a rank that
    raised (its traceback is in rank<r>.err); the guard hint only for a rank that never started."""
    killed = [r for r in failed if (codes[r] or 0) < 0]
    raised = [r for r in failed if rank_file(out_dir, r, "err").exists()]
    if killed:
        return _death_message(spec, opts, killed[0], codes[killed[0]] or 0, out_dir)
    if raised:
        err = rank_file(out_dir, raised[0], "err")
        lines = err.read_text().strip().splitlines()
        return f"rank {raised[0]} failed: {lines[-1] if lines else 'no message'} (traceback in {err})"
    r = failed[0]
    if not _started_path(out_dir, r).exists():
        return (f"rank {r} exited with code {codes[r]} before running any hetplan code: a script that calls "
                f"launch_local needs an `if __name__ == '__main__':` guard (or use method='torchrun')")
    return _death_message(spec, opts, r, codes[r] or 0, out_dir)


def _death_message(spec: LaunchSpec, opts: RunOptions, rank: int, code: int, progress_dir: Path) -> str:
    """'rank 3 (node v100-0, stage 1) was killed by signal SIGKILL (9) during step 2 of 5'."""
    row = spec.ranks[rank]
    if code < 0:
        try:
            how = f"was killed by signal {signal.Signals(-code).name} ({-code})"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code} without a Python error"
    done = rank_steps_done(progress_dir, rank)  # a rank killed while writing leaves its file empty
    when = (f"during step {done + 1} of {opts.steps}" if done < opts.steps
            else f"after its last step ({opts.steps} of {opts.steps}), while finishing")
    return f"rank {rank} (node {row.node}, stage {row.stage}) {how} {when}; the other ranks were stopped"


def _run_torchrun(spec: LaunchSpec, spec_path: Path, opts: RunOptions, timeout_s: float) -> None:
    flags = {"hidden_size": "--hidden", "num_heads": "--heads", "ffn_hidden_size": "--ffn",
             "vocab_size": "--vocab", "seq_len": "--seq-len"}
    argv = [sys.executable, "-m", "hetplan.runtime._torchrun", "--standalone", "--nnodes=1",
            f"--nproc-per-node={spec.world_size}", "-m", "hetplan.runtime.execute",
            "--spec", str(spec_path), "--single-host", "--steps", str(opts.steps), "--dtype", opts.dtype,
            "--collective-timeout", str(opts.timeout_s)]
    for key, value in opts.model.items():
        if key == "tied_embeddings":
            argv += [] if value else ["--untied"]
        else:
            argv += [flags[key], str(value)]
    for flag, value in (("--optimizer", opts.optimizer), ("--lr", opts.lr), ("--seed", opts.seed),
                        ("--log-json", opts.log_path), ("--dump-params", opts.dump_dir),
                        ("--progress-dir", opts.progress_dir),
                        ("--save-checkpoint", opts.save_checkpoint), ("--load-checkpoint", opts.load_checkpoint)):
        if value is not None:
            argv += [flag, str(value)]
    if opts.measure:
        argv.append("--measure")
    try:
        # the ranks' progress lines go where the processes method's go, as they come: file descriptor
        # 1, which the CLI points at stderr (they were printed on stdout at the end of the run)
        proc = subprocess.run(argv, env={**os.environ, **_local_env(), DIE_WITH_PARENT_ENV: "1"}, text=True,
                              timeout=timeout_s,
                              stdout=subprocess.PIPE if opts.quiet else None, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"torchrun did not finish within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise LaunchError(_torchrun_failure(spec, opts, proc.returncode, proc.stderr + (proc.stdout or "")))


def _torchrun_failure(spec: LaunchSpec, opts: RunOptions, returncode: int, output: str) -> str:
    """torchrun's summary names the first failed rank ('Root Cause' section: 'rank : 1 (local_rank:
    1)', 'exitcode : -9 (pid: ...)', torch/distributed/elastic/multiprocessing/errors); a
    negative exit code is a signal. --single-host makes the spec rank equal torchrun's RANK."""
    root = output.split("Root Cause", 1)[-1]
    rank, code = re.search(r"rank\s*:\s*(\d+)", root), re.search(r"exitcode\s*:\s*(-?\d+)", root)
    if rank and code and int(code.group(1)) < 0 and int(rank.group(1)) < spec.world_size:
        return "torchrun: " + _death_message(spec, opts, int(rank.group(1)), int(code.group(1)),
                                             Path(opts.progress_dir or "."))
    errors = [ln for ln in output.splitlines() if "Error" in ln or "error" in ln]
    return f"torchrun exited with {returncode}: {errors[-1] if errors else output[-500:]}"


def _check_options(spec: LaunchSpec, opts: RunOptions, warn: bool = True) -> None:
    """Errors a rank would hit, raised here before any process starts (`warn`: say what the ranks
    will convert, check_checkpoint)."""
    from hetplan.errors import PlanError
    from hetplan.runtime.execute import DTYPES, check_checkpoint, model_config

    model_config(spec, opts.model)
    if opts.load_checkpoint:
        check_checkpoint(spec, opts, Path(opts.load_checkpoint), "load_checkpoint", warn=warn)
    if opts.dtype not in DTYPES:
        raise PlanError(f"unknown dtype {opts.dtype!r}; use one of {sorted(DTYPES)}", "dtype")
    if opts.optimizer not in (None, "adam", "sgd"):
        raise PlanError(f"unknown optimizer {opts.optimizer!r}; use adam or sgd", "optimizer")
    if opts.steps < 1:
        raise PlanError(f"steps must be at least 1, got {opts.steps}", "steps")


def launch_local(instance: Instance | str | Path, plan: Plan | str | Path, steps: int = 10,
                 model_overrides: dict[str, Any] | None = None, *, schedule: str | None = None,
                 dtype: str = "float32", optimizer: str | None = None, lr: float | None = None, seed: int = 0,
                 out_dir: str | Path | None = None, method: Literal["processes", "torchrun"] = "processes",
                 dump_params: bool = False, save_checkpoint: str | Path | None = None,
                 load_checkpoint: str | Path | None = None, timeout_s: float = 600.0, quiet: bool = False,
                 threads_per_rank: int = 1, measure: bool = False,
                 on_progress: Callable[[int], None] | None = None) -> LocalRunResult:
    """Train `plan` for `steps` iterations with one local process per rank; returns loss and time
    per iteration (rank 0 also prints them). Raises PlanError for an invalid plan, LaunchError
    when a rank fails. `measure` records per-rank step breakdowns (`rank_steps`, runtime/probe.py);
    `on_progress(steps completed by every rank)` is called as they advance (method "processes")."""
    inst, pl = _as_instance(instance), _as_plan(plan)
    if schedule is not None:
        pl = pl.model_copy(update={"schedule": schedule})
    spec = build_spec(inst, pl)
    if method not in ("processes", "torchrun"):
        raise LaunchError(f"unknown local launch method {method!r}; use 'processes' or 'torchrun'")
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="hetplan-local-"))
    log_path = out / "log.json"
    opts = RunOptions(steps=steps, model=dict(model_overrides or {}), dtype=dtype, optimizer=optimizer, lr=lr,
                      seed=seed, backend="gloo", log_path=str(log_path),
                      dump_dir=str(out / "params") if dump_params else None,
                      save_checkpoint=str(save_checkpoint) if save_checkpoint else None,
                      load_checkpoint=str(load_checkpoint) if load_checkpoint else None,
                      timeout_s=min(timeout_s, 300.0), quiet=quiet, progress_dir=str(out), measure=measure)
    try:
        _check_options(spec, opts)  # before anything is written: a refused launch leaves the folder as it was
    except BaseException:
        if out_dir is None:  # and leaves no empty temporary folder behind
            out.rmdir()
        raise
    out.mkdir(parents=True, exist_ok=True)
    spec_path = spec.save(out / "launch_spec.json")
    log_path.unlink(missing_ok=True)
    if method == "processes":
        _run_processes(spec, spec_path, opts, out, timeout_s, threads_per_rank, on_progress)
    else:
        clear_rank_files(out)
        _run_torchrun(spec, spec_path, opts, timeout_s)
    log = json.loads(log_path.read_text())
    return LocalRunResult(losses=[s["loss"] for s in log["steps"]], times_s=[s["time_s"] for s in log["steps"]],
                          peak_mem_bytes=log["steps"][-1]["peak_mem_bytes"] if log["steps"] else [],
                          log=log, out_dir=out, spec=spec, rank_steps=[s["ranks"] for s in log["steps"]] if measure else [])
