"""ModelConfig: the handful of numbers that fix a Llama / Qwen2 transformer.

Read from a Hugging Face ``config.json`` (``ModelConfig.from_hf``) or built by
``tiny_random_config()`` for the seeded default model. Only what the forward
pass needs is kept; anything that would change the math in a way this package
does not implement (sliding windows, an unknown RoPE scaling, another
activation) is refused here with a one-line error naming the file and the key,
instead of producing wrong tokens later.

upstream: vllm/config/model.py:117 ModelConfig
"""
from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass, field, replace

# config.json "architectures" entry -> the family name used below.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(ValueError):
    """A config.json this package cannot run (the message names file and key)."""


@dataclass(slots=True)
class ModelConfig:
    architecture: str  # "llama", "qwen2" or "mixtral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)  # {"rope_type": ..., "factor": ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: always; Llama: attention_bias
    o_bias: bool = False  # Llama with attention_bias also has a bias on o_proj
    mlp_bias: bool = False  # Llama mlp_bias
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    num_local_experts: int = 0  # Mixtral: experts per MoE layer (0: a dense MLP)
    num_experts_per_tok: int = 0  # Mixtral: top_k, the experts each token uses

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """K and V, every layer, one token: 2 * layers * kv_heads * head_dim * itemsize."""
        return 2 * self.num_hidden_layers * self.kv_size * itemsize

    def validate(self, source: str = "config") -> None:
        def bad(key: str, why: str) -> ModelConfigError:
            return ModelConfigError(f"{source}: {key} {why}")

        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim",
                    "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise bad(key, f"must be >= 1, got {getattr(self, key)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad("num_key_value_heads", f"({self.num_key_value_heads}) must divide "
                      f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim % 2:
            raise bad("head_dim", f"must be even for rotary embeddings, got {self.head_dim}")
        if (self.architecture == "mixtral") != self.is_moe:
            raise bad("num_local_experts", f"must be >= 1 for mixtral and 0 otherwise, got "
                      f"{self.num_local_experts} for {self.architecture}")
        if self.is_moe and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise bad("num_experts_per_tok", f"must be in [1, {self.num_local_experts}] "
                      f"(num_local_experts), got {self.num_experts_per_tok}")
        if self.is_moe and (self.qkv_bias or self.o_bias or self.mlp_bias):
            raise bad("attention_bias", "is not part of a mixtral model")
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise bad("rope_scaling", f"type {rope_type!r} is not supported "
                      f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")

    def to_hf_dict(self) -> dict:
        """A config.json that transformers reads back as the same model."""
        arch = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.architecture]
        if self.architecture == "qwen2" and (self.o_bias or self.mlp_bias or not self.qkv_bias):
            raise ModelConfigError("config: a qwen2 model has q/k/v biases and no other bias")
        if self.architecture == "llama" and self.qkv_bias != self.o_bias:
            raise ModelConfigError("config: llama's attention_bias covers q/k/v and o together")
        d = {
            "architectures": [arch],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_id": self.eos_token_id,
            "bos_token_id": self.bos_token_id,
            "torch_dtype": "float32",
        }
        if self.rope_scaling.get("rope_type", "default") != "default":
            d["rope_scaling"] = dict(self.rope_scaling)
        if self.architecture == "llama":
            d["attention_bias"] = self.qkv_bias
            d["mlp_bias"] = self.mlp_bias
        if self.is_moe:
            d["num_local_experts"] = self.num_local_experts
            d["num_experts_per_tok"] = self.num_experts_per_tok
        return d

    @classmethod
    def from_hf(cls, path: str | pathlib.Path) -> ModelConfig:
        """Parse a Hugging Face config.json (a file, or a folder holding one)."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json (a model folder needs one)")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_hf_dict(d, source=str(path))

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> ModelConfig:
        archs = d.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES),
                      None)
        if family is None and not archs:  # older files may name only the model_type
            family = {"llama": "llama", "qwen2": "qwen2", "mixtral": "mixtral"}.get(
                d.get("model_type", ""))
        if family is None:
            what = ", ".join(archs) or f"model_type {d.get('model_type')!r}"
            raise ModelConfigError(
                f"{source}: architecture {what} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def need(key: str):
            if key not in d:
                raise ModelConfigError(f"{source}: missing key {key!r}")
            return d[key]

        if d.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"{source}: hidden_act {d['hidden_act']!r} is not supported "
                                   "(only 'silu', the SwiGLU MLP)")
        if d.get("use_sliding_window"):
            raise ModelConfigError(f"{source}: use_sliding_window is not supported")

        # transformers >= 5 nests RoPE settings in "rope_parameters"; older files
        # keep "rope_theta" at the top level and scaling in "rope_scaling".
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope_theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
        rope.setdefault("rope_type", "default")

        heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        eos = d.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])
                        if e is not None)
        attention_bias = bool(d.get("attention_bias", False))
        cfg = cls(
            architecture=family,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family == "llama" and attention_bias,
            mlp_bias=family == "llama" and bool(d.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
            bos_token_id=d.get("bos_token_id"),
            num_local_experts=int(need("num_local_experts")) if family == "mixtral" else 0,
            num_experts_per_tok=int(need("num_experts_per_tok")) if family == "mixtral" else 0,
        )
        cfg.validate(source)
        return cfg


def tiny_random_config() -> ModelConfig:
    """The default model's shape: small enough that engine tests take milliseconds.

    vocab_size 257 and EOS 256 match ByteTokenizer, so text in, text out works
    with no files at all.
    """
    return ModelConfig(
        architecture="llama",
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_ids=(256,),
    )


def tiny_moe_config() -> ModelConfig:
    """tiny-random's shape with Mixtral's MLP: 4 experts of intermediate size 96, top-2."""
    return replace(tiny_random_config(), architecture="mixtral", intermediate_size=96,
                   num_local_experts=4, num_experts_per_tok=2)


def rope_inv_freq(cfg: ModelConfig):
    """Inverse frequencies of the rotary embedding, in float32 as transformers computes them.

    ``default``: theta ** (-2i / head_dim). ``linear``: divided by ``factor``.
    ``llama3``: long wavelengths divided by ``factor``, short ones kept, the band
    between them interpolated (Llama 3.1's context extension).
    """
    import numpy as np

    dim = cfg.head_dim
    inv = (1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))).astype(
        np.float32)
    rs = cfg.rope_scaling
    kind = rs.get("rope_type", "default")
    if kind == "linear":
        inv = inv / np.float32(rs["factor"])
    elif kind == "llama3":
        factor = float(rs["factor"])
        low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old_len = float(rs.get("original_max_position_embeddings", cfg.max_position_embeddings))
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)
