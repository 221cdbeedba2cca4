"""Text from a stream of bytes that arrives in chunks (an HTTP response, a log)."""

from __future__ import annotations

import codecs
from typing import Iterable, Iterator


def decoded_chunks(chunks: Iterable[bytes]) -> Iterator[str]:
    """The UTF-8 text of ``chunks``, as it arrives: a character split between two chunks is
    decoded whole, invalid bytes become U+FFFD, and empty pieces are not yielded."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        text = decoder.decode(chunk)
        if text:
            yield text
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail
