#!/usr/bin/env python3
"""Writes the wire v4 test vectors of this folder into vectors.hex, one `=== NAME` section per
packet, with every field annotated.

An independent implementation of ../WIRE.md (struct packing, no INA code): the C++ test
(tests/protocol/wire_test.cc) checks its own encoder and decoder against these bytes and against
field values transcribed by hand. Run it only when WIRE.md changes, and review the diff.
"""
import os
import re
import struct
from fractions import Fraction

NAME = re.compile(r"[a-z0-9_]+")  # a section's name (README.md "Format")
SECTIONS = {}  # name -> its text, in the order written

FLAGS = {0x01: "RESULT", 0x02: "RETRANSMIT", 0x04: "ERROR", 0x08: "NONFINITE", 0x10: "HELLO",
         0x20: "PARTIAL"}
DTYPES = {1: "int32", 2: "float32", 3: "float16", 4: "bfloat16"}
OPS = {1: "sum", 2: "min", 3: "max"}
WIDTH = {1: 4, 2: 4, 3: 2, 4: 2}
ACC = {1: 4, 2: 8, 3: 4, 4: 4}


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def vector(name, title, flags, seq, rank, slot, shadow, count, dtype, op, coll, elems, exp,
           root, words, notes, seal=None):
    """Adds the section of one vector to SECTIONS; with seal = (k0, k1) its tag is packet_tag()
    under that key of the bytes written (tag field zero), else the tag field stays 0."""
    if flags & (0x10 | 0x04):
        width, kind = 4, "u32 control words"
    elif flags & 0x20:
        width, kind = ACC[dtype], "int%d fixed-point words" % (8 * ACC[dtype])
    else:
        width, kind = WIDTH[dtype], "%s words (%d bytes)" % (DTYPES[dtype], WIDTH[dtype])
    assert len(words) == count
    lines = ["# " + l if l else "#" for l in title.split("\n")]
    lines += ["#", "# bytes                 # offset  field      value"]

    def row(hexs, off, field, value):
        lines.append("%-24s# %-3d %-10s %s" % (hexs, off, field, value))

    def tag_row(tag):
        row("%016x" % tag, 32, "tag", "0 (not sealed)" if tag == 0 else "0x%016X" % tag)

    fl = " | ".join("%s (0x%02X)" % (n, b) for b, n in FLAGS.items() if flags & b) or "none"
    row("494e", 0, "magic", '0x494E ("IN")')
    row("04", 2, "version", "4")
    row("%02x" % flags, 3, "flags", "0x%02X = %s" % (flags, fl))
    row("01020304", 4, "job", "0x01020304")
    row("%08x" % seq, 8, "seq", "0x%08X (%d)" % (seq, seq))
    row("%04x" % rank, 12, "rank", "%d" % rank)
    row("%04x" % (slot | (0x8000 if shadow else 0)), 14, "slot",
        "%d (0x%04X)%s" % (slot, slot, ", shadow bit set: copy 1" if shadow else ", copy 0"))
    row("%04x" % count, 16, "count", "%d" % count)
    row("%02x" % dtype, 18, "dtype", "%d = %s" % (dtype, DTYPES[dtype]))
    row("%02x" % op, 19, "op", "%d = %s" % (op, OPS[op]))
    row("%08x" % coll, 20, "coll", "%d" % coll)
    row("%08x" % elems, 24, "elems", "%d" % elems)
    row("%04x" % (exp & 0xFFFF), 28, "exp", "kNoExponent" if exp == -32768 else "%d" % exp)
    row("%04x" % root, 30, "root", "none (0xFFFF)" if root == 0xFFFF else "%d" % root)
    tag_at = len(lines)
    tag_row(0)
    lines.append("# payload: %d little-endian %s" % (count, kind))
    off = 40
    for i, (w, note) in enumerate(zip(words, notes)):
        b = (w & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
        lines.append("%-24s# %-3d [%d] %s" % (b.hex(), off, i, note))
        off += width
    if seal is not None:
        datagram = bytes.fromhex("".join(l.split("#", 1)[0].strip() for l in lines))
        tag_row(packet_tag(*seal, datagram))
        lines[tag_at] = lines.pop()
    assert NAME.fullmatch(name) and name not in SECTIONS, name
    SECTIONS[name] = "=== %s\n" % name + "\n".join(lines) + "\n"


M64 = (1 << 64) - 1


def siphash24(k0, k1, msg):  # SipHash-2-4 (Aumasson, Bernstein 2012), from the paper
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261,
         k1 ^ 0x7465646279746573]
    rotl = lambda x, b: ((x << b) | (x >> (64 - b))) & M64

    def rnd():
        v[0] = (v[0] + v[1]) & M64; v[1] = rotl(v[1], 13) ^ v[0]; v[0] = rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & M64; v[3] = rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & M64; v[3] = rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & M64; v[1] = rotl(v[1], 17) ^ v[2]; v[2] = rotl(v[2], 32)

    tail = msg + bytes((8 - (len(msg) + 1) % 8) % 8) + bytes([len(msg) & 0xFF])
    for i in range(0, len(tail), 8):
        m = int.from_bytes(tail[i:i + 8], "little")
        v[3] ^= m; rnd(); rnd(); v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        rnd()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


