"""Tokenizers: text <-> token ids behind one tiny interface.

The engine never looks inside a tokenizer; it needs ``encode``, ``decode``,
``vocab_size`` and ``eos_token_id``. ``ByteTokenizer`` is the whole idea in a
few lines (one UTF-8 byte is one token, plus an end-of-sequence id), so every
number in the course can be computed by hand: ``"hello"`` is 5 tokens.
``HFTokenizer`` puts a real Hugging Face ``tokenizer.json`` behind the same
interface for the numpy transformer in ``mini_vllm/models``, plus the model's
chat template (``apply_chat_template``), rendered with jinja2 as transformers does.

In vLLM the tokenizer lives in the front end, outside the engine core: the
core only ever sees ``prompt_token_ids``.
upstream: vllm/v1/engine/detokenizer.py:309 check_stop_strings (text-side stop checks)
upstream: vllm/renderers/hf.py:634 safe_apply_chat_template
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
    ``chat_template`` is tokenizer_config.json's, or None.
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
        cfg = folder / "tokenizer_config.json"
        self._config = json.loads(cfg.read_text()) if cfg.is_file() else {}
        template = self._config.get("chat_template")
        self.chat_template: str | None = template if isinstance(template, str) else None

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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tokenize: bool = True) -> list[int] | str:
        """Render a conversation with the model's template: token ids, or the text.

        ``messages`` is ``[{"role": "user", "content": "..."}, ...]``;
        ``add_generation_prompt`` ends the text with the header of the
        assistant's turn, so the model answers instead of continuing the user.
        Same names and defaults as transformers' method.
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat_template in tokenizer_config.json")
        text = render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    bos_token=_token_text(self._config.get("bos_token")),
                                    eos_token=_token_text(self._config.get("eos_token")))
        if not tokenize:
            return text
        # The template writes any BOS itself; special tokens must not be added twice.
        return self._tok.encode(text, add_special_tokens=False).ids


def _token_text(token: object) -> str:
    if isinstance(token, dict):  # {"content": "<s>", ...} in older tokenizer_config files
        token = token.get("content")
    return token if isinstance(token, str) else ""


def render_chat_template(template: str, messages: list[dict], add_generation_prompt: bool = False,
                         **variables: object) -> str:
    """A chat template rendered in jinja2's sandbox (a template is code from a file).

    Uses the environment settings transformers uses (``trim_blocks``,
    ``lstrip_blocks``, loop controls, a ``tojson`` filter, ``raise_exception``),
    so a template renders here exactly as it does there.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, "
                         f"got {messages!r:.60}")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', "
                             f"got {m!r:.60}")
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v, indent=None, **kw: json.dumps(
        v, indent=indent, **{"ensure_ascii": False, **kw})
    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template: syntax error on line {exc.lineno}: {exc.message}") from None
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               **variables)
    except jinja2.TemplateError as exc:  # an undefined name, or the sandbox refusing something
        raise ValueError(f"chat template: {type(exc).__name__}: {exc}") from None
