#!/usr/bin/env python3
"""Writes the fuzz harnesses' seed inputs into CORPUS_DIR/<harness>/seed-*: run_fuzzer.sh calls it
at every run (into its work directory), so the seeds follow the input layouts and the wire
vectors. Crash regressions are committed by hand in tests/fuzz/corpus/<harness>/, named regress-*.

  tests/fuzz/make_seeds.py CORPUS_DIR

The engine seeds follow engine_fuzz.cc's record layout; the wire seeds are the checked-in wire
vectors (the sections of protocol/testdata/vectors.hex), one seed named after each."""
import json
import os
import pathlib
import re
import string
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent
VECTORS = HERE.parent.parent / "protocol" / "testdata" / "vectors.hex"
SECTION = re.compile(r"=== ([a-z0-9_]+)")


def wire_vectors(path=VECTORS):
    """The packets of a vectors file by name, sorted by name (format in its folder's README.md);
    exits with the line on a malformed file."""
    texts, name = {}, None
    for n, line in enumerate(open(path), 1):
        if line.startswith("==="):
            m = SECTION.fullmatch(line.rstrip("\r\n"))
            if not m or m.group(1) in texts:
                sys.exit("%s:%d: a malformed or duplicated section %r" % (path, n, line.strip()))
            name = m.group(1)
            texts[name] = ""
        elif name is None:
            if line.split("#", 1)[0].strip():
                sys.exit("%s:%d: bytes before the first section" % (path, n))
        else:
            texts[name] += line.split("#", 1)[0]
    out = {}
    for name in sorted(texts):
        words = texts[name].split()  # whitespace between bytes, never inside one
        digits = "".join(words)
        if not digits or any(len(w) % 2 for w in words) or \
                any(c not in string.hexdigits for c in digits):
            sys.exit("%s: section %s: no bytes, a byte split or not hex" % (path, name))
        out[name] = bytes.fromhex(digits)
    if not out:
        sys.exit("%s: no sections" % path)
    return out


def vector(name):
    return wire_vectors()[name]


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


US_MAC = bytes([2, 0, 0, 0, 0, 1])
PEER_MAC = bytes([2, 0, 0, 0, 0, 2])
US_IP = bytes([10, 0, 0, 1])
PEER_IP = bytes([10, 0, 0, 2])


def ipv4(proto, payload, options=b""):
    ihl = 5 + len(options) // 4
    h = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 4 * ihl + len(payload), 1, 0x4000, 64, proto,
                    0, PEER_IP, US_IP) + options
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return h + payload


def udp_frame(datagram, dport=47474, options=b"", padding=b""):
    udp = struct.pack("!HHHH", 40000, dport, 8 + len(datagram), 0) + datagram
    pseudo = PEER_IP + US_IP + struct.pack("!BBH", 0, 17, len(udp))
    c = csum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    return US_MAC + PEER_MAC + b"\x08\x00" + ipv4(17, udp, options) + padding


def frame_seeds():
    hello = vector("hello")
    data = vector("data_f32_sum")
    arp = (b"\xff" * 6 + PEER_MAC + b"\x08\x06" +
           struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, PEER_MAC, PEER_IP, b"\0" * 6, US_IP))
    icmp = struct.pack("!BBHHH", 8, 0, 0, 7, 1) + b"ping data"
    icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
    return {
        "udp-hello": b"\0" + udp_frame(hello),
        "udp-data-offload-good": b"\x05" + udp_frame(data),
        "udp-options-padding": b"\0" + udp_frame(hello, options=b"\x01\x01\x01\x00",
                                                 padding=b"\0" * 6),
        "udp-wrong-port": b"\0" + udp_frame(hello, dport=9),
        "arp-request": b"\0" + arp,
        "icmp-echo": b"\0" + US_MAC + PEER_MAC + b"\x08\x00" + ipv4(1, icmp),
    }


# ---- engine_fuzz.cc records ----
FLAGS = [0x00, 0x02, 0x08, 0x10, 0x12, 0x20, 0x22, 0x01, 0x09, 0x11, 0x04, 0x21]  # kFlagChoices
FLAT, LEAF, ROOT = 0, 1, 2
DTYPES = {"i32": 0, "f32": 1, "f16": 2}  # input byte -> 1 + byte % 6


def rec(job, flags, rank, *, seq=1, slot=0, shadow=0, dtype="i32", op=0, exp=None, elems=0,
        words=b"", width=4, fix=0, clock=1, how=2, flip=None):
    """One structured packet: mode, fields in engine_fuzz.cc's order, payload, fix, clock."""
    b = bytes([(how << 2) | job, FLAGS.index(flags), seq, rank, slot, shadow, DTYPES[dtype], op])
    if flags & 0x20:
        b += struct.pack("!h", exp if exp is not None else 0)
    count = len(words) // width
    b += bytes([0, elems, 0xFF]) + struct.pack("!H", count) + words + bytes([fix])
    if how == 3:
        b += struct.pack("!H", flip or 0)
    return b + struct.pack("!H", clock)


