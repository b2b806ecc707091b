"""Record SmolLM2's golden values from transformers (a dev script, not run in CI).

    python -m mini_vllm download smollm2
    python benchmarks/record_smollm2_golden.py      # about a minute; needs torch,
                                                    # transformers, accelerate

It writes ``mini_vllm/tests/golden/smollm2.json``, which
``mini_vllm/tests/test_smollm2_*.py`` compare mini_vllm against. Everything in
it comes from transformers reading the GGUF on its own (``gguf_file=``), not
from mini_vllm's converted folder, so the two implementations check each other:

- ``tokenizer``: ids of hard texts. One deliberate change to transformers'
  GGUF tokenizer: it does not know the file's ``tokenizer.ggml.pre = "smollm"``
  and falls back to plain GPT-2 byte-level splitting, while the model's own
  tokenizer.json (and llama.cpp's "smollm" rule) split every digit off first.
  The two differ only where digits follow spaces (``"a  1"``); the script puts
  the digit split in front and prints the texts where that changed the ids.
- ``chat``: for 4 chat prompts (rendered by transformers' template code), the
  prompt ids, 16 greedy tokens from ``generate`` (float32, one thread, an
  explicit ``attention_mask``: the pad id ``<|im_end|>`` occurs in every chat
  prompt, so transformers cannot infer the mask), and the first step's logits
  at the top 20 ids plus 64 fixed random ids.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "mini_vllm" / "tests" / "golden" / "smollm2.json"

TEXTS = [
    "",
    "Hello, world!",
    "The year 2024 had 366 days; pi is 3.14159.",
    "a  1   22\t333\n4444",
    "naïve café, Straße, 東京タワー, Привет мир",
    "emoji: 🙂👍🏽 🇫🇷 👨‍👩‍👧",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "   leading and trailing spaces   ",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm you're it's",
    "<|endoftext|>not<|im_end|>special?",
]

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
]
MAX_NEW_TOKENS = 16


def main() -> None:
    import numpy as np
    import torch
    import transformers
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mini_vllm.models import hub

    torch.set_num_threads(1)
    gguf = hub.require("smollm2")
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    backend = tok.backend_tokenizer
    plain = {t: backend.encode(t, add_special_tokens=False).ids for t in TEXTS}
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    ids = {t: backend.encode(t, add_special_tokens=False).ids for t in TEXTS}
    for t in TEXTS:
        if plain[t] != ids[t]:
            print(f"digit split changed the ids of {t!r}: {plain[t]} -> {ids[t]}")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    model.eval()
    print(f"transformers {transformers.__version__}: tokenizer and model loaded in "
          f"{time.perf_counter() - t0:.1f} s")

    probe = np.random.default_rng(0).choice(model.config.vocab_size, 64, replace=False)
    chats = []
    for prompt in PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                       add_generation_prompt=True, tokenize=False)
        prompt_ids = backend.encode(text, add_special_tokens=False).ids
        x = torch.tensor([prompt_ids])
        mask = torch.ones_like(x)
        with torch.no_grad():
            logits = model(input_ids=x, attention_mask=mask).logits[0, -1].numpy()
            out = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
        tokens = out[0, len(prompt_ids):].tolist()
        top = np.argsort(-logits)[:20]
        chats.append({
            "prompt": prompt,
            "text": text,
            "prompt_ids": prompt_ids,
            "greedy_ids": tokens,
            "greedy_text": tok.decode(tokens, skip_special_tokens=True),
            "logit_ids": [int(i) for i in np.concatenate([top, probe])],
            "logits": [round(float(logits[i]), 6) for i in np.concatenate([top, probe])],
        })
        print(f"{prompt!r} -> {chats[-1]['greedy_text']!r}")

    golden = {
        "source": (f"transformers {transformers.__version__}, torch {torch.__version__}, "
                   f"float32, 1 thread, GGUF {gguf.name} read by transformers itself; "
                   "recorded by benchmarks/record_smollm2_golden.py"),
        "max_new_tokens": MAX_NEW_TOKENS,
        "tokenizer": [{"text": t, "ids": ids[t]} for t in TEXTS],
        "chat": chats,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
