"""The request headers the plugin's gRPC server receives: each header block
joined from its HEADERS and CONTINUATION frames (:class:`HeaderBlocks`) and
decoded (:class:`HeaderDecoder`, HPACK).

Why this module exists: the ``hpack`` library's decoder took 27 us per
kubelet call warm and 35 us in the plugin (its per-field tuples, checks and
debug calls), as much as the server's framing, task and timer together
(issue 36; docs/figures.md). A gRPC request is a few fields, most of them
indexed; this decoder does what RFC 7541 asks of a decoder and nothing
else: integers (5.1), string literals with Huffman (5.2, Appendix B), the
static table (Appendix A), the dynamic table with its eviction (4), size
updates only at the head of a block (4.2), every field representation
(6.1-6.3). Any violation is a :class:`driver.errors.WireError`, which the connection
answers with COMPRESSION_ERROR (RFC 9113 section 4.3): the peer's table
and ours can no longer agree. A decoded list over ``max_list`` bytes (names
and values plus 32 each, as SETTINGS_MAX_HEADER_LIST_SIZE counts them) is
one too: a small block of indexed fields cannot expand into megabytes.

Tests decode what the ``hpack`` library encodes (every representation,
Huffman or not, table size changes) and compare with its decoder.
"""

from __future__ import annotations

from collections import deque

from driver.errors import WireError
from plugin.servers import h2wire as w
from plugin.servers.hpack_tables import CODES, LENGTHS, STATIC_TABLE

ENTRY_OVERHEAD = 32  # RFC 7541 section 4.1
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE, which we never change
MAX_INT = 1 << 32  # no integer of a sane peer comes near
EOS = 256


def _huffman_machine() -> tuple[list[int], list[int], frozenset[int]]:
    """The Huffman code as a machine reading 4 bits at a time: its states are
    the code tree's inner nodes (the bits read since the last symbol); for a
    state and a nibble, the next state and the symbol completed on the way
    (every code is 5 bits or more: at most one per nibble), -1 for none, -2
    for EOS. With the states whose bits are a valid padding: at most 7 ones."""
    children: list[list[int]] = [[-1, -1]]  # inner nodes; a leaf is ~symbol
    for symbol, (code, length) in enumerate(zip(CODES, LENGTHS, strict=True)):
        node = 0
        for shift in range(length - 1, -1, -1):
            bit = code >> shift & 1
            if shift == 0:
                children[node][bit] = ~symbol
            elif children[node][bit] == -1:
                children.append([-1, -1])
                children[node][bit] = node = len(children) - 1
            else:
                node = children[node][bit]
    nexts, emits = [], []
    for state in range(len(children)):
        for nibble in range(16):
            node, emit = state, -1
            for shift in (3, 2, 1, 0):
                node = children[node][nibble >> shift & 1]
                if node < 0:  # a leaf: its symbol, and the next code from the root
                    emit = -2 if ~node == EOS else ~node
                    node = 0
            nexts.append(node * 16)
            emits.append(emit)
    padding, node = {0}, 0
    for _ in range(7):
        node = children[node][1]
        padding.add(node * 16)
    return nexts, emits, frozenset(padding)


_NEXT, _EMIT, _PADDING = _huffman_machine()
_STATIC = len(STATIC_TABLE)


def huffman(data: bytes) -> bytes:
    """A Huffman-coded string literal (RFC 7541 section 5.2, Appendix B)."""
    out = bytearray()
    state = 0  # the machine's state times 16: a nibble is added to it
    nexts, emits = _NEXT, _EMIT
    for byte in data:
        at = state + (byte >> 4)
        state, emit = nexts[at], emits[at]
        if emit >= 0:
            out.append(emit)
        elif emit == -2:
            raise WireError("the Huffman EOS symbol inside a string")
        at = state + (byte & 15)
        state, emit = nexts[at], emits[at]
        if emit >= 0:
            out.append(emit)
        elif emit == -2:
            raise WireError("the Huffman EOS symbol inside a string")
    if state not in _PADDING:
        raise WireError("invalid Huffman padding")
    return bytes(out)


