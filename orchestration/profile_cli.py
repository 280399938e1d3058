"""`hetplan profile`: measure the runtime's model on this machine and write a profile file.

    hetplan profile --model OPT-350M --device cpu --mbs 1,2,4 --tp 1,2 --seq-len 128 -o profile.yaml
    hetplan profile --model arch.yaml --device cuda:0 --mbs 1,2 --tp 1 --format sailor -o out/profile.json
    hetplan profile-schema -o instances/profile_schema.json

What is measured and how: `hetplan.runtime.profiler`. The file: hetplan's profile format
(`hetplan.profiles`; YAML for -o *.yaml / *.yml, JSON for *.json), or with --format sailor Sailor's
profile.json plus an llm_info.json beside it (`hetplan.importers.sailor.write_sailor_profile`).
Bad input is checked before torch is imported, so such errors come back at once.
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from hetplan.errors import InstanceError
from hetplan.runtime.runnable import check_arch, check_shape, check_shape_options

# A microbatch is at most a global batch, and the largest published are ~2K sequences (GPT-3 175B: 3.2M
# tokens of 2,048; Llama-3-405B: 16M of 8,192).
MAX_MICROBATCH = 1 << 16
# TP t starts t processes; the largest scale-up (NVLink) domain announced is 576 GPUs (NVL576).
MAX_TP = 1024


def parse_sizes(text: str, option: str, most: int) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): integers from 1 to `most`, each once, ascending."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InstanceError(f"expected comma-separated integers, got {text!r}", option) from None
    if not values or any(v < 1 for v in values):
        raise InstanceError(f"expected integers >= 1, got {text!r}", option)
    if max(values) > most:
        raise InstanceError(f"{max(values)} is above the ceiling of {most:,}", option)
    return tuple(sorted(set(values)))


def resolve_arch(model: str, overrides: dict[str, Any]):
    """A preset name of core/data/models.yaml, or a YAML/JSON file of ModelArch fields; then overrides."""
    from pydantic import ValidationError

    from hetplan.catalog import ModelArch, model_presets
    from hetplan.instance import format_validation_error, read_structured

    presets = model_presets()
    if model in presets:
        fields = presets[model].model_dump()
    elif Path(model).suffix in (".yaml", ".yml", ".json") or Path(model).exists():
        data = read_structured(Path(model))
        if not isinstance(data, dict):
            raise InstanceError("expected a mapping of model fields (num_layers, hidden_size, ...)", model)
        fields = {"name": Path(model).stem, **data}
    else:
        raise InstanceError(f"unknown model preset {model!r} (and no such file); known: {sorted(presets)}",
                            "--model")
    try:
        return ModelArch(**{**fields, **{k: v for k, v in overrides.items() if v is not None}})
    except ValidationError as exc:
        raise InstanceError(format_validation_error(exc), "--model") from None
    except TypeError as exc:
        raise InstanceError(str(exc), "--model") from None


def _check_output(output: Path, fmt: str) -> None:
    from hetplan.files import check_writable

    check_writable(output, "--output")
    if fmt not in ("hetplan", "sailor"):
        raise InstanceError(f"unknown format {fmt!r}; use hetplan or sailor", "--format")
    if fmt == "sailor" and output.suffix != ".json":
        raise InstanceError("Sailor's profile is JSON: give a .json file name", "--output")


def _check_threads(threads: int) -> None:
    """At least one, and no more than the cores: more only times their contention, and OpenMP crashes
    (a segmentation fault) when it cannot create that many threads."""
    from hetplan.errors import check_number

    check_number(threads, "--threads")
    cores = os.cpu_count() or 1
    if threads > cores:
        raise InstanceError(f"{threads} threads is more than the {cores} cores of this machine", "--threads")


def _check_counts(warmup: int, repeats: int, threads: int, device: str, dtype: str, optimizer: str) -> None:
    from hetplan.errors import check_number

    check_number(warmup, "--warmup", zero=True)
    check_number(repeats, "--repeats")
    _check_threads(threads)
    if dtype not in ("float32", "float64", "bfloat16"):  # runtime/execute.py DTYPES
        raise InstanceError(f"unknown dtype {dtype!r}; use float32, float64 or bfloat16", "--dtype")
    if optimizer not in ("adam", "sgd"):
        raise InstanceError(f"unknown optimizer {optimizer!r}; use adam or sgd", "--optimizer")
    kind, _, index = device.partition(":")
    if device != "cpu" and (kind != "cuda" or (index and not index.isdigit())):
        raise InstanceError(f"expected cpu, cuda or cuda:INDEX, got {device!r}", "--device")


def start_forkserver() -> None:
    """Start the forkserver of the measuring processes now, so that its imports (torch, seconds) run
    while this process imports torch itself; hetplan.runtime.profiler.FORKSERVER_PRELOAD, spelled here because
    that module imports torch."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(["hetplan.runtime.profiler", "torch._dynamo"])
    forkserver.ensure_running()


