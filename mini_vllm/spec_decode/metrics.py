"""SpecDecodingStats: drafts and acceptances, with upstream's definitions.

* draft acceptance rate = accepted / drafted tokens;
* mean acceptance length = 1 + accepted / drafts: the tokens one verify step
  yields per request, the bonus (or recovered) token included;
* per-position rate i = drafts whose first i + 1 tokens were accepted / drafts.

upstream: vllm/v1/spec_decode/metrics.py:18 SpecDecodingStats
upstream: vllm/v1/spec_decode/metrics.py:95 mean_acceptance_length
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's verify step: ``num_accepted_tokens`` of its drafts were accepted."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens:
            raise ValueError(f"num_accepted_tokens must be in [0, num_draft_tokens] and "
                             f"num_draft_tokens <= {self.num_spec_tokens}, got "
                             f"{num_accepted_tokens} of {num_draft_tokens}")
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1

    def add(self, other: SpecDecodingStats) -> None:
        """Accumulate another step's stats into this one."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for i, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[i] += n

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def per_position_acceptance_rates(self) -> list[float]:
        return [n / self.num_drafts if self.num_drafts else float("nan")
                for n in self.num_accepted_tokens_per_pos]

    def log_line(self) -> str:
        """Upstream's log line, less its two throughput fields (no wall clock here)."""
        rates = ", ".join(f"{p:.3f}" for p in self.per_position_acceptance_rates)
        return (f"SpecDecoding metrics: Mean acceptance length: {self.mean_acceptance_length:.2f}, "
                f"Accepted: {self.num_accepted_tokens} tokens, Drafted: {self.num_draft_tokens} tokens, "
                f"Per-position acceptance rate: {rates}, "
                f"Avg Draft acceptance rate: {100 * self.draft_acceptance_rate:.1f}%")
