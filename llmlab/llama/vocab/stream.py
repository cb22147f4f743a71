"""Streaming detokenizer: print tokens as they are generated without breaking characters.

A token can end in the middle of a UTF-8 character (byte-fallback tokens, or BPE tokens that
split a Chinese character or an emoji), so its bytes alone may not be printable. The decoder
keeps such an incomplete tail back until the bytes that complete it arrive.
"""
from __future__ import annotations

import codecs


class StreamDecoder:
    """``push(token)`` returns the text that is complete so far; ``flush()`` whatever is left.

    Joined, the outputs equal ``tokenizer.detokenize(tokens, special)`` for models without
    space cleaning (SmolLM2, Gemma 3 here).
    """

    def __init__(self, tokenizer, special: bool = False):
        self.tokenizer, self.special = tokenizer, special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True

    def push(self, token: int) -> str:
        piece = self.tokenizer.token_to_piece(token, self.special)
        if self._first and self.tokenizer.vocab.add_space_prefix and piece[:1] == b" ":
            piece = piece[1:]   # the space SentencePiece put in front of the text
        self._first = False
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """Pending bytes of an unfinished character, as U+FFFD."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending(self) -> bytes:
        """Bytes held back, waiting for the rest of their character."""
        return self._decoder.getstate()[0]
