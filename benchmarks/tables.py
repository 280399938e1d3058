"""What the benchmark scripts share to print their tables and compare two planners' plans."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def cell(x: float | None, fmt: str) -> str:
    """A number formatted for a table; "-" for a missing one."""
    return "-" if x is None else format(x, fmt)


def print_rows(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Left-aligned columns as wide as their widest cell, under a dashed rule."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def select(chosen: list, only: str | None, hint: str = "") -> list | None:
    """The scenarios (objects with `name`) named in the comma-separated `only` (all without it);
    None, with one line on stderr, when it names an unknown one."""
    if not only:
        return chosen
    names = set(only.split(","))
    unknown = names - {sc.name for sc in chosen}
    if unknown:
        print(f"unknown scenarios {sorted(unknown)}{hint}", file=sys.stderr)
        return None
    return [sc for sc in chosen if sc.name in names]


def objective_ratio(objective: str, base: Any, het: Any) -> float | None:
    """hetplan over the baseline on the objective (> 1: hetplan better): throughput ratio, or the
    baseline's cost over hetplan's for min cost; None when either has no plan. `base` and `het`
    carry `iters_per_s` and `cost_usd`."""
    if base.iters_per_s is None or het.iters_per_s is None:
        return None
    if objective == "min_cost":
        return base.cost_usd / het.cost_usd
    return het.iters_per_s / base.iters_per_s


def max_throughput_instance(text: str, script: str) -> Any | None:
    """The instance in file `text`, or the bundled one of that name, when its objective is max
    throughput; None, with one line on stderr naming `script`, otherwise."""
    from hetplan.bundled import bundled_instance_path
    from hetplan.errors import HetplanError
    from hetplan.instance import load_instance

    path = Path(text)
    try:
        instance = load_instance(path if path.exists() else bundled_instance_path(text))
    except HetplanError as e:
        print(f"{script}: {e}", file=sys.stderr)
        return None
    if instance.objective.kind != "max_throughput":
        print(f"{script}: max-throughput instances only", file=sys.stderr)
        return None
    return instance