class HeaderDecoder:
    """One connection's decoding context: the dynamic table the peer's
    encoder fills."""

    def __init__(self, max_list: int, max_table: int = DEFAULT_TABLE_SIZE) -> None:
        self._max_list = max_list
        self._limit = max_table  # what our SETTINGS allow the peer
        self._max = max_table  # the size the peer chose, at most _limit
        self._size = 0
        self._table: deque[tuple[bytes, bytes]] = deque()  # newest first

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The fields of one whole header block, in order."""
        out: list[tuple[bytes, bytes]] = []
        pos, end, listed = 0, len(block), 0
        while pos < end:
            first = block[pos]
            if first & 0x80:  # 6.1: an indexed field
                index, pos = self._int(block, pos, 7)
                field = self._entry(index)
            elif first & 0xE0 == 0x20:  # 6.3: a dynamic table size update
                if out:
                    raise WireError("a table size update after a field")
                size, pos = self._int(block, pos, 5)
                if size > self._limit:
                    raise WireError(f"a table size of {size} over the {self._limit} allowed")
                self._max = size
                self._evict(0)
                continue
            else:  # 6.2: a literal, with incremental indexing (01) or not (0000, 0001)
                indexing = bool(first & 0x40)
                index, pos = self._int(block, pos, 6 if indexing else 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = self._string(block, pos)
                value, pos = self._string(block, pos)
                field = (name, value)
                if indexing:
                    self._add(field)
            listed += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if listed > self._max_list:
                raise WireError(f"a header list over {self._max_list} bytes")
            out.append(field)
        return out

    @staticmethod
    def _int(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
        """An integer with a ``prefix``-bit prefix at ``pos`` (5.1); the position after it."""
        limit = (1 << prefix) - 1
        value = block[pos] & limit
        pos += 1
        if value < limit:
            return value, pos
        shift = 0
        while True:
            if pos >= len(block):
                raise WireError("an integer cut short")
            byte = block[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            if value >= MAX_INT:
                raise WireError("an integer too large")
            if not byte & 0x80:
                return value, pos
            shift += 7

    def _string(self, block: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(block):
            raise WireError("a string literal missing")
        coded = block[pos] & 0x80
        length, pos = self._int(block, pos, 7)
        if pos + length > len(block):
            raise WireError("a string literal cut short")
        raw = block[pos : pos + length]
        return (huffman(raw) if coded else raw), pos + length

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC:
            return STATIC_TABLE[index - 1]
        if _STATIC < index <= _STATIC + len(self._table):
            return self._table[index - _STATIC - 1]
        raise WireError(f"index {index} is in neither table")

    def _add(self, field: tuple[bytes, bytes]) -> None:
        """A new entry (4.4): older ones evicted to make room; an entry larger
        than the table empties it and is not added."""
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        self._evict(size)
        if size <= self._max:
            self._table.appendleft(field)
            self._size += size

    def _evict(self, room: int) -> None:
        while self._table and self._size + room > self._max:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD


class HeaderBlocks:
    """One connection's incoming header blocks: a HEADERS frame and the
    CONTINUATION frames after it joined (RFC 9113 sections 6.2 and 6.10),
    each whole block decoded in the connection's one HPACK context. Errors
    are :class:`driver.errors.WireError` carrying the connection error."""

    def __init__(self, max_list: int) -> None:
        self._max_list = max_list  # of the encoded block, and of the decoded list
        self._decoder = HeaderDecoder(max_list)
        self._open: tuple[int, int, bytearray] | None = None  # (stream, first flags, fragments)

    @property
    def open(self) -> bool:
        """A block waits for its CONTINUATION: no other frame may come."""
        return self._open is not None

    def frame(
        self, ftype: int, flags: int, sid: int, payload: bytes
    ) -> tuple[int, int, list[tuple[bytes, bytes]]] | None:
        """A HEADERS or CONTINUATION frame; (stream, the HEADERS' flags, the
        fields) once its block is whole."""
        if ftype == w.CONTINUATION:
            if self._open is None or self._open[0] != sid:
                raise WireError("CONTINUATION without its HEADERS", w.PROTOCOL_ERROR)
            _, first_flags, block = self._open
            block += payload
        else:
            if sid == 0 or not sid & 1:
                raise WireError(f"HEADERS on stream {sid}", w.PROTOCOL_ERROR)
            fragment = w.unpad(payload, flags, priority=True)
            if fragment is None:
                raise WireError("HEADERS padding longer than the frame", w.PROTOCOL_ERROR)
            block, first_flags = bytearray(fragment), flags
        if len(block) > self._max_list:
            raise WireError(f"a header block over {self._max_list} bytes", w.PROTOCOL_ERROR)
        if not flags & w.END_HEADERS:
            self._open = (sid, first_flags, block)
            return None
        self._open = None
        try:
            return sid, first_flags, self._decoder.decode(bytes(block))
        except WireError as exc:
            raise WireError(f"header block: {exc}", w.COMPRESSION_ERROR) from exc
