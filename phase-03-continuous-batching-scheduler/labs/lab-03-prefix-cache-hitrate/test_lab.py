from course import load_impl

impl = load_impl(__file__)

import pathlib  # noqa: E402

import pytest  # noqa: E402

from mini_vllm.tokenizer import ByteTokenizer  # noqa: E402

PROMPTS = impl.build_prompts(impl.SYSTEM * 2)  # 126-byte system prompt, 16 questions
TOKENS = [ByteTokenizer().encode(p) for p in PROMPTS]
_TWIN = {}


def twin(caching):
    if caching not in _TWIN:
        _TWIN[caching] = impl.measure_twin(PROMPTS, caching)
    return _TWIN[caching]


def test_the_last_token_is_never_a_hit():
    same = [[7] * 32] * 3  # two full blocks each, identical
    assert impl.prefix_cache_hits(same, 16) == [0, 16, 16]  # (32 - 1) // 16 = 1 block
    assert impl.prefix_cache_hits([[7] * 16, [7] * 16], 16) == [0, 0]


def test_only_full_blocks_with_the_same_whole_prefix_hit():
    a = [1] * 16 + [2] * 16 + [9]
    b = [1] * 16 + [2] * 8 + [3] * 9  # diverges inside block 2
    c = [5] * 16 + [2] * 16 + [9]  # same block 2 content, different parent
    assert impl.prefix_cache_hits([a, b, c], 16) == [0, 16, 0]
    assert impl.prefix_cache_hits([a, b, c], 16, enable_caching=False) == [0, 0, 0]
    # a's second block ([2] * 16) is cached, but under the parent [1] * 16: as a
    # first block it is a different block and must miss
    assert impl.prefix_cache_hits([a, [2] * 16 + [3]], 16) == [0, 0]
    assert impl.prefix_cache_hits([[4] * 48 + [1], [4] * 40 + [2]], 16) == [0, 32]


def test_a_prompt_caches_its_last_full_block_even_though_it_cannot_hit_it():
    # 32 tokens hit at most 1 block themselves, but both full blocks are cached
    assert impl.prefix_cache_hits([[7] * 32, [7] * 33], 16) == [0, 32]
    assert impl.prefix_cache_hits([[7] * 16, [7] * 17], 8) == [0, 16]


def test_hit_rate_counts_tokens_so_15_of_16_requests_is_not_93_7_percent():
    rate = impl.hit_rate(TOKENS, 16)
    assert impl.format_hit_rate(rate) == "78.4%"
    assert rate < 15 / 16  # tails and the recomputed last block keep it below the request ratio
    # and 15/16 itself, printed the way vLLM prints it, reads 93.8%, not 93.7%
    assert impl.format_hit_rate(15 / 16) == "93.8%"


def test_the_workload_shares_137_tokens_which_is_8_full_blocks():
    assert len(impl.SYSTEM * 2) == 126 and len(PROMPTS) == 16
    common = 0
    while len({t[common] for t in TOKENS}) == 1:
        common += 1
    assert common == 137 and common // 16 * 16 == 128
    assert impl.prefix_cache_hits(TOKENS, 16)[1:] == [128] * 15


def test_twin_measures_exactly_what_the_calculator_predicts():
    on = twin(True)
    assert on.hits == impl.prefix_cache_hits(TOKENS, 16) == [0] + [128] * 15
    assert (on.queries, sum(on.hits)) == (2450, 1920)
    assert impl.format_hit_rate(on.hit_rate) == "78.4%"
    off = twin(False)
    assert off.hits == [0] * 16 and off.hit_rate == 0.0


def test_twin_memory_effect_is_160_blocks_vs_40():
    assert twin(False).blocks_after_admission == impl.blocks_after_admission(TOKENS, 16, False) == 160
    assert twin(True).blocks_after_admission == impl.blocks_after_admission(TOKENS, 16, True) == 40


