"""Lab 00-05 — byte-level BPE: lossless, deterministic, shorter, and equal to the HF trainer."""
from course import load_impl

impl = load_impl(__file__)

import functools  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CORPUS = impl.load_corpus()
MiB = 1 << 20

# Any Unicode string without surrogates (which UTF-8 cannot encode), built from code
# points so hypothesis need not build its Unicode tables (slow on a fresh checkout).
CODE_POINT = st.one_of(
    st.integers(0x00, 0x7F), st.integers(0x80, 0xD7FF), st.integers(0xE000, 0x10FFFF)
)
ANY_TEXT = st.lists(CODE_POINT, max_size=60).map(lambda cps: "".join(map(chr, cps)))


@functools.cache
def all_merges() -> tuple[tuple[int, int], ...]:
    """Every merge the corpus allows (training stops when no pair is left)."""
    return tuple(impl.train_bpe(CORPUS, 2000))


def merges(vocab_size: int) -> tuple[tuple[int, int], ...]:
    # Training is greedy and deterministic, so a smaller vocabulary's merges are a
    # prefix of a larger one's (test_merges_are_deterministic... checks it).
    return all_merges()[: vocab_size - 256]


def test_pair_counts_and_the_first_merge_of_aaabdaaabac():
    word = tuple(b"aaabdaaabac")
    counts = impl.get_pair_counts({word: 1})
    # overlapping windows: "aaa" holds (a, a) twice, and the word has two "aaa"
    assert counts[(97, 97)] == 4, "count (a, a) over overlapping windows: 2 in each 'aaa'"
    assert counts[(97, 98)] == 2
    assert impl.train_bpe("aaabdaaabac", 257) == [(97, 97)], "one merge, the most frequent pair"
    # every non-overlapping occurrence is replaced, not just the first: aa a b d aa a b a c
    assert impl.merge_pair(word, (97, 97), 256) == [256, 97, 98, 100, 256, 97, 98, 97, 99], (
        "merge_pair must replace every occurrence, left to right, without overlap, and return a list"
    )


def test_word_frequencies_weight_the_counts():
    counts = impl.get_pair_counts({(1, 2, 3): 5, (2, 3): 2})
    assert counts == {(1, 2): 5, (2, 3): 7}


def test_merges_are_deterministic_and_numbered_from_256():
    first = impl.train_bpe(CORPUS, 300)
    assert first == impl.train_bpe(CORPUS, 300), "training must be deterministic"
    assert len(first) == 44, "vocabulary 300 on this corpus means 300 - 256 = 44 merges"
    assert tuple(first) == all_merges()[:44], "a bigger vocabulary may only add merges at the end"
    assert len(merges(512)) == 256
    table = impl.vocab_bytes(list(merges(512)))
    assert [table[256 + i] for i in range(10)] == [
        b" t", b"he", b" the", b" a", b" s", b"er", b"in", b" w", b" n", b" o"
    ]
    assert sorted(table[256:], key=len)[-1] == b" vocabulary"


def test_training_stops_when_the_corpus_runs_out_of_pairs():
    assert len(all_merges()) == 793, (
        "train_bpe(CORPUS, 2000) must stop once no pre-token has two ids left (793 merges)"
    )


def test_guide_examples():
    m = list(merges(512))
    table = impl.vocab_bytes(m)
    ids = impl.encode("The keeper counted the ships.", m)
    assert len(b"The keeper counted the ships.") == 29
    assert len(ids) == 8, f"expected 8 tokens at vocabulary 512, got {len(ids)}: {ids}"
    assert [table[i] for i in ids] == [
        b"The", b" keeper", b" count", b"ed", b" the", b" ship", b"s", b"."
    ]
    # words the corpus never saw fall back to smaller pieces, down to single bytes
    assert impl.encode("vLLM is fast", []) == [118, 76, 76, 77, 32, 105, 115, 32, 102, 97, 115, 116]
    ids = impl.encode("vLLM is fast", m)
    assert [table[i] for i in ids] == [b"v", b"L", b"L", b"M", b" is", b" f", b"a", b"st"]


def test_encode_applies_merges_by_rank():
    # (b, c) was learned first, so "abc" becomes a + bc even though a-b comes first
    assert impl.encode("abc", [(98, 99), (97, 98)]) == [97, 256], (
        "encode must merge the lowest-rank pair first, not the leftmost pair"
    )
    assert impl.encode("abc", [(97, 98), (98, 99)]) == [256, 99]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(ANY_TEXT)
def test_round_trip_on_any_unicode(text):
    m = list(merges(512))
    ids = impl.encode(text, m)
    assert impl.decode(ids, m) == text
    # and at the byte level: the tokens spell out exactly the UTF-8 bytes
    table = impl.vocab_bytes(m)
    assert b"".join(table[i] for i in ids) == text.encode("utf-8")


@settings(max_examples=30, deadline=None, derandomize=True)
@given(ANY_TEXT)
def test_zero_merges_is_the_byte_tokenizer(text):
    assert impl.encode(text, []) == list(text.encode("utf-8"))


def test_byte_baseline_matches_mini_vllm_byte_tokenizer():
    from mini_vllm.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    # the guide: 256 byte values plus one end-of-sequence id (256), 257 entries in all
    assert (tok.vocab_size, tok.eos_token_id) == (257, 256)
    assert max(impl.encode(CORPUS, [])) < tok.eos_token_id  # bytes never collide with EOS
    for text in (CORPUS[:500], impl.HELD_OUT, "naïve café, 東京"):
        assert impl.encode(text, []) == tok.encode(text)
        assert impl.decode(tok.encode(text), []) == text


