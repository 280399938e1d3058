"""Per-layer-unit parameter counts, FLOPs and activation bytes of a decoder-only transformer.

Units: 0 = embedding, 1..L = transformer blocks, L + 1 = head (final norm + LM head).
Sources:
- FLOPs: a matmul of an (m x k) by a (k x n) matrix costs 2mkn; per block and sequence this gives
  24 s h^2 + 4 s^2 h for MHA with ffn = 4h (Narayanan et al., SC'21, "Efficient large-scale language
  model training on GPU clusters using Megatron-LM", sec. 5.1); backward = 2 x forward.
- Activations: Korthikanti et al., MLSys'23, "Reducing activation recomputation in large transformer
  models", sec. 4.1 and Table 2: per block s b h (34 + 5 a s / h) bytes with 16-bit activations and
  1-byte dropout masks; with tensor parallelism t (no sequence parallelism)
  s b h (10 + 24 / t + 5 a s / (h t)); selective recomputation drops the 5 a s^2 b term; full
  recomputation keeps only the 2 s b h block input. Generalised here to any ffn width, GQA and
  SwiGLU by keeping the paper's per-tensor accounting (see `_block_activation_elems`).

Checked against Sailor's measured llm_info.json (../shared/reference/sailor/model, per unit and TP at
microbatch 1; tests/test_sailor_fidelity.py). Parameters per GPU agree within 1 % for OPT-350 and
GPT-Neo-2.7 at TP 1, 2, 4 (the embedding and head differ by up to 0.8 %: Megatron pads the vocabulary
to a multiple of the TP degree, these counts do not) except one unit: Sailor's GPT-Neo head holds
2 h = 5120 parameters, the final norm alone, because its profiler counts `layer.parameters()` per
module and Hugging Face's GPT-Neo ties lm_head to the embedding, so the shared matrix is counted once,
at the embedding; here the head counts the copy of the tied matrix the last pipeline stage holds
(Sailor's OPT-350 head does count it). Activations are compared in bytes with llm_info's act_mem_bytes,
which `profile_utils.take_time_and_mem_fwd` takes as torch.cuda.memory_allocated after a unit's forward
minus before it, in a mixed-precision run: what the unit allocated and still holds, at the dtype each
op produced. Against fp16 figures here, no flash attention, no recomputation:
  OPT-350 blocks +12.8 % (TP 1), +10.9 % (TP 2), +7.2..+7.7 % (TP 4); GPT-Neo-2.7 blocks -12.3 %,
  -16.2 %, -22.1..-22.8 %; embedding -25 % (OPT) and -40 % (GPT-Neo); OPT head -25 .. -27 %.
The embedding's output stays fp32 under autocast (4 bytes per element measured, 2 here), and Hugging
Face's GPT-Neo attention upcasts query and key to fp32 before the softmax (GPTNeoSelfAttention._attn),
which the 16-bit accounting here does not model; the OPT block and head residuals are not attributed.
GPT-Neo's head in llm_info is the final norm alone (2 h parameters, so the logits projection ran outside
the measured module), and its activations (2 s h floats) are not comparable with a head that has logits.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hetplan.catalog import ModelArch

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def is_embedding(arch: ModelArch, unit: int) -> bool:
    return unit == 0


def is_head(arch: ModelArch, unit: int) -> bool:
    return unit == arch.num_units - 1


def _check_unit(arch: ModelArch, unit: int) -> None:
    if not 0 <= unit < arch.num_units:
        raise ValueError(f"layer unit {unit} out of range [0, {arch.num_units})")


def _has_bias(arch: ModelArch) -> bool:
    return arch.family in ("gpt", "opt")  # Llama has no linear biases and uses RMSNorm


def _norm_params(arch: ModelArch) -> int:
    return arch.hidden_size * (2 if _has_bias(arch) else 1)


def _kv_dim(arch: ModelArch) -> int:
    return arch.kv_heads * (arch.hidden_size // arch.num_heads)


@dataclass(frozen=True)
class UnitParams:
    """Parameters of a unit: `sharded` split over TP ranks, `replicated` held whole by every rank."""

    sharded: int
    replicated: int

    def per_gpu(self, tp: int) -> float:
        return self.sharded / tp + self.replicated

    @property
    def total(self) -> int:
        return self.sharded + self.replicated


@lru_cache(maxsize=4096)  # called per unit in every simulation, planner table and migration plan
def unit_params(arch: ModelArch, unit: int) -> UnitParams:
    """Megatron-style split: column-parallel weights and biases and vocab rows are sharded; row-parallel
    biases and norms are replicated. The head holds its own copy of a tied embedding matrix when it
    sits on another stage, so it always counts V x h (see `total_params` for the tied count)."""
    _check_unit(arch, unit)
    h, v, f = arch.hidden_size, arch.vocab_size, arch.ffn_hidden_size
    if is_embedding(arch, unit):
        positions = arch.seq_len * h if arch.family in ("gpt", "opt") else 0  # Llama uses RoPE
        return UnitParams(sharded=v * h, replicated=positions)
    if is_head(arch, unit):
        return UnitParams(sharded=v * h, replicated=_norm_params(arch))
    kv = _kv_dim(arch)
    qkv = h * (h + 2 * kv)
    out_proj = h * h
    mlp = (3 if arch.mlp == "swiglu" else 2) * h * f
    sharded = qkv + out_proj + mlp
    replicated = 2 * _norm_params(arch)
    if _has_bias(arch):
        sharded += (h + 2 * kv) + f  # column-parallel biases: QKV and MLP up-projection
        replicated += 2 * h  # row-parallel biases: attention output and MLP down-projection
    return UnitParams(sharded=sharded, replicated=replicated)


def block_matmul_weights(arch: ModelArch) -> int:
    """Weights of a block's matrix multiplications (QKV, attention output, MLP), biases excluded."""
    h = arch.hidden_size
    mlp = (3 if arch.mlp == "swiglu" else 2) * h * arch.ffn_hidden_size
    return h * (h + 2 * _kv_dim(arch)) + h * h + mlp


