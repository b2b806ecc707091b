"""A Llama / Qwen2 decoder in numpy, running on a paged KV cache.

One class serves both families; the config says where they differ (Qwen2 has
a bias on q/k/v; Llama may have ``attention_bias`` / ``mlp_bias``; either may
tie the output embedding to the input one). Each layer adds two things to the
residual stream ``x`` (one row per scheduled token)::

    q, k, v = split(RMSNorm(x) @ qkv_proj)          # q: heads, k/v: kv_heads
    q, k    = RoPE(q, positions), RoPE(k, positions)
    write k, v into the paged cache at slot_mapping
    x = x + attention(q, cache, block tables) @ o_proj   # the backend's kernel
    gate, up = split(RMSNorm(x) @ gate_up_proj)
    x = x + (silu(gate) * up) @ down_proj            # the SwiGLU MLP

Like vLLM, q/k/v are one matrix (``qkv_proj``) and gate/up are one matrix
(``gate_up_proj``): fewer, bigger matmuls. Weights are stored ``[in, out]`` so
a layer is ``x @ W``. The batch is flat: ``T`` rows from any number of
requests, prefill chunks and decodes mixed; only attention looks at which
request a row belongs to. The final norm and the LM head run only on the rows
in ``logits_indices`` (one per request), as in vLLM.

The four matmuls of a layer go through ``LinearLayer`` objects (``self.linears``)
whose quantization method owns the weight: float32 by default, int8 / int4 /
FP8 when the model is built with a ``QuantizationConfig`` (see
``mini_vllm/quantization``). ``kv_cache_dtype="fp8"`` stores K and V as FP8 E4M3
(scale 1.0, values clamped to +-448), a quarter of the float32 cache's bytes.

upstream: vllm/model_executor/models/llama.py:501 LlamaForCausalLM
upstream: vllm/model_executor/models/llama.py:316 LlamaDecoderLayer.forward
upstream: vllm/model_executor/models/qwen2.py:120 Qwen2Attention
upstream: vllm/model_executor/layers/rotary_embedding/common.py:18 rotate_neox
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mini_vllm.model_input import ModelInput
from mini_vllm.models.attention import write_kv
from mini_vllm.models.attention_backends import AttentionBackend, NumpyGatherBackend
from mini_vllm.models.config import ModelConfig, rope_inv_freq
from mini_vllm.quantization.base_config import (
    LinearLayer,
    QuantizationConfig,
    QuantizeMethodBase,
    UnquantizedLinearMethod,
)
from mini_vllm.quantization.fp8 import FP8_E4M3_MAX, fp8_dtype


@dataclass(slots=True)
class MoEWeights:
    """A Mixtral layer's MLP: a router and E experts, in vLLM's FusedMoE layout."""

    router: np.ndarray  # [hidden, num_experts]
    w13: np.ndarray  # [num_experts, 2 * intermediate, hidden]: gate rows, then up rows
    w2: np.ndarray  # [num_experts, hidden, intermediate]


@dataclass(slots=True)
class LayerWeights:
    input_norm: np.ndarray  # [hidden]
    qkv_proj: np.ndarray  # [hidden, q_size + 2 * kv_size]
    o_proj: np.ndarray  # [q_size, hidden]
    post_norm: np.ndarray  # [hidden]
    gate_up_proj: np.ndarray | None  # [hidden, 2 * intermediate]; None in a MoE layer
    down_proj: np.ndarray | None  # [intermediate, hidden]; None in a MoE layer
    qkv_bias: np.ndarray | None = None  # [q_size + 2 * kv_size]
    o_bias: np.ndarray | None = None  # [hidden]
    gate_up_bias: np.ndarray | None = None  # [2 * intermediate]
    down_bias: np.ndarray | None = None  # [hidden]
    moe: MoEWeights | None = None  # Mixtral: replaces gate_up_proj / down_proj


@dataclass(slots=True)
class Weights:
    embed_tokens: np.ndarray  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: np.ndarray  # [hidden]
    lm_head: np.ndarray  # [hidden, vocab]; embed_tokens.T when tied


@dataclass(slots=True)
class DecoderLinears:
    """The linear layers of one decoder layer, each with its quantization method.

    A Mixtral layer has no dense MLP: ``gate_up_proj`` and ``down_proj`` are None
    and ``moe`` (a ``FusedMoE``) takes their place.
    """

    qkv_proj: LinearLayer
    o_proj: LinearLayer
    gate_up_proj: LinearLayer | None
    down_proj: LinearLayer | None
    moe: object | None = None  # mini_vllm.models.moe.FusedMoE


# (LayerWeights field, name after "model.layers.N.", bias field): vLLM's module names.
_LINEARS = (
    ("qkv_proj", "self_attn.qkv_proj", "qkv_bias"),
    ("o_proj", "self_attn.o_proj", "o_bias"),
    ("gate_up_proj", "mlp.gate_up_proj", "gate_up_bias"),
    ("down_proj", "mlp.down_proj", "down_bias"),
)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "fp8" is E4M3, as on NVIDIA GPUs


def build_linears(weights: Weights, quant_config: QuantizationConfig | None,
                  top_k: int = 0) -> list[DecoderLinears]:
    """Make every layer's linear layers, load the weights into them, and let each method process them.

    The order is upstream's: ``create_weights`` declares ``layer.weight`` [out, in];
    the checkpoint's array (``[in, out]`` here) is bound to it transposed, a view,
    after the shapes are checked; ``process_weights_after_loading`` quantizes.
    """
    result = []
    for i, lw in enumerate(weights.layers):
        made = {}
        if lw.moe is not None:
            from mini_vllm.models.moe import FusedMoE

            made = {"gate_up_proj": None, "down_proj": None,
                    "moe": FusedMoE(lw.moe.router, lw.moe.w13, lw.moe.w2, top_k=top_k)}
        for field, suffix, bias_field in _LINEARS:
            w = getattr(lw, field)  # [in, out]
            if w is None and lw.moe is not None:
                continue  # the MoE layer's MLP: experts are never quantized here
            in_size, out_size = w.shape
            prefix = f"model.layers.{i}.{suffix}"
            layer = LinearLayer(in_size, out_size, prefix, bias=getattr(lw, bias_field))
            if quant_config is None:
                layer.quant_method = UnquantizedLinearMethod()
            else:  # upstream's rule: a config leaves a layer alone by returning UnquantizedLinearMethod()
                layer.quant_method = quant_config.get_quant_method(layer, prefix)
                if not isinstance(layer.quant_method, QuantizeMethodBase):
                    raise ValueError(f"{type(quant_config).__name__}.get_quant_method returned "
                                     f"{layer.quant_method!r} for {prefix}: every linear layer needs a "
                                     f"QuantizeMethodBase (UnquantizedLinearMethod() leaves it unquantized)")
            layer.quant_method.create_weights(layer, in_size, out_size)
            declared = getattr(layer, "weight", None)
            if getattr(declared, "shape", None) != (out_size, in_size):
                raise ValueError(f"{type(layer.quant_method).__name__}.create_weights must set "
                                 f"layer.weight to shape [output_size, input_size] = "
                                 f"{[out_size, in_size]} for {prefix}, got "
                                 f"{getattr(declared, 'shape', declared)!r}")
            layer.weight = w.T
            layer.quant_method.process_weights_after_loading(layer)
            made[field] = layer
        result.append(DecoderLinears(**made))
    return result


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + np.float32(eps)))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), written so that no exp can overflow.

    sigmoid(x) = exp(min(x, 0)) / (1 + exp(-|x|)): for x >= 0 that is
    1 / (1 + e^-x), below 0 it is e^x / (1 + e^x); both exponents are <= 0.
    Branch-free on purpose: on SmolLM2's MLP activations (965 x 1536) a single
    ``np.where`` over the sign mask took twice as long as this whole function.
    """
    num = np.exp(np.minimum(x, 0))
    den = np.exp(-np.abs(x))
    den += 1
    num /= den
    num *= x
    return num


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (i, i + head_dim/2) by position * inv_freq[i] (the "neox" layout HF uses).

    x: [T, heads, head_dim]; cos, sin: [T, head_dim / 2].
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def kv_cache_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """[layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim], arguments checked.

    One definition for every backend, so numpy and torch caches can never disagree.
    """
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return (config.num_hidden_layers, 2, num_blocks, block_size,
            config.num_key_value_heads, config.head_dim)


