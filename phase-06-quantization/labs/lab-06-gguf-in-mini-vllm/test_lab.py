"""Lab 06-06 tests: SmolLM2's GGUF loaded your way, run in mini_vllm, checked against transformers."""
from __future__ import annotations

import course
from course import load_impl

impl = load_impl(__file__)

import json  # noqa: E402
import pathlib  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = course.REPO_ROOT
# Recorded by mini_vllm's benchmarks/record_smollm2_golden.py: transformers 5.23 reading the
# same GGUF file by itself (float32, one thread). chat[0] is "What is the capital of France?"
# rendered with the file's chat template (37 tokens) and its 8 greedy tokens.
GOLDEN = json.loads((ROOT / "mini_vllm" / "tests" / "golden" / "smollm2.json").read_text())
CAPITAL = GOLDEN["chat"][0]


def permute(w, n_heads):
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute), test-side:
    Hugging Face rows (j, j + head_dim/2) of each head become rows (2j, 2j + 1)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def neox_to_gptj(head_dim):
    """Index map: position p of the GPT-J layout holds NeoX element order[p]."""
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()


# ---------------------------------------------------------------- unpermute_qk


def test_unpermute_qk_by_hand():
    # One head of 4 rows, as stored: [a0, b0, a1, b1] (pairs interleaved) -> [a0, a1, b0, b1].
    w = np.array([[0.0], [10.0], [1.0], [11.0]])
    assert impl.unpermute_qk(w, 1).ravel().tolist() == [0.0, 1.0, 10.0, 11.0]
    # Two heads: each head is reordered inside itself; heads never mix.
    w2 = np.arange(8.0)[:, None] * [1.0, -1.0]
    out = impl.unpermute_qk(w2, 2)
    assert out[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    np.testing.assert_array_equal(out[:, 1], -out[:, 0])  # whole rows move, columns stay
    # Read with one head instead of two, the same rows come out in another order.
    assert impl.unpermute_qk(w2, 1)[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert w2[:, 0].tolist() == list(range(8))  # the input is not modified
    assert impl.unpermute_qk([[0.0], [10.0], [1.0], [11.0]], 1).ravel().tolist() == [0, 1, 10, 11]


def test_unpermute_qk_inverts_the_converter():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((576, 40)).astype(np.float32)  # 9 heads of 64, like SmolLM2's q
    k = rng.standard_normal((192, 40)).astype(np.float32)  # 3 KV heads of 64
    np.testing.assert_array_equal(impl.unpermute_qk(permute(q, 9), 9), q)
    np.testing.assert_array_equal(impl.unpermute_qk(permute(k, 3), 3), k)
    got = impl.unpermute_qk(permute(q, 9), 9)
    assert got.dtype == np.float32 and got.shape == (576, 40)
    # q un-permuted with the KV head count (3 "heads" of 192) is a different matrix
    assert not np.array_equal(impl.unpermute_qk(permute(q, 9), 3), q)


def test_unpermute_qk_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"w must be a 2-D array \[out, in\], got shape \(8,\)"):
        impl.unpermute_qk(np.ones(8), 2)
    with pytest.raises(ValueError, match=r"w: 12 rows do not split into n_heads=4 heads of an even size"):
        impl.unpermute_qk(np.ones((12, 3)), 4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"n_heads must be an integer >= 1"):
            impl.unpermute_qk(np.ones((8, 3)), bad)


# ---------------------------------------------------------------- apply_rope_gptj


def test_apply_rope_gptj_by_hand():
    # head_dim 4: pairs (0, 1) with angle 0 and (2, 3) with angle 1. cos/sin chosen exact:
    # pair 0 turns by 90 degrees (cos 0, sin 1): (1, 2) -> (-2, 1); pair 1 by 180: (3, 4) -> (-3, -4).
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    cos, sin = np.array([[0.0, -1.0]]), np.array([[1.0, 0.0]])
    out = impl.apply_rope_gptj(x, cos, sin)
    assert out.ravel().tolist() == [-2.0, 1.0, -3.0, -4.0]
    assert x.ravel().tolist() == [1.0, 2.0, 3.0, 4.0]  # not modified
    # NeoX pairs (0, 2) and (1, 3) instead: mini_vllm's apply_rope gives another answer
    from mini_vllm.models.llama import apply_rope

    assert apply_rope(x, cos, sin).ravel().tolist() == [-3.0, -2.0, 1.0, -4.0]
    assert impl.apply_rope_gptj(x.tolist(), cos, sin).ravel().tolist() == [-2.0, 1.0, -3.0, -4.0]


def test_apply_rope_gptj_is_neox_on_interleaved_dims():
    # The whole reason the two routes agree: GPT-J rotation of the interleaved vector equals
    # the NeoX rotation, interleaved. Same multiplications, so equal bit for bit.
    from mini_vllm.models.llama import apply_rope

    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 64)).astype(np.float32)
    ang = rng.uniform(0, 6, (5, 32)).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)
    order = neox_to_gptj(64)
    got = impl.apply_rope_gptj(x[..., order], cos, sin)
    np.testing.assert_array_equal(got, apply_rope(x, cos, sin)[..., order])
    assert got.dtype == np.float32 and got.shape == (5, 3, 64)


