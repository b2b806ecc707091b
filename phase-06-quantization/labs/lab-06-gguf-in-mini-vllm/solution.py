"""Lab 06-06 — load a real quantized model: SmolLM2's GGUF file into mini_vllm (reference solution).

A ``.gguf`` file is everything llama.cpp needs in one blob: a key/value
header (the model's shape, its vocabulary and merge rules, the chat
template) and then the tensors, most of them block-quantized. SmolLM2-135M's
file stores the linear layers as Q4_1 (lab 03's format), the token embedding
as Q8_0 and the norms as float32. The ``gguf`` package parses the header and
dequantizes the blocks; turning that into a model that answers correctly
takes four decisions, and each one has a wrong answer that still runs:

* **Shape from the header.** ``llama.block_count``, ``llama.attention.head_count``,
  ``llama.rope.freq_base``, ``llama.attention.layer_norm_rms_epsilon``... are
  the config. Nothing else in the file says how many heads there are.
* **Names and layouts.** ``blk.7.attn_q.weight`` is layer 7's ``q_proj``. GGUF
  lists dimensions fastest-first, so a tensor shown as ``[576, 192]`` is
  ``[192, 576]`` (``[out, in]``) once read into numpy. mini_vllm wants
  ``[in, out]``, with q, k, v fused into one ``qkv_proj`` and gate, up into one
  ``gate_up_proj``; the file has no ``output.weight``, so the LM head is the
  token embedding (tied).
* **The rotary pairing.** Hugging Face's Llama rotates the pairs
  ``(i, i + head_dim/2)`` of each head ("NeoX" style); llama.cpp rotates
  ``(2i, 2i + 1)`` ("GPT-J" style, interleaved). The converter that wrote the
  file reordered the rows of ``attn_q`` and ``attn_k`` so that llama.cpp's
  pairing meets the right numbers. Either undo that reordering
  (``unpermute_qk``, what mini_vllm and transformers do), or keep the file's
  rows and rotate interleaved pairs (``apply_rope_gptj``, what vLLM does for
  GGUF Llama). The two give the same model.
* **The tokenizer.** The header carries a GPT-2 byte-level BPE: 49,152 token
  strings and 48,900 merge rules, plus 17 control tokens (``<|im_start|>``...)
  that must stay one id each, or the chat template falls apart.

What you write: ``gguf_config``, ``unpermute_qk``, ``apply_rope_gptj``,
``read_tensors``, ``build_weights``, ``tokenizer_from_gguf`` and
``quantized_footprint``. Given (identical in starter.py): ``field``,
``TokenizerAdapter``, ``forward_logits``, ``gguf_to_weights`` (your
``gguf_config``, ``read_tensors`` and ``build_weights`` in a row) and ``main``.

upstream: vllm/model_executor/models/llama.py:241 is_gguf
upstream: vllm/model_executor/layers/rotary_embedding/common.py:144 forward_static
upstream: vllm/model_executor/model_loader/weight_utils.py:1281 gguf_quant_weights_iterator
"""
from __future__ import annotations

import re

import numpy as np

from mini_vllm.models.config import ModelConfig
from mini_vllm.models.llama import LayerWeights, Weights

ARCH = "llama"
TOKEN_TYPE_CONTROL = 3  # tokenizer.ggml.token_type: 1 normal, 3 control (special), ...
# tokenizer.ggml.pre values whose pre-tokenizer splits every digit off on its own
DIGIT_SPLITTING_PRE = ("smollm", "starcoder", "refact", "deepseek-coder")
ROPE_STYLES = ("neox", "gptj")

_MISSING = object()


# --------------------------------------------------------------------------
# Given (identical in starter.py)
# --------------------------------------------------------------------------


def field(reader, key: str, default=_MISSING):
    """Given. The value of one header key as plain Python (str, int, float, bool, list).

    ``reader`` is a ``gguf.GGUFReader`` (or anything with a ``fields`` dict
    whose values have ``contents()``). A missing key returns ``default``, or
    raises ``ValueError("reader: missing metadata key '<key>'")`` when no
    default is given.
    """
    if key not in reader.fields:
        if default is _MISSING:
            raise ValueError(f"reader: missing metadata key {key!r}")
        return default
    return reader.fields[key].contents()