class LlamaForCausalLM:
    """The numpy transformer behind the model interface every mini_vllm model shares."""

    def __init__(self, config: ModelConfig, weights: Weights, tokenizer=None,
                 max_model_len: int | None = None, name: str = "llama",
                 quant_config: QuantizationConfig | None = None):
        config.validate()
        if quant_config is not None and not isinstance(quant_config, QuantizationConfig):
            raise ValueError(f"quant_config must be a QuantizationConfig or None, got {quant_config!r}")
        self.config = config
        self.quant_config = quant_config
        if quant_config is not None and config.is_moe:
            raise ValueError("quantization covers dense models only: a mixtral model's experts "
                             "have no quantized method in mini_vllm (use quantization=None)")
        self.linears = build_linears(weights, quant_config, config.num_experts_per_tok)
        if quant_config is not None:
            # The methods hold the weights now; drop this model's references to the
            # float32 matrices so they can be freed (the caller's Weights is untouched).
            no_linears = dict.fromkeys(f for f, _, _ in _LINEARS)
            weights = replace(weights, layers=[replace(lw, **no_linears) for lw in weights.layers])
        self.weights = weights
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = config.vocab_size
        self.eos_token_id = config.eos_token_id
        if max_model_len is None:
            max_model_len = config.max_position_embeddings
        if (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                or not 1 <= max_model_len <= config.max_position_embeddings):
            raise ValueError(f"max_model_len must be an integer in [1, {config.max_position_embeddings}] "
                             f"(the model's max_position_embeddings), got {max_model_len!r}")
        self.max_model_len = max_model_len
        self.inv_freq = rope_inv_freq(config)
        self.scale = config.head_dim ** -0.5
        self.kv_cache: np.ndarray | None = None  # [layers, 2, blocks, block_size, kv_heads, hd]
        self.kv_cache_dtype = "auto"
        self.last_expert_loads: np.ndarray | None = None  # MoE: [layers, experts] of the last forward
        self.attn_backend: AttentionBackend = NumpyGatherBackend()

    attn_platform = "numpy"  # which AttentionBackend classes can serve this model

    def quantized(self, quant_config: QuantizationConfig) -> LlamaForCausalLM:
        """The same model (config, weights, tokenizer, name) with its linear layers quantized.

        This model is left as it is; it must still hold float32 weights.
        """
        if self.quant_config is not None:
            raise ValueError(f"this model is already quantized ({self.quant_config.get_name()}); "
                             f"quantize the float32 model instead")
        return LlamaForCausalLM(self.config, self.weights, tokenizer=self.tokenizer,
                                max_model_len=self.max_model_len, name=self.name,
                                quant_config=quant_config)

    def set_attn_backend(self, backend_cls: type[AttentionBackend]) -> None:
        """Use ``backend_cls`` (already validated by ``get_attn_backend``) in every layer."""
        self.attn_backend = backend_cls()

    # -- the model interface -------------------------------------------------
    supported_kv_cache_dtypes = KV_CACHE_DTYPES

    def init_kv_cache(self, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto") -> None:
        """Allocate K and V for every layer: [num_blocks, block_size, kv_heads, head_dim] each.

        ``kv_cache_dtype``: "auto" (float32, the model's dtype) or "fp8" / "fp8_e4m3".
        """
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {kv_cache_dtype!r}")
        dtype = np.float32 if kv_cache_dtype == "auto" else fp8_dtype()
        self.kv_cache = np.zeros(kv_cache_shape(self.config, num_blocks, block_size), dtype=dtype)
        self.kv_cache_dtype = kv_cache_dtype

    def linear_weight_bytes(self) -> int:
        """Bytes the linear layers' weights take as stored (codes and scales; biases excluded)."""
        return sum(layer.weight_bytes() for lin in self.linears
                   for layer in (lin.qkv_proj, lin.o_proj, lin.gate_up_proj, lin.down_proj)
                   if layer is not None)

    @property
    def kv_cache_bytes(self) -> int:
        return 0 if self.kv_cache is None else self.kv_cache.nbytes

    def execute(self, model_input: ModelInput) -> np.ndarray:
        """Run one step; return float32 logits [len(logits_indices), vocab]."""
        if self.kv_cache is None:
            raise RuntimeError("call init_kv_cache(num_blocks, block_size) before execute()")
        if model_input.block_size != self.kv_cache.shape[3]:
            raise ValueError(f"model_input.block_size ({model_input.block_size}) differs from "
                             f"the KV cache's block_size ({self.kv_cache.shape[3]})")
        hidden = self.forward(model_input)
        return self.compute_logits(hidden[model_input.logits_indices])

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Final RMSNorm and LM head, only for the rows that are sampled."""
        x = rms_norm(hidden, self.weights.norm, self.config.rms_norm_eps)
        return x @ self.weights.lm_head

    # -- the forward pass ----------------------------------------------------
    def forward(self, model_input: ModelInput) -> np.ndarray:
        """The residual stream after the last layer, every row: [T, hidden]."""
        c, w = self.config, self.weights
        num_tokens = model_input.num_tokens
        x = w.embed_tokens[model_input.token_ids]
        angles = model_input.positions.astype(np.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angles), np.sin(angles)
        fp8_cache = self.kv_cache_dtype != "auto"
        if c.is_moe:  # tokens routed to each expert, per layer, in this forward pass
            self.last_expert_loads = np.zeros((c.num_hidden_layers, c.num_local_experts), np.int64)
        for layer_idx, (lw, lin) in enumerate(zip(w.layers, self.linears, strict=True)):
            h = rms_norm(x, lw.input_norm, c.rms_norm_eps)
            qkv = lin.qkv_proj(h)
            q = qkv[:, :c.q_size].reshape(num_tokens, c.num_attention_heads, c.head_dim)
            k = qkv[:, c.q_size:c.q_size + c.kv_size].reshape(
                num_tokens, c.num_key_value_heads, c.head_dim)
            v = qkv[:, c.q_size + c.kv_size:].reshape(num_tokens, c.num_key_value_heads,
                                                      c.head_dim)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if fp8_cache:  # scale 1.0: clamp to E4M3's range, since the cast would give NaN
                k, v = np.clip(k, -FP8_E4M3_MAX, FP8_E4M3_MAX), np.clip(v, -FP8_E4M3_MAX, FP8_E4M3_MAX)
            k_cache, v_cache = self.kv_cache[layer_idx]
            write_kv(k_cache, v_cache, k, v, model_input.slot_mapping)
            attn = self.attn_backend.forward(q, k_cache, v_cache, model_input, self.scale)
            x = x + lin.o_proj(attn.reshape(num_tokens, c.q_size))

            h = rms_norm(x, lw.post_norm, c.rms_norm_eps)
            if lin.moe is not None:  # Mixtral: route each token to top_k of the experts
                x = x + lin.moe(h)
                self.last_expert_loads[layer_idx] = lin.moe.last_expert_loads
                continue
            gate_up = lin.gate_up_proj(h)
            act = silu(gate_up[:, :c.intermediate_size])
            act *= gate_up[:, c.intermediate_size:]  # silu(gate) * up, in place
            x = x + lin.down_proj(act)
        return x


def random_weights(config: ModelConfig, seed: int = 0) -> Weights:
    """Seeded random weights, scaled so logits spread out (std about 1), never near-ties.

    Linear layers are N(0, 1/fan_in); norm weights are 1 + N(0, 0.1^2) so they
    matter; biases are present exactly where the config asks for them.
    """
    rng = np.random.default_rng(seed)
    c = config

    def mat(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)

    def vec(n: int, mean: float = 0.0, std: float = 0.1) -> np.ndarray:
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    def experts() -> MoEWeights:
        e, h, f = c.num_local_experts, c.hidden_size, c.intermediate_size
        # the router is scaled up so that tokens really choose between experts
        return MoEWeights(router=mat(h, e) * np.float32(4),
                          w13=np.stack([mat(h, 2 * f).T for _ in range(e)]),
                          w2=np.stack([mat(f, h).T for _ in range(e)]))

    qkv_out = c.q_size + 2 * c.kv_size
    layers = [
        LayerWeights(
            input_norm=vec(c.hidden_size, 1.0),
            qkv_proj=mat(c.hidden_size, qkv_out),
            o_proj=mat(c.q_size, c.hidden_size),
            post_norm=vec(c.hidden_size, 1.0),
            gate_up_proj=None if c.is_moe else mat(c.hidden_size, 2 * c.intermediate_size),
            down_proj=None if c.is_moe else mat(c.intermediate_size, c.hidden_size),
            qkv_bias=vec(qkv_out) if c.qkv_bias else None,
            o_bias=vec(c.hidden_size) if c.o_bias else None,
            gate_up_bias=vec(2 * c.intermediate_size) if c.mlp_bias else None,
            down_bias=vec(c.hidden_size) if c.mlp_bias else None,
            moe=experts() if c.is_moe else None,
        )
        for _ in range(c.num_hidden_layers)
    ]
    embed = rng.standard_normal((c.vocab_size, c.hidden_size)).astype(np.float32)
    lm_head = embed.T if c.tie_word_embeddings else mat(c.hidden_size, c.vocab_size)
    return Weights(embed_tokens=embed, layers=layers, norm=vec(c.hidden_size, 1.0),
                   lm_head=lm_head)
