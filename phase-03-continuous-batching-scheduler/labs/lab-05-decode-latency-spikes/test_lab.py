from course import load_impl

impl = load_impl(__file__)

import pytest  # noqa: E402

UNCHUNKED = [257, 2] + [1] * 13
CHUNKED_32 = [33] * 8 + [2] + [1] * 6


def test_unchunked_prefill_spikes_exactly_one_decode_step():
    costs = impl.decode_step_costs(256, 0)
    assert costs == UNCHUNKED
    assert sorted(costs)[-2] <= 3  # one balloon, then calm


def test_threshold_32_caps_every_step_at_33_for_8_steps():
    costs = impl.decode_step_costs(256, 32)
    assert costs == CHUNKED_32
    assert max(costs) <= 32 + 1
    assert sum(c > 2 for c in costs) == 8 == -(-256 // 32)


def test_the_work_is_conserved_and_so_is_the_mean_latency():
    a, b = impl.decode_step_costs(256, 0), impl.decode_step_costs(256, 32)
    assert sum(a) == sum(b) == 272
    ms_a, ms_b = impl.itl_ms(a), impl.itl_ms(b)
    assert sum(ms_a) == pytest.approx(sum(ms_b)) == pytest.approx(177.2)
    assert max(ms_a) == pytest.approx(35.7) and max(ms_b) == pytest.approx(13.3)
    assert min(ms_a) == pytest.approx(10.1)
    assert ms_a[:3] == [35.7, 10.2, 10.1] and ms_b[7:10] == [13.3, 10.2, 10.1]
    assert round(max(ms_a) / min(ms_a), 1) == 3.5  # the spike, in this cost model


def test_chunking_does_not_change_the_victims_tokens():
    p0, p32 = impl.victim_profile(256, 0), impl.victim_profile(256, 32)
    assert p0["victim_tokens"] == p32["victim_tokens"] and len(p0["victim_tokens"]) == 16


def test_the_victim_is_never_starved():
    # running-first: the victim gets a token in every step until it finishes
    for t in (0, 8, 32, 100):
        assert len(impl.decode_step_costs(256, t)) == 15


def test_the_price_moves_to_the_long_requests_ttft():
    rows = {r["threshold"]: r for r in impl.threshold_sweep()}
    assert {t: (r["worst_cost"], r["long_ttft_steps"]) for t, r in rows.items()} == {
        0: (257, 1), 16: (17, 16), 32: (33, 8), 64: (65, 4), 128: (129, 2), 256: (257, 1),
    }


def test_costs_cover_only_the_victims_steps_and_follow_its_max_tokens():
    p = impl.victim_profile(256, 0, victim_max_tokens=6, long_max_tokens=40)
    # the long request outlives the victim: its lone decode steps are not the victim's
    assert p["costs"] == [257, 2, 2, 2, 2] and len(p["victim_tokens"]) == 6
    assert p["long_ttft_steps"] == 1


def test_both_requests_run_to_max_tokens_even_on_a_model_that_loves_eos(monkeypatch):
    from mini_vllm.engine import LLMEngine
    from mini_vllm.model import ToyModel

    # EOS outscores every other token: greedy picks it first, every time
    monkeypatch.setattr(impl, "LLMEngine", lambda model, *a, **kw: LLMEngine(ToyModel(eos_bias=10.0), *a, **kw))
    p = impl.victim_profile(64, 16)
    assert p["victim_tokens"] == [256] * 16
    assert p["costs"] == [17] * 4 + [2] + [1] * 10 and p["long_ttft_steps"] == 4


def test_a_small_budget_caps_the_spike_too():
    # threshold 0, budget 64: the decode takes 1 token, the prompt gets the other 63
    assert impl.decode_step_costs(256, 0, max_num_batched_tokens=64) == [64] * 4 + [5, 2] + [1] * 9


def test_cost_model_rejects_negative_parameters():
    assert impl.itl_ms([1, 257], 10.0, 0.1) == [10.1, 35.7]
    with pytest.raises(ValueError, match="per_token_ms"):
        impl.itl_ms([1], 10.0, -1.0)
    with pytest.raises(ValueError, match="fixed_ms"):
        impl.itl_ms([1], -0.5, 0.1)
    assert impl.itl_ms([], 1.0, 1.0) == []


def test_cost_model_keeps_six_decimals():
    assert impl.itl_ms([3, 0], 10.0, 0.0005) == [10.0015, 10.0]
    assert impl.itl_ms([7], 0.0, 1 / 3) == [2.333333]


def test_zero_costs_are_allowed_in_the_cost_model():
    assert impl.itl_ms([5, 1], 10.0, 0.0) == [10.0, 10.0]
    assert impl.itl_ms([5], 0.0, 0.5) == [2.5]


def test_a_one_token_long_prompt_is_valid_and_barely_shows():
    p = impl.victim_profile(1)
    assert p["costs"] == [2, 2] + [1] * 13 and p["long_ttft_steps"] == 1


def test_victim_profile_rejects_an_empty_long_prompt():
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="long_prompt_len"):
            impl.victim_profile(bad)


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    out = impl.plot_profiles(str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 10_000 and out.endswith("p.png")