def _progress_runner(total: int):
    """(rich progress bar on stderr, callback advancing it)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=False)
    task = bar.add_task("", total=total)
    return bar, lambda text: bar.update(task, advance=1, description=text)


def _run_with_progress(profiler, request):
    bar, advance = _progress_runner(profiler.steps(request))
    bar.start()
    try:
        result = profiler.run_profile(request, advance)
    except BaseException:
        # a failure is its one error line on stderr: no bar above it, nor the blank line of Progress.stop
        bar.live.transient = True
        bar.live.stop()
        raise
    bar.stop()
    return result


def write_profile(profile, output: Path, fmt: str) -> list[Path]:
    from hetplan.files import write_atomic
    from hetplan.profiles import ProfileSet

    if fmt == "sailor":
        from hetplan.importers.sailor import write_sailor_profile

        return write_sailor_profile(profile, output)
    return [write_atomic(output, ProfileSet((profile,)).to_text(output), "--output")]


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        model: str = typer.Option(..., "--model", help="model preset name, or a YAML/JSON file of ModelArch fields"),
        output: Path = typer.Option(..., "-o", "--output", help="profile file (.yaml or .json)"),
        device: str = typer.Option("cpu", "--device", help="cpu | cuda | cuda:INDEX (TP rank r uses INDEX + r)"),
        mbs: str = typer.Option("1,2,4", "--mbs", help="microbatch sizes, comma-separated"),
        tp: str = typer.Option("1", "--tp", help="TP degrees, comma-separated (t > 1 starts t processes)"),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="override the model's sequence length"),
        layers: Optional[int] = typer.Option(None, "--layers"),
        hidden: Optional[int] = typer.Option(None, "--hidden"),
        heads: Optional[int] = typer.Option(None, "--heads"),
        ffn: Optional[int] = typer.Option(None, "--ffn"),
        vocab: Optional[int] = typer.Option(None, "--vocab"),
        dtype: str = typer.Option("float32", "--dtype", help="float32 | float64 | bfloat16"),
        gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="name of the device type in the profile "
                                               "(default: CPU-<threads>thread, or the CUDA device's name)"),
        threads: int = typer.Option(1, "--threads", help="torch threads per process"),
        warmup: int = typer.Option(2, "--warmup", help="runs discarded before timing"),
        repeats: int = typer.Option(5, "--repeats", help="timed runs; the median is kept"),
        optimizer: str = typer.Option("adam", "--optimizer", help="adam | sgd"),
        links: bool = typer.Option(False, "--links", help="measure p2p/all-reduce between two local processes "
                                   "(done anyway when a TP degree > 1 is profiled)"),
        fmt: str = typer.Option("hetplan", "--format", help="hetplan | sailor"),
    ) -> None:
        """Measure per-layer-unit times and memory of the runtime's model on this machine."""
        micro, degrees = parse_sizes(mbs, "--mbs", MAX_MICROBATCH), parse_sizes(tp, "--tp", MAX_TP)
        overrides = {"seq_len": seq_len, "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
                     "ffn_hidden_size": ffn, "vocab_size": vocab}
        check_shape_options(overrides)
        arch = resolve_arch(model, overrides)
        check_shape(arch)
        check_arch(arch, degrees)
        _check_counts(warmup, repeats, threads, device, dtype, optimizer)
        _check_output(output, fmt)
        if any(t > 1 for t in degrees) or links:
            start_forkserver()
        from hetplan.runtime import profiler  # torch

        request = profiler.ProfileRequest(arch=arch, microbatches=micro, tp_degrees=degrees, device=device,
                                          gpu_type=gpu_type or "", dtype=dtype, threads=threads, warmup=warmup,
                                          repeats=repeats, optimizer=optimizer, links=links)
        profiler.check_request(request)  # CUDA present, enough devices, enough memory
        if gpu_type is None:
            request = replace(request, gpu_type=profiler.default_device_name(device, threads))
        result = _run_with_progress(profiler, request)
        for path in write_profile(result, output, fmt):
            sys.stdout.write(f"{path}\n")

    @app.command("profile-schema")
    def profile_schema_cmd(output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                                 help="write here instead of stdout")) -> None:
        """Export the JSON Schema of hetplan profile files (instances/profile_schema.json)."""
        import json

        from hetplan.files import write_atomic
        from hetplan.profiles import profile_json_schema

        text = json.dumps(profile_json_schema(), indent=2) + "\n"
        if output:
            write_atomic(output, text, "--output")
        else:
            sys.stdout.write(text)
