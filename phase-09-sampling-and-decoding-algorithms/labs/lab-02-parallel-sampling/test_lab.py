"""Lab 09-02 tests: the parallel-sampling calculator against mini_vllm's own counters.

Every engine number below is measured on ``LLM("tiny-random")`` (a real
2-layer transformer with a paged KV cache, 4,096 positions) or on mini_vllm's
scheduler and KV cache manager alone; the expected values are derived by hand
in the comments. Each engine case runs once per session (``_run`` caches it).
"""
from __future__ import annotations

from course import load_impl

impl = load_impl(__file__)

import functools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mini_vllm.engine import LLM  # noqa: E402
from mini_vllm.kv_cache import KVCacheManager  # noqa: E402
from mini_vllm.request import Request  # noqa: E402
from mini_vllm.sampling_params import SamplingParams  # noqa: E402
from mini_vllm.scheduler import Scheduler  # noqa: E402


def prompt_ids(length: int, seed: int = 0) -> list[int]:
    """A fixed prompt of byte tokens (0..255: never EOS, which is 256)."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, length)]


def _run(prompt_len, n, block_size, max_tokens, enable_caching=True, seed=11):
    """One fresh engine, one prompt with n children; what its counters say (once per case)."""
    return _run_cached(prompt_len, n, block_size, max_tokens, enable_caching, seed)


@functools.cache
def _run_cached(prompt_len, n, block_size, max_tokens, enable_caching, seed):
    llm = LLM("tiny-random", block_size=block_size, enable_caching=enable_caching)
    params = SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": prompt_ids(prompt_len)}, params)[0]
    stats = llm.llm_engine.stats
    return {
        "hits": [o.metrics.num_cached_tokens for o in out.outputs],
        "prefill": sum(s.num_prefill_tokens for s in stats),
        "rate": sum(s.num_cached_tokens for s in stats) / (n * prompt_len),
        "peak_blocks": max(s.blocks_used for s in stats),
        "first_step": stats[0],
        "tokens": [tuple(o.token_ids) for o in out.outputs],
    }


def assert_calculator_matches(prompt_len, n, block_size, max_tokens, enable_caching=True):
    """The four predictions against the engine's four counters."""
    got = _run(prompt_len, n, block_size, max_tokens, enable_caching)
    args = (prompt_len, n, block_size)
    assert got["hits"] == impl.expected_hit_tokens(*args, enable_caching=enable_caching)
    assert got["prefill"] == impl.expected_prefill_tokens(*args, enable_caching=enable_caching)
    assert got["rate"] == pytest.approx(impl.expected_hit_rate(*args, enable_caching=enable_caching),
                                        abs=1e-12)
    assert got["peak_blocks"] == impl.expected_blocks(*args, max_tokens, enable_caching=enable_caching)
    return got


# ---------------------------------------------------------------- the design's case, on the engine


def test_2000_token_prompt_block_16_n_4_on_the_engine():
    # Child 0 computes all 2,000 tokens. The others may take at most 1,999 tokens from the
    # cache, in whole blocks: 1,999 // 16 = 124 blocks = 1,984 tokens; each computes the
    # last 16 (positions 1,984..1,999). Computed: 2,000 + 3 * 16 = 2,048 of 8,000 (3.9x
    # fewer). Hit rate = 3 * 1,984 / 8,000 = 0.744. Peak blocks with 3 output tokens: KV
    # for 2,002 tokens per child = 126 blocks, of which 124 are shared: 124 + 4 * 2 = 132.
    got = assert_calculator_matches(2000, 4, 16, max_tokens=3)
    assert got["hits"] == [0, 1984, 1984, 1984]
    assert got["prefill"] == 2048
    assert got["rate"] == pytest.approx(0.744, abs=1e-12)
    assert got["peak_blocks"] == 132


def test_children_hit_the_first_childs_blocks_in_the_same_step():
    # All four children are admitted in step 1. Blocks are cached when they are allocated,
    # so child 1 already finds child 0's 124 blocks in that step: 2,000 + 16 + 16 + 16 =
    # 2,048 tokens, exactly the default max_num_batched_tokens, and 5,952 hit tokens.
    first = _run(2000, 4, 16, 3)["first_step"]
    hits = impl.expected_hit_tokens(2000, 4, 16)
    assert list(first.num_scheduled_tokens.values()) == [2000 - h for h in hits] == [2000, 16, 16, 16]
    assert first.num_cached_tokens == sum(hits) == 5952
    assert first.num_prefill_tokens == impl.expected_prefill_tokens(2000, 4, 16) == 2048
    # After step 1: child 0's 125 blocks, one fresh block for each later child's last 16 tokens.
    assert first.blocks_used == impl.expected_blocks(2000, 4, 16, 1) == 128


