"""Checkers of notebook 02_tokenizer: BPE merges, WordPiece and Unigram segmentations."""
from __future__ import annotations

from .verdict import Verdict, needs_answer


@needs_answer("answer")
def check_next_bpe_merge(tok, word: str, step: int, answer: tuple[str, str]) -> Verdict:
    """The pair BPE merges at ``step`` (0-based) of ``word``: the adjacent pair of lowest rank."""
    steps = tok.algorithm.trace(word)
    if step >= len(steps):
        return Verdict.not_yet(f"step {step}", f"{word!r} has only {len(steps)} merges")
    m = steps[step]
    if tuple(answer) == (m.left, m.right):
        return Verdict.correct(f"{m.left!r} + {m.right!r} (rank {m.rank})")
    before = steps[step - 1].symbols if step else list(tok.algorithm.byte_symbols(word))
    pairs = list(zip(before, before[1:]))
    if tuple(answer) not in pairs:
        return Verdict.not_yet(f"{answer}", f"that pair is not adjacent in {before}")
    rank = tok.vocab.merges.get(f"{answer[0]} {answer[1]}")
    extra = f" (its rank is {rank})" if rank is not None else " (that pair is not in the merge list)"
    return Verdict.not_yet(f"{answer}{extra}", f"another adjacent pair has a lower rank (the merge at this step has rank {m.rank})")


@needs_answer("answer")
def check_segmentation(expected: list[str], answer: list[str], what: str) -> Verdict:
    ok = list(answer) == list(expected)
    if ok:
        return Verdict.correct(f"{what}: {answer}")
    if "".join(answer) != "".join(expected):
        return Verdict.not_yet(f"{answer}", "the pieces must join back into the (normalised) text, ▁ markers included")
    first = next(i for i, (a, b) in enumerate(zip(answer + [None] * 9, expected + [None] * 9)) if a != b)
    return Verdict.not_yet(f"{answer}", f"pieces agree up to piece {first}; look again from there")


@needs_answer("answer")
def check_wordpiece(text: str, answer: list[str]) -> Verdict:
    from ...viz.tokenizers_demo import wordpiece
    return check_segmentation(wordpiece(text), answer, f"WordPiece of {text!r}")


@needs_answer("answer")
def check_unigram(text: str, answer: list[str]) -> Verdict:
    from ...viz.tokenizers_demo import UGM_VOCAB, score, unigram
    want = unigram(text)
    if list(answer) != want and all(p in UGM_VOCAB for p in answer) and "".join(answer) == "".join(want):
        return Verdict.not_yet(f"{answer} (total {score(answer):.1f})",
                               f"a segmentation with a higher total exists ({score(want):.1f})")
    return check_segmentation(want, answer, f"Unigram of {text!r}")
