"""Beam search on top of the engine, the way vLLM's offline ``LLM.beam_search`` runs it.

vLLM v1 has no beam search inside the engine core. It is a loop *around* the
engine: every step, each live beam (prompt + the tokens chosen so far) is sent
as a fresh request for one token with ``logprobs = 2 * beam_width``; every
entry of the returned logprobs dict becomes a candidate beam. Candidates that
end in EOS are set aside as completed; the best ``beam_width`` of the others,
by ``get_beam_search_score``, live on. After ``max_tokens`` steps (or when no
beam is left) completed and live beams are ranked together and the best
``beam_width`` returned.

Each step re-submits whole sequences, so without prefix caching step t
recomputes the prompt and t tokens for every beam. With it, only the
sequence's last, partial block is computed again: that is what makes this
design affordable.

The score divides the summed logprob by ``len(tokens) ** length_penalty``,
where ``tokens`` *includes the prompt* (and a final EOS is not counted).

upstream: vllm/entrypoints/generate/beam_search/offline.py:27 BeamSearchOfflineMixin.beam_search
upstream: vllm/entrypoints/generate/beam_search/utils.py:137 get_beam_search_score
upstream: vllm/sampling_params.py:977 BeamSearchParams
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mini_vllm.sampling_params import SamplingParams


@dataclass(slots=True)
class BeamSearchParams:
    """upstream: vllm/sampling_params.py:977 BeamSearchParams"""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) < float("inf"):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        # The per-step requests are built from these; fail here, not in step one.
        SamplingParams(temperature=self.temperature, max_tokens=1, logprobs=2 * self.beam_width)


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: ``tokens`` is the prompt followed by the generated tokens, as upstream.

    upstream: vllm/entrypoints/generate/beam_search/utils.py:19 BeamSearchSequence
    """

    tokens: list[int]
    logprobs: list[dict] = field(default_factory=list)  # one dict per generated token
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(tokens: list[int], cumulative_logprob: float, eos_token_id: int | None,
                          length_penalty: float = 1.0) -> float:
    """``cumulative_logprob / len ** length_penalty``; ``len`` counts the prompt, not a final EOS."""
    seq_len = len(tokens)
    if tokens[-1] == eos_token_id:
        seq_len -= 1
    return cumulative_logprob / (seq_len ** length_penalty)


def beam_search(engine, prompts: list, params: BeamSearchParams) -> list[BeamSearchOutput]:
    """Run upstream's offline loop on ``engine`` (an ``LLMEngine`` with no requests in flight)."""
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
    if engine.has_unfinished_requests():
        raise ValueError("beam_search needs an idle engine: finish or abort the requests in flight first")
    eos = engine.model.eos_token_id
    width = params.beam_width

    def score(beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, eos, params.length_penalty)

    step_params = SamplingParams(temperature=params.temperature, max_tokens=1, logprobs=2 * width)
    instances = []
    for prompt in prompts:
        ids = engine._tokenize(prompt)
        if len(ids) + params.max_tokens > engine.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len = {engine.max_model_len}")
        instances.append(([BeamSearchSequence(tokens=ids)], []))  # (live beams, completed)

    for _ in range(params.max_tokens):
        live = [beam for beams, _ in instances for beam in beams]
        if not live:
            break
        results = engine.generate([{"prompt_token_ids": b.tokens} for b in live], [step_params] * len(live))
        at = 0
        for i, (beams, completed) in enumerate(instances):
            candidates = []
            for beam in beams:
                position = results[at].logprobs[0]
                at += 1
                for token, logprob in position.items():
                    new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [position],
                                             beam.cum_logprob + logprob.logprob)
                    if token == eos and not params.ignore_eos:
                        new.finish_reason = "stop"
                        completed.append(new)
                    else:
                        candidates.append(new)
            candidates.sort(key=score, reverse=True)  # stable: ties keep submission order
            instances[i] = (candidates[:width], completed)

    outputs = []
    for beams, completed in instances:
        for beam in beams:
            beam.finish_reason = "length"
        best = sorted(completed + beams, key=score, reverse=True)[:width]
        for beam in best:
            beam.text = engine.tokenizer.decode(beam.tokens)
        outputs.append(BeamSearchOutput(best))
    return outputs
