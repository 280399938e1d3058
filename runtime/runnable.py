"""What the runtime's model (runtime/model.py) can run, checked without importing torch: the
profiler, `hetplan profile`, `launch --local`, `measure` and `run` refuse other architectures and
shapes before any work starts."""
from __future__ import annotations

from hetplan.catalog import MAX_LAYERS
from hetplan.errors import InstanceError

# Ceilings on the model's shape, each well above any real model, so that a mistyped size is refused
# here by name and not by torch's allocator mid-run (an internal error before). The bundled catalogue
# (core/data/models.yaml) tops out at seq 2,048, vocab 50,272, hidden 8,192, FFN 22,016, 64 heads.
# (ModelArch field, option, ceiling):
SHAPE_CEILINGS = (
    ("seq_len", "--seq-len", 1 << 24),  # 16.8M tokens; the longest published context is 10M (Llama 4 Scout)
    ("vocab_size", "--vocab", 1 << 21),  # 2.1M; the largest published vocabularies are ~256K (Gemma, BLOOM)
    ("hidden_size", "--hidden", 1 << 17),  # 131,072; the widest published are ~20K (MT-NLG 20,480, PaLM 18,432)
    ("ffn_hidden_size", "--ffn", 1 << 19),  # 524,288; the widest published are ~80K (MT-NLG 81,920)
    ("num_heads", "--heads", 1 << 17),  # as hidden: a head is at least one unit wide
    ("num_layers", "--layers", MAX_LAYERS),  # ModelArch's own ceiling, here named by option
)


def check_arch(arch, tp_degrees: tuple[int, ...]) -> None:
    """InstanceError for an architecture the runtime model (runtime/model.py) cannot run, or cannot
    split over one of the TP degrees."""
    if arch.mlp != "gelu":
        raise InstanceError(f"the runtime model has a GELU MLP; {arch.name} uses {arch.mlp}", "--model")
    if arch.kv_heads != arch.num_heads:
        raise InstanceError(f"the runtime model has no grouped-query attention; {arch.name} has "
                            f"{arch.kv_heads} KV heads for {arch.num_heads} query heads", "--model")
    if arch.hidden_size % arch.num_heads:
        raise InstanceError(f"hidden_size {arch.hidden_size} is not divisible by num_heads {arch.num_heads}",
                            "--model")
    for t in tp_degrees:
        for name, value in (("num_heads", arch.num_heads), ("ffn_hidden_size", arch.ffn_hidden_size),
                            ("vocab_size", arch.vocab_size)):
            if value % t:
                raise InstanceError(f"TP degree {t} does not divide {name} {value} of {arch.name}", "--tp")


def check_shape_options(overrides: dict[str, int | None]) -> None:
    """Each shape option given (keyed by ModelArch field) is >= 1 and under its ceiling, named by option."""
    for field, option, ceiling in SHAPE_CEILINGS:
        value = overrides.get(field)
        if value is not None and value < 1:  # 0 was once taken as "not given": the full model ran on the CPU
            raise InstanceError(f"must be at least 1, got {value}", option)
        if value is not None and value > ceiling:
            raise InstanceError(f"{value} is above the ceiling of {ceiling:,}", option)


def check_shape(arch) -> None:
    """The same ceilings on a model file's own figures (a preset is under them)."""
    for field, _, ceiling in SHAPE_CEILINGS:
        if getattr(arch, field) > ceiling:
            raise InstanceError(f"{field} {getattr(arch, field)} of {arch.name} is above the ceiling of "
                                f"{ceiling:,}", "--model")
