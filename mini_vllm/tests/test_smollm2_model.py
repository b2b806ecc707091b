"""The real model: SmolLM2-135M-Instruct from its GGUF, checked against transformers.

The golden values in golden/smollm2.json were recorded from transformers reading
the same GGUF on its own (benchmarks/record_smollm2_golden.py, float32, one
thread). The model is loaded once per session and every test runs numpy's BLAS
on one thread: on a busy 2-core machine a second BLAS thread makes small
matmuls many times slower, and a different summation order could flip a near-tie.
Skipped (by the root conftest.py) until ``python -m mini_vllm download smollm2``.
"""
from __future__ import annotations

import io
import json
import pathlib
import re

import numpy as np
import pytest

pytest.importorskip("gguf")
threadpoolctl = pytest.importorskip("threadpoolctl")

from mini_vllm.__main__ import build_parser, main, run_chat  # noqa: E402
from mini_vllm.engine import LLM, LLMEngine  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.model

HERE = pathlib.Path(__file__).resolve().parent
README = HERE.parents[1] / "README.md"
GOLDEN = json.loads((HERE / "golden" / "smollm2.json").read_text())
CAPITAL = "What is the capital of France?"


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    with threadpoolctl.threadpool_limits(1, "blas"):
        yield


@pytest.fixture(scope="session")
def tokenizer():
    from mini_vllm.models import get_model

    return get_model("smollm2").tokenizer


@pytest.fixture(scope="session")
def greedy_run():
    """The 4 golden chat prompts in one engine: 16 greedy tokens each, step 1's logits."""
    with threadpoolctl.threadpool_limits(1, "blas"):
        engine = LLMEngine("smollm2")
        model, step_logits = engine.model, []
        execute = model.execute
        model.execute = lambda model_input: step_logits.append(execute(model_input)) or step_logits[-1]
        params = SamplingParams(temperature=0, max_tokens=GOLDEN["max_new_tokens"])
        requests = engine.generate([{"prompt_token_ids": c["prompt_ids"]} for c in GOLDEN["chat"]],
                                   params)
    assert list(engine.stats[0].num_scheduled_tokens) == [r.request_id for r in requests]
    return [list(r.output_token_ids) for r in requests], step_logits[0]


def test_config_read_from_the_gguf_metadata():
    from mini_vllm.models import get_model

    c = get_model("smollm2").config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.rope_theta, c.max_position_embeddings) == (49152, 100000.0, 8192)
    assert c.tie_word_embeddings and c.eos_token_ids == (2,) and c.bos_token_id == 1
    assert abs(c.rms_norm_eps - 1e-5) < 1e-12


@pytest.mark.parametrize("case", GOLDEN["tokenizer"], ids=lambda c: repr(c["text"][:20]))
def test_tokenizer_ids_equal_golden(tokenizer, case):
    ids = tokenizer.encode(case["text"])
    assert ids == case["ids"]
    if not re.search(r"<\|\w+\|>", case["text"]):  # special tokens are dropped by decode
        assert tokenizer.decode(ids) == case["text"]


def test_chat_template_renders_like_transformers(tokenizer):
    for case in GOLDEN["chat"]:
        messages = [{"role": "user", "content": case["prompt"]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text == case["text"]
        assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == case["prompt_ids"]
    assert GOLDEN["chat"][0]["prompt_ids"][:8] == [1, 9690, 198, 2683, 359, 253, 5356, 5646]


def test_greedy_tokens_equal_transformers(greedy_run):
    tokens, _ = greedy_run
    assert tokens == [c["greedy_ids"] for c in GOLDEN["chat"]]


def test_first_step_logits_within_1e_3_of_transformers(greedy_run):
    _, logits = greedy_run
    for row, case in zip(logits, GOLDEN["chat"], strict=True):
        np.testing.assert_allclose(row[case["logit_ids"]], case["logits"], rtol=0, atol=1e-3)


def test_the_engine_answers_the_capital_question(tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": CAPITAL}],
                                           add_generation_prompt=True, tokenize=False)
    out = LLM("smollm2").generate(prompt, SamplingParams(temperature=0, max_tokens=16))[0]
    assert out.outputs[0].text == "The capital of France is Paris."
    assert out.outputs[0].token_ids == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    assert out.outputs[0].finish_reason == "stop"


def test_chunked_prefill_prefix_caching_and_preemption_leave_outputs_unchanged():
    """A 24-token budget chunks every prompt (35-39 tokens); they share the system prompt's
    first block; 6 usable blocks of 16 cannot hold all four at once, so one is preempted."""
    n = 8
    engine = LLMEngine("smollm2", block_size=16, num_blocks=7, max_num_batched_tokens=24)
    requests = engine.generate([{"prompt_token_ids": c["prompt_ids"]} for c in GOLDEN["chat"]],
                               SamplingParams(temperature=0, max_tokens=n))
    assert [list(r.output_token_ids) for r in requests] == [c["greedy_ids"][:n] for c in GOLDEN["chat"]]
    assert engine.stats[0].num_scheduled_tokens == {"req-0": 24}  # a chunk of a 37-token prompt
    assert sum(s.num_cached_tokens for s in engine.stats) >= 48
    assert sum(len(s.preempted) for s in engine.stats) >= 1


def _readme_block(after: str) -> list[str]:
    """The lines of the first ```text block after the line containing ``after``."""
    text = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    rest = text.split(after, 1)[1]
    return rest.split("```text\n", 1)[1].split("```", 1)[0].splitlines()


def test_the_readme_quick_start_answer_is_what_the_cli_prints(capsys):
    """README.md quotes this command's trace and answer as captured: keep them true."""
    quoted = _readme_block(f'generate --model smollm2 --chat "{CAPITAL}"')
    assert main(["generate", "--model", "smollm2", "--chat", CAPITAL]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(quoted) >= 5 and all(line in printed for line in quoted), (quoted, printed)
    assert any("'The capital of France is Paris.'" in line for line in quoted)


def test_chat_streams_answers_and_reuses_the_history_prefix(capsys):
    stdin = io.StringIO(f"{CAPITAL}\n\nAnd of Italy?\n")
    run_chat(build_parser().parse_args(["chat", "--max-tokens", "16"]), stdin=stdin)
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"> {CAPITAL}", "The capital of France is Paris.",
                                "> And of Italy?", "The capital of Italy is Rome."]
    stats = err.splitlines()
    assert len(stats) == 2 and "finish_reason=stop" in stats[0]
    cached = int(re.search(r"of which (\d+) from the prefix cache", stats[1]).group(1))
    assert cached >= 32  # the first turn's blocks are reused by the second