def test_twin_honours_block_size_counts_blocks_at_admission_and_decodes_greedily_past_eos():
    # 8-token blocks, and 12 output tokens that grow every request by at least one
    # block after admission: the count must come from step 1, on 8-token blocks.
    # The third prompt fills exactly one block, and tiny-random's greedy answer to
    # it is EOS as its 3rd token: the twin must keep going (ignore_eos).
    from mini_vllm.engine import LLMEngine
    from mini_vllm.sampling_params import SamplingParams

    prompts = [impl.SYSTEM + "Q1?", impl.SYSTEM + "Q22?", "uq@JROjI"]
    tokens = [ByteTokenizer().encode(p) for p in prompts]
    res = impl.measure_twin(prompts, True, block_size=8, max_tokens=12)
    assert res.hits == impl.prefix_cache_hits(tokens, 8) == [0, 64, 0]
    assert res.queries == sum(len(t) for t in tokens)
    blocks = impl.blocks_after_admission(tokens, 8, True)
    assert type(blocks) is int and res.blocks_after_admission == blocks == 9 + (9 - 8) + 1
    greedy = LLMEngine("tiny-random", block_size=8).generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert res.token_ids == [list(r.output_token_ids) for r in greedy]
    assert all(len(t) == 12 for t in res.token_ids) and res.token_ids[2][2] == 256


def test_twin_refuses_a_batch_that_step_1_cannot_admit_whole():
    # 257 prompts, one more than the engine's 256 seats: the last one waits for step 2,
    # so step 1's block count would not be "everyone admitted"
    with pytest.raises(ValueError, match="step 1"):
        impl.measure_twin([f"{i:03d}" for i in range(257)])
    # 4,000 + 4,000 + 192 tokens fill the 8,192-token budget exactly: the 4th prompt
    # waits for step 2 (where everyone is scheduled: step 2 proves nothing)
    with pytest.raises(ValueError, match="step 1"):
        impl.measure_twin(["a" * 4000, "b" * 4000, "c" * 192, "d" * 10])


def test_outputs_are_identical_with_caching_on_and_off():
    assert twin(True).token_ids == twin(False).token_ids


def test_illustrative_gpu_numbers_come_from_the_calculator():
    n = impl.illustrative_gpu_numbers()
    assert n == {"queries": 7392, "hits": 6720, "hit_rate": "90.9%", "blocks_on": 44, "blocks_off": 464}


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="block_size"):
        impl.prefix_cache_hits(TOKENS, 0)
    with pytest.raises(ValueError, match="block_size"):
        impl.blocks_after_admission(TOKENS, -16)
    with pytest.raises(ValueError, match="empty"):
        impl.prefix_cache_hits([[1, 2, 3], []], 16)
    with pytest.raises(ValueError, match="max_tokens"):
        impl.measure_twin(PROMPTS[:1], max_tokens=1)


def test_run_py_reports_the_illustrative_numbers_and_reads_real_counter_names():
    from course.loader import import_path

    run = import_path(pathlib.Path(__file__).parent / "run.py")
    prompts = [[1] * run.PREFIX_TOKENS + [1000 + i] * 14 for i in range(16)]
    fake = {"caching": True, "prompts": prompts, "queries": 7392, "hits": 6720,
            "preemptions": 0, "answers": ["a", "b"]}
    text = run.report(fake)
    assert "predicted: queries=7392 hits=6720 hit rate=90.9% blocks after admission=44" in text
    assert text.rstrip().endswith("AGREE")
    assert run.report(dict(fake, hits=6700)).rstrip().endswith("DISAGREE")
    off = run.report(dict(fake, caching=False, queries=0, hits=0))
    assert "blocks after admission=464" in off and off.rstrip().endswith("AGREE")
    loggers = pathlib.Path(__file__).resolve().parents[3] / "upstream/vllm/v1/metrics/loggers.py"
    if loggers.exists():  # the counter names run.py reads must exist at the pin
        src = loggers.read_text()
        for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"):
            assert f'name="{name}"' in src


@pytest.mark.gpu
@pytest.mark.vllm
def test_real_vllm_counters_match_the_calculator():
    from course.loader import import_path

    run = import_path(pathlib.Path(__file__).parent / "run.py")
    res = run.measure(run.MODEL, caching=True)
    assert res["hits"] == sum(impl.prefix_cache_hits(res["prompts"], run.BLOCK_SIZE))
    assert res["queries"] == sum(len(p) for p in res["prompts"])