def gradient_bytes(arch: ModelArch, units: range, precision: str) -> float:
    """Bytes of the gradients of `units` (all TP shards together), held in the training dtype."""
    return sum(unit_params(arch, u).total for u in units) * DTYPE_BYTES[precision]


def sync_volume_factor(zero_stage: int) -> float:
    """Gradient-sync traffic relative to an all-reduce: ZeRO-3 adds the parameter all-gathers, 1.5x
    (Rajbhandari et al. SC'20 sec. 7)."""
    return 1.5 if zero_stage >= 3 else 1.0


def total_params(arch: ModelArch) -> int:
    """Parameter count of the model (a tied LM head counted once)."""
    n = sum(unit_params(arch, u).total for u in range(arch.num_units))
    return n - (arch.vocab_size * arch.hidden_size if arch.tied_embeddings else 0)


def unit_flops_fwd(arch: ModelArch, unit: int, seqs: int) -> float:
    """Forward FLOPs of one unit for `seqs` sequences (2 FLOPs per multiply-add)."""
    _check_unit(arch, unit)
    s, h = arch.seq_len, arch.hidden_size
    if is_embedding(arch, unit):
        return 0.0  # a lookup: memory-bound, handled by the roofline's bytes term
    if is_head(arch, unit):
        return 2.0 * seqs * s * h * arch.vocab_size
    attention = 4.0 * s * s * h  # Q K^T and (softmax) V
    return seqs * (2.0 * s * block_matmul_weights(arch) + attention)


def unit_attention_flops_fwd(arch: ModelArch, unit: int, seqs: int) -> float:
    """The s^2 part of a block's forward FLOPs (what selective recomputation redoes)."""
    if is_embedding(arch, unit) or is_head(arch, unit):
        return 0.0
    return seqs * 4.0 * arch.seq_len**2 * arch.hidden_size


def _block_activation_elems(arch: ModelArch, seqs: int, tp: int, flash: bool, recompute: str,
                            act_bytes: int) -> float:
    """Bytes a block keeps for backward, per Korthikanti et al. sec. 4.1, generalised.

    Replicated over TP ranks (no sequence parallelism): both norm inputs (2 x 2sbh), the QKV input
    (2sbh), the MLP input (2sbh), and the two dropout masks (sbh each, GPT/OPT only).
    Sharded over TP: Q, K (for QK^T) and V, the attention-projection input, the MLP intermediate
    tensors, and the attention core's softmax output, dropout mask and dropout output (a s^2 b each).
    """
    s, h, a, f = arch.seq_len, arch.hidden_size, arch.num_heads, arch.ffn_hidden_size
    sbh = s * seqs * h
    e = act_bytes / 2  # the paper's figures assume 2-byte activations
    dropout = _has_bias(arch)  # GPT/OPT train with dropout; Llama does not
    if recompute == "full":
        return 2 * e * sbh  # only the block input is kept
    kv_frac = _kv_dim(arch) / h
    replicated = e * (4 + 2 + 2) * sbh + (2 * sbh if dropout else 0)
    attn_sharded = e * (2 + 2 * kv_frac + 2 * kv_frac + 2) * sbh  # Q, K, V, projection input
    mlp_tensors = 3 if arch.mlp == "swiglu" else 2  # gelu: its input and the down-proj input
    mlp_sharded = e * 2 * mlp_tensors * s * seqs * f
    core = 0.0
    if not flash and recompute != "selective":
        per = (2 * e + 1 + 2 * e) if dropout else 2 * e  # softmax out, dropout mask, dropout out
        core = per * a * s * s * seqs
    return replicated + (attn_sharded + mlp_sharded + core) / tp


def unit_activation_bytes(arch: ModelArch, unit: int, seqs: int, tp: int, *, precision: str = "fp16",
                          recompute: str = "none", flash_attention: bool = False) -> float:
    """Activation bytes one TP rank keeps for one microbatch of `seqs` sequences in this unit."""
    _check_unit(arch, unit)
    act = DTYPE_BYTES[precision]
    s, h = arch.seq_len, arch.hidden_size
    if is_embedding(arch, unit):
        return act * s * seqs * h + (s * seqs * h if _has_bias(arch) else 0)  # output (+ dropout mask)
    if is_head(arch, unit):
        # norm input + logits in the training dtype + their fp32 copy for the cross-entropy (sharded)
        return act * s * seqs * h + (act + 4) * s * seqs * arch.vocab_size / tp
    return _block_activation_elems(arch, seqs, tp, flash_attention, recompute, act)


def boundary_activation_bytes(arch: ModelArch, seqs: int, precision: str = "fp16") -> float:
    """Bytes of the hidden state passed between pipeline stages for `seqs` sequences."""
    return DTYPE_BYTES[precision] * arch.seq_len * seqs * arch.hidden_size


def megatron_block_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1) -> float:
    """Korthikanti et al. eq. for a GPT block, TP t, no sequence parallelism: s b h (10 + 24/t + 5as/(ht))."""
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
