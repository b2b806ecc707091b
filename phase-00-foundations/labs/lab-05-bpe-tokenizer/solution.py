"""Lab 00-05 — a byte-level BPE tokenizer, trained on the lab's own corpus (reference).

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
from itertools import pairwise

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
    """Count every adjacent pair (overlapping windows) in every word, times its frequency."""
    counts: dict[tuple[int, int], int] = {}
    for word, freq in words.items():
        for pair in pairwise(word):
            counts[pair] = counts.get(pair, 0) + freq
    return counts


def merge_pair(ids: tuple[int, ...] | list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace each occurrence of ``pair``, scanning left to right without overlap."""
    out: list[int] = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """Learn ``vocab_size - 256`` merges (fewer if the text runs out of pairs).

    Merge ``i`` creates id ``256 + i``. Each round picks the pair with the highest
    count, breaking ties by the smallest pair.
    """
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be >= 256 (the byte alphabet), got {vocab_size}")
    words: dict[tuple[int, ...], int] = {}
    for piece in pretokenize(text):
        key = tuple(piece.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    merges: list[tuple[int, int]] = []
    for new_id in range(256, vocab_size):
        counts = get_pair_counts(words)
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        merged: dict[tuple[int, ...], int] = {}
        for word, freq in words.items():
            key = tuple(merge_pair(word, best, new_id))
            merged[key] = merged.get(key, 0) + freq
        words = merged
    return merges


def vocab_bytes(merges: list[tuple[int, int]]) -> list[bytes]:
    """The byte string every id stands for: ids 0..255 are single bytes."""
    table = [bytes([b]) for b in range(256)]
    for a, b in merges:
        table.append(table[a] + table[b])
    return table


def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """Token ids of ``text``: each pre-token's bytes, merged lowest rank first."""
    rank = {pair: i for i, pair in enumerate(merges)}
    ids: list[int] = []
    for piece in pretokenize(text):
        word = list(piece.encode("utf-8"))
        while len(word) > 1:
            pair = min(pairwise(word), key=lambda p: rank.get(p, len(rank)))
            if pair not in rank:
                break
            word = merge_pair(word, pair, 256 + rank[pair])
        ids.extend(word)
    return ids


def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of ``ids``; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
    table = vocab_bytes(merges)
    for i in ids:
        if not 0 <= i < len(table):
            raise ValueError(f"token id must be in [0, {len(table)}), got {i}")
    return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


def compression_ratio(text: str, merges: list[tuple[int, int]]) -> float:
    """Bytes per BPE token: how many byte-tokenizer tokens one BPE token replaces."""
    n_bytes = len(text.encode("utf-8"))
    if n_bytes == 0:
        raise ValueError("text must not be empty")
    return n_bytes / len(encode(text, merges))


def kv_bytes_for_text(text: str, merges: list[tuple[int, int]], kv_bytes_per_token: int) -> tuple[int, int]:
    """KV-cache bytes to hold ``text``: (one byte per token, BPE tokens)."""
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    return (
        len(text.encode("utf-8")) * kv_bytes_per_token,
        len(encode(text, merges)) * kv_bytes_per_token,
    )


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
