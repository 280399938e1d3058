"""What the runtime's model (runtime/model.py) can run, checked without importing torch: the
profiler and `hetplan profile` refuse other architectures before any work starts."""
from __future__ import annotations

from hetplan.errors import InstanceError


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
