"""Pipeline schedules as per-stage action lists (names as in torch.distributed.pipelining).

An action is ("F", m) or ("B", m): forward or backward of microbatch m on this stage.

* GPipe: all M forwards, then all M backwards (in microbatch order); M activations alive.
* 1F1B (PipeDream-flush, Narayanan et al. 2021 sec. 2.2): stage s of P runs
  w = min(P - 1 - s, M) warm-up forwards, then alternates one forward and one backward, then
  drains the remaining backwards; at most min(P - s, M) activations alive.

Receives block, sends are asynchronous, so both are deadlock-free for any P and M: every
action waits only on actions of neighbouring stages that appear earlier in their own lists
(`simulate` checks it by running the dataflow).
"""
from __future__ import annotations

from typing import Literal

Action = tuple[Literal["F", "B"], int]
SCHEDULES = ("GPipe", "1F1B")


def stage_actions(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> list[Action]:
    if schedule == "GPipe":
        return [("F", m) for m in range(num_microbatches)] + [("B", m) for m in range(num_microbatches)]
    if schedule == "1F1B":
        warmup = min(num_stages - 1 - stage, num_microbatches)
        out: list[Action] = [("F", m) for m in range(warmup)]
        for i in range(num_microbatches - warmup):
            out += [("F", warmup + i), ("B", i)]
        return out + [("B", m) for m in range(num_microbatches - warmup, num_microbatches)]
    raise ValueError(f"unknown schedule {schedule!r}; known: {SCHEDULES}")


def max_in_flight(actions: list[Action]) -> int:
    """Largest number of microbatches whose activations are alive (forward done, backward not)."""
    alive = peak = 0
    for kind, _ in actions:
        alive += 1 if kind == "F" else -1
        peak = max(peak, alive)
    return peak


def simulate(schedule: str, num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """Run a schedule's per-stage action lists as a dataflow (see `run_dataflow`)."""
    return run_dataflow([stage_actions(schedule, num_stages, s, num_microbatches) for s in range(num_stages)])


def run_dataflow(lists: list[list[Action]]) -> list[list[Action]]:
    """Execute per-stage action lists in rounds: an action runs once its inputs exist (F(m) needs
    F(m) of the previous stage; B(m) needs this stage's F(m) and B(m) of the next stage); sends
    never block. Returns the actions run per round; RuntimeError on deadlock."""
    num_stages = len(lists)
    pos = [0] * num_stages
    done: set[tuple[int, str, int]] = set()
    rounds: list[list[Action]] = []
    while any(pos[s] < len(lists[s]) for s in range(num_stages)):
        ready = []
        for s in range(num_stages):
            if pos[s] == len(lists[s]):
                continue
            kind, m = lists[s][pos[s]]
            if kind == "F":
                ok = s == 0 or (s - 1, "F", m) in done
            else:
                ok = (s, "F", m) in done and (s == num_stages - 1 or (s + 1, "B", m) in done)
            if ok:
                ready.append(s)
        if not ready:
            raise RuntimeError(f"deadlock at positions {pos}")
        step = []
        for s in ready:
            kind, m = lists[s][pos[s]]
            done.add((s, kind, m))
            step.append((kind, m))
            pos[s] += 1
        rounds.append(step)
    return rounds