def raw(job, datagram, seal=False, clock=1):
    return bytes([(1 if seal else 0) << 2 | job]) + struct.pack("!H", len(datagram)) + datagram + \
        struct.pack("!H", clock)


def i32(*v):
    return struct.pack("<%di" % len(v), *v)


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def engine_seeds():
    hello = lambda job, r, world_fix=1: rec(job, 0x10, r, words=i32(0), fix=world_fix)
    flat_join = b"".join(hello(FLAT, r) for r in range(3))
    i32_round = b"".join(rec(FLAT, 0x00, r, elems=16, words=i32(*range(r, r + 16)))
                         for r in range(3))
    f32_round = b"".join(rec(FLAT, 0x00, r, seq=2, slot=1, dtype="f32", elems=8,
                             words=f32(*[0.5 * r + i for i in range(8)])) for r in range(3))
    retransmit = rec(FLAT, 0x02, 0, elems=16, words=i32(*range(16)))
    mismatch = (rec(FLAT, 0x00, 0, seq=3, slot=2, elems=4, words=i32(1, 2, 3, 4)) +
                rec(FLAT, 0x00, 1, seq=3, slot=2, elems=5, words=i32(1, 2, 3, 4, 5)) +
                rec(FLAT, 0x00, 2, seq=3, slot=2, elems=4, words=i32(1, 2, 3, 4)))
    leaf_join = hello(LEAF, 2) + hello(LEAF, 3) + rec(LEAF, 0x11, 1, words=i32(4, 64))
    leaf_round = (b"".join(rec(LEAF, 0x00, r, elems=4, words=i32(r, r, r, r)) for r in (2, 3)) +
                  rec(LEAF, 0x01, 0, elems=4, words=i32(9, 9, 9, 9)))
    leaf_float = (b"".join(rec(LEAF, 0x00, r, dtype="f32", elems=4, words=f32(1, 2, 3, 4))
                           for r in (2, 3)) +
                  rec(LEAF, 0x21, 0, dtype="f32", exp=3) +
                  rec(LEAF, 0x01, 0, dtype="f32", elems=4, words=f32(2, 4, 6, 8)))
    root_join = hello(ROOT, 0) + hello(ROOT, 1)
    root_float = (b"".join(rec(ROOT, 0x20, r, dtype="f32", exp=2) for r in (0, 1)) +
                  b"".join(rec(ROOT, 0x20, r, dtype="f32", exp=3, elems=2,
                               words=struct.pack("<2q", 1 << 40, 3 << 40), width=8)
                           for r in (0, 1)))
    return {
        "flat-i32-round": flat_join + i32_round + retransmit,
        "flat-f32-round": flat_join + f32_round,
        "flat-mismatch": flat_join + mismatch,
        "flat-not-ready": rec(FLAT, 0x00, 0, elems=2, words=i32(1, 2)),
        "flat-bad-tag": flat_join + rec(FLAT, 0x00, 0, elems=2, words=i32(1, 2), how=3, flip=35),
        "world-mismatch": rec(FLAT, 0x10, 0, words=i32(5)),
        "leaf-i32": leaf_join + leaf_round,
        "leaf-f32": leaf_join + leaf_float,
        "root-f32": root_join + root_float,
        "raw-vectors": b"".join(raw(FLAT, v) for v in wire_vectors().values()),
        "raw-sealed": raw(FLAT, vector("hello"), seal=True),
    }


