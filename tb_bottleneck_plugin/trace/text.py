"""The text of one trace file: bytes -> bounded UTF-8 blocks, read ahead in a thread.

Part of the loader (`loader.py` drives it). Decompression runs in a background thread
(zlib releases the GIL), so it overlaps with decoding on a second core. Bounded: every
zlib call yields at most ``_OUT_BYTES``, the text of one file is capped
(`_max_decompressed`), and a long run of whitespace (the gzip bomb ``{"traceEvents":[``
+ GBs of spaces) is rejected within a few MB. UTF-8 BOMs are dropped and UTF-16/32
text is transcoded, with a note.
"""
from __future__ import annotations

import codecs
import os
import queue
import threading
import zlib
from typing import Iterator, List, Optional, Tuple

from ..errors import TraceError, TruncatedTraceError

_READ_BYTES = 256 << 10  # compressed bytes per read
_OUT_BYTES = 1 << 20  # most text one zlib call (or one plain read) may produce: a 1000x bomb stays 1 MB
# Default cap on the decompressed text of one file: max(8 GiB, 40 x its stored size).
# Real traces inflate 12-30x; more is a bomb or a file no analysis could hold anyway.
MAX_DECOMPRESSED_BYTES = 8 << 30
MAX_DECOMPRESSION_RATIO = 40
MAX_DECOMPRESSED_ENV = "TB_BOTTLENECKS_MAX_DECOMPRESSED_BYTES"
# No-progress limits: JSON of a trace never holds MBs of whitespace in a row, a header
# (the keys before traceEvents) of MBs, or a single event of tens of MB.
_MAX_WHITESPACE_RUN = 4 << 20


def _decompressed_blocks(stream, path: str, gzipped: bool, notes: List[str]) -> Iterator[bytes]:
    """Yield the file's bytes in blocks of at most ``_OUT_BYTES``, gunzipping on the
    fly (multi-member aware). ``max_length`` bounds every zlib call, so a member that
    inflates 1000x never materialises more than one block. Bytes after a complete
    gzip member that are not another member are ignored with a note (some uploaders
    pad or append), not a rejected file."""
    if not gzipped:
        while True:
            block = stream.read(_OUT_BYTES)
            if not block:
                return
            yield block
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    fresh = True  # the current gzip member has not consumed any input yet
    members = 0  # complete members so far
    while True:
        raw = stream.read(_READ_BYTES)
        if not raw:
            break
        while True:
            try:
                out = inflater.decompress(raw, _OUT_BYTES)
            except zlib.error as exc:
                if members:
                    notes.append("bytes after the end of the gzip stream (not another gzip member) were ignored")
                    return
                raise TraceError(path, f"not a valid gzip file ({exc})") from None
            fresh = False
            if out:
                yield out
            if inflater.eof:  # a member ended; another may follow (concatenated gzip)
                members += 1
                raw = inflater.unused_data.lstrip(b"\x00")
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                fresh = True
                if not raw:
                    break
                continue
            raw = inflater.unconsumed_tail
            if not raw and len(out) < _OUT_BYTES:
                break  # input used up and nothing pending inside zlib
    if not fresh and not inflater.eof:
        raise TruncatedTraceError(path, "gzip stream ends early (file truncated or still being written)")


