"""Commands that speak Sailor's formats: `hetplan import sailor` and `hetplan export-plan --to sailor`
(`hetplan simulate` reads Sailor plan dicts through `load_any_plan`)."""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from hetplan.errors import InstanceError, PlanError
from hetplan.instance import Instance, read_structured
from hetplan.plan import Plan, plan_from_dict

REPO = Path(__file__).resolve().parents[1]


def default_sailor_dir() -> Path | None:
    """$HETPLAN_SHARED_DIR/reference/sailor, else ../shared/reference/sailor beside the working folder
    or beside the repository; None when none holds Sailor's data."""
    candidates = []
    if os.environ.get("HETPLAN_SHARED_DIR"):
        candidates.append(Path(os.environ["HETPLAN_SHARED_DIR"]) / "reference" / "sailor")
    candidates += [Path.cwd().parent / "shared" / "reference" / "sailor", REPO.parent / "shared" / "reference" / "sailor"]
    return next((c for c in candidates if (c / "profiles").is_dir()), None)


def parse_cluster(spec: str) -> dict[tuple[str, str], int]:
    """'A100-40@us-central1-a=32,V100-16@us-central1-a=96' -> {(GPU type, zone): GPUs}."""
    out: dict[tuple[str, str], int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            where, count = part.split("=")
            gpu, zone = where.split("@")
            n = int(count)
        except ValueError:
            raise InstanceError(f"expected GPU@zone=count, got {part!r}", "--cluster") from None
        if n < 1 or not gpu or not zone:
            raise InstanceError(f"expected GPU@zone=count with count >= 1, got {part!r}", "--cluster")
        out[(gpu, zone)] = out.get((gpu, zone), 0) + n
    if not out:
        raise InstanceError("no GPUs given; e.g. A100-40@us-central1-a=32", "--cluster")
    return out


def load_instance_and_plan(instance: str, plan: str) -> tuple[Instance, Plan]:
    """The instance and `load_any_plan` of `plan` on it: every command that takes an instance and a
    plan reads both so, Sailor's format included (`launch`, `measure` and `run` refused it as a
    hetplan plan missing its fields)."""
    from hetplan.instance import load_instance

    inst = load_instance(instance)
    loaded = load_any_plan(plan, inst)
    if loaded.instance is not None and loaded.instance != inst.name:  # helper-11's F7: never looked at
        warnings.warn(f"the plan names instance {loaded.instance!r}, not this one ({inst.name!r}): it is checked "
                      "and priced on this one")
    return inst, loaded


def load_any_plan(path: str, instance: Instance) -> Plan:
    """A hetplan plan file, a bundled plan's name, or a plan in Sailor's format (recognised by its keys)."""
    from hetplan.importers.sailor_plan import is_sailor_plan, plan_from_sailor
    from hetplan.plan import load_plan, validate_plan

    if Path(path).is_file():
        data = read_structured(Path(path), PlanError)
        if is_sailor_plan(data):
            plan = plan_from_sailor(data, instance, name=Path(path).stem)
            try:  # checked here, where its errors can name the file's own keys
                validate_plan(instance, plan)
            except PlanError as exc:
                raise PlanError(exc.detail, in_sailor_terms(exc.field)) from None
            return plan
        return plan_from_dict(data) if isinstance(data, dict) else load_plan(path)
    return load_plan(path)


# hetplan plan fields -> where a Sailor plan says the same ([[[gpu, gpus_per_node, zone]], tp] a replica)
_SAILOR_FIELDS = [(r"^stages\[(\d+)\]\.replicas\[(\d+)\]\.tp$", r"pipeline_list[0].tmp_per_stage[\1][\2][1]"),
                  (r"^stages\[(\d+)\]\.replicas\[(\d+)\]\.gpu_type$",
                   r"pipeline_list[0].tmp_per_stage[\1][\2][0][0][0]"),
                  (r"^stages\[(\d+)\]\.replicas\[(\d+)\]\.zone$", r"pipeline_list[0].tmp_per_stage[\1][\2][0][0][2]"),
                  (r"^stages\[(\d+)\]\.replicas\[(\d+)\].*$", r"pipeline_list[0].tmp_per_stage[\1][\2]"),
                  (r"^stages\[(\d+)\]\.layer_(start|end)$", r"pipeline_list[0].layers_per_stage[\1]"),
                  (r"^stages\[(\d+)\]$", r"pipeline_list[0].layers_per_stage[\1]"),
                  (r"^stages$", "pipeline_list[0].layers_per_stage"),
                  (r"^(num_microbatches|micro_batch_size)$", "mbs")]


def in_sailor_terms(field: str | None) -> str | None:
    """A validation error's field of the hetplan plan read from a Sailor plan, as the Sailor file's key."""
    for pattern, repl in _SAILOR_FIELDS:
        if field is not None and re.match(pattern, field):
            return re.sub(pattern, repl, field)
    return field


def register(app: typer.Typer) -> None:
    import_app = typer.Typer(help="Write a hetplan instance from another system's data.", no_args_is_help=True)
    app.add_typer(import_app, name="import")

    @import_app.command("sailor")
    def import_sailor(
            model: str = typer.Option(..., "--model", help="Sailor's model name: OPT-350 | GPT-Neo-2.7"),
            cluster: str = typer.Option(..., "--cluster", help="GPU@zone=count,... e.g. A100-40@us-central1-a=32"),
            sailor_dir: Optional[Path] = typer.Option(None, "--sailor-dir", help="Sailor's data (default: "
                                                      "../shared/reference/sailor)"),
            objective: str = typer.Option("max_throughput", "--objective", help="max_throughput | min_cost"),
            max_cost: Optional[float] = typer.Option(None, "--max-cost", help="USD per iteration"),
            min_throughput: Optional[float] = typer.Option(None, "--min-throughput", help="iterations per second"),
            output: Path = typer.Option(..., "-o", "--output", help="instance file to write (JSON if it ends "
                                                                    "in .json, else YAML)")) -> None:
        """An instance that scores plans as Sailor's simulator does (estimators preset sailor)."""
        from hetplan.files import write_atomic
        from hetplan.importers.sailor import sailor_instance_dict
        from hetplan.instance import instance_from_dict
        from hetplan.errors import check_number, fields_as

        counts = parse_cluster(cluster)  # the cheap checks first
        ref = sailor_dir or default_sailor_dir()
        if ref is None or not (Path(ref) / "profiles").is_dir():
            raise InstanceError(f"no Sailor data (profiles/) in {ref}; give --sailor-dir", "--sailor-dir")
        if objective not in ("max_throughput", "min_cost"):
            raise InstanceError(f"expected max_throughput or min_cost, got {objective!r}", "--objective")
        check_number(max_cost, "--max-cost")
        check_number(min_throughput, "--min-throughput")
        constraints: dict[str, Any] = {}
        if max_cost is not None:
            constraints["max_cost_per_iteration_usd"] = max_cost
        if min_throughput is not None:
            constraints["min_throughput_iters_per_s"] = min_throughput
        with fields_as({"model": "--model", "cluster": "--cluster"}):
            data = sailor_instance_dict(ref, model, gpu_counts=counts, preset="sailor", counts_field="--cluster",
                                        objective=objective, constraints=constraints,
                                        name=f"sailor_{model}_{cluster.replace(',', '_').replace('=', 'x')}")
        instance_from_dict(data)  # refuse to write what would not load
        text = (json.dumps(data, indent=2) + "\n" if output.suffix == ".json"  # read back by suffix
                else yaml.safe_dump(data, sort_keys=False))
        write_atomic(output, text, "--output")
        typer.echo(f"written: {output}")

    @app.command("export-plan")
    def export_plan(instance: str = typer.Argument(..., help="instance file or bundled name"),
                    plan: str = typer.Argument(..., help="plan file (hetplan or Sailor format)"),
                    to: str = typer.Option("sailor", "--to", help="format: sailor"),
                    output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here, not stdout")) -> None:
        """Write a plan in another system's format."""
        from hetplan.files import write_atomic
        from hetplan.importers.sailor_plan import plan_to_sailor
        from hetplan.plan import validate_plan

        if to != "sailor":
            raise PlanError(f"unknown format {to!r}; known: sailor", "--to")
        inst, given = load_instance_and_plan(instance, plan)
        if given.metadata.get("source") != "sailor" and any(r.node for s in given.stages for r in s.replicas):
            warnings.warn("Sailor's format names no nodes: the plan's nodes and GPUs are left out, and a reader "
                          "places its replicas again (first fit)")
        placed = validate_plan(inst, given)
        text = json.dumps(plan_to_sailor(placed, inst), indent=2) + "\n"
        if output:
            write_atomic(output, text, "--output")
            typer.echo(f"written: {output}")
        else:
            typer.echo(text, nl=False)
