"""Step log output as the step page shows it: stored chunks cut into lines, each with
its stream (stdout, stderr, a qlflow note, the dropped-output marker), the time it was
read and the chunk it came from.

A chunk holds whatever the executor read at once, so a line can span chunks. Lines
are joined across chunks of the same stream here; a line still open at the end of
what was read (`ends` false) is joined by the page's script with the first line of
the next poll, when that continues it (`continues` true).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eventstore.logs import DROPPED
from projections.step_logs import LogChunk


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of an Attempt's output (without its newline)."""

    seq: int  # the chunk the line ends in (or reaches, if still open)
    at_ms: int  # when the chunk its first characters came in was read
    stream: str  # stdout | stderr | qlflow | dropped
    text: str
    ends: bool  # it ended with a newline (else more of it may follow)
    continues: bool = False  # it continues the open last line of an earlier read


def lines(chunks: Iterable[LogChunk], open_stream: str | None = None) -> list[LogLine]:
    """The chunks (of one Attempt, in seq order) as lines. `open_stream`: the stream of
    an open last line the reader already has (a follower's place), which the first
    line of the same stream continues."""
    found: list[LogLine] = []
    for chunk in chunks:
        if chunk.stream == DROPPED:  # the marker: one line of its own, however written
            said = " ".join(chunk.text.split())
            found.append(LogLine(chunk.seq, chunk.at_ms, chunk.stream, said, True))
            continue
        for piece in chunk.text.splitlines(keepends=True):
            body = piece.rstrip("\r\n")
            ends = body != piece
            last = found[-1] if found else None
            if last is not None and not last.ends and last.stream == chunk.stream:
                found[-1] = LogLine(
                    chunk.seq, last.at_ms, last.stream, last.text + body, ends, last.continues
                )
                continue
            continues = not found and open_stream is not None and open_stream == chunk.stream
            found.append(LogLine(chunk.seq, chunk.at_ms, chunk.stream, body, ends, continues))
    return found
