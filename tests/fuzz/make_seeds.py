#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/ from the wire formats as
documented (pdkv.proto, docs/backends.md), encoded here by hand: protobuf's
varints and length-delimited fields, the descriptors' little-endian u64s and
length-prefixed strings, mooncake's 40-byte frame headers. Run it again only
when a format changes; the seeds are committed."""

import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, value):
    """One protobuf field: int -> varint, bytes/str -> length-delimited."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


def packed(number, values):
    return field(number, b"".join(varint(v) for v in values))


VERSION = 3


def rank_ref(engine, tp=0, incarnation=7):
    return message((1, engine), (3, tp), (5, incarnation))


def rank_info(engine, tp, tp_size, role):
    kv = message((1, 2), (2, 4), (3, 2), (4, 4), (5, 2), (6, 16))
    return message((1, engine), (3, 1), (4, tp), (5, tp_size), (7, 1), (9, 2), (10, kv),
                   (11, "loopback"), (12, "127.0.0.1:1"), (13, b"desc"), (14, 42 + tp),
                   (15, role))


def u64(n):
    return struct.pack("<Q", n)


def blob(b):
    if isinstance(b, str):
        b = b.encode()
    return u64(len(b)) + b


def frame(kind, seq, addr, length, payload):
    return struct.pack("<IHHQQQQ", 0x4D4B4450, kind, 0, seq, addr, length, len(payload)) + payload


def seeds():
    out = {}
    register = [message((1, VERSION), (2, rank_info("prefill", t, 2, 0))) for t in range(2)]
    topology = message((1, VERSION), (2, "prefill"))
    records = b"".join(b"\x00" + struct.pack("<H", len(r)) + r for r in register)
    out["bootstrap"] = [records + b"\x01" + struct.pack("<H", len(topology)) + topology,
                        b"\x00" + struct.pack("<H", len(register[0])) + register[0]]

    info = message((1, VERSION), (2, 3), (3, rank_ref("decode"))) + packed(4, [1, 2])
    status = message((1, VERSION), (2, 3), (3, rank_ref("prefill")), (4, 1), (7, 4096))
    failed = message((1, VERSION), (2, 3), (3, rank_ref("prefill")), (5, "cut"), (6, 9),
                     (8, 1), (9, 1))
    abort = message((1, VERSION), (2, 3), (3, rank_ref("decode")), (4, "stop"))
    notice = message((1, VERSION), (2, 5), (3, rank_ref("decode")), (10, 1))
    batch = message((1, VERSION), (2, status), (2, failed))
    out["control"] = [b"\x00\x07" + info, b"\x01\x07" + status, b"\x01\x07" + failed,
                      b"\x02\x07" + abort, b"\x00\x03" + notice, b"\x00\x00" + info,
                      b"\x03\x07" + batch]

    # Buffers: base, length, memfd (all ones: not shared), the memfd's inode.
    mooncake = (blob("pdkv-mooncake-3") + blob("127.0.0.1:5000") + blob("host") + u64(1) +
                u64(2) + blob(b"s" * 32) + u64(1) + blob("127.0.0.1:5000") + u64(2) +
                u64(0x10000) + u64(4096) + u64(2**64 - 1) + u64(0) +
                u64(0x20000) + u64(4096) + u64(5) + u64(77))
    # Key, nonce, host, start time, inbox key, keeps inbound, doorbell and
    # its eventfd-id, endpoints; memory: id, base, length, memfd, its inode,
    # keys.
    mori = (blob("pdkv-mori-5") + blob("engine") + u64(3) + blob("host") + u64(12345) +
            u64(0x77) + u64(1) + u64(9) + u64(42) + u64(1) + blob("tcp;ofi_rxm") + blob(b"addr") +
            u64(1) + u64(0) +
            u64(0x10000) + u64(4096) + u64(7) + u64(99) + u64(1) + u64(0x1234))
    nixl = blob("pdkv-nixl-2") + blob(b"worker") + u64(5) + u64(0) + u64(1) + u64(0) + \
        u64(4096) + blob(b"rkey")
    out["descriptors"] = [b"\x00" + mooncake, b"\x01" + mori, b"\x02" + nixl]

    write = frame(4, 1, 100, 5, b"hello")
    read = frame(6, 2, 0, 16, b"")
    notify = frame(8, 3, 0, 4, b"note")
    out["mooncake_frames"] = [b"\x03" + write + read + notify, b"\x00" + write,
                              b"\x01" + frame(4, 1, 1 << 20, 8, b"12345678")]

    rng = random.Random(17)
    out["planner"] = [bytes(rng.randrange(256) for _ in range(n)) for n in (16, 32, 64, 128)]
    return out


def main():
    for target, items in seeds().items():
        folder = os.path.join(HERE, "corpus", target)
        os.makedirs(folder, exist_ok=True)
        for i, data in enumerate(items):
            with open(os.path.join(folder, f"seed-{i}"), "wb") as f:
                f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