def config_seeds():
    return {
        "env-basic": "INA_RANK=0\nINA_WORLD_SIZE=4\nINA_AGGREGATOR=10.0.0.1:47474\n",
        "env-sharded": "INA_RANK=1\nINA_WORLD_SIZE=2\nINA_AGGREGATOR=a:1,b:2,[::1]:3\n"
                       "INA_JOB=7\nINA_JOB_KEY=000102030405060708090a0b0c0d0e0f\n",
        "env-launcher": "OMPI_COMM_WORLD_RANK=3\nOMPI_COMM_WORLD_SIZE=8\nMASTER_ADDR=h\n"
                        "MASTER_PORT=29500\nINA_ALGO=ring\nINA_FALLBACK=float\n",
        "env-knobs": "RANK=0\nWORLD_SIZE=1\nINA_TRANSPORT=udp\nINA_BLOCK_ELEMS=512\nINA_WINDOW=64\n"
                     "INA_TIMEOUT_MS=100\nINA_RETRANSMIT_US=50\nINA_TEST_DROP_PERCENT=1.5\n"
                     "INA_TEST_STRAGGLE=10:2000\nINA_TEST_SEED=0x10\nINA_HOST_TRANSPORT=tcp\n"
                     "INA_COST_MODEL=alpha=1,beta=2\nINA_CONTROLLER=ctl:47480\nINA_JOB_NAME=j.1\n"
                     "INA_VERBS_DEVICE=mlx5_0\nINA_VERBS_GID_INDEX=3\nINA_DEVICE_BUFFERS=2\n",
        "env-bypass": "INA_RANK=1\nINA_WORLD_SIZE=2\nINA_AGGREGATOR=10.0.0.1\nINA_TRANSPORT=xdp\n"
                      "INA_LOCAL_IP=10.0.0.2\nINA_LOCAL_MAC=02:00:00:00:00:01\n"
                      "INA_AGGREGATOR_MAC=02:00:00:00:00:02\nINA_LOCAL_PORT=47500\n"
                      "INA_DPDK_ARGS=--no-huge -m 64 --vdev=net_null0\nINA_DPDK_PORT=net_null0\n"
                      "INA_XDP_IFACE=eth1\nINA_XDP_QUEUE=1\nINA_XDP_COPY=1\n",
        "admitted": "admitted\njob 3\nkey 00112233445566778899aabbccddeeff\n"
                    "aggregator 10.0.0.5:47474\nslots 64\nblock 256\n",
        "admitted-sharded": "admitted\njob 4\nkey 00112233445566778899aabbccddeeff\nshards 2\n"
                            "aggregator a:1\naggregator [::1]:2\nslots 8\nblock 128\nreason x\n",
        "refused": "refused\njob 5\nreason no capacity\n",
    }


def agg_jobs_seeds():
    key = "00112233445566778899aabbccddeeff"
    flat = {"job": 1, "key": key, "world": 4, "slots": 16, "block_elems": 256, "slot_base": 0}
    leaf = dict(flat, job=2, slot_base=16, role="leaf", rank_base=2, local_ranks=2,
                child_index=1, parent="10.0.0.9:47474", parent_world=2, leaf_bases=[0, 2])
    root = dict(flat, job=3, world=2, slot_base=32, role="root")
    return {
        "flat": json.dumps({"jobs": [flat]}),
        "tree": json.dumps({"jobs": [leaf, root]}),
        "overlap": json.dumps({"jobs": [flat, dict(flat, job=5, slot_base=8)], "draining": False}),
        "empty": json.dumps({"jobs": []}),
    }


def controller_seeds():
    hb = lambda i, cap=256, fan=8: "hb " + json.dumps(
        {"id": "agg%d" % i, "host": "10.0.0.%d" % i, "port": 47474, "slot_capacity": cap,
         "max_fan_in": fan, "block_elems": 256, "http": "10.0.0.%d:9100" % i,
         "jobs": {"1": {"packets": 10}, "x": {}}})
    state = {"version": 3, "next_id": 3, "aggregators": [
        {"id": "a", "host": "h", "port": 1, "slot_capacity": 64, "max_fan_in": 4,
         "block_elems": 256, "http": "", "draining": False}],
        "jobs": [{"id": 2, "name": "n", "world": 2, "key": "00" * 16, "slots": 8,
                  "block_elems": 256, "dtypes": ["float32"], "state": "active", "reason": "",
                  "placements": [{"aggregator": "a", "role": "flat", "slot_base": 0,
                                  "local_ranks": 2}],
                  "shards_asked": 1, "replacements": 0, "released": [1]}]}
    return {
        "flat": "\n".join([hb(1), "admit name=a&world=4&rank=0&slots=16&block=256",
                           "admit name=a&world=4&rank=3", "release a 0", "release a 1",
                           "release a 2", "release a 3"]),
        "tree": "\n".join([hb(1, fan=2), hb(2, fan=2), hb(3, fan=2),
                           "admit name=t&world=4&rank=2&dtypes=float32,int32", "tick 100",
                           hb(1, fan=2), "drain agg2 1", "tick 5000", hb(1, fan=2), "remove 1"]),
        "sharded": "\n".join([hb(1), hb(2), "admit name=s&world=2&shards=2&slots=8",
                              "admit name=r&world=100", "tick 70000"]),
        "state": "state " + json.dumps(state) + "\nadmit name=n&world=2\nadmit name=m&world=2",
    }


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_seeds.py CORPUS_DIR")
    out = pathlib.Path(sys.argv[1])
    sets = {
        "wire": wire_vectors(),
        "frame": frame_seeds(),
        "engine": engine_seeds(),
        "config": config_seeds(),
        "agg_jobs": agg_jobs_seeds(),
        "controller": controller_seeds(),
    }
    for harness, seeds in sets.items():
        d = out / harness
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("seed-*"):
            old.unlink()
        for name, body in seeds.items():
            (d / ("seed-" + name)).write_bytes(body.encode() if isinstance(body, str) else body)
    print("make_seeds: wrote", sum(len(s) for s in sets.values()), "seeds under", out)


if __name__ == "__main__":
    main()