def test_apply_rope_gptj_rejects_bad_shapes():
    cos = sin = np.ones((2, 2))
    with pytest.raises(ValueError, match=r"x must be \[T, heads, head_dim\] with an even head_dim"):
        impl.apply_rope_gptj(np.ones((2, 4)), cos, sin)
    with pytest.raises(ValueError, match=r"x must be \[T, heads, head_dim\] with an even head_dim"):
        impl.apply_rope_gptj(np.ones((2, 1, 5)), cos, sin)
    with pytest.raises(ValueError, match=r"cos must be \[T, head_dim / 2\] = \[2, 2\], got shape \(2, 3\)"):
        impl.apply_rope_gptj(np.ones((2, 1, 4)), np.ones((2, 3)), sin)
    with pytest.raises(ValueError, match=r"sin must be \[T, head_dim / 2\] = \[2, 2\]"):
        impl.apply_rope_gptj(np.ones((2, 1, 4)), cos, np.ones((3, 2)))


# ---------------------------------------------------------------- gguf_config on a fake header


class FakeField:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


def fake_reader(drop=(), tensors=("token_embd.weight",), **changes):
    meta = {
        "general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 8,
        "llama.feed_forward_length": 6, "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1, "llama.rope.freq_base": 500.0,
        "llama.attention.layer_norm_rms_epsilon": 3e-6, "llama.context_length": 64,
        "llama.vocab_size": 10, "llama.rope.dimension_count": 4,
        "tokenizer.ggml.eos_token_id": 7, "tokenizer.ggml.bos_token_id": 5,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(11)],
    }
    meta.update({k.replace("__", "."): v for k, v in changes.items()})
    return SimpleNamespace(fields={k: FakeField(v) for k, v in meta.items() if k not in drop},
                           tensors=[SimpleNamespace(name=n) for n in tensors])


def test_gguf_config_reads_every_key():
    c = impl.gguf_config(fake_reader())
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (2, 8, 6)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (2, 1, 4)
    assert (c.vocab_size, c.max_position_embeddings) == (10, 64)
    assert c.rope_theta == 500.0 and c.rms_norm_eps == 3e-6  # from the file, not the defaults
    assert c.eos_token_ids == (7,) and c.bos_token_id == 5
    assert c.rope_scaling == {"rope_type": "default"} and c.architecture == "llama"
    assert c.tie_word_embeddings  # no output.weight tensor
    assert not (c.qkv_bias or c.o_bias or c.mlp_bias)
    assert not impl.gguf_config(fake_reader(tensors=("output.weight",))).tie_word_embeddings


def test_gguf_config_defaults_only_for_optional_keys():
    c = impl.gguf_config(fake_reader(drop=("llama.attention.head_count_kv", "llama.rope.freq_base",
                                           "llama.vocab_size", "llama.rope.dimension_count",
                                           "tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.bos_token_id")))
    assert c.num_key_value_heads == 2 and c.rope_theta == 10000.0
    assert c.vocab_size == 11  # the length of tokenizer.ggml.tokens
    assert c.eos_token_ids == () and c.bos_token_id is None
    for key in ("llama.block_count", "llama.attention.layer_norm_rms_epsilon",
                "llama.context_length", "llama.feed_forward_length"):
        with pytest.raises(ValueError, match=rf"reader: missing metadata key '{key}'"):
            impl.gguf_config(fake_reader(drop=(key,)))