# WIRE.md "Incarnations": the epoch of a barrier and the key of an incarnation, under the job key
# (k0, k1) = (lo, hi).
def incarnation_epoch(k0, k1, salt, nonces):
    h, r = salt, 0
    while True:
        block = nonces[r:r + 28]
        h = siphash24(k0, k1, b"INAepoch" + struct.pack("<Q", h) +
                      b"".join(struct.pack("<I", n) for n in block))
        r += len(block)
        if r >= len(nonces):
            return h or 1


def incarnation_key(k0, k1, epoch):
    e = struct.pack("<Q", epoch)
    return siphash24(k0, k1, b"INAkey-0" + e), siphash24(k0, k1, b"INAkey-1" + e)


# WIRE.md "The tag": POLYVAL (RFC 8452) under a hash key derived from the key, then SipHash-2-4
# over "INAtag-4", the POLYVAL value and the length. GF(2^128) elements are ints, bit i the
# coefficient of x^i (16 bytes little-endian).
P128 = (1 << 128) | (1 << 127) | (1 << 126) | (1 << 121) | 1


def gf_mul(a, b):  # a * b mod P128
    r = 0
    for i in range(128):
        if (b >> i) & 1:
            r ^= a << i
    for i in range(255, 127, -1):
        if (r >> i) & 1:
            r ^= P128 << (i - 128)
    return r


def gf_pow(a, e):
    r = 1
    while e:
        if e & 1:
            r = gf_mul(r, a)
        a, e = gf_mul(a, a), e >> 1
    return r


X_INV_128 = gf_pow(gf_pow(2, 128), (1 << 128) - 2)  # x^-128: dot(a, b) = a * b * x^-128


def polyval(h, data):  # RFC 8452, section 3; the last block zero-padded
    s = 0
    for i in range(0, len(data), 16):
        x = int.from_bytes(data[i:i + 16].ljust(16, b"\0"), "little")
        s = gf_mul(gf_mul(s ^ x, h), X_INV_128)
    return s


# RFC 8452, Appendix A: POLYVAL(H, X_1, X_2).
assert polyval(int.from_bytes(bytes.fromhex("25629347589242761d31f826ba4b757b"), "little"),
               bytes.fromhex("4f4f95668c83dfb6401762bb2d01a262d1a24ddd2721d006bbe45f20d3c9f362")
               ) == int.from_bytes(bytes.fromhex("f7a3b47b846119fae5b7866cf5e5b77e"), "little")


def packet_tag(k0, k1, dgram):  # dgram with its tag field (bytes 32..39) zero
    h = siphash24(k0, k1, b"INAmac-H" + struct.pack("<Q", 0)) | \
        siphash24(k0, k1, b"INAmac-H" + struct.pack("<Q", 1)) << 64
    s = polyval(h, dgram)
    return siphash24(k0, k1, b"INAtag-4" + s.to_bytes(16, "little") + struct.pack("<Q", len(dgram)))


# The SipHash paper's key (bytes 00..0f): k0 = 0x0706050403020100, k1 = 0x0f0e0d0c0b0a0908.
K0, K1 = 0x0706050403020100, 0x0F0E0D0C0B0A0908
assert siphash24(K0, K1, bytes(range(15))) == 0xA129CA6149BE45E5  # the paper's vector
NONCES = [0x5EED1234, 0x5EED1235, 0x5EED1200]  # the hello vector's nonce is rank 0's
EPOCH = incarnation_epoch(K0, K1, 0x5A17, NONCES)
KEY = incarnation_key(K0, K1, EPOCH)
# 60 ranks: three blocks of the chain.
EPOCH60 = incarnation_epoch(K0, K1, 0, list(range(1, 61)))


def q(x, e, b):  # rint(x * 2^(b - e)), ties to even, exactly
    v = Fraction(x) * Fraction(2) ** (b - e)
    fl = v.numerator // v.denominator
    r = v - fl
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    return fl


NOEXP = -32768
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]

