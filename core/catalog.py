"""The bundled GPU catalogue and model presets (published facts, see core/data/*.yaml for sources)."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Annotated, Any, Callable, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

GIB = 1024**3
MAX_LAYERS = 4096  # far above any published model (GPT-3 has 96 layers, MT-NLG 105)


class LinkSpec(BaseModel):
    """One point-to-point link class: bandwidth in GB/s (1e9 bytes/s, per direction) and latency."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["nvlink", "pcie", "ethernet", "infiniband", "wan", "other"] = "other"
    bandwidth_GBps: float = Field(gt=0, description="per-direction bandwidth, 1e9 bytes per second")
    latency_s: float = Field(ge=0, default=0.0, description="one-way latency in seconds")


def numbers_only(expected: str) -> Callable[[Any], Any]:
    """A before-validator refusing true/false and text where `expected` is due ("an integer",
    "seconds"): pydantic's lax mode reads `count: true` as 1 and `"num_microbatches": "3"` as 3; a
    number written as yes/no or in quotes is a typo (or another program's output to look at)."""
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"expected {expected}, got {str(value).lower()}")
        if isinstance(value, str):
            raise ValueError(f"expected {expected}, got the text {value!r} (a number is written without quotes)")
        return value

    return check


integer_only = numbers_only("an integer")


Int = Annotated[int, BeforeValidator(integer_only)]  # an integer field of an instance, model or plan file
# the same, above 0, for a field that may be None (`Int | None` with Field(gt=0) writes "gt" into the schema)
PositiveInt = Annotated[int, Field(gt=0), BeforeValidator(integer_only)]


class GpuSpec(BaseModel):
    """Published figures of one GPU type. Any field may be overridden by an instance."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    peak_fp16_tflops: float = Field(gt=0)
    peak_bf16_tflops: float | None = Field(default=None, gt=0)
    peak_fp32_tflops: float = Field(gt=0)
    memory_gib: float = Field(gt=0)
    memory_bandwidth_GBps: float = Field(gt=0)
    default_mfu: float = Field(gt=0, le=1, description="assumed fraction of peak reached by matmuls")
    intra_node: LinkSpec

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for a training precision; bf16 on a GPU without bf16 is an error upstream."""
        if precision == "fp32":
            return self.peak_fp32_tflops * 1e12
        if precision == "bf16":
            if self.peak_bf16_tflops is None:
                raise ValueError(f"{self.name} has no bf16 support")
            return self.peak_bf16_tflops * 1e12
        return self.peak_fp16_tflops * 1e12


class ModelArch(BaseModel):
    """A decoder-only transformer. Layer units: 0 = embedding, 1..num_layers = blocks, last = head."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = "custom"
    family: Literal["gpt", "opt", "llama"] = "gpt"
    # at most 4,096 blocks: published models have under 200 (Llama-3-405B 126) and DeepNet trained
    # 1,000 (Wang et al. 2022); the planner's per-unit tables would take minutes at 100,000
    num_layers: Int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: Int = Field(gt=0)
    num_heads: Int = Field(gt=0)
    num_kv_heads: PositiveInt | None = Field(default=None, description="grouped-query attention; None = num_heads")
    ffn_hidden_size: Int = Field(gt=0)
    vocab_size: Int = Field(gt=0)
    seq_len: Int = Field(gt=0)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    tied_embeddings: bool = True

    @property
    def num_units(self) -> int:
        """Number of placeable layer units: embedding + blocks + head."""
        return self.num_layers + 2

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GpuSpec]:
    raw = yaml.safe_load(resources.files("hetplan").joinpath("data/gpus.yaml").read_text())
    return {name: GpuSpec(name=name, **fields) for name, fields in raw.items()}


@lru_cache(maxsize=1)
def model_presets() -> dict[str, ModelArch]:
    raw = yaml.safe_load(resources.files("hetplan").joinpath("data/models.yaml").read_text())
    return {name: ModelArch(name=name, **fields) for name, fields in raw.items()}