def test_gguf_config_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match=r"reader: general.architecture must be 'llama', got 'qwen2'"):
        impl.gguf_config(fake_reader(general__architecture="qwen2"))
    with pytest.raises(ValueError, match=r"reader: llama.rope.dimension_count 2 differs from head_dim 4"):
        impl.gguf_config(fake_reader(llama__rope__dimension_count=2))


# ---------------------------------------------------------------- build_weights on tiny tensors


def tiny_tensors(config, rng):
    """Tensors as read_tensors returns them ([out, in]), every value distinct."""
    c = config
    shapes = {"token_embd.weight": (c.vocab_size, c.hidden_size), "output_norm.weight": (c.hidden_size,)}
    for i in range(c.num_hidden_layers):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (c.hidden_size,), p + "ffn_norm.weight": (c.hidden_size,),
                       p + "attn_q.weight": (c.q_size, c.hidden_size),
                       p + "attn_k.weight": (c.kv_size, c.hidden_size),
                       p + "attn_v.weight": (c.kv_size, c.hidden_size),
                       p + "attn_output.weight": (c.hidden_size, c.q_size),
                       p + "ffn_gate.weight": (c.intermediate_size, c.hidden_size),
                       p + "ffn_up.weight": (c.intermediate_size, c.hidden_size),
                       p + "ffn_down.weight": (c.hidden_size, c.intermediate_size)})
    total = sum(int(np.prod(s)) for s in shapes.values())
    values = rng.permutation(total).astype(np.float32)
    out, at = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        out[name] = values[at:at + n].reshape(shape)
        at += n
    return out


def test_build_weights_places_every_tensor():
    c = impl.gguf_config(fake_reader())  # 2 layers, hidden 8, 2 heads / 1 KV head of 4, ffn 6
    t = tiny_tensors(c, np.random.default_rng(2))
    before = {k: v.copy() for k, v in t.items()}
    w = impl.build_weights(c, t)
    for i, lw in enumerate(w.layers):
        p = f"blk.{i}."
        np.testing.assert_array_equal(lw.input_norm, t[p + "attn_norm.weight"])
        np.testing.assert_array_equal(lw.post_norm, t[p + "ffn_norm.weight"])
        assert lw.qkv_proj.shape == (8, 8 + 2 * 4)
        # columns q | k | v; q un-permuted with 2 heads, k with its 1 KV head, v as stored
        np.testing.assert_array_equal(lw.qkv_proj[:, :8], permute_back(t[p + "attn_q.weight"], 2).T)
        np.testing.assert_array_equal(lw.qkv_proj[:, 8:12], permute_back(t[p + "attn_k.weight"], 1).T)
        np.testing.assert_array_equal(lw.qkv_proj[:, 12:], t[p + "attn_v.weight"].T)
        np.testing.assert_array_equal(lw.o_proj, t[p + "attn_output.weight"].T)
        np.testing.assert_array_equal(lw.gate_up_proj[:, :6], t[p + "ffn_gate.weight"].T)
        np.testing.assert_array_equal(lw.gate_up_proj[:, 6:], t[p + "ffn_up.weight"].T)
        np.testing.assert_array_equal(lw.down_proj, t[p + "ffn_down.weight"].T)
        assert lw.qkv_bias is None and lw.o_bias is None
        for arr in (lw.qkv_proj, lw.o_proj, lw.gate_up_proj, lw.down_proj):
            assert arr.dtype == np.float32
    np.testing.assert_array_equal(w.embed_tokens, t["token_embd.weight"])
    np.testing.assert_array_equal(w.norm, t["output_norm.weight"])
    # the tied head is the embedding itself, transposed: one tensor in memory, not two
    assert w.lm_head.shape == (8, 10) and np.shares_memory(w.lm_head, w.embed_tokens)
    np.testing.assert_array_equal(w.lm_head, w.embed_tokens.T)
    for k in t:
        np.testing.assert_array_equal(t[k], before[k])
    # unpermute=False: q and k keep the file's rows (for GPT-J rotary); nothing else changes
    raw = impl.build_weights(c, t, unpermute=False)
    np.testing.assert_array_equal(raw.layers[1].qkv_proj[:, :8], t["blk.1.attn_q.weight"].T)
    np.testing.assert_array_equal(raw.layers[1].qkv_proj[:, 8:12], t["blk.1.attn_k.weight"].T)
    np.testing.assert_array_equal(raw.layers[1].qkv_proj[:, 12:], w.layers[1].qkv_proj[:, 12:])


