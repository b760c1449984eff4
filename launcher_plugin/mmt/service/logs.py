"""Reading a job's logs without holding them in memory: a log can be many GB, and `mmt logs --tail 3`, `-f` and the
SDK's ``logs`` must cost the same for a 1 KB log as for a 1 GB one (the dashboard reads by byte range too).

* the last N lines: found by seeking back from the end in blocks, counting newlines, then read from there;
* the whole log, or what follows an offset: read in bounded chunks, decoded incrementally (a UTF-8 character split
  across two chunks stays whole);
* following: from an offset, in bounded chunks per poll, until the job has ended.

What a terminal is shown goes through the console's sanitiser (``mmt.launching.console.clean``: no control
sequences, what a carriage return left visible) unless asked for the raw text.
"""

import codecs
import os
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

from mmt.launching.console import clean

BLOCK = 64 * 1024  # bytes read per step while seeking back for the last lines
CHUNK = 256 * 1024  # bytes read per step going forward
MAX_PIECE = 1024 * 1024  # characters of one line held at once; a longer line is given out in pieces
POLL_S = 0.5


def tail_offset(path: Path, lines: int, block: int = BLOCK) -> int:
    """The byte offset where the last ``lines`` lines of the file start (0 when it has no more than that). A last
    line without its newline counts as a line; memory: one block."""
    if lines < 1:
        raise ValueError(f"lines must be >= 1, not {lines}")
    with open(path, "rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        if end == 0:
            return 0
        handle.seek(end - 1)
        if handle.read(1) == b"\n":  # the newline that ends the last line starts no line after it
            end -= 1
        found, position = 0, end
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            data = handle.read(position - start)
            index = len(data)
            while True:
                index = data.rfind(b"\n", 0, index)
                if index < 0:
                    break
                found += 1
                if found == lines:
                    return start + index + 1
            position = start
    return 0


def chunks(path: Path, start: int = 0, end: Optional[int] = None, size: Optional[int] = None) -> Iterator[bytes]:
    """The bytes of the file from ``start`` to ``end`` (default: its size when opened), ``size`` (CHUNK) at a
    time."""
    size = size or CHUNK
    with open(path, "rb") as handle:
        stop = handle.seek(0, os.SEEK_END) if end is None else end
        handle.seek(start)
        position = start
        while position < stop:
            data = handle.read(min(size, stop - position))
            if not data:
                return
            position += len(data)
            yield data


def read_text(path: Path, start: int = 0, end: Optional[int] = None) -> str:
    """The text of the file from byte ``start`` (invalid UTF-8 replaced), read in chunks: the memory it takes is
    the text returned, not a copy of it per step."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parts = [decoder.decode(data) for data in chunks(path, start, end)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


class LineReader:
    """Bytes in, lines out (each with its newline), decoded; ``sanitise``: as the console shows them (no control
    sequences). A line longer than MAX_PIECE characters comes out in pieces, so that memory stays bounded."""

    def __init__(self, sanitise: bool = False) -> None:
        self.sanitise = sanitise
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def _show(self, text: str) -> str:
        return clean(text) if self.sanitise else text

    def feed(self, data: bytes) -> List[str]:
        lines = (self._partial + self._decoder.decode(data)).split("\n")
        self._partial = lines.pop()
        out = [self._show(line) + "\n" for line in lines]
        if len(self._partial) > MAX_PIECE:  # a huge line in the making: give out what there is of it
            out.append(self._show(self._partial))
            self._partial = ""
        return out

    def flush(self) -> List[str]:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [self._show(rest)] if rest else []


def lines(path: Path, start: int = 0, sanitise: bool = False) -> Iterator[str]:
    """The file's lines from byte ``start`` to its end (as it is now), read in bounded chunks."""
    reader = LineReader(sanitise)
    for data in chunks(path, start):
        yield from reader.feed(data)
    yield from reader.flush()


def follow(path: Path, start: int, ended: Callable[[], bool], sanitise: bool = False,
           poll_s: float = POLL_S) -> Iterator[str]:
    """The lines of the file from byte ``start`` on, as they are written, until ``ended()`` says the writer is done
    (checked before each read, so the last lines are never missed). A file that is not there yet is waited for; one
    that shrank (rewritten) is read again from its start."""
    reader, offset = LineReader(sanitise), start
    while True:
        done = ended()
        try:
            size = path.stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            size = None
        if size is not None:
            if size < offset:
                offset = 0
            try:
                for data in chunks(path, offset, size):
                    offset += len(data)
                    yield from reader.feed(data)
            except (FileNotFoundError, NotADirectoryError):  # gone between the stat and the open: next poll
                pass
        if done:
            yield from reader.flush()
            return
        time.sleep(poll_s)
