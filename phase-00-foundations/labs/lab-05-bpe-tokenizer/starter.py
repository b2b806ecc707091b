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
    """Count every adjacent pair (overlapping windows) in every word, times its frequency.

    ``words`` maps a word (a tuple of ids) to how often it occurs. For each word,
    every window (w[i], w[i+1]) adds ``freq`` to that pair's count
    (itertools.pairwise yields the windows): "aaa" holds the pair (a, a) twice.
    Return a plain dict {pair: count}.
    """
    raise NotImplementedError("get_pair_counts: your turn (see the docstring)")


def merge_pair(ids: tuple[int, ...] | list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace each occurrence of ``pair``, scanning left to right without overlap.

    Walk i from 0: if ids[i], ids[i+1] equal the pair, emit ``new_id`` and jump by
    two; otherwise emit ids[i] and step by one. Return a new list.
    merge_pair(b"aaab", (97, 97), 256) is [256, 97, 98].
    """
    raise NotImplementedError("merge_pair: your turn (see the docstring)")


def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:
    """Learn ``vocab_size - 256`` merges (fewer if the text runs out of pairs).

    Merge ``i`` creates id ``256 + i``. Each round picks the pair with the highest
    count, breaking ties by the smallest pair.

    Recipe:
      1. vocab_size below 256 -> ValueError naming vocab_size.
      2. words = {tuple(piece.encode("utf-8")): count} over pretokenize(text).
      3. For new_id in 256 .. vocab_size-1: counts = get_pair_counts(words); stop if
         empty; best = min(counts, key=lambda p: (-counts[p], p)); record it;
         rebuild words with merge_pair(word, best, new_id) (equal results add up).
      4. Return the list of merged pairs, in order.
    """
    raise NotImplementedError("train_bpe: your turn (see the docstring)")


def vocab_bytes(merges: list[tuple[int, int]]) -> list[bytes]:
    """The byte string every id stands for: ids 0..255 are single bytes.

    Start from [bytes([b]) for b in range(256)]; for each merge (a, b) append
    table[a] + table[b]. Merged ids only ever refer to smaller ids, so one pass works.
    """
    raise NotImplementedError("vocab_bytes: your turn (see the docstring)")


def encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """Token ids of ``text``: each pre-token's bytes, merged lowest rank first.

    Recipe: rank = {pair: index in merges}. For each piece in pretokenize(text):
    word = list(piece.encode("utf-8")); while it has two or more ids, find the
    adjacent pair with the lowest rank (pairs not in ``rank`` never win); if none
    is mergeable stop, else word = merge_pair(word, pair, 256 + rank[pair]).
    Concatenate the words.
    """
    raise NotImplementedError("encode: your turn (see the docstring)")


def decode(ids: list[int], merges: list[tuple[int, int]]) -> str:
    """The text of ``ids``; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD.

    Recipe: table = vocab_bytes(merges); an id outside ``range(len(table))``,
    negative ones included (Python would quietly index from the end), ->
    ValueError whose message contains "token id"; join the byte strings and
    decode as UTF-8 with errors="replace".
    """
    raise NotImplementedError("decode: your turn (see the docstring)")


def compression_ratio(text: str, merges: list[tuple[int, int]]) -> float:
    """Bytes per BPE token: how many byte-tokenizer tokens one BPE token replaces.

    Recipe: empty text -> ValueError mentioning "text"; return
    len(text.encode("utf-8")) / len(encode(text, merges)).
    """
    raise NotImplementedError("compression_ratio: your turn (see the docstring)")


def kv_bytes_for_text(text: str, merges: list[tuple[int, int]], kv_bytes_per_token: int) -> tuple[int, int]:
    """KV-cache bytes to hold ``text``: (one byte per token, BPE tokens).

    Recipe: kv_bytes_per_token must be > 0 (ValueError naming it). Multiply each
    token count (bytes, BPE ids) by kv_bytes_per_token.
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