def permute_back(w, n_heads):
    """The test's own inverse of permute (reshape [head, j, 2] -> [head, 2, j])."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def test_build_weights_untied_head_and_bad_tensors():
    c = impl.gguf_config(fake_reader(tensors=("output.weight",)))
    t = tiny_tensors(c, np.random.default_rng(3))
    t["output.weight"] = np.arange(80, dtype=np.float32).reshape(10, 8)
    w = impl.build_weights(c, t)
    np.testing.assert_array_equal(w.lm_head, t["output.weight"].T)
    assert not np.shares_memory(w.lm_head, w.embed_tokens)
    with pytest.raises(ValueError, match=r"tensors: missing blk.1.ffn_up.weight"):
        impl.build_weights(c, {k: v for k, v in t.items() if k != "blk.1.ffn_up.weight"})
    with pytest.raises(ValueError, match=r"tensors: blk.2.attn_q.weight has no place in a llama model with 2 layers"):
        impl.build_weights(c, {**t, "blk.2.attn_q.weight": t["blk.0.attn_q.weight"]})
    with pytest.raises(ValueError, match=r"tensors: rope_freqs.weight has no place"):
        impl.build_weights(c, {**t, "rope_freqs.weight": t["output_norm.weight"]})
    tied = impl.gguf_config(fake_reader())  # a tied config has no use for output.weight
    with pytest.raises(ValueError, match=r"tensors: output.weight has no place"):
        impl.build_weights(tied, t)


# ---------------------------------------------------------------- the real file

@pytest.fixture(scope="module")
def smollm2():
    """The GGUF parsed once per session (about 2 s, mostly the 98k tokenizer strings; lab 03
    shares the parse through ``hub.gguf_reader``), read your way."""
    pytest.importorskip("gguf")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mini_vllm.models import hub

    if hub.model_path("smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: python -m mini_vllm download smollm2")
    reader = hub.gguf_reader("smollm2")
    with threadpoolctl.threadpool_limits(1, "blas"):
        config = impl.gguf_config(reader)
        tensors = impl.read_tensors(reader)
        weights = impl.build_weights(config, tensors)
        tok = impl.tokenizer_from_gguf(reader)
        logits = impl.forward_logits(config, weights, CAPITAL["prompt_ids"])
    return SimpleNamespace(reader=reader, config=config, tensors=tensors, weights=weights,
                           tok=tok, logits=logits)


@pytest.fixture(scope="module")
def oracle():
    """mini_vllm's own loader (mini_vllm/models/gguf.py, through its converted folder)."""
    import threadpoolctl

    from mini_vllm.models import get_model

    with threadpoolctl.threadpool_limits(1, "blas"):
        return get_model("smollm2")


@pytest.mark.model
def test_config_matches_the_header(smollm2, oracle):
    c = smollm2.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.max_position_embeddings) == (49152, 8192)
    assert c.rope_theta == 100000.0  # llama.rope.freq_base; the 10000 default would be wrong
    assert c.rms_norm_eps == pytest.approx(1e-5, abs=1e-12)  # float32 9.9999997e-06 in the file
    assert c.tie_word_embeddings and c.eos_token_ids == (2,) and c.bos_token_id == 1
    assert c == oracle.config  # every field, dataclass equality


