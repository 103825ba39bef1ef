"""Words for counts in messages: "1 file", "2 files" (issue 26 item 9: "wrote 1 files", "on 1 ranks")."""

from __future__ import annotations

from collections.abc import Iterable


def plural(n: int, noun: str, many: str | None = None) -> str:
    """`n` and the noun, singular for exactly one ("1 rank", "3 ranks", "1,024 ranks"); `many` for irregulars."""
    return f"{n:,} {noun if n == 1 else (many or noun + 's')}"


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """ " (did you mean X?)" for the known name closest to `word`, else "" (issue 26 item 9).

    Spelling apart, names that differ only in case, spaces, dashes or underscores ("A100 80GB",
    "a100_80gb" for "A100-80GB") match first; then difflib's ratio of at least 0.75 ("micro_batchs").
    """
    import difflib

    names = list(known)
    squash = {_squash(n): n for n in names}
    text = str(word)
    if _squash(text) in squash and squash[_squash(text)] != text:
        return f" (did you mean {squash[_squash(text)]}?)"
    close = difflib.get_close_matches(text, names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _squash(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())