def test_2000_tokens_without_caching_by_the_numbers():
    # Too slow for the engine here (8,000 prompt tokens); the arithmetic: nothing is shared,
    # 4 * 2,000 tokens computed, 4 * 126 blocks at the third output token.
    assert impl.expected_hit_tokens(2000, 4, 16, enable_caching=False) == [0, 0, 0, 0]
    assert impl.expected_prefill_tokens(2000, 4, 16, enable_caching=False) == 8000
    assert impl.expected_hit_rate(2000, 4, 16, enable_caching=False) == 0.0
    assert impl.expected_blocks(2000, 4, 16, 3, enable_caching=False) == 504
    assert impl.expected_blocks(2000, 4, 16, 3) == 132


# ---------------------------------------------------------------- the edges, on the engine


def test_prompt_shorter_than_one_block_shares_nothing():
    # 10 tokens < 16: 9 // 16 = 0 blocks can hit. Each child computes its 10 tokens and
    # holds ceil(11 / 16) = 1 block of its own at the second output token.
    got = assert_calculator_matches(10, 4, 16, max_tokens=2)
    assert got["hits"] == [0, 0, 0, 0]
    assert got["prefill"] == 40 and got["rate"] == 0.0 and got["peak_blocks"] == 4


def test_prompt_of_exactly_k_blocks_recomputes_its_last_block():
    # 64 tokens = 4 full blocks, all cached by child 0. A later child may hit only 63
    # tokens -> 3 blocks = 48; it recomputes the whole 4th block (16 tokens), into a block
    # of its own (same content as child 0's). Counting the 4th block would give 64 hits.
    # Computed: 64 + 3 * 16 = 112. Rate 144 / 256 = 0.5625. Blocks with 1 output token:
    # KV for 64 tokens = 4 blocks each, 3 shared: 3 + 4 * 1 = 7.
    got = assert_calculator_matches(64, 4, 16, max_tokens=1)
    assert got["hits"] == [0, 48, 48, 48]
    assert got["prefill"] == 112
    assert got["rate"] == pytest.approx(0.5625, abs=1e-12)
    assert got["peak_blocks"] == 7
    assert impl.cacheable_prefix_tokens(64, 16) == 48


def test_one_token_past_a_block_recomputes_one_token():
    # 17 tokens: 16 // 16 = 1 block hits, the later child computes 1 token. 18 computed.
    got = assert_calculator_matches(17, 2, 16, max_tokens=1)
    assert got["hits"] == [0, 16] and got["prefill"] == 18 and got["peak_blocks"] == 3


def test_caching_off_shares_nothing_and_on_shares_the_full_blocks():
    # 100 tokens, blocks of 16, 2 output tokens: KV for 101 tokens = 7 blocks per child.
    # On: 99 // 16 = 6 blocks = 96 hits; 100 + 3 * 4 = 112 computed; 6 + 4 * 1 = 10 blocks.
    # Off: 400 computed, 4 * 7 = 28 blocks.
    on = assert_calculator_matches(100, 4, 16, max_tokens=2)
    off = assert_calculator_matches(100, 4, 16, max_tokens=2, enable_caching=False)
    assert on["hits"] == [0, 96, 96, 96] and on["prefill"] == 112 and on["peak_blocks"] == 10
    assert off["hits"] == [0, 0, 0, 0] and off["prefill"] == 400 and off["peak_blocks"] == 28
    assert on["rate"] == pytest.approx(0.72, abs=1e-12) and off["rate"] == 0.0
    # Sharing changes what is computed, never what is sampled.
    assert on["tokens"] == off["tokens"]


def test_block_size_8_n_3_and_output_blocks():
    # 37 tokens, blocks of 8: 36 // 8 = 4 blocks = 32 hits; each later child computes 5.
    # 37 + 2 * 5 = 47 computed; rate 64 / 111. With 5 output tokens each child has KV for
    # 41 tokens = 6 blocks: 4 shared + 3 * 2 private = 10 (18 without caching).
    got = assert_calculator_matches(37, 3, 8, max_tokens=5)
    assert got["hits"] == [0, 32, 32] and got["prefill"] == 47 and got["peak_blocks"] == 10
    assert got["rate"] == pytest.approx(64 / 111, abs=1e-12)
    assert impl.expected_blocks(37, 3, 8, 5, enable_caching=False) == 18