@pytest.mark.model
def test_weight_bytes_match_the_file(smollm2):
    foot = impl.quantized_footprint(smollm2.reader)
    # Q4_1: 32 weights in 20 bytes (fp16 d, fp16 m, 16 bytes of nibbles) = 5.0 bits/weight;
    # Q8_0: 32 in 34 (fp16 d, 32 int8) = 8.5; the 61 norms stay float32.
    assert foot == {"Q4_1": (210, 106_168_320, 66_355_200), "Q8_0": (1, 28_311_552, 30_081_024),
                    "F32": (61, 35_136, 140_544)}
    assert all(type(n) is int for v in foot.values() for n in v)  # counts, not floats
    n_weights = sum(v[1] for v in foot.values())
    n_bytes = sum(v[2] for v in foot.values())
    assert (n_weights, n_bytes) == (134_515_008, 96_576_768)
    assert n_bytes == sum(int(t.n_bytes) for t in smollm2.reader.tensors)  # gguf agrees
    assert n_bytes < pathlib.Path(smollm2.reader.data.filename).stat().st_size < n_bytes + 2_000_000
    # Your float32 Weights hold exactly the file's weights: the tied head adds none.
    arrays = [smollm2.weights.embed_tokens, smollm2.weights.norm, smollm2.weights.lm_head]
    for lw in smollm2.weights.layers:
        arrays += [lw.input_norm, lw.qkv_proj, lw.o_proj, lw.post_norm, lw.gate_up_proj, lw.down_proj]
    unique = {}
    for a in arrays:
        base = a if a.base is None else a.base
        unique[id(base)] = a.size
    assert sum(unique.values()) == 134_515_008  # 538 MB of float32 from 96.6 MB of file


@pytest.mark.model
def test_every_layer_equals_mini_vllm_loader(smollm2, oracle):
    # Both dequantize the same bytes with gguf and move them without arithmetic:
    # equality is exact, float32 bit for bit.
    mine, ref = smollm2.weights, oracle.weights
    for i, (a, b) in enumerate(zip(mine.layers, ref.layers, strict=True)):
        for name in ("input_norm", "qkv_proj", "o_proj", "post_norm", "gate_up_proj", "down_proj"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), f"layer {i} {name}"
    np.testing.assert_array_equal(mine.embed_tokens, ref.embed_tokens)
    np.testing.assert_array_equal(mine.norm, ref.norm)
    np.testing.assert_array_equal(mine.lm_head, ref.lm_head)


@pytest.mark.model
def test_smollm2_greedy_tokens_match_transformers_gguf(smollm2):
    import threadpoolctl

    from mini_vllm.engine import LLMEngine
    from mini_vllm.models.llama import LlamaForCausalLM
    from mini_vllm.sampling_params import SamplingParams

    # Step 1's logits at 84 pinned ids equal transformers' within 1e-3 (measured 2.3e-5).
    np.testing.assert_allclose(smollm2.logits[-1][CAPITAL["logit_ids"]], CAPITAL["logits"],
                               rtol=0, atol=1e-3)
    model = LlamaForCausalLM(smollm2.config, smollm2.weights,
                             tokenizer=impl.TokenizerAdapter(smollm2.tok, smollm2.config.eos_token_id))
    with threadpoolctl.threadpool_limits(1, "blas"):
        engine = LLMEngine(model, block_size=16, num_blocks=8)
        out = engine.generate([{"prompt_token_ids": CAPITAL["prompt_ids"]}],
                              SamplingParams(temperature=0, max_tokens=16))[0]
    assert list(out.output_token_ids) == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    assert list(out.output_token_ids) == CAPITAL["greedy_ids"]
    assert out.output_text() == "The capital of France is Paris."  # your decoder; EOS dropped


@pytest.mark.model
def test_unpermute_and_interleaved_rope_agree(smollm2):
    import threadpoolctl

    ids = CAPITAL["prompt_ids"]
    with threadpoolctl.threadpool_limits(1, "blas"):
        raw = impl.build_weights(smollm2.config, smollm2.tensors, unpermute=False)
        gptj = impl.forward_logits(smollm2.config, raw, ids, "gptj")
        # the file's rows with NeoX rotary: the pairs meet the wrong numbers
        broken = impl.forward_logits(smollm2.config, raw, ids)
    neox = smollm2.logits
    # Same model, summed in another order inside each head's q.k: measured max |d| 8.3e-5
    # over 37 x 49,152 logits up to 37.6 in size (float32). The 1e-5 of the design notes is
    # below what float32 gives here; 5e-4 is still 60,000x smaller than the broken route's gap.
    np.testing.assert_allclose(gptj, neox, rtol=0, atol=5e-4)
    assert (gptj.argmax(-1) == neox.argmax(-1)).all()
    assert neox[-1].argmax() == 504 and broken[-1].argmax() == 2  # "The" vs <|im_end|> at once
    assert np.abs(broken - neox).max() > 10


