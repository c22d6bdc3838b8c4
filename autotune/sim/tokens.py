"""The simulator's stand-in tokenizer and detokenizer (deterministic, dependency-free).

Text becomes one token per word or punctuation mark (`\\w+|[^\\w\\s]`), with ids from a CRC32 of
the piece, so equal texts share token prefixes (the radix cache sees real hits). Generated tokens
are common English words, each exactly one token when the output text is tokenized again.
"""

from __future__ import annotations

import re
import zlib

_PIECE = re.compile(r"\w+|[^\w\s]")
VOCAB = 100_000
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
]
FIRST_WORD_ID = VOCAB


def encode(text: str) -> list[int]:
    """Token ids of `text` (at least one token, like a BOS)."""
    ids = [zlib.crc32(piece.encode()) % VOCAB for piece in _PIECE.findall(text)]
    return ids or [0]


def count(text: str) -> int:
    """Tokens `text` stands for (one per word or punctuation mark, at least one), as `encode` would
    give."""
    return max(1, len(_PIECE.findall(text)))


def generated_id(seed: int, position: int) -> int:
    """The id of the token generated at `position` for a request seeded `seed`: a common word,
    deterministic, so equal requests answer alike."""
    return FIRST_WORD_ID + (seed * 31 + position * 7 + position // 5) % len(WORDS)


def decode_piece(token_id: int) -> str:
    """Text of one generated token (leading space included)."""
    if token_id >= FIRST_WORD_ID:
        return " " + WORDS[(token_id - FIRST_WORD_ID) % len(WORDS)]
    return " tok"