vector("data_i32_sum", "DATA, worker -> aggregator: int32 SUM, retransmitted, shadow copy.",
       0x02, 0xA1B2C3D4, 515, 0x0123, True, 4, 1, 1, 7, 65540, NOEXP, 0xFFFF,
       [1, -1, 2**31 - 1, -2**31], ["1", "-1", "INT32_MAX", "INT32_MIN"])
xs = [0.1, -0.001, 0.12, -0.0625]
vector("data_f32_sum",
       "DATA: float32 SUM, raw user words (no quantization on the worker in v2).\n"
       "NONFINITE on DATA is allowed (the aggregator scans every block itself).",
       0x0A, 0x00000010, 3, 2, False, 4, 2, 1, 0xFFFFFFFF, 0xFFFFFFFF, NOEXP, 0xFFFF,
       [f32_bits(x) for x in xs], ["%gf = 0x%08X" % (x, f32_bits(x)) for x in xs])
vector("data_f16_min", "DATA: float16 MIN, an odd count (10 payload bytes), root 2.",
       0x00, 0x00000011, 1, 9, True, 5, 3, 2, 1, 5, NOEXP, 2,
       [0x3C00, 0xC000, 0x7BFF, 0x8000, 0x0001],
       ["1.0", "-2.0", "65504 (largest finite)", "-0.0", "2^-24 (smallest subnormal)"])
vector("data_bf16_sum", "DATA: bfloat16 SUM, 2-byte words.",
       0x00, 0x00000012, 0, 0, False, 4, 4, 1, 2, 1000000, NOEXP, 0xFFFF,
       [0x3F80, 0xC020, 0x4049, 0x0001],
       ["1.0", "-2.5", "3.140625", "2^-133 (smallest subnormal)"])
vector("result_i32_max", "RESULT, aggregator -> worker: int32 MAX, slot 0x7FFF, seq top bit.",
       0x01, 0xFFFFFFFE, 0, 0x7FFF, False, 3, 1, 3, 0x80000000, 3, NOEXP, 0xFFFF,
       [7, -7, 0], ["7", "-7", "0"])
vector("result_f32_sum",
       "RESULT: float32 SUM of a block that held a NaN or Inf: NONFINITE, every element NaN.",
       0x09, 0x00000010, 0, 2, False, 2, 2, 1, 0xFFFFFFFF, 0xFFFFFFFF, NOEXP, 0xFFFF,
       [0x7FC00000, 0x7FC00000], ["quiet NaN", "quiet NaN"])
vector("result_f16_sum", "RESULT: float16 SUM, correctly rounded once from the integer sum.",
       0x01, 0x00000020, 0, 4, True, 3, 3, 1, 12, 3, NOEXP, 0xFFFF,
       [0x3C00, 0x3555, 0x8000], ["1.0", "0.33325195 (1/3 rounded)", "-0.0"])
vector("result_bf16_max",
       "RESULT: bfloat16 MAX resent to one rank (RETRANSMIT), in the user's width.",
       0x03, 0x00000021, 0, 5, False, 4, 4, 3, 13, 4, NOEXP, 0xFFFF,
       [0xFF80, 0xC020, 0x8000, 0x3F80], ["-Inf", "-2.5", "-0.0", "1.0"])
vector("partial_exp_f32",
       "PARTIAL, tree leaf -> root: the exponent request of a float32 SUM block (count 0).\n"
       "rank = the leaf's child index; exp = E_leaf = MAX of its ranks' block exponents;\n"
       "NONFINITE: one of its ranks' blocks held a NaN or Inf.",
       0x28, 0x00000030, 1, 6, False, 0, 2, 1, 20, 1024, -3, 0xFFFF, [], [])
vector("partial_exp_answer_bf16",
       "PARTIAL | RESULT, root -> leaves: the job-wide E = MAX over the leaves (count 0).",
       0x21, 0x00000031, 0, 7, True, 0, 4, 1, 21, 2048, 5, 0xFFFF, [], [])
E, N = -3, 4
B = 62 - 2
vals = [f32(0.1), f32(-0.001)]
vector("partial_f32_sum",
       "PARTIAL, leaf -> root: fixed-point partial sums of a float32 SUM block, int64 words.\n"
       "exp = E - B, the exponent of one unit: E = -3, world N = 4, B = 62 - 2 = 60: exp = -63.\n"
       "The words are rint(x * 2^(B-E)) of a leaf with one rank and the values below.",
       0x20, 0x00000030, 1, 6, False, 2, 2, 1, 20, 1024, E - B, 0xFFFF,
       [q(v, E, B) for v in vals], ["q(0.1f) = %d" % q(vals[0], E, B),
                                    "q(-0.001f) = %d" % q(vals[1], E, B)])