def test_n_1_is_a_plain_request():
    got = assert_calculator_matches(50, 1, 16, max_tokens=2)
    assert got["hits"] == [0] and got["prefill"] == 50 and got["peak_blocks"] == 4


# ---------------------------------------------------------------- many shapes, on the scheduler alone


def schedule_children(prompt_len, n, block_size, enable_caching):
    """mini_vllm's real Scheduler + KVCacheManager, no model: admit n children in one step."""
    blocks_per_child = -(-prompt_len // block_size)
    kv = KVCacheManager(n * blocks_per_child + 1, block_size, enable_caching)
    sched = Scheduler(kv, max_num_batched_tokens=n * prompt_len)
    ids = prompt_ids(prompt_len, seed=prompt_len)
    for i in range(n):
        sched.add_request(Request(f"c{i}", ids, SamplingParams(max_tokens=1), None))
    out = sched.schedule()
    assert len(out.scheduled_new_reqs) == n  # one step, as the calculator assumes
    pool = kv.block_pool
    return ([out.num_cached_tokens[f"c{i}"] for i in range(n)], out.total_num_scheduled_tokens,
            pool.num_blocks - 1 - pool.get_num_free_blocks())


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_every_small_shape_against_the_scheduler(block_size):
    # 1 <= prompt_len <= 40, 1 <= n <= 4, caching on and off: 320 shapes per block size.
    # Block size 1 is the finest grain: every token but the last is a hit.
    for enable_caching in (True, False):
        for n in range(1, 5):
            for prompt_len in range(1, 41):
                hits, computed, blocks = schedule_children(prompt_len, n, block_size, enable_caching)
                shape = (prompt_len, n, block_size)
                assert hits == impl.expected_hit_tokens(*shape, enable_caching=enable_caching), shape
                assert computed == impl.expected_prefill_tokens(*shape, enable_caching=enable_caching)
                assert blocks == impl.expected_blocks(*shape, 1, enable_caching=enable_caching), shape
                assert sum(hits) / (n * prompt_len) == pytest.approx(
                    impl.expected_hit_rate(*shape, enable_caching=enable_caching), abs=1e-12)


# ---------------------------------------------------------------- the arithmetic, pinned


def test_cacheable_prefix_is_capped_then_floored():
    # (prompt_len - 1) // block_size * block_size, never prompt_len // block_size * block_size
    assert [impl.cacheable_prefix_tokens(L, 16) for L in (1, 15, 16, 17, 32, 33, 2000)] == \
        [0, 0, 0, 16, 16, 32, 1984]
    assert impl.cacheable_prefix_tokens(2000, 1) == 1999
    assert impl.cacheable_prefix_tokens(5, 5) == 0 and impl.cacheable_prefix_tokens(6, 5) == 5


def test_hit_rate_is_over_all_n_children():
    # 5,952 / 8,000 = 0.744: every child's lookup is a query, child 0's miss included. Over
    # the 3 later children alone it would be 0.992; (n - 1) / n would say 0.75.
    assert impl.expected_hit_rate(2000, 4, 16) == pytest.approx(0.744, abs=1e-12)
    assert impl.expected_hit_rate(2000, 2, 16) == pytest.approx(0.496, abs=1e-12)
    assert impl.expected_hit_rate(2000, 1, 16) == 0.0
    # Always below (n - 1) / n, and closer to it as the prompt grows: 3 * 99,984 / 400,000.
    for L in (17, 160, 2000, 100_000):
        assert impl.expected_hit_rate(L, 4, 16) < 0.75
    assert impl.expected_hit_rate(100_000, 4, 16) == pytest.approx(0.74988, abs=1e-12)


def test_prefill_saving_factor():
    # 8,000 / 2,048 = 3.90625: close to n = 4 only because 16 tokens is small next to 2,000.
    assert 8000 / impl.expected_prefill_tokens(2000, 4, 16) == pytest.approx(3.90625)
    # A later child computes between 1 and block_size tokens: 33 -> 1, 48 -> 16.
    assert impl.expected_prefill_tokens(33, 2, 16) == 34
    assert impl.expected_prefill_tokens(48, 2, 16) == 64
    assert impl.expected_prefill_tokens(48, 8, 1) == 48 + 7


def test_blocks_count_the_unsent_token_out():
    # The newest sampled token has no KV yet: at the m-th output token a child holds KV for
    # prompt_len + m - 1 tokens. 64 tokens, m = 1: 4 blocks each (3 shared) -> 7; m = 2:
    # 65 tokens -> 5 blocks each -> 3 + 4 * 2 = 11.
    assert impl.expected_blocks(64, 4, 16, 1) == 7
    assert impl.expected_blocks(64, 4, 16, 2) == 11
    # Counts are ints (a block count of 7.0 means a true division slipped in somewhere).
    assert type(impl.expected_blocks(64, 4, 16, 1)) is int
    assert type(impl.expected_prefill_tokens(64, 4, 16)) is int
    assert all(type(h) is int for h in impl.expected_hit_tokens(64, 4, 16))
    assert impl.expected_blocks(64, 4, 16, 17) == 3 + 4 * 2
    assert impl.expected_blocks(64, 4, 16, 18) == 3 + 4 * 3
    # One child, or no full block to share: caching changes nothing.
    assert impl.expected_blocks(100, 1, 16, 1) == impl.expected_blocks(100, 1, 16, 1, enable_caching=False) == 7
    assert impl.expected_blocks(16, 3, 16, 1) == impl.expected_blocks(16, 3, 16, 1, enable_caching=False) == 3


# ---------------------------------------------------------------- seeds


def test_child_seeds_are_seed_plus_index():
    assert impl.child_seeds(7, 4) == [7, 8, 9, 10]
    assert impl.child_seeds(0, 3) == [0, 1, 2]
    assert impl.child_seeds(123, 1) == [123]
    assert impl.child_seeds(None, 3) == [None, None, None]


def test_children_are_the_requests_their_seeds_name():
    # Child i of a seeded parent is exactly a standalone n = 1 request with seed + i (here on
    # an engine without caching: the cache changes no token either). Children differ from
    # one another, and a second engine reproduces them.
    children = _run(100, 4, 16, 2)["tokens"]
    llm = LLM("tiny-random", block_size=16, enable_caching=False)
    seeds = impl.child_seeds(11, 4)
    alone = llm.generate([{"prompt_token_ids": prompt_ids(100)}] * 4,
                         [SamplingParams(temperature=1.0, seed=s, max_tokens=2, ignore_eos=True)
                          for s in seeds])
    assert [tuple(o.outputs[0].token_ids) for o in alone] == children
    assert len(set(children)) == 4
    again = LLM("tiny-random", block_size=16).generate(
        {"prompt_token_ids": prompt_ids(100)},
        SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=2, ignore_eos=True))[0]
    assert [tuple(o.token_ids) for o in again.outputs] == children


