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
import re
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

from mmt.launching.console import clean

BLOCK = 64 * 1024  # bytes read per step while seeking back for the last lines
CHUNK = 256 * 1024  # bytes read per step going forward
MAX_PIECE = 1024 * 1024  # characters of one line held at once; a longer line is given out in pieces
POLL_S = 0.5
# a character the sanitiser would act on (ESC, the other C0 controls but tab and newline, DEL): most text has none
_ANY_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


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
    """Bytes in, text of whole lines out, decoded; ``sanitise``: as the console shows them (no control sequences,
    what a carriage return left visible). A line longer than MAX_PIECE characters comes out in pieces, so that memory
    stays bounded."""

    def __init__(self, sanitise: bool = False) -> None:
        self.sanitise = sanitise
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def _show(self, text: str) -> str:
        if not self.sanitise or not text or not _ANY_CONTROL.search(text):
            return text
        if "\r" not in text:  # the sanitiser keeps newlines: a block of lines at once
            return clean(text)
        return "\n".join(clean(line) for line in text.split("\n"))  # a carriage return acts within its line

    def feed(self, data: bytes) -> str:
        text = self._partial + self._decoder.decode(data)
        cut = text.rfind("\n") + 1
        whole, self._partial = text[:cut], text[cut:]
        if len(self._partial) > MAX_PIECE:  # a huge line in the making: give out what there is of it
            whole, self._partial = whole + self._partial, ""
        return self._show(whole)

    def flush(self) -> str:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return self._show(rest)


def split_lines(text: str) -> List[str]:
    """``text``'s lines, each with its newline (the last one without, if it has none): only "\\n" ends a line."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def text_blocks(path: Path, start: int = 0, sanitise: bool = False) -> Iterator[str]:
    """The file's text from byte ``start`` to its end (as it is now), in blocks of whole lines of at most about
    CHUNK bytes."""
    reader = LineReader(sanitise)
    for data in chunks(path, start):
        block = reader.feed(data)
        if block:
            yield block
    rest = reader.flush()
    if rest:
        yield rest


def follow(
    path: Path,
    start: int,
    ended: Callable[[], bool],
    sanitise: bool = False,
    by_line: bool = True,
    poll_s: float = POLL_S,
) -> Iterator[str]:
    """The file's text from byte ``start`` on, as it is written, until ``ended()`` says the writer is done (checked
    before each read, so that the last lines are never missed): line by line, or in blocks of whole lines
    (``by_line=False``). A file that is not there yet is waited for; one that shrank (rewritten) is read again from
    its start."""
    reader, offset = LineReader(sanitise), start

    def out(text: str) -> Iterator[str]:
        if text:
            yield from (split_lines(text) if by_line else [text])

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
                    yield from out(reader.feed(data))
            except (FileNotFoundError, NotADirectoryError):  # gone between the stat and the open: next poll
                pass
        if done:
            yield from out(reader.flush())
            return
        time.sleep(poll_s)
