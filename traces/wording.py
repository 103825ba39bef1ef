"""Words for counts in messages: "1 file", "2 files" (issue 26 item 9: "wrote 1 files", "on 1 ranks")."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """`n` and the noun, singular for exactly one ("1 rank", "3 ranks", "1,024 ranks"); `many` for irregulars."""
    return f"{n:,} {noun if n == 1 else (many or noun + 's')}"