class TokenizerAdapter:
    """Given. A ``tokenizers.Tokenizer`` behind mini_vllm's tokenizer interface.

    mini_vllm's engine calls ``encode(text) -> list[int]`` and
    ``decode(ids) -> str`` (special tokens dropped, as Hugging Face does), and
    reads ``vocab_size`` and ``eos_token_id``.
    """

    def __init__(self, tokenizer, eos_token_id: int | None):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def forward_logits(config: ModelConfig, weights: Weights, token_ids, rope_style: str = "neox"):
    """Given. One prefill of ``token_ids`` through mini_vllm's numpy Llama: float32 ``[T, vocab]``.

    ``rope_style="neox"`` runs the model as it is (Hugging Face's pairing);
    ``"gptj"`` swaps mini_vllm's ``apply_rope`` for your ``apply_rope_gptj``
    for this one call, the switch vLLM flips for GGUF Llama. Logits come back
    for every position, not only the last.

    Raises ValueError naming ``rope_style`` (not "neox" or "gptj") or
    ``token_ids`` (empty).
    """
    import mini_vllm.models.llama as llama
    from mini_vllm.models.runner import Chunk, make_model_input

    if rope_style not in ROPE_STYLES:
        raise ValueError(f"rope_style must be 'neox' or 'gptj', got {rope_style!r}")
    token_ids = [int(t) for t in token_ids]
    if not token_ids:
        raise ValueError("token_ids must hold at least one token id")
    block_size = 16
    num_blocks = -(-len(token_ids) // block_size)
    model = llama.LlamaForCausalLM(config, weights)
    model.init_kv_cache(num_blocks + 1, block_size)  # block 0 stays unused, as in the engine
    model_input = make_model_input([Chunk(token_ids, 0, list(range(1, num_blocks + 1)))],
                                   block_size)
    original = llama.apply_rope
    if rope_style == "gptj":
        llama.apply_rope = apply_rope_gptj
    try:
        hidden = model.forward(model_input)
    finally:
        llama.apply_rope = original
    return model.compute_logits(hidden)


def gguf_to_weights(reader, unpermute: bool = True) -> tuple[ModelConfig, Weights]:
    """Given. The whole load: ``(gguf_config(reader), build_weights(config, read_tensors(reader)))``.

    ``unpermute`` is passed on to ``build_weights``: True for mini_vllm's
    NeoX rotary, False to keep the file's q/k rows for ``apply_rope_gptj``.
    """
    config = gguf_config(reader)
    return config, build_weights(config, read_tensors(reader), unpermute)


# --------------------------------------------------------------------------
# Your work
# --------------------------------------------------------------------------


def gguf_config(reader) -> ModelConfig:
    """The model's shape, read from the GGUF header: a mini_vllm ``ModelConfig``.

    Keys (all ``llama.*`` unless noted; ``field(reader, key)`` reads one):
    ``general.architecture`` must be "llama"; ``block_count`` -> layers;
    ``embedding_length`` -> hidden size; ``feed_forward_length`` -> MLP size;
    ``attention.head_count`` and ``attention.head_count_kv`` (default: the
    head count) -> heads; ``head_dim = embedding_length // head_count``, and
    ``rope.dimension_count`` (default head_dim) must equal it;
    ``attention.layer_norm_rms_epsilon`` -> ``rms_norm_eps``;
    ``rope.freq_base`` -> ``rope_theta`` (default 10000.0 only when the key is
    absent); ``context_length`` -> ``max_position_embeddings``; ``vocab_size``
    (default: the length of ``tokenizer.ggml.tokens``);
    ``tokenizer.ggml.eos_token_id`` -> ``eos_token_ids`` (a 1-tuple, or ()),
    ``tokenizer.ggml.bos_token_id`` -> ``bos_token_id`` (or None);
    ``rope_scaling = {"rope_type": "default"}``; ``tie_word_embeddings`` is
    True when the file has no ``output.weight`` tensor. No biases.

    Raises ValueError naming ``reader``: another architecture, a required key
    missing (the message names the key), or ``rope.dimension_count`` not
    equal to head_dim (partial rotary is not supported).
    """
    arch = field(reader, "general.architecture")
    if arch != ARCH:
        raise ValueError(f"reader: general.architecture must be 'llama', got {arch!r}")

    def key(name: str, default=_MISSING):
        return field(reader, f"{ARCH}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    head_dim = hidden // heads
    rotary = int(key("rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ValueError(f"reader: llama.rope.dimension_count {rotary} differs from head_dim "
                         f"{head_dim} (partial rotary embeddings are not supported)")
    vocab = key("vocab_size", None)
    if vocab is None:
        vocab = len(field(reader, "tokenizer.ggml.tokens"))
    eos = field(reader, "tokenizer.ggml.eos_token_id", None)
    bos = field(reader, "tokenizer.ggml.bos_token_id", None)
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return ModelConfig(
        architecture="llama",
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        # stored as float32 in the file: 9.999999747e-06, which float() keeps exactly
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling={"rope_type": "default"},
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings=not has_output,
        eos_token_ids=() if eos is None else (int(eos),),
        bos_token_id=None if bos is None else int(bos),
    )


def unpermute_qk(w, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row order for ``attn_q`` / ``attn_k``: ``[out, in]`` back to Hugging Face's.

    ``w``: ``[n_heads * head_dim, in]``, rows as stored in the GGUF file.
    Inside each head of ``head_dim`` rows, Hugging Face's row ``j`` (first
    half) and row ``j + head_dim/2`` (second half) were written as rows
    ``2j`` and ``2j + 1``. This function puts the even rows of each head
    first, then the odd rows. ``n_heads`` is the number of heads *this*
    matrix has: the attention heads for q, the KV heads for k. Returns a new
    array of w's dtype and shape; w is not modified.

    Raises ValueError naming ``w`` (not 2-D, or rows that do not split into
    ``n_heads`` heads of an even size) or ``n_heads`` (not an integer >= 1).
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"n_heads must be an integer >= 1, got {n_heads!r}")
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"w must be a 2-D array [out, in], got shape {w.shape}")
    out, fan_in = w.shape
    if out % (2 * n_heads):
        raise ValueError(f"w: {out} rows do not split into n_heads={n_heads} heads "
                         f"of an even size")
    half = out // n_heads // 2
    # file rows of one head: (j, 0), (j, 1) interleaved -> axes [head, j, 2];
    # Hugging Face wants [head, 2, j]: first every pair's first row, then every second row
    return w.reshape(n_heads, half, 2, fan_in).swapaxes(1, 2).reshape(out, fan_in).copy()


def apply_rope_gptj(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary embedding on interleaved pairs ``(2i, 2i + 1)`` (GPT-J style; llama.cpp's).

    x: ``[T, heads, head_dim]``; cos, sin: ``[T, head_dim / 2]`` (column
    ``i`` is ``position * inv_freq[i]``, as mini_vllm computes them). Pair
    ``i`` is ``(x[..., 2i], x[..., 2i + 1])``, rotated by angle ``i``::

        out[..., 2i]     = x[..., 2i] * cos_i - x[..., 2i + 1] * sin_i
        out[..., 2i + 1] = x[..., 2i + 1] * cos_i + x[..., 2i] * sin_i

    Same signature as mini_vllm's ``apply_rope`` (which pairs ``i`` with
    ``i + head_dim/2``), so ``forward_logits`` can swap one for the other.
    Returns a new array of x's shape; x is not modified.

    Raises ValueError naming ``x`` (not 3-D with an even last axis) or ``cos``
    / ``sin`` (not ``[T, head_dim / 2]``).
    """
    x = np.asarray(x)
    if x.ndim != 3 or x.shape[-1] % 2:
        raise ValueError(f"x must be [T, heads, head_dim] with an even head_dim, got shape {x.shape}")
    want = (x.shape[0], x.shape[-1] // 2)
    for name, arr in (("cos", cos), ("sin", sin)):
        if np.shape(arr) != want:
            raise ValueError(f"{name} must be [T, head_dim / 2] = {list(want)}, "
                             f"got shape {np.shape(arr)}")
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = odd * c + even * s
    return out


_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                  "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def read_tensors(reader) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized: ``{gguf name: float32 array}``, numpy's axis order.

    For each ``t`` in ``reader.tensors``: ``gguf.quants.dequantize(t.data,
    t.tensor_type)`` gives float32 values (Q4_1, Q8_0 and F32 alike), and
    GGUF lists dimensions fastest-first, so the array's shape is
    ``tuple(reversed(t.shape))``: a Linear weight comes out ``[out, in]``
    (``blk.0.attn_k.weight``, shown as ``[576, 192]`` by GGUF tools, is
    ``[192, 576]``), a norm ``[hidden]``, ``token_embd.weight`` ``[vocab,
    hidden]``. Names are kept as in the file. No reordering, no transposes.
    """
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # slowest-first, as numpy wants
        out[t.name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return out


def build_weights(config: ModelConfig, tensors: dict[str, np.ndarray],
                  unpermute: bool = True) -> Weights:
    """Place the file's tensors (from ``read_tensors``) into mini_vllm's ``Weights``.

    Tensors arrive ``[out, in]``; mini_vllm stores ``[in, out]``. Per layer ``i``
    (names ``blk.i.<part>.weight``)::

        input_norm   = attn_norm                 post_norm = ffn_norm
        qkv_proj     = [attn_q.T | attn_k.T | attn_v.T]     [hidden, q + 2 kv]
        o_proj       = attn_output.T                          [q, hidden]
        gate_up_proj = [ffn_gate.T | ffn_up.T]                [hidden, 2 ffn]
        down_proj    = ffn_down.T                             [ffn, hidden]

    and ``embed_tokens = token_embd`` ``[vocab, hidden]``, ``norm =
    output_norm``, ``lm_head = embed_tokens.T`` when
    ``config.tie_word_embeddings`` (a view of the same memory: a tied head is
    one tensor, not two), else ``output.T``. With ``unpermute=True`` (the
    default) attn_q and attn_k pass through ``unpermute_qk`` with the
    attention heads and the KV heads respectively, for mini_vllm's NeoX
    rotary; with ``unpermute=False`` their rows stay in the file's order, for
    ``apply_rope_gptj``. attn_v is never reordered: it is not rotated. Every
    array is float32 (transposed views are fine: no need to copy into C
    order); ``tensors`` is not modified.

    Raises ValueError naming ``tensors``: a tensor missing (the message names
    it), or one with no place in a Llama of this config (another name, or a
    layer index >= ``num_hidden_layers``).
    """
    c = config
    allowed = {"token_embd.weight", "output_norm.weight"}
    if not c.tie_word_embeddings:
        allowed.add("output.weight")
    for name in tensors:
        m = _BLOCK_TENSOR.fullmatch(name)
        in_model = m is not None and int(m.group(1)) < c.num_hidden_layers and m.group(2) in _LAYER_TENSORS
        if name not in allowed and not in_model:
            raise ValueError(f"tensors: {name} has no place in a llama model with "
                             f"{c.num_hidden_layers} layers")

    def take(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"tensors: missing {name}")
        return tensors[name]

    def columns(*parts: np.ndarray) -> np.ndarray:
        # [out, in] matrices side by side as [in, out] column blocks. A transpose is a
        # view (no copy; BLAS reads either order at the same speed); fusing copies once.
        if len(parts) == 1:
            return parts[0].T
        return np.concatenate([p.T for p in parts], axis=1)

    layers = []
    for i in range(c.num_hidden_layers):
        p = f"blk.{i}."
        q, k = take(p + "attn_q.weight"), take(p + "attn_k.weight")
        if unpermute:
            q = unpermute_qk(q, c.num_attention_heads)
            k = unpermute_qk(k, c.num_key_value_heads)  # k has only the KV heads
        layers.append(LayerWeights(
            input_norm=take(p + "attn_norm.weight"),
            qkv_proj=columns(q, k, take(p + "attn_v.weight")),
            o_proj=columns(take(p + "attn_output.weight")),
            post_norm=take(p + "ffn_norm.weight"),
            gate_up_proj=columns(take(p + "ffn_gate.weight"), take(p + "ffn_up.weight")),
            down_proj=columns(take(p + "ffn_down.weight")),
        ))
    embed = take("token_embd.weight")
    lm_head = embed.T if c.tie_word_embeddings else columns(take("output.weight"))
    return Weights(embed_tokens=embed, layers=layers, norm=take("output_norm.weight"),
                   lm_head=lm_head)


def tokenizer_from_gguf(reader):
    """The model's tokenizer, rebuilt from the header: a ``tokenizers.Tokenizer``.

    ``tokenizer.ggml.model`` must be "gpt2" (byte-level BPE). Build
    ``models.BPE(vocab, merges)`` from ``tokenizer.ggml.tokens`` (id = list
    index) and ``tokenizer.ggml.merges`` (strings "a b" -> pairs ("a", "b")).
    Pre-tokenizer: GPT-2's byte-level rules, ``ByteLevel(add_prefix_space=False)``;
    when ``tokenizer.ggml.pre`` is one of ``DIGIT_SPLITTING_PRE`` (SmolLM2's is
    "smollm"), first ``Digits(individual_digits=True)``, so "2024" is four
    tokens. Decoder: ``decoders.ByteLevel()`` (maps "Ġ" back to a space and
    byte symbols back to UTF-8). Every token whose ``tokenizer.ggml.token_type``
    is 3 (control) is added as a special token, so "<|im_start|>" in a text
    encodes to its one id (1 in SmolLM2) and ``decode(...,
    skip_special_tokens=True)`` drops it. No post-processor: encode adds no BOS.

    Raises ValueError naming ``reader`` when ``tokenizer.ggml.model`` is not
    "gpt2" (or a key is missing).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"reader: tokenizer.ggml.model must be 'gpt2' (byte-level BPE), "
                         f"got {kind!r}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if field(reader, "tokenizer.ggml.pre", None) in DIGIT_SPLITTING_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = field(reader, "tokenizer.ggml.token_type", [])
    specials = [tokens[i] for i, kind in enumerate(types) if kind == TOKEN_TYPE_CONTROL]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def quantized_footprint(reader) -> dict[str, tuple[int, int, int]]:
    """What the file stores, per tensor type: ``{type name: (tensors, weights, bytes)}``.

    For each tensor ``t`` of ``reader.tensors``: its type name is
    ``t.tensor_type.name`` ("Q4_1", "Q8_0", "F32"...), its weight count the
    product of ``t.shape``, and its byte count ``weights // block_size *
    type_size`` with ``block_size, type_size = gguf.GGML_QUANT_SIZES[type]``
    (Q4_1: 32 weights in 20 bytes; Q8_0: 32 in 34; F32: 1 in 4). Compute the
    bytes from that rule, not from ``t.n_bytes``: the tests compare the two.

    Raises ValueError naming ``reader`` when a tensor's weight count is not a
    whole number of its type's blocks.
    """
    from gguf import GGML_QUANT_SIZES

    out: dict[str, list[int]] = {}
    for t in reader.tensors:
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        n = int(np.prod([int(d) for d in t.shape]))
        if n % block:
            raise ValueError(f"reader: tensor {t.name} holds {n} weights, not a whole number "
                             f"of {t.tensor_type.name} blocks of {block}")
        entry = out.setdefault(t.tensor_type.name, [0, 0, 0])
        entry[0] += 1
        entry[1] += n
        entry[2] += n // block * size
    return {name: tuple(v) for name, v in out.items()}


# --------------------------------------------------------------------------
# python solution.py
# --------------------------------------------------------------------------

QUESTION = "What is the capital of France?"


def main() -> None:
    """Load the file your way, answer one chat question in mini_vllm's engine, print a summary."""
    import time

    import threadpoolctl
    from gguf import GGUFReader

    from mini_vllm.engine import LLMEngine
    from mini_vllm.models.hub import model_path
    from mini_vllm.models.llama import LlamaForCausalLM
    from mini_vllm.sampling_params import SamplingParams
    from mini_vllm.tokenizer import render_chat_template

    path = model_path("smollm2")
    if path is None:
        print("SmolLM2 not downloaded: python -m mini_vllm download smollm2")
        return
    with threadpoolctl.threadpool_limits(1, "blas"):
        t0 = time.perf_counter()
        reader = GGUFReader(path)
        config, weights = gguf_to_weights(reader)
        tok = tokenizer_from_gguf(reader)
        load_s = time.perf_counter() - t0
        foot = quantized_footprint(reader)
        n_weights = sum(v[1] for v in foot.values())
        n_bytes = sum(v[2] for v in foot.values())
        print(f"{path.name}: {len(reader.tensors)} tensors, {n_weights:,} weights in "
              f"{n_bytes:,} bytes ({8 * n_bytes / n_weights:.2f} bits/weight)")
        for name, (count, n, b) in sorted(foot.items()):
            print(f"  {name}: {count} tensors, {n:,} weights, {b:,} bytes")
        print(f"config: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
              f"{config.num_attention_heads} heads / {config.num_key_value_heads} KV heads, "
              f"rope_theta {config.rope_theta:g}, tied head {config.tie_word_embeddings}")
        text = render_chat_template(field(reader, "tokenizer.chat_template"),
                                    [{"role": "user", "content": QUESTION}],
                                    add_generation_prompt=True)
        ids = tok.encode(text).ids
        model = LlamaForCausalLM(config, weights,
                                 tokenizer=TokenizerAdapter(tok, config.eos_token_id))
        engine = LLMEngine(model, block_size=16, num_blocks=8)
        out = engine.generate([{"prompt_token_ids": ids}],
                              SamplingParams(temperature=0, max_tokens=16))[0]
        print(f"prompt: {len(ids)} tokens; answer: {out.output_text()!r} = token ids "
              f"{list(out.output_token_ids)}")
        print(f"(parse + dequantize + tokenizer: {load_s:.1f} s)")


if __name__ == "__main__":
    main()