E, B = 1, 30 - 3
vector("partial_f16_sum",
       "PARTIAL, leaf -> root: float16 SUM partials, int32 words. E = 1, N = 8, B = 27:\n"
       "exp = E - B = -26; the words are the sums over the leaf's two ranks of rint(x * 2^26).",
       0x20, 0x00000040, 2, 8, True, 2, 3, 1, 22, 2, E - B, 0xFFFF,
       [q(1.0, E, B) + q(0.5, E, B), q(-0.25, E, B) + q(-0.25, E, B)],
       ["1.0 + 0.5 -> 100663296", "-0.25 + -0.25 -> -33554432"])
vector("hello", "HELLO, worker -> aggregator: a retransmitted join request.\n"
       "seq = the incarnation nonce; payload [world_size].",
       0x12, 0x5EED1234, 39, 0, False, 1, 1, 1, 0, 0, NOEXP, 0xFFFF, [40], ["world_size 40"])
vector("welcome",
       "WELCOME, aggregator -> worker: the answer to the hello vector (seq = its nonce).\n"
       "Under the job key 000102..0f (k0 = 0x%016X, k1 = 0x%016X), with salt 0x5A17\n"
       "and the nonces of ranks 0, 1, 2 = 0x%08X, 0x%08X, 0x%08X:\n"
       "epoch = incarnation_epoch = 0x%016X,\n"
       "incarnation_key = (k0 0x%016X, k1 0x%016X).\n"
       "(Ranks 1..60 with nonces 1..60, salt 0: epoch 0x%016X.)"
       % (K0, K1, NONCES[0], NONCES[1], NONCES[2], EPOCH, KEY[0], KEY[1], EPOCH60),
       0x11, NONCES[0], 0, 0, False, 4, 1, 1, 0, 0, NOEXP, 0xFFFF,
       [512, 1024, EPOCH & 0xFFFFFFFF, EPOCH >> 32],
       ["num_slots 512", "max_payload_bytes 1024", "epoch, low 32 bits", "epoch, high 32 bits"])
vector("error_missing_ranks",
       "ERROR, aggregator -> worker: kMissingRanks with the bitmap of a 40-rank job\n"
       "(ranks 0, 1, 2, 5, 31, 32, 39 present). rank = the rank answered.",
       0x04, 0xA1B2C3D4, 515, 0x0123, True, 3, 1, 1, 7, 65540, NOEXP, 0xFFFF,
       [1, 0x80000027, 0x00000081], ["reason 1 = kMissingRanks", "bitmap[0] ranks 0, 1, 2, 5, 31",
                                     "bitmap[1] ranks 32, 39"])
vector("error_aborted",
       "ERROR, worker -> aggregator: kAborted, the one ERROR a worker sends: rank 2 gives up on\n"
       "the round (seq, slot, shadow) at its deadline. The aggregator answers a late rank's DATA\n"
       "for that round with the same three words.",
       0x04, 0x00001234, 2, 9, True, 3, 1, 1, 11, 1000, NOEXP, 0xFFFF,
       [5, 2, 1], ["reason 5 = kAborted", "the rank that gave up: 2", "cause 1 = its deadline"])
vector("error_superseded",
       "ERROR, aggregator -> worker: kSuperseded, the answer to DATA for a round older than the\n"
       "one its slot copy holds (seq 0x1234 there, the copy holds 0x1274).",
       0x04, 0x00001234, 3, 9, True, 2, 1, 1, 11, 1000, NOEXP, 0xFFFF,
       [6, 0x1274], ["reason 6 = kSuperseded", "the sequence the copy holds: 0x1274"])

# A sealed DATA packet: 100 float32 words (440 bytes: the tag's 27 whole blocks and a partial one)
# under the incarnation key of the welcome vector.
vector("data_f32_sealed",
       "DATA: float32 SUM, 100 words, sealed: word i = (i - 50) / 8.\n"
       "The tag under the incarnation key of welcome (k0 0x%016X, k1 0x%016X)."
       % (KEY[0], KEY[1]),
       0x00, 0x00000100, 1, 3, False, 100, 2, 1, 30, 100, NOEXP, 0xFFFF,
       [f32_bits((i - 50) / 8.0) for i in range(100)],
       ["%g" % ((i - 50) / 8.0) for i in range(100)], seal=KEY)

HEAD = """\
# Wire format version 4 test vectors (../WIRE.md): one packet per section, `=== NAME` starts the
# packet NAME. Format and the list of vectors: README.md. Written by gen_vectors.py: do not edit
# by hand; rerun it when WIRE.md changes and review the diff.
"""
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.hex"), "w") as f:
    f.write(HEAD + "".join("\n" + text for text in SECTIONS.values()))