def test_compression_ratio_beats_bytes():
    assert impl.compression_ratio(CORPUS, []) == 1.0
    ratios = [impl.compression_ratio(CORPUS, list(merges(v))) for v in (300, 400, 512, 1024)]
    assert ratios == sorted(ratios) and ratios[0] > 1
    assert [round(r, 2) for r in ratios] == [1.57, 2.15, 2.67, 4.45]
    held = [impl.compression_ratio(impl.HELD_OUT, list(merges(v))) for v in (300, 400, 512, 1024)]
    assert [round(r, 2) for r in held] == [1.66, 2.13, 2.57, 3.65]


def test_fewer_tokens_means_less_kv_memory():
    kv_bytes, kv_bpe = impl.kv_bytes_for_text(CORPUS, list(merges(512)), 131_072)
    assert len(CORPUS.encode("utf-8")) == 4586
    assert kv_bytes == 4586 * 131_072 == 601_096_192
    assert kv_bpe == 1717 * 131_072
    assert (round(kv_bytes / MiB), round(kv_bpe / MiB)) == (573, 215)


def test_agrees_with_hugging_face_bpe_trainer():
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers for the oracle")
    # Give HF the same pre-tokens, each byte b spelled as the character chr(0x100 + b):
    # its alphabet then gets ids 0..255 in byte order and its tie-break (smallest
    # pair of ids) is the same rule as ours, so merges must agree exactly.
    base = 0x100
    spell = lambda b: "".join(chr(base + x) for x in b)  # noqa: E731
    pieces = [spell(p.encode("utf-8")) for p in impl.pretokenize(CORPUS)]
    for vocab_size in (300, 512):
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=[chr(base + b) for b in range(256)],
            special_tokens=[],
            show_progress=False,
        )
        tok.train_from_iterator(pieces, trainer)
        model = json.loads(tok.to_str())["model"]
        assert all(model["vocab"][chr(base + b)] == b for b in range(256))
        hf = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        hf_bytes = [(bytes(ord(c) - base for c in a), bytes(ord(c) - base for c in b)) for a, b in hf]
        ours = list(merges(vocab_size))
        table = impl.vocab_bytes(ours)
        assert hf_bytes == [(table[a], table[b]) for a, b in ours]
        hf_ids = [i for p in impl.pretokenize(impl.HELD_OUT) for i in tok.encode(spell(p.encode())).ids]
        assert hf_ids == impl.encode(impl.HELD_OUT, ours)


def test_a_cut_multi_byte_character_decodes_to_the_replacement_character():
    # "é" is two bytes, 0xC3 0xA9: either byte alone is not valid UTF-8
    assert impl.decode([0xC3], []) == "\ufffd"
    assert impl.decode([104, 0xC3], []) == "h\ufffd"
    assert impl.decode([0xC3, 0xA9], []) == "é"


def test_lengths_are_counted_in_utf8_bytes_not_characters():
    text = "naïve café, 東京"  # 14 characters, 20 bytes
    assert len(text) == 14 and len(text.encode("utf-8")) == 20
    assert impl.compression_ratio(text, []) == 1.0
    assert impl.kv_bytes_for_text(text, [], 10) == (200, 200)
    m = list(merges(512))
    assert impl.kv_bytes_for_text(text, m, 1) == (20, len(impl.encode(text, m)))
    assert impl.compression_ratio(text, m) == 20 / len(impl.encode(text, m))


def test_merges_never_cross_a_pre_token_boundary():
    # "ab ab ab": the pair (b, space) occurs twice in the raw bytes, but a space always
    # starts the next pre-token, so a space may only open a learned token; and once
    # "ab" and " ab" exist no pre-token has a pair left, so training stops at two merges
    learned = impl.train_bpe("ab ab ab", 300)
    table = impl.vocab_bytes(learned)
    assert [table[256 + i] for i in range(len(learned))] == [b"ab", b" ab"]
    big = impl.vocab_bytes(list(merges(1024)))
    assert all(b" " not in token[1:] for token in big[256:])


def test_ties_go_to_the_smallest_pair():
    # every pair occurs once: (97, 98) < (98, 99) < (99, 100)
    assert impl.train_bpe("abcd", 257) == [(97, 98)]
    assert impl.train_bpe("dcba", 257) == [(98, 97)]  # (98, 97) < (99, 98) < (100, 99)


def test_argument_checks_sit_at_their_boundaries():
    assert impl.train_bpe(CORPUS, 256) == []  # the bytes alone: no merge
    for bad in (255, 0):
        with pytest.raises(ValueError, match="vocab_size"):
            impl.train_bpe(CORPUS, bad)
    assert impl.decode([255], []) == "\ufffd"  # the last byte id is valid (alone, not UTF-8)
    for bad in (256, -1):
        with pytest.raises(ValueError, match="token id"):
            impl.decode([bad], [])
    assert impl.decode([256], [(104, 105)]) == "hi"
    with pytest.raises(ValueError, match="token id"):
        impl.decode([257], [(104, 105)])
    assert impl.kv_bytes_for_text("hi", [], 1) == (2, 2)
    for bad in (0, -5):
        with pytest.raises(ValueError, match="kv_bytes_per_token"):
            impl.kv_bytes_for_text("hi", [], bad)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        impl.train_bpe(CORPUS, 100)
    with pytest.raises(ValueError, match="token id"):
        impl.decode([300], [])
    with pytest.raises(ValueError, match="token id"):
        impl.decode([-1], [])  # not the last entry of the table
    with pytest.raises(ValueError, match="text"):
        impl.compression_ratio("", [])
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        impl.kv_bytes_for_text("hi", [], 0)
