"""The plugin's HPACK decoder against the ``hpack`` library: what hpack's
encoder writes, ours decodes as hpack's decoder does, block after block on
one connection (the dynamic table must follow the peer's exactly); what
RFC 7541 forbids is refused."""

from __future__ import annotations

import random

import hpack
import pytest
from hpack.exceptions import HPACKError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from driver.errors import WireError
from plugin.servers import h2wire as w
from plugin.servers.h2headers import HeaderBlocks, HeaderDecoder, huffman
from plugin.servers.h2wire import hpack_int

LIMIT = 16 << 10
NAMES = [":method", ":path", ":authority", "content-type", "te", "grpc-timeout", "user-agent",
         "x-a", "x-long-name-" + "n" * 40, "accept-encoding"]  # fmt: skip


def _value(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return f"{rng.randrange(10**9)}u"  # a grpc-timeout's digits
    if kind == 1:
        return "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz/.-_") for _ in range(rng.randrange(30))
        )
    if kind == 2:
        return "v" * rng.randrange(200, 1500)  # over a small table: empties it
    return rng.choice(["POST", "application/grpc", "trailers", "gzip, deflate", ""])


@pytest.mark.parametrize("seed", range(6))
def test_blocks_of_one_connection_decode_as_hpack_decodes_them(seed: int) -> None:
    rng = random.Random(seed)
    encoder, theirs, ours = hpack.Encoder(), hpack.Decoder(LIMIT), HeaderDecoder(LIMIT)
    for _ in range(300):
        if rng.random() < 0.05:  # the peer shrinks or regrows its table: a size update
            encoder.header_table_size = rng.choice([0, 64, 256, 1024, 4096])
        fields = [(rng.choice(NAMES), _value(rng)) for _ in range(rng.randrange(1, 9))]
        sensitive = rng.random() < 0.2
        block = encoder.encode(
            [(n, v, sensitive and i % 2 == 0) for i, (n, v) in enumerate(fields)],
            huffman=rng.random() < 0.7,
        )
        assert ours.decode(block) == [tuple(f) for f in theirs.decode(block, raw=True)]


def test_huffman_strings_of_every_byte() -> None:
    code = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
    rng = random.Random(7)
    every = bytes(range(256))
    assert huffman(code.encode(every)) == every
    for _ in range(500):
        text = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        assert huffman(code.encode(text)) == text


def _literal(value: bytes, coded: bool) -> bytes:
    """A literal without indexing, name ``x``, the value as given (raw bytes
    behind the Huffman flag when ``coded``)."""
    return b"\x00\x01x" + hpack_int(len(value), 7, 0x80 if coded else 0) + value


@pytest.mark.parametrize(
    ("block", "why"),
    [
        (b"\x80", "index 0"),
        (b"\xbe", "index 62 with an empty dynamic table"),
        (b"\xff", "an integer cut short"),
        (b"\xff\xff\xff\xff\xff\x7f", "an integer too large"),
        (b"\x00\x05ab", "a string literal cut short"),
        (b"\x00\x01x", "a string literal missing"),
        (b"\x3f\xe2\x1f", "a table size update over 4096"),
        (b"\x82\x20", "a table size update after a field"),
        (_literal(b"\x00", coded=True), "Huffman padding of zeros"),
        (_literal(b"\x07\xff", coded=True), "Huffman padding of 8 bits or more"),
        (_literal(b"\xff\xff\xff\xff", coded=True), "the EOS symbol in a string"),
    ],
)
def test_a_malformed_block_is_refused(block: bytes, why: str) -> None:
    with pytest.raises(WireError):
        HeaderDecoder(LIMIT).decode(block)
    with pytest.raises(HPACKError):  # as the library refuses it
        hpack.Decoder(LIMIT).decode(block, raw=True)


def test_a_list_that_expands_past_the_limit_is_refused() -> None:
    """Indexed fields cost a byte each on the wire: a block of them may not
    decode into more than the limit (names, values and 32 each)."""
    decoder = HeaderDecoder(LIMIT)
    big = b"\x40\x01x" + hpack_int(3000, 7, 0) + b"v" * 3000  # x: v*3000, into the table
    assert decoder.decode(big) == [(b"x", b"v" * 3000)]
    assert len(decoder.decode(b"\xbe" * 5)) == 5  # 5 x 3033 bytes: under 16 KiB
    with pytest.raises(WireError, match="over 16384 bytes"):
        decoder.decode(b"\xbe" * 6)


def test_an_entry_larger_than_the_table_empties_it() -> None:
    decoder = HeaderDecoder(LIMIT)
    decoder.decode(b"\x40\x01a\x01b")  # a: b, entry 62
    assert decoder.decode(b"\xbe") == [(b"a", b"b")]
    huge = b"\x40\x01x" + hpack_int(5000, 7, 0) + b"v" * 5000  # 5033 bytes > 4096
    assert decoder.decode(huge) == [(b"x", b"v" * 5000)]
    with pytest.raises(WireError, match="index 62"):
        decoder.decode(b"\xbe")


def test_a_smaller_table_evicts_at_once() -> None:
    """A size update of 0 empties the table before the block's first field."""
    decoder = HeaderDecoder(LIMIT)
    decoder.decode(b"\x40\x01a\x01b")
    with pytest.raises(WireError, match="index 62"):
        decoder.decode(b"\x20\xbe")


def test_a_block_split_into_continuations_is_joined_and_padding_dropped() -> None:
    """RFC 9113 6.2 and 6.10: the HEADERS frame's padding and priority fields
    go, its CONTINUATIONs join it, and the block keeps the HEADERS' flags."""
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/a.B/C"), ("te", "trailers")])
    blocks = HeaderBlocks(LIMIT)
    padded = bytes([3]) + b"\x00\x00\x00\x00\x10" + block[:2] + b"\x00" * 3
    flags = w.PADDED | w.PRIORITY_FLAG | w.END_STREAM
    assert blocks.frame(w.HEADERS, flags, 1, padded) is None
    assert blocks.open
    assert blocks.frame(w.CONTINUATION, 0, 1, block[2:4]) is None
    whole = blocks.frame(w.CONTINUATION, w.END_HEADERS, 1, block[4:])
    assert whole == (1, flags, [(b":method", b"POST"), (b":path", b"/a.B/C"), (b"te", b"trailers")])
    assert not blocks.open


@pytest.mark.parametrize(
    ("ftype", "flags", "sid", "payload", "code"),
    [
        (w.CONTINUATION, w.END_HEADERS, 1, b"\x82", w.PROTOCOL_ERROR),  # no HEADERS before it
        (w.HEADERS, w.END_HEADERS, 2, b"\x82", w.PROTOCOL_ERROR),  # a server-side stream id
        (w.HEADERS, w.END_HEADERS | w.PADDED, 1, b"\x09\x82", w.PROTOCOL_ERROR),  # padding > frame
        (w.HEADERS, 0, 1, b"\x00" * (LIMIT + 1), w.PROTOCOL_ERROR),  # a block over the limit
        (w.HEADERS, w.END_HEADERS, 1, b"\x80", w.COMPRESSION_ERROR),  # undecodable
    ],
)
def test_a_bad_header_frame_is_the_connection_error_it_names(
    ftype: int, flags: int, sid: int, payload: bytes, code: int
) -> None:
    with pytest.raises(WireError) as failed:
        HeaderBlocks(LIMIT).frame(ftype, flags, sid, payload)
    assert failed.value.code == code
