"""Lab 00-05 — a byte-level BPE tokenizer, trained on the lab's own corpus (starter).

Text is split into pre-tokens (a word with its leading space, a run of digits,
a run of punctuation, a run of whitespace), each pre-token becomes its UTF-8
bytes (ids 0..255), and training repeatedly merges the most frequent adjacent
pair of ids into a new id (256, 257, ...). Merges never cross a pre-token
boundary. Ties in frequency go to the smallest pair ``(a, b)``: the same rule as
the Hugging Face ``tokenizers`` BPE trainer, which the tests use as an oracle.

Encoding applies the learned merges to new text, lowest rank first; decoding
expands every id back to its bytes. Because every id stands for a fixed byte
string, ``decode(encode(s)) == s`` for any string at all.

mini_vllm uses the simplest tokenizer possible (one byte, one token:
mini_vllm/tokenizer.py ByteTokenizer); this lab measures what BPE buys over it.
"""
from __future__ import annotations

import pathlib
import re
import sys
from itertools import pairwise  # noqa: F401  (handy for pair counting)

CORPUS_PATH = pathlib.Path(__file__).with_name("corpus.txt")

# A simplified GPT-2 style split: letters with an optional leading space, digits,
# other symbols, whitespace (a run of spaces before a word leaves its last space
# to the word), and underscores. Every character of any string matches one branch.
PRETOKEN = re.compile(r" ?[^\W\d_]+| ?\d+| ?[^\w\s]+|\s+(?!\S)|\s+|_+")


# Text the tokenizer never trained on, for honest compression numbers.
HELD_OUT = (
    "A ferry left the harbour at noon and the keeper wrote its name in the book. "
    "Later the wind turned, the fog came in, and the mail boat waited by the quay "
    "until the sea was calm again. Counting is patient work; the numbers keep."
)


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into pre-tokens; joining them gives ``text`` back."""
    return PRETOKEN.findall(text)


def load_corpus() -> str:
    return CORPUS_PATH.read_text(encoding="utf-8")


def get_pair_counts(words: dict[tuple[int, ...], int]) -> dict[tuple[int, int], int]:
    """How often each adjacent pair of ids occurs, weighted by word frequency.

    ``words`` maps a word (a tuple of ids) to how often it occurs. Every window of
    two neighbouring ids counts, overlapping ones included ("aaa" holds (a, a)
    twice), and each occurrence adds the word's frequency. Returns a plain dict
    {pair: count} holding only pairs that occur.
    """
    raise NotImplementedError("get_pair_counts: your turn (see the docstring)")


def merge_pair(ids: tuple[int, ...] | list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ids`` with every occurrence of ``pair`` replaced by ``new_id``.

    Occurrences are found left to right and never overlap: once two ids are
    merged, neither can be part of another match. Returns a new list; the input is
    not modified. merge_pair(b"aaab", (97, 97), 256) is [256, 97, 98].
    """
    raise NotImplementedError("merge_pair: your turn (see the docstring)")


def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """Learn ``vocab_size - 256`` merges from ``text`` (fewer if it runs out of pairs).

    Contract:
      * Merge ``i`` creates id ``256 + i``; the result is the list of merged pairs,
        in the order learned.
      * Each round merges the most frequent adjacent pair; ties go to the
        smallest pair (as tuples), the rule of the Hugging Face trainer.
      * Pairs are counted inside pre-tokens only (``pretokenize``), so no merge
        crosses a word, digit or punctuation boundary.
      * Deterministic: a smaller vocabulary's merges are a prefix of a larger one's.
    Errors: ``vocab_size`` below 256 (the byte alphabet) is a ValueError naming it.
    """
    raise NotImplementedError("train_bpe: your turn (see the docstring)")


def vocab_bytes(merges: list[tuple[int, int]]) -> list[bytes]:
    """The byte string every id stands for, as a list indexed by id.

    Ids 0..255 are the single bytes; merge ``i`` stands for its two parts joined,
    in order. Length: 256 + len(merges).
    """
    raise NotImplementedError("vocab_bytes: your turn (see the docstring)")


def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """Token ids of ``text`` under ``merges``.

    Each pre-token is encoded separately, starting from its UTF-8 bytes; the
    learned merges are applied by rank (earliest learned first, not leftmost
    first) until no adjacent pair of the pre-token is a learned merge. With no
    merges the result is the UTF-8 bytes. Every id maps back to its bytes, so
    decoding gives ``text`` back exactly.
    """
    raise NotImplementedError("encode: your turn (see the docstring)")


def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of ``ids``.

    The ids' byte strings are joined and read as UTF-8; an invalid sequence (a
    multi-byte character cut in two) becomes U+FFFD rather than an error.
    Errors: an id outside ``0 .. 255 + len(merges)``, negative ones included, is a
    ValueError whose message contains "token id".
    """
    raise NotImplementedError("decode: your turn (see the docstring)")


def compression_ratio(text: str, merges: list[tuple[int, int]]) -> float:
    """UTF-8 bytes per BPE token: how many byte-tokenizer tokens one BPE token replaces.

    A float; 1.0 with no merges. Lengths are in UTF-8 bytes, not characters.
    Errors: empty ``text`` is a ValueError mentioning text.
    """
    raise NotImplementedError("compression_ratio: your turn (see the docstring)")


def kv_bytes_for_text(text: str, merges: list[tuple[int, int]], kv_bytes_per_token: int) -> tuple[int, int]:
    """KV-cache bytes to hold ``text``: ``(as one token per byte, as BPE tokens)``.

    Errors: ``kv_bytes_per_token`` not > 0 is a ValueError naming it.
    """
    raise NotImplementedError("kv_bytes_for_text: your turn (see the docstring)")


def main(out: str = "bpe_compression.png", vocab_size: int = 512) -> None:
    """Train on the corpus, print what the merges do to length and KV memory, plot it."""
    corpus = load_corpus()
    merges = train_bpe(corpus, vocab_size)
    table = vocab_bytes(merges)
    print(f"corpus: {len(corpus.encode('utf-8'))} bytes; learned {len(merges)} merges")
    print("first ten merges:", [table[256 + i].decode("utf-8", "replace") for i in range(10)])
    print("longest tokens:", sorted((t for t in table[256:]), key=len)[-5:])
    every = train_bpe(corpus, 2000)  # a smaller vocabulary's merges are a prefix of these
    print(f"{'vocab':>6} {'corpus bytes/token':>19} {'held-out bytes/token':>21}")
    for size in (256, 300, 400, 512, 1024):
        m = every[: size - 256]
        print(f"{size:>6} {compression_ratio(corpus, m):>19.2f} {compression_ratio(HELD_OUT, m):>21.2f}")
    kv_byte, kv_bpe = kv_bytes_for_text(corpus, merges, 131_072)
    print(
        f"KV to hold the corpus at Llama-3.1-8B's 128 KiB/token: "
        f"{kv_byte / 2**20:.0f} MiB as bytes, {kv_bpe / 2**20:.0f} MiB as BPE-{vocab_size} tokens"
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(range(256, 256 + len(every) + 1, 16))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [compression_ratio(corpus, every[: s - 256]) for s in sizes], label="training corpus")
    ax.plot(sizes, [compression_ratio(HELD_OUT, every[: s - 256]) for s in sizes], label="held-out text")
    ax.set_xlabel("vocabulary size (256 bytes + merges)")
    ax.set_ylabel("bytes per token")
    ax.set_title("What BPE merges buy over one byte per token")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
