"""A GPT-style decoder split into layer units, with Megatron-style tensor parallelism.

Layer units follow the plan: 0 = embedding (word + learned position), 1..L = pre-LayerNorm
transformer blocks, L + 1 = head (final LayerNorm + LM head + cross-entropy).

Tensor parallelism inside a replica of TP degree t (Megatron-LM, Shoeybi et al. 2019, sec. 3):
  * attention q/k/v and MLP fc1 are column parallel (output rows split, heads split by t);
  * attention output and MLP fc2 are row parallel (input columns split), their partial outputs
    all-reduced (`reduce_from_tp`); the input of a column-parallel layer passes `copy_to_tp`,
    whose backward all-reduces the input gradient;
  * word embedding is vocab parallel (rows split; lookups outside the shard give 0, all-reduced);
  * the LM head is column parallel over the vocabulary, logits are all-gathered before the loss.
LayerNorms, the position embedding and row-parallel biases are replicated on every TP rank.

Every parameter is addressable by (unit, name, TP shard): `ParamInfo` carries the unit, the name,
the split dimension (None = replicated) and the full shape, so gradients of differently sharded
replicas can be combined and layer-wise checkpoints split or merged for another TP degree.
A tied LM head uses the key of the word embedding, "0/wte".

Initial values are drawn for the *full* tensor from a generator seeded by (seed, key) and then
sliced, so any plan and the single-process reference start from identical weights.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetplan.errors import PlanError

LN_EPS = 1e-5
INIT_STD = 0.02


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    tied_embeddings: bool = True

    @property
    def num_units(self) -> int:
        return self.num_layers + 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def check(self, tp_degrees: set[int] | None = None) -> None:
        """Shapes must split evenly over every TP degree used; PlanError names the field."""
        if self.hidden_size % self.num_heads:
            raise PlanError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
                            "model.hidden_size")
        for t in sorted(tp_degrees or {1}):
            for field, value in (("num_heads", self.num_heads), ("ffn_hidden_size", self.ffn_hidden_size),
                                 ("vocab_size", self.vocab_size)):
                if value % t:
                    raise PlanError(f"{field} {value} is not divisible by tensor-parallel degree {t}", f"model.{field}")


@dataclass(frozen=True)
class ParamInfo:
    unit: int
    name: str
    shard_dim: int | None  # None: replicated on every TP rank
    full_shape: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"{self.unit}/{self.name}"


# ---- tensor-parallel communication ------------------------------------------------------------
@dataclass(frozen=True)
class TPContext:
    """The TP group of one replica; size 1 means no communication at all."""

    size: int = 1
    rank: int = 0
    group: object | None = None  # torch ProcessGroup

    @property
    def active(self) -> bool:
        return self.size > 1


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=tp.group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x.contiguous(), group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.tp.size, dim=-1)[ctx.tp.rank].contiguous(), None


def copy_to_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return _CopyToTP.apply(x, tp) if tp.active else x


def reduce_from_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return _ReduceFromTP.apply(x, tp) if tp.active else x


def gather_from_tp(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    return _GatherFromTP.apply(x, tp) if tp.active else x


# ---- deterministic initialisation -------------------------------------------------------------
def init_full(key: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full (unsharded) initial value of a parameter, in float64, independent of the plan."""
    name = key.rsplit("/", 1)[-1]
    if name.endswith("ln1_weight") or name.endswith("ln2_weight") or name == "lnf_weight":
        return torch.ones(shape, dtype=torch.float64)
    if name.endswith("_bias"):
        return torch.zeros(shape, dtype=torch.float64)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % (2**62))
    return torch.randn(shape, generator=gen, dtype=torch.float64) * INIT_STD


def shard_of(full: torch.Tensor, dim: int | None, tp: TPContext) -> torch.Tensor:
    return full if dim is None else full.chunk(tp.size, dim=dim)[tp.rank]


