"""GLOSSARY.md keeps its promise: every term a guide introduces in bold is defined there.

A guide introduces a term by setting it in bold (``**term**``). Bold is also used for run-in
headings ("**Plan.**", "**Going deeper: ...**") and for emphasis; those are recognised by shape
(they end in punctuation, start with a digit, or are already a link) or listed in EMPHASIS
below. Everything else must match a glossary heading, directly, through one of the heading's
parts ("BF16 and FP16" covers both), or through ALIASES. The check runs on every phase that
exists, so it stays true as phases land.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "GLOSSARY.md"

# Bold text in a guide that is emphasis or a label, not a term. Keep it short; each line says why.
EMPHASIS = {
    "allocated", "back", "evicted", "front", "full", "middle", "last token",  # stressed words
    "recomputed", "revived", "build", "read", "check yourself", "draw",  # verbs, list labels
    "going deeper",  # the label of an aside
    "decode, batch of 64", "decode, one sequence", "prefill of 2,048 tokens",  # table row labels
    "kv memory", "seats", "tokens per step",  # labels of Phase 03's three scarce things
    "offline: llm(model=...).generate(prompts)", "online: vllm serve",  # labels of two entry paths
    "finished_\\",  # FINISHED_*, a family of status names (see "Request status")
    "suffix", "longest", "earliest", "includes",  # Phase 08: the n-gram rule's stressed words
    "conditional", "per-position",  # Phase 08: the two readings of "Acceptance rate", stressed
    "and", "both", "prompt included",  # Phase 09: stressed words (prompt AND output, the length)
    "interface",  # Phase 09: a list label in the logits-processor section
    "dp for a dense model", "dp for an moe model", "ep itself",  # Phase 10: paragraph labels
}

# A term whose wording differs from its glossary heading: term -> heading.
ALIASES = {
    "bandwidth-bound": "Memory-bandwidth-bound",
    "eos": "EOS token",
    "greedy": "Greedy decoding",
    "head": "Attention head",
    "decoder block": "Decoder layer",
    "query": "QKV",
    "key": "QKV",
    "value": "QKV",
    "on-chip sram": "SRAM",
    "subword": "BPE",
    "preemption by recompute": "Recompute",
    "waiting": "Request status",
    "running": "Request status",
    "preempted": "Request status",
    "draft acceptance rate": "Acceptance rate",
    "allowed_token_ids": "Allowed token IDs",  # Phase 09: the SamplingParams field names
    "bad_words": "Bad words",
    "min_tokens": "Min tokens",
    "logit_bias": "Logit bias",
    "vllm's custom all-reduce": "Custom all-reduce",  # Phase 10
}

BOLD_RE = re.compile(r"(\[)?\*\*([^*\n]+?)\*\*(\]\()?")
FENCE_RE = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)


def normalize(text: str) -> str:
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"^the ", "", text)
    return text.rstrip(".:,;!?").strip()


def glossary_headings() -> list[str]:
    return [line[4:].strip() for line in GLOSSARY.read_text(encoding="utf-8").splitlines()
            if line.startswith("### ")]


def heading_names(heading: str) -> set[str]:
    """The names a heading answers to: itself, its parts ("A and B", "A, B", "A / B") and the
    text inside or outside a parenthesis."""
    names = {normalize(heading)}
    bare = re.sub(r"\s*\(.*?\)", "", heading)
    names.add(normalize(bare))
    names.update(normalize(inner) for inner in re.findall(r"\((.*?)\)", heading))
    for part in re.split(r",\s*|\s+and\s+|\s*/\s*", bare):
        if part.strip():
            names.add(normalize(part))
    return names


def known_names() -> set[str]:
    names: set[str] = set()
    for heading in glossary_headings():
        names |= heading_names(heading)
    return names


def term_names(term: str) -> set[str]:
    """A bold term matches as written, without a parenthesis, by its parenthesis, or singular."""
    names = {normalize(term), normalize(re.sub(r"\s*\(.*?\)", "", term))}
    names.update(normalize(inner) for inner in re.findall(r"\((.*?)\)", term))
    names |= {name[:-1] for name in names if name.endswith("s")}
    return names


def bold_terms(text: str) -> list[str]:
    text = FENCE_RE.sub("", text)
    terms = []
    for match in BOLD_RE.finditer(text):
        opened, term, closed = match.groups()
        term = term.strip()
        if opened and closed:  # [**term**](link): already a link
            continue
        if term[-1] in ".?:!" or term[0].isdigit() or "](" in term:
            continue
        terms.append(term)
    return terms


def undefined_terms() -> list[tuple[str, str]]:
    known = known_names()
    missing = []
    for guide in sorted(ROOT.glob("phase-*/00-guide.md")):
        for term in bold_terms(guide.read_text(encoding="utf-8")):
            names = term_names(term)
            if names & EMPHASIS:
                continue
            if names & known:
                continue
            if any(normalize(ALIASES[n]) in known for n in names if n in ALIASES):
                continue
            missing.append((guide.parent.name, term))
    return missing


def test_every_bold_term_of_a_guide_has_a_glossary_entry():
    missing = undefined_terms()
    assert not missing, (
        "bold terms with no GLOSSARY.md entry (add one, or list emphasis in EMPHASIS): "
        + "; ".join(f"{phase}: {term!r}" for phase, term in missing)
    )


def test_aliases_and_emphasis_stay_honest():
    known = known_names()
    stale = [a for a, heading in ALIASES.items() if normalize(heading) not in known]
    assert not stale, f"ALIASES point at headings GLOSSARY.md no longer has: {stale}"
    # an emphasis entry that became a glossary term should be removed from EMPHASIS
    assert not (EMPHASIS & known), sorted(EMPHASIS & known)


def test_the_check_catches_a_new_undefined_term():
    assert bold_terms("A **zorblax cache** is **defined.** and [**TTFT**](x) **3 ms**") == [
        "zorblax cache"]
    assert not term_names("zorblax cache") & known_names()
    assert term_names("Byte-pair encoding (BPE)") & known_names()
    assert term_names("blocks") >= {"block"}


def github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_into_the_glossary_resolve():
    text = GLOSSARY.read_text(encoding="utf-8")
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    anchors |= set(re.findall(r'<a id="([^"]+)"></a>', text))
    broken = []
    pages = [GLOSSARY, *ROOT.glob("*.md"), *ROOT.glob("phase-*/*.md"), *ROOT.glob("phase-*/labs/*.md")]
    for page in sorted(set(pages)):
        body = page.read_text(encoding="utf-8")
        for anchor in re.findall(r"GLOSSARY\.md#([\w\-]+)", body):
            if anchor not in anchors:
                broken.append(f"{page.relative_to(ROOT)}: #{anchor}")
        if page == GLOSSARY:
            for anchor in re.findall(r"\]\(#([\w\-]+)\)", body):
                if anchor not in anchors:
                    broken.append(f"GLOSSARY.md: #{anchor}")
    assert not broken, broken


def test_every_glossary_heading_is_unique():
    # two entries with one heading get anchors "#term" and "#term-1": links reach only the first
    headings = [normalize(h) for h in glossary_headings()]
    repeated = sorted({h for h in headings if headings.count(h) > 1})
    assert not repeated, f"GLOSSARY.md defines these terms twice: {repeated}"