# Byte-order marks and the NUL pattern of UTF-16/32 text that starts with ASCII.
_BOMS = ((b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"),
         (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"))


def _sniff_encoding(head: bytes) -> Tuple[Optional[str], int]:
    """(codec of text that is not UTF-8, length of its BOM) from the first 4 bytes."""
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return codec, len(bom)
    if len(head) >= 4:
        if head[0] and not head[1] and not head[2] and not head[3]:
            return "utf-32-le", 0
        if not head[0] and not head[1] and not head[2] and head[3]:
            return "utf-32-be", 0
        if head[0] and not head[1]:
            return "utf-16-le", 0
        if not head[0] and head[1]:
            return "utf-16-be", 0
    return None, 0


def _max_decompressed(stored_size: int, limit: Optional[int]) -> int:
    """The cap on one file's text: the argument, else the environment variable, else
    max(8 GiB, 40 x the stored size)."""
    if limit is None:
        try:
            limit = int(os.environ.get(MAX_DECOMPRESSED_ENV, ""))
        except ValueError:
            limit = None
    if limit is None or limit <= 0:
        limit = max(MAX_DECOMPRESSED_BYTES, MAX_DECOMPRESSION_RATIO * stored_size)
    return limit


def _text_blocks(stream, path: str, gzipped: bool, notes: List[str], limit: int) -> Iterator[bytes]:
    """The file's JSON text as UTF-8 blocks, bounded.

    - A UTF-8 BOM is dropped (Windows tools write one; msgspec rejects it). UTF-16/32
      text (PowerShell's `>`) is transcoded to UTF-8, with a note.
    - More than ``limit`` decompressed bytes: rejected while streaming.
    - A run of more than ``_MAX_WHITESPACE_RUN`` whitespace bytes: rejected. This is the
      bomb ``{"traceEvents":[`` + GBs of spaces, which otherwise never yields an event
      and only grows the buffer. The check is O(1) per block unless the block ends
      in whitespace.
    """
    total = 0
    whitespace = 0
    head: Optional[bytes] = b""
    decoder = None
    for block in _decompressed_blocks(stream, path, gzipped, notes):
        total += len(block)
        if total > limit:
            raise TraceError(path, f"more than {limit:,} bytes of text after decompression: refused "
                                   f"(a decompression bomb? the limit is {MAX_DECOMPRESSED_ENV})")
        if head is not None:  # sniff the encoding from the first 4 bytes
            head += block
            if len(head) < 4:
                continue
            block, head = head, None
            if block.startswith(b"\xef\xbb\xbf"):
                block = block[3:]
            else:
                codec, bom = _sniff_encoding(block[:4])
                if codec:
                    decoder = codecs.getincrementaldecoder(codec)()
                    block = block[bom:]
                    notes.append(f"the file is {codec.upper()} text, not UTF-8: decoded")
        if decoder is not None:
            try:
                block = decoder.decode(block).encode("utf-8")
            except UnicodeError as exc:
                raise TraceError(path, f"not valid text ({exc})") from None
        stripped = len(block.rstrip())
        whitespace = whitespace + len(block) if stripped == 0 else len(block) - stripped
        if whitespace > _MAX_WHITESPACE_RUN:
            raise TraceError(path, f"more than {_MAX_WHITESPACE_RUN >> 20} MB of whitespace in a row at byte "
                                   f"{total:,} of the text: not a trace (a decompression bomb?)")
        if block:
            yield block
    if head:  # a file of fewer than 4 bytes
        yield head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    if decoder is not None:
        try:
            decoder.decode(b"", final=True)
        except UnicodeError as exc:
            raise TraceError(path, f"not valid text ({exc})") from None


class _Prefetcher:
    """Runs a block iterator in a background thread, a few blocks ahead."""

    _END = object()

    def __init__(self, blocks: Iterator[bytes], depth: int = 4):
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(blocks,), daemon=True,
                                        name="tb-bottlenecks-gunzip")
        self._thread.start()

    def _run(self, blocks):
        try:
            for block in blocks:
                if self._stop.is_set():
                    return
                self._queue.put(block)
            self._queue.put(self._END)
        except BaseException as exc:  # handed to the consumer, re-raised there
            self._queue.put(exc)

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self):
        """Stop the thread and wait for it (it may be inside a read of the stream, which
        the whole-file fallback then seeks and reads again: a read racing it gave 'not a
        valid gzip file' now and then)."""
        self._stop.set()
        for _ in range(400):  # <= ~20 s; the thread ends after the block it is reading
            while True:  # unblock a producer waiting on a full queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            if self._thread is threading.current_thread():
                return
            self._thread.join(0.05)
            if not self._thread.is_alive():
                return
