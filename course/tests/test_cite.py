"""The citation checker against a tiny fixture upstream/ tree."""

from __future__ import annotations

import pytest

from course import cite
from course.errors import CourseError

UPSTREAM = {
    "upstream/vllm/v1/core/block_pool.py": """
        import collections


        class BlockPool:
            \"\"\"Fixture stand-in.\"\"\"

            def __init__(self, num_gpu_blocks):
                self.num_gpu_blocks = num_gpu_blocks

            def get_new_blocks(self, num_blocks):
                if num_blocks > self.num_gpu_blocks:
                    raise ValueError("too many")
                return list(range(num_blocks))
        """,
}
# Line numbers in the fixture: class BlockPool is line 4, get_new_blocks line 10,
# and the file has 13 lines.


def check(tree, doc_text: str):
    root = tree({**UPSTREAM, "doc.md": doc_text})
    return cite.check(root, root / "upstream")


def broken_reasons(report) -> list[tuple[int, str, str]]:
    return [(c.line, c.text, why) for c, why in report.broken]


def test_good_citations_pass_including_ranges_and_dotted_symbols(tree):
    report = check(
        tree,
        """
        # Doc
        The pool: `vllm/v1/core/block_pool.py:4 BlockPool`, its allocator
        `vllm/v1/core/block_pool.py:10 BlockPool.get_new_blocks` and the check
        `vllm/v1/core/block_pool.py:11-12 num_gpu_blocks`.
        """,
    )
    assert report.checked == 3
    assert report.broken == []


def test_symbol_within_three_lines_is_accepted_and_four_away_is_not(tree):
    report = check(
        tree,
        """
        near `vllm/v1/core/block_pool.py:7 get_new_blocks`
        far `vllm/v1/core/block_pool.py:6 get_new_blocks`
        """,
    )
    assert broken_reasons(report) == [
        (
            2,
            "vllm/v1/core/block_pool.py:6 get_new_blocks",
            "get_new_blocks does not appear on lines 3-9",
        ),
    ]


def test_missing_file_is_reported_with_its_location(tree):
    report = check(tree, "# T\n\nsee `vllm/v1/core/nope.py:3 Nope`\n")
    assert broken_reasons(report) == [
        (3, "vllm/v1/core/nope.py:3 Nope", "no such file in upstream/")
    ]


def test_line_out_of_range_is_reported(tree):
    report = check(tree, "`vllm/v1/core/block_pool.py:12-40 BlockPool`\n")
    assert broken_reasons(report) == [
        (
            1,
            "vllm/v1/core/block_pool.py:12-40 BlockPool",
            "line 40 is past the end of the file (13 lines)",
        ),
    ]


def test_wrong_symbol_is_reported(tree):
    report = check(tree, "`vllm/v1/core/block_pool.py:10 BlockPool.free_blocks`\n")
    assert [why for _, _, why in broken_reasons(report)] == [
        "free_blocks does not appear on lines 7-13"
    ]


def test_whole_word_match_only(tree):
    # "get_new" is a prefix of get_new_blocks, not a whole word
    report = check(tree, "`vllm/v1/core/block_pool.py:10 get_new`\n")
    assert len(report.broken) == 1


def test_code_span_without_symbol_is_broken(tree):
    report = check(tree, "`vllm/v1/core/block_pool.py:10`\n")
    assert broken_reasons(report) == [
        (1, "vllm/v1/core/block_pool.py:10", "no symbol (write `path:line Symbol`)")
    ]


def test_span_with_two_words_after_the_line_is_broken(tree):
    report = check(tree, "`vllm/v1/core/block_pool.py:10 the allocator`\n")
    assert "more than one word" in report.broken[0][1]


def test_citations_in_fenced_code_and_escaped_spans_are_ignored(tree):
    report = check(
        tree,
        """
        ```text
        `vllm/v1/core/nope.py:1 Nope`
        ```
        ~~~~python
        x = "`vllm/v1/core/nope.py:1 Nope`"
        ~~~~
        Show the syntax: `` `vllm/v1/core/nope.py:1 Nope` ``.
        Not a citation: `block_pool.get_new_blocks`, `pytest -q`.
        After the fence: `vllm/v1/core/nope.py:2 Nope`
        """,
    )
    assert broken_reasons(report) == [
        (9, "vllm/v1/core/nope.py:2 Nope", "no such file in upstream/")
    ]


def test_path_must_not_start_with_upstream(tree):
    report = check(tree, "`upstream/vllm/v1/core/block_pool.py:4 BlockPool`\n")
    assert "drop the leading upstream/" in report.broken[0][1]


def test_deep_dives_are_counted_and_upstream_markdown_is_not_scanned(tree):
    root = tree(
        {
            **UPSTREAM,
            "upstream/README.md": "`vllm/nope.py:1 X`\n",
            ".venv/x.md": "`vllm/nope.py:1 X`\n",
            "phase-02-paged-attention/01-deep-dive.md": (
                "`vllm/v1/core/block_pool.py:4 BlockPool`\n"
                "`vllm/v1/core/block_pool.py:10 get_new_blocks`\n"
                "`vllm/v1/core/block_pool.py:99 BlockPool`\n"
            ),
            "phase-03-x/01-deep-dive.md": "# nothing cited yet\n",
        }
    )
    report = cite.check(root, root / "upstream")
    counts = {d.parent.name: c for d, c in report.per_deep_dive.items()}
    assert counts == {"phase-02-paged-attention": (3, 1), "phase-03-x": (0, 0)}
    assert report.files == 2
    lines = cite.format_report(report, root)
    assert lines[0] == (
        "phase-02-paged-attention/01-deep-dive.md:3: vllm/v1/core/block_pool.py:99 BlockPool: "
        "line 99 is past the end of the file (13 lines)"
    )
    assert lines[-1] == "3 citations in 2 files; 1 broken"


def test_missing_upstream_is_a_clear_error(tmp_path):
    with pytest.raises(CourseError, match="run `python -m course upstream`"):
        cite.check(tmp_path, tmp_path / "upstream")


def test_a_plain_word_symbol_passes_only_where_defined_or_rare(tree):
    report = check(
        tree,
        """
        defined `vllm/v1/core/block_pool.py:4 BlockPool`
        qualified `vllm/v1/core/block_pool.py:8 BlockPool.num_gpu_blocks`
        rare in the file (once) `vllm/v1/core/block_pool.py:12 raise`
        common in the file and defined nowhere near `vllm/v1/core/block_pool.py:8 self`
        """,
    )
    assert report.checked == 4
    assert [(line, text.split()[-1]) for line, text, _ in broken_reasons(report)] == [(4, "self")]
    assert "plain word found 4 times" in broken_reasons(report)[0][2]


def test_python_upstream_references_are_checked_like_markdown(tree):
    root = tree(
        {
            **UPSTREAM,
            "mini_vllm/pool.py": '''
                """A pool.

                upstream: vllm/v1/core/block_pool.py:10 BlockPool.get_new_blocks
                upstream: vllm/v1/core/block_pool.py:2 BlockPool.get_new_blocks
                """

                def f():
                    """upstream: vllm/v1/core/block_pool.py:4 BlockPool"""
                    # upstream: vllm/v1/core/block_pool.py:11-12 (no symbol here)
                ''',
            "course/example.py": "# upstream: vllm/nowhere.py:1 Ignored (course/ holds examples)\n",
        }
    )
    report = cite.check(root, root / "upstream")
    assert report.checked == 4
    assert sorted((c.line, why.split(" ")[0]) for c, why in report.broken) == [
        (4, "get_new_blocks"),
        (9, "no"),
    ]
