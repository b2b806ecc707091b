from __future__ import annotations

import json

import pytest

from mini_vllm.tokenizer import ByteTokenizer, HFTokenizer


def test_byte_tokenizer_is_one_token_per_utf8_byte():
    tok = ByteTokenizer()
    assert tok.vocab_size == 257 and tok.eos_token_id == 256
    assert tok.encode("hello") == [104, 101, 108, 108, 111]
    assert tok.encode("é") == [0xC3, 0xA9]  # one character, two bytes, two tokens
    assert tok.encode("") == []


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    for text in ["hello world", "naïve café", "日本語", "emoji 🙂", "\n\t"]:
        assert tok.decode(tok.encode(text)) == text


def test_decode_skips_eos_and_replaces_broken_utf8():
    tok = ByteTokenizer()
    assert tok.decode([104, 256, 105]) == "hi"
    assert tok.decode([0xC3]) == "\ufffd"  # half a character: replaced, never raised


@pytest.fixture
def hf_folder(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3, "foo": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(["</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return tmp_path


def test_hf_tokenizer_has_the_same_interface(hf_folder):
    tok = HFTokenizer(hf_folder)
    assert tok.vocab_size == 5
    assert tok.eos_token_id == 1  # read from tokenizer_config.json
    assert tok.encode("hello world foo") == [2, 3, 4]
    assert tok.encode("hello bar") == [2, 0]
    assert tok.decode([2, 3, 1]) == "hello world"  # EOS is special: skipped


def test_hf_tokenizer_accepts_the_json_file_and_an_explicit_eos(hf_folder):
    tok = HFTokenizer(hf_folder / "tokenizer.json", eos_token_id=4)
    assert tok.eos_token_id == 4


def test_hf_tokenizer_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        HFTokenizer(tmp_path)
