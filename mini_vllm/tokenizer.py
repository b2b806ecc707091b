"""Tokenizers: text <-> token ids behind one tiny interface.

The engine never looks inside a tokenizer; it needs ``encode``, ``decode``,
``vocab_size`` and ``eos_token_id``. ``ByteTokenizer`` is the whole idea in a
few lines (one UTF-8 byte is one token, plus an end-of-sequence id), so every
number in the course can be computed by hand: ``"hello"`` is 5 tokens.
``HFTokenizer`` puts a real Hugging Face ``tokenizer.json`` behind the same
interface for the numpy transformer in ``mini_vllm/models``.

In vLLM the tokenizer lives in the front end, outside the engine core: the
core only ever sees ``prompt_token_ids``.
upstream: vllm/v1/engine/detokenizer.py:309 check_stop_strings (text-side stop checks)
"""
from __future__ import annotations

import json
from pathlib import Path


class ByteTokenizer:
    """One UTF-8 byte is one token; id 256 is EOS; the vocabulary has 257 ids."""

    vocab_size = 257
    eos_token_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Ids >= 256 (EOS) carry no text; a cut in the middle of a multi-byte
        # character becomes U+FFFD instead of raising.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """The same interface over a Hugging Face ``tokenizer.json`` (via ``tokenizers``).

    ``path`` is the json file or a folder holding it. The EOS id is taken from
    ``eos_token_id`` if given, else from the folder's ``tokenizer_config.json``
    or ``config.json``; it is ``None`` when none says. ``encode`` adds the
    tokenizer's special tokens (a BOS for Llama) by default, as Hugging Face does.
    """

    def __init__(
        self, path: str | Path, eos_token_id: int | None = None, add_special_tokens: bool = True
    ) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"path: no tokenizer.json at {file}")
        self._tok = Tokenizer.from_file(str(file))
        self.add_special_tokens = add_special_tokens
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_token_id: int | None = (
            eos_token_id if eos_token_id is not None else self._find_eos(folder)
        )

    def _find_eos(self, folder: Path) -> int | None:
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            eos = json.loads(cfg.read_text()).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and self._tok.token_to_id(eos) is not None:
                return self._tok.token_to_id(eos)
        cfg = folder / "config.json"
        if cfg.is_file():
            eos = json.loads(cfg.read_text()).get("eos_token_id")
            if isinstance(eos, list):
                eos = eos[0] if eos else None
            if isinstance(eos, int):
                return eos
        return None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)
