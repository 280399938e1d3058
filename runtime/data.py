"""A seeded synthetic token stream that any rank, or a single-process reference, can reproduce.

Sequence `index` of iteration `iteration` is generated from its own generator, seeded by
(seed, iteration, index), so a replica that takes samples [a, b) of a global microbatch gets
exactly the tokens the reference sees at those positions, whatever the plan.

Each sequence walks the vocabulary: t_0 random, t_{i+1} = (t_i + d_i) mod V with d_i drawn from
{1, 2}. Next-token prediction can learn it (the loss falls from ln V towards ln 2), so a training
run shows a real loss curve.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SyntheticTokens:
    vocab_size: int
    seq_len: int
    seed: int = 0

    def sequence(self, iteration: int, index: int) -> torch.Tensor:
        """seq_len + 1 tokens: inputs are [:-1], labels [1:]."""
        gen = torch.Generator().manual_seed(((self.seed * 1_000_003 + iteration) * 1_000_033 + index) % (2**62))
        start = torch.randint(self.vocab_size, (1,), generator=gen)
        steps = torch.randint(1, 3, (self.seq_len,), generator=gen)
        return (torch.cat([start, start + steps.cumsum(0)]) % self.vocab_size).long()

    def batch(self, iteration: int, start: int, end: int) -> torch.Tensor:
        """Sequences [start, end) of an iteration's global batch, shape (end - start, seq_len + 1)."""
        return torch.stack([self.sequence(iteration, i) for i in range(start, end)])