class _Unit(nn.Module):
    """Base: registers parameters with their ParamInfo, initialised from the full tensor."""

    def __init__(self, unit: int, tp: TPContext, seed: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.unit, self.tp, self._seed, self._dtype, self._device = unit, tp, seed, dtype, device
        self.infos: dict[str, ParamInfo] = {}

    def _param(self, name: str, full_shape: tuple[int, ...], shard_dim: int | None, key_unit: int | None = None,
               key_name: str | None = None) -> nn.Parameter:
        info = ParamInfo(self.unit if key_unit is None else key_unit, key_name or name, shard_dim, full_shape)
        value = shard_of(init_full(info.key, full_shape, self._seed), shard_dim, self.tp)
        param = nn.Parameter(value.to(dtype=self._dtype, device=self._device).contiguous())
        self.register_parameter(name, param)
        self.infos[name] = info
        return param


class EmbeddingUnit(_Unit):
    def __init__(self, cfg: ModelConfig, tp: TPContext, seed: int, dtype: torch.dtype, device: torch.device):
        super().__init__(0, tp, seed, dtype, device)
        self.vocab_per_rank = cfg.vocab_size // tp.size
        self._param("wte", (cfg.vocab_size, cfg.hidden_size), 0)
        self._param("wpe", (cfg.seq_len, cfg.hidden_size), None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.tp.rank * self.vocab_per_rank
        outside = (local < 0) | (local >= self.vocab_per_rank)
        emb = F.embedding(local.masked_fill(outside, 0), self.wte)
        emb = reduce_from_tp(emb.masked_fill(outside.unsqueeze(-1), 0.0), self.tp)
        return emb + self.wpe[: tokens.shape[1]]


class BlockUnit(_Unit):
    def __init__(self, unit: int, cfg: ModelConfig, tp: TPContext, seed: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__(unit, tp, seed, dtype, device)
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        self.heads_per_rank = cfg.num_heads // tp.size
        self.head_dim = cfg.head_dim
        for ln in ("ln1", "ln2"):
            self._param(f"{ln}_weight", (h,), None)
            self._param(f"{ln}_bias", (h,), None)
        for proj in ("q", "k", "v"):
            self._param(f"attn_{proj}_weight", (h, h), 0)
            self._param(f"attn_{proj}_bias", (h,), 0)
        self._param("attn_out_weight", (h, h), 1)
        self._param("attn_out_bias", (h,), None)
        self._param("mlp_fc1_weight", (f, h), 0)
        self._param("mlp_fc1_bias", (f,), 0)
        self._param("mlp_fc2_weight", (h, f), 1)
        self._param("mlp_fc2_bias", (h,), None)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        return x.view(n, s, self.heads_per_rank, self.head_dim).transpose(1, 2)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        h = copy_to_tp(F.layer_norm(x, x.shape[-1:], self.ln1_weight, self.ln1_bias, LN_EPS), self.tp)
        q = self._heads(F.linear(h, self.attn_q_weight, self.attn_q_bias))
        k = self._heads(F.linear(h, self.attn_k_weight, self.attn_k_bias))
        v = self._heads(F.linear(h, self.attn_v_weight, self.attn_v_bias))
        s = x.shape[1]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        ctx = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v
        ctx = ctx.transpose(1, 2).reshape(x.shape[0], s, -1)
        return reduce_from_tp(F.linear(ctx, self.attn_out_weight), self.tp) + self.attn_out_bias

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = copy_to_tp(F.layer_norm(x, x.shape[-1:], self.ln2_weight, self.ln2_bias, LN_EPS), self.tp)
        h = F.gelu(F.linear(h, self.mlp_fc1_weight, self.mlp_fc1_bias))
        return reduce_from_tp(F.linear(h, self.mlp_fc2_weight), self.tp) + self.mlp_fc2_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.mlp(x)


class HeadUnit(_Unit):
    """Final LayerNorm, LM head, and the loss: sum over sequences of the per-sequence mean
    token cross-entropy, times `loss_scale` (1 / global batch size), so that gradients of all
    replicas and microbatches simply add up to the full-batch gradient."""

    def __init__(self, unit: int, cfg: ModelConfig, tp: TPContext, seed: int, dtype: torch.dtype,
                 device: torch.device, tied_weight: nn.Parameter | None = None):
        super().__init__(unit, tp, seed, dtype, device)
        h, v = cfg.hidden_size, cfg.vocab_size
        self._param("lnf_weight", (h,), None)
        self._param("lnf_bias", (h,), None)
        self.tied = cfg.tied_embeddings
        self._shared = tied_weight  # the embedding's own Parameter when both units share a stage
        if self.tied and tied_weight is None:
            self._param("wte", (v, h), 0, key_unit=0, key_name="wte")
        elif not self.tied:
            self._param("lm_head", (v, h), 0)

    @property
    def lm_weight(self) -> torch.Tensor:
        if self._shared is not None:
            return self._shared
        return self.wte if self.tied else self.lm_head

    def forward(self, x: torch.Tensor, labels: torch.Tensor, loss_scale: float) -> torch.Tensor:
        h = copy_to_tp(F.layer_norm(x, x.shape[-1:], self.lnf_weight, self.lnf_bias, LN_EPS), self.tp)
        logits = gather_from_tp(F.linear(h, self.lm_weight), self.tp)
        n, s, v = logits.shape
        token_loss = F.cross_entropy(logits.reshape(n * s, v), labels.reshape(n * s), reduction="none")
        return token_loss.view(n, s).mean(dim=1).sum() * loss_scale


class StageModule(nn.Module):
    """The layer units [layer_start, layer_end) of one stage, for one TP rank of one replica."""

    def __init__(self, cfg: ModelConfig, layer_start: int, layer_end: int, tp: TPContext | None = None,
                 seed: int = 0, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__()
        tp = tp or TPContext()
        cfg.check({tp.size})
        device = torch.device(device)
        self.cfg, self.layer_start, self.layer_end, self.tp = cfg, layer_start, layer_end, tp
        head = cfg.num_units - 1
        self.embedding = EmbeddingUnit(cfg, tp, seed, dtype, device) if layer_start == 0 else None
        self.blocks = nn.ModuleList(BlockUnit(u, cfg, tp, seed, dtype, device)
                                    for u in range(max(1, layer_start), min(head, layer_end)))
        shared = self.embedding.wte if (self.embedding is not None and cfg.tied_embeddings) else None
        self.head = (HeadUnit(head, cfg, tp, seed, dtype, device, tied_weight=shared)
                     if layer_end == cfg.num_units else None)

    @property
    def is_first(self) -> bool:
        return self.embedding is not None

    @property
    def is_last(self) -> bool:
        return self.head is not None

    def units(self) -> list[_Unit]:
        out: list[_Unit] = [self.embedding] if self.embedding is not None else []
        out += list(self.blocks)
        return out + ([self.head] if self.head is not None else [])

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None, loss_scale: float = 1.0) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            if labels is None:
                raise ValueError("the last stage needs labels")
            return self.head(x, labels, loss_scale)
        return x

    def logical_params(self) -> list[tuple[ParamInfo, nn.Parameter]]:
        """Every parameter this rank holds, once, sorted by (unit, name)."""
        seen: dict[int, tuple[ParamInfo, nn.Parameter]] = {}
        for unit in self.units():
            for name, info in unit.infos.items():
                param = getattr(unit, name)
                seen.setdefault(id(param), (info, param))
        return sorted(seen.values(), key=lambda ip: (ip[0].unit, ip[0].name))