def test_neighbouring_parent_seeds_overlap():
    # seed + i means parent seed 12's child 0 is parent seed 11's child 1: same prompt,
    # same seed, same tokens. Pick parent seeds at least n apart when that matters.
    assert impl.child_seeds(12, 4)[0] == impl.child_seeds(11, 4)[1]
    ours = LLM("tiny-random", block_size=16).generate(
        {"prompt_token_ids": prompt_ids(100)},
        SamplingParams(n=2, temperature=1.0, seed=impl.child_seeds(11, 4)[1], max_tokens=2,
                       ignore_eos=True))[0]
    assert tuple(ours.outputs[0].token_ids) == _run(100, 4, 16, 2)["tokens"][1]


# ---------------------------------------------------------------- bad input


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match=r"prompt_len must be an integer >= 1, got 0"):
        impl.cacheable_prefix_tokens(0, 16)
    with pytest.raises(ValueError, match=r"block_size must be an integer >= 1, got 0"):
        impl.cacheable_prefix_tokens(10, 0)
    with pytest.raises(ValueError, match=r"block_size must be an integer >= 1, got True"):
        impl.cacheable_prefix_tokens(10, True)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        impl.expected_hit_tokens(10, 0, 16)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        impl.expected_hit_tokens(10, 0, 16, enable_caching=False)
    with pytest.raises(ValueError, match=r"prompt_len must be an integer >= 1, got 2\.5"):
        impl.expected_prefill_tokens(2.5, 2, 16)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got -1"):
        impl.expected_hit_rate(10, -1, 16)
    with pytest.raises(ValueError, match=r"enable_caching must be True or False, got 1"):
        impl.expected_hit_rate(10, 2, 16, enable_caching=1)
    with pytest.raises(ValueError, match=r"num_output_tokens must be an integer >= 1, got 0"):
        impl.expected_blocks(10, 2, 16, 0)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        impl.expected_blocks(10, 0, 16, 1)
    with pytest.raises(ValueError, match=r"enable_caching must be True or False, got None"):
        impl.expected_blocks(10, 2, 16, 1, enable_caching=None)
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -1"):
        impl.child_seeds(-1, 2)
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got False"):
        impl.child_seeds(False, 2)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        impl.child_seeds(5, 0)
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        impl.child_seeds(None, 0)
