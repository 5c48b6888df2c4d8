"""Server-Sent Events decoding for Triton's ``generate_stream`` endpoint.

Kept free of JSON and HTTP so the framing rules (blank line ends an event,
several ``data:`` lines join with a newline, ``:`` starts a comment) can be
tested on plain lists of lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def iter_sse_data(lines: Iterable[bytes | str]) -> Iterator[str]:
    """Yield the data payload of each event in a stream of SSE lines.

    Lines may be bytes or str, with or without their line ending. A pending
    event is still yielded at end of input: a server that closes the
    connection right after its last ``data:`` line has still said it.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\n").rstrip("\r")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