@pytest.mark.model
@pytest.mark.parametrize("case", GOLDEN["tokenizer"], ids=lambda c: repr(c["text"][:16]))
def test_tokenizer_matches_transformers(smollm2, case):
    ids = smollm2.tok.encode(case["text"]).ids
    assert ids == case["ids"]  # digits split one by one, no prefix space, no BOS
    if "<|" not in case["text"]:
        assert smollm2.tok.decode(ids) == case["text"]


@pytest.mark.model
@pytest.mark.parametrize("text", ["a  b   c", "hello\n\nworld"])
def test_runs_of_whitespace_split_like_gpt2(smollm2, oracle, text):
    # GPT-2's pre-tokenizer regex keeps a run of spaces or newlines apart from the word
    # after it; without the regex (use_regex=False) byte-level BPE merges across them
    # and these two texts get other ids. The oracle is mini_vllm's tokenizer.json.
    assert smollm2.tok.encode(text).ids == oracle.tokenizer.encode(text)


@pytest.mark.model
def test_special_tokens_are_single_ids(smollm2):
    tok = smollm2.tok
    assert tok.encode("<|im_start|>").ids == [1]
    assert tok.encode("<|im_end|>").ids == [2]
    controls = [i for i, t in enumerate(impl.field(smollm2.reader, "tokenizer.ggml.token_type"))
                if t == 3]
    assert controls == list(range(17))  # <|endoftext|> ... <empty_output>
    tokens = impl.field(smollm2.reader, "tokenizer.ggml.tokens")
    assert [tok.encode(tokens[i]).ids for i in controls] == [[i] for i in controls]
    assert tok.encode(CAPITAL["text"]).ids == CAPITAL["prompt_ids"]  # the chat template's markers
    assert tok.decode(CAPITAL["prompt_ids"][:4], skip_special_tokens=True) == "system\nYou"
    assert tok.get_vocab_size(with_added_tokens=True) == 49152


@pytest.mark.model
def test_tokenizer_rejects_another_model_kind(smollm2):
    reader = SimpleNamespace(fields={**smollm2.reader.fields,
                                     "tokenizer.ggml.model": FakeField("llama")})
    with pytest.raises(ValueError, match=r"reader: tokenizer.ggml.model must be 'gpt2' \(byte-level BPE\), got 'llama'"):
        impl.tokenizer_from_gguf(reader)
    # Another pre-tokenizer name: no digit splitting, but the byte-level rules still apply
    # (this vocabulary has no multi-digit tokens, so digits come out one by one anyway).
    gpt2 = impl.tokenizer_from_gguf(SimpleNamespace(
        fields={**smollm2.reader.fields, "tokenizer.ggml.pre": FakeField("gpt2")}))
    assert gpt2.encode("Hello, world!").ids == GOLDEN["tokenizer"][1]["ids"]
    assert gpt2.decode(gpt2.encode(" naïve café").ids) == " naïve café"


def test_footprint_rejects_a_partial_block():
    gguf = pytest.importorskip("gguf")
    t = SimpleNamespace(name="blk.0.attn_q.weight", tensor_type=gguf.GGMLQuantizationType.Q4_1,
                        shape=np.array([33]))
    with pytest.raises(ValueError, match=r"reader: tensor blk.0.attn_q.weight holds 33 weights, "
                                         r"not a whole number of Q4_1 blocks of 32"):
        impl.quantized_footprint(SimpleNamespace(tensors=[t]))
    t.shape = np.array([32, 2])
    assert impl.quantized_footprint(SimpleNamespace(tensors=[t])) == {"Q4_1": (1, 64, 40)}
