"""HTTP/2 frames and the few header blocks a gRPC server sends, as bytes.

Why this module exists: the plugin's gRPC server (``plugin.servers.h2conn``)
speaks HTTP/2 itself instead of through grpclib and h2, whose state machine
and HPACK encoder cost more CPU per kubelet call than the plugin's own work
on a claim (issue 36, docs/figures.md). A gRPC server sends only a handful
of header fields, always the same ones, so they are encoded here once, as
HPACK literals that never touch the dynamic table (RFC 7541 section 6.2.2):
the peer's table stays as it is and nothing here keeps any state.

Everything is a pure function of its arguments (RFC 9113 section 4 for the
frame layout, section 6 for each type).
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9

# Flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Settings identifiers (section 6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

# Error codes (section 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR = 0x9

# gRPC status codes (google.rpc.Code) the server answers with
UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNIMPLEMENTED = 2, 4, 8, 12
INTERNAL, UNAVAILABLE = 13, 14

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1

HEAD = struct.Struct(">IBL")  # length << 8 | type, flags, stream id
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte head, then ``payload``."""
    return HEAD.pack(len(payload) << 8 | ftype, flags, stream) + payload


def settings(values: dict[int, int]) -> bytes:
    """A SETTINGS frame carrying ``values``."""
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values.items()))


def parse_settings(payload: bytes) -> list[tuple[int, int]] | None:
    """The (identifier, value) pairs of a SETTINGS payload; None when its
    length is not a multiple of 6 (a FRAME_SIZE_ERROR)."""
    if len(payload) % 6:
        return None
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def unpad(payload: bytes, flags: int, *, priority: bool = False) -> bytes | None:
    """A DATA or HEADERS payload without its padding (and, for HEADERS, its
    priority fields); None when the padding does not fit in the frame."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            return None
        start, end = 1, len(payload) - payload[0]
    if priority and flags & PRIORITY_FLAG:
        start += 5
    return payload[start:end] if start <= end else None


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream) + _U32.pack(code) + debug)


def u32(payload: bytes) -> int:
    """The first 4 bytes of ``payload`` as a 31-bit value (the top bit reserved)."""
    return int(_U32.unpack_from(payload)[0]) & MAX_WINDOW


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1) in a first byte already carrying ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman."""
    return b"\x00" + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


def table_size_update(size: int) -> bytes:
    """A dynamic table size update (RFC 7541 section 6.3)."""
    return hpack_int(size, 5, 0x20)


# ":status: 200" is entry 8 of the static table; "content-type" is entry 31,
# sent as a literal without indexing with that indexed name.
RESPONSE_HEADERS = b"\x88" + hpack_int(31, 4, 0) + hpack_int(16, 7, 0) + b"application/grpc"
OK_TRAILERS = literal(b"grpc-status", b"0")


def status_trailers(code: int, message: str) -> bytes:
    """The trailers of a call that ends with ``code`` and ``message``."""
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    return block


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: printable ASCII but ``%`` as is, the rest %XX."""
    return b"".join(
        bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
        for b in message.encode("utf-8", "replace")
    )


def grpc_timeout_s(value: bytes) -> float | None:
    """The seconds of a ``grpc-timeout`` header (``1S``, ``500m``); None if malformed."""
    units = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in units:
        return None
    return int(digits) * units[unit]
