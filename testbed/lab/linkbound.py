"""Link-bound testbed: link rates (tc tbf), the rate check, INA's framing and every variant's
bound.

In a cluster the links are the bottleneck; on one machine they are not unless they are shaped.
`shape()` puts a token bucket (tbf) of the given rate on a device; topo.Topology(link_rate=R)
puts one on both ends of every worker link (the worker's eth0 and its switch port) and on every
leaf-spine link. The aggregator's link is not shaped: the aggregator plays the switch, whose
internal path is not one worker's link. `rate_check()` streams TCP over every worker link in
both directions before a sweep and compares the goodput with the rate: a shaped link gives
R x 1448/1514 (tbf counts Ethernet frames without FCS; TCP with timestamps carries 1448 of
1514 bytes), an unshaped veth gives many times more, an overloaded machine less.

Bounds (algbw, bytes of the user's buffer per second, for a link of R bit/s each way):
  INA (in-network)   R/8 x P/F                    each worker sends and receives its data once;
                                                   P user bytes per packet, F bytes per frame
  ring (host, Gloo)  R/8 x E x N / (2(N-1)) / W   each rank sends 2(N-1)/N of the data
  halving-doubling   as the ring at a power of two N (Rabenseifner), plus D for a non-power
  double binary tree R/8 x E / T(N) / W            T(N): the most a rank sends or receives, in
                                                   units of D, in libina's two trees (tree.h)
with E = 1448/1514 (TCP) and W the host path's wire bytes per user byte (float16/bfloat16 travel
as float32 words: 2). Open MPI's default picks its own algorithm: its bound is the ring's (the
best a host algorithm does), and mpi-ring forces the ring.

The framing constants live in `ina_framing()` only (wire.h's kHeaderSize is read from the
source tree, so a new wire version updates the header by itself; the bytes per element on the
wire are in WIRE_ELEM_BYTES).
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WIRE_H = os.path.join(ROOT, "protocol", "include", "ina", "protocol", "wire.h")

ETH_HDR, IPV4_HDR, UDP_HDR = 14, 20, 8
TCP_PAYLOAD, TCP_FRAME = 1448, 1514          # MSS with timestamps; 14 + 20 + 32 + 1448
TCP_EFFICIENCY = TCP_PAYLOAD / TCP_FRAME

# Bytes each element takes on INA's wire, per dtype (wire v2: the user's width).
WIRE_ELEM_BYTES = {"float32": 4, "int32": 4, "float16": 2, "bfloat16": 2,
                   "float8_e4m3": 1, "float8_e5m2": 1}
DTYPE_BYTES = {"float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3": 1,
               "float8_e5m2": 1}
DEFAULT_HEADER = 40

# tbf settings: a trial held 119.5 MB/s of TCP and 120.3 MB/s of UDP through 1 Gbit/s with these
# on both ends; a smaller burst cuts TCP's goodput, a smaller limit drops bursts of datagrams.
TBF_BURST, TBF_LIMIT = "128kb", "1mb"


def ina_header_bytes(wire_h=WIRE_H):
    """INA's header size, from protocol/include/ina/protocol/wire.h (kHeaderSize), or 32."""
    try:
        with open(wire_h) as f:
            m = re.search(r"kHeaderSize\s*=\s*(\d+)", f.read())
        if m:
            return int(m.group(1))
    except OSError:
        pass
    return DEFAULT_HEADER


def ina_framing(dtype="float32", block_elems=256):
    """(user bytes per packet, bytes per frame as tbf counts them) of a full INA data packet:
    frame = Ethernet 14 + IPv4 20 + UDP 8 + INA header + payload. Wire v2 sizes the block in
    bytes: block_elems counts 4-byte elements as INA_BLOCK_ELEMS does (payload 4 x block_elems
    bytes, so 2 x as many 16-bit elements). The one place the testbed reads INA's framing from
    (wire v2: 14+20+8+40+1024)."""
    if dtype not in WIRE_ELEM_BYTES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(WIRE_ELEM_BYTES)}")
    payload = block_elems * 4
    elems = payload // WIRE_ELEM_BYTES[dtype]
    frame = ETH_HDR + IPV4_HDR + UDP_HDR + ina_header_bytes() + payload
    return elems * DTYPE_BYTES[dtype], frame


def host_wire_factor(dtype):
    """Wire bytes per user byte on libina's host path (float fallback): half-width floats are
    widened to float32 words."""
    return 4 / DTYPE_BYTES[dtype]


def parse_rate(text):
    """'500mbit', '1gbit', '100kbit', '2.5gbit' -> bits per second (tc's units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(kbit|mbit|gbit|bit)?\s*", text.lower())
    if not m:
        raise ValueError(f"link rate {text!r}: expected a number with kbit, mbit or gbit, "
                         "e.g. 500mbit or 1gbit")
    mult = {"bit": 1, None: 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    bps = float(m.group(1)) * mult
    if bps < 1e6:
        raise ValueError(f"link rate {text!r}: below 1 Mbit/s")
    return int(bps)


def rate_name(bps):
    return f"{bps / 1e9:g}gbit" if bps >= 1e9 and bps % 1e8 == 0 else f"{bps / 1e6:g}mbit"


def tbf_argv(dev, bps):
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(bps)}bit",
            "burst", TBF_BURST, "limit", TBF_LIMIT]


def shape(ns, dev, bps):
    """tbf of bps on dev's egress in namespace ns."""
    r = subprocess.run(["ip", "netns", "exec", ns, *tbf_argv(dev, bps)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tc tbf on {dev} in {ns} failed: {r.stderr.strip()} "
                           "(sch_tbf missing from the kernel?)")


# ---- bounds ----

def _btree(size, rank):
    """worker/host/tree.cc's btree: (parent, [children])."""
    bit = 1
    while bit < size and not (bit & rank):
        bit <<= 1
    if rank == 0:
        return -1, [bit >> 1] if size > 1 else []
    up = (rank ^ bit) | (bit << 1)
    if up >= size:
        up = rank ^ bit
    low = bit >> 1
    kids = [] if low == 0 else [rank - low]
    down1 = -1 if low == 0 else rank + low
    while down1 >= size:
        low >>= 1
        down1 = -1 if low == 0 else rank + low
    if down1 >= 0:
        kids.append(down1)
    return up, kids


def _dtree(size, rank, which):
    if which == 0:
        return _btree(size, rank)
    if size % 2 == 1:
        p, k = _btree(size, (rank - 1 + size) % size)
        m = lambda x: -1 if x < 0 else (x + 1) % size  # noqa: E731
    else:
        p, k = _btree(size, size - 1 - rank)
        m = lambda x: -1 if x < 0 else size - 1 - x  # noqa: E731
    return m(p), [m(x) for x in k]


def tree_traffic(n):
    """The most bytes a rank sends or receives in libina's double binary tree AllReduce, in
    units of the buffer D (each tree carries D/2 up and down)."""
    if n < 2:
        return 0.0
    worst = 0.0
    for r in range(n):
        sent = 0.0
        for which in (0, 1):
            parent, kids = _dtree(n, r, which)
            sent += 0.5 * (len(kids) + (1 if parent >= 0 else 0))  # up to parent, down to kids
        worst = max(worst, sent)
    return worst


def hd_traffic(n):
    n2 = 1 << (n.bit_length() - 1)
    t = 2 * (n2 - 1) / n2 if n2 > 1 else 0.0
    return t + (1.0 if n2 != n else 0.0)


BOUND_KIND = {"ina": "ina", "ina-dpdk": "ina", "ina-xdp": "ina", "ina-veth": "ina", "host-ring": "ring",
              "gloo": "ring", "mpi": "ring", "mpi-ring": "ring", "host-hd": "hd",
              "host-tree": "tree"}


def bound_algbw(variant, n, bps, dtype="float32", block_elems=256):
    """The variant's bound on algbw (bytes of the user's buffer per second) on links of bps,
    or None for a variant without one."""
    kind = BOUND_KIND.get(variant)
    if kind is None or n < 2:
        return None
    link = bps / 8
    if kind == "ina":
        user, frame = ina_framing(dtype, block_elems)
        return link * user / frame
    per_rank = {"ring": 2 * (n - 1) / n, "hd": hd_traffic(n), "tree": tree_traffic(n)}[kind]
    return link * TCP_EFFICIENCY / per_rank / host_wire_factor(dtype)


# ---- the rate check ----

_SERVER = r"""
import socket, sys, time
ip, port, warm, dur = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((ip, port)); s.listen(1); s.settimeout(10); print("up", flush=True)
c, _ = s.accept(); c.settimeout(5)
buf = bytearray(1 << 20); got = 0; first = None; mark = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    now = time.monotonic(); got += k
    if first is None:
        first = now
    if mark is None and now - first >= warm:
        mark = (now, got)
    if mark and now - mark[0] >= dur:
        print(f"{(got - mark[1]) / (now - mark[0]):.0f}", flush=True)
        break
c.close()
"""

_CLIENT = r"""
import socket, sys, time
ip, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((ip, port), timeout=5)
data = memoryview(bytearray(256 << 10)); end = time.monotonic() + limit
try:
    while time.monotonic() < end:
        s.sendall(data)
except OSError:
    pass
"""


def stream(topo, src, dst, port, warm=0.3, dur=0.8):
    """TCP goodput (bytes/s) from host src to host dst of a topo.Topology."""
    srv = topo.popen(dst, [sys.executable, "-c", _SERVER, dst.ip, str(port), str(warm), str(dur)],
                     stdout=subprocess.PIPE, text=True)
    line = srv.stdout.readline()
    if line.strip() != "up":
        srv.kill()
        srv.wait()
        raise RuntimeError(f"rate check: the receiver in {dst.ns} did not start")
    cli = topo.popen(src, [sys.executable, "-c", _CLIENT, dst.ip, str(port), str(warm + dur + 5)])
    try:
        out, _ = srv.communicate(timeout=warm + dur + 10)
    except subprocess.TimeoutExpired:
        srv.kill()
        out, _ = srv.communicate()
    cli.kill()
    cli.wait()
    try:
        return float(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0.0


def rate_check(topo, bps, low=0.85, high=1.08, port=40877):
    """Streams TCP over every worker link in both directions (w_i -> w_i+1 in turn, so each
    stream checks the sender's uplink and the receiver's downlink; with one worker, to and
    from the first aggregator) and compares with bps x 1448/1514. Returns (ok, rows), rows
    [dict(src, dst, expected, measured, ratio, ok)]."""
    ws = topo.workers()
    pairs = [(ws[i], ws[(i + 1) % len(ws)]) for i in range(len(ws))] if len(ws) > 1 else \
        [(ws[0], topo.aggregators()[0]), (topo.aggregators()[0], ws[0])]
    expected = bps / 8 * TCP_EFFICIENCY
    rows = []
    for k, (a, b) in enumerate(pairs):
        # A stream below the rate is tried twice more (the best kept): on a busy machine one
        # can lose the CPU for a moment. Above the rate is never a transient.
        got = 0.0
        for attempt in range(3):
            got = max(got, stream(topo, a, b, port + 3 * k + attempt))
            if got / expected >= low:
                break
        ratio = got / expected
        rows.append(dict(src=a.name, dst=b.name, expected=expected, measured=got, ratio=ratio,
                         ok=low <= ratio <= high))
    return all(r["ok"] for r in rows), rows


def describe_check(bps, rows):
    lines = [f"rate check at {rate_name(bps)}: TCP goodput expected {rows[0]['expected'] / 1e6:.1f} "
             f"MB/s (x {TCP_PAYLOAD}/{TCP_FRAME})" if rows else f"rate check at {rate_name(bps)}"]
    for r in rows:
        lines.append(f"  {r['src']} -> {r['dst']}: {r['measured'] / 1e6:8.1f} MB/s  "
                     f"{r['ratio'] * 100:5.1f}%  {'ok' if r['ok'] else 'FAILED'}")
    return "\n".join(lines)


# ---- tables ----

VARIANT_ORDER = ["ina", "ina-xdp", "ina-dpdk", "host-ring", "host-hd", "host-tree", "gloo", "mpi", "mpi-ring"]


def _num(r, k, conv=float):
    try:
        return conv(r[k])
    except (KeyError, TypeError, ValueError):
        return None


def row_block_elems(r):
    """INA's block of a results row in 4-byte elements: its block_bytes column (ina-bench's
    config line), or 256 for rows recorded before the column (1 KiB blocks, the default then)."""
    b = r.get("block_bytes") or ""
    return int(b) // 4 if str(b).isdigit() and int(b) > 0 else 256


def link_rows(rows):
    """The link-bound rows of a results.csv (dicts), with numbers parsed and the bound added:
    link_rate (bit/s), ranks, bytes, time_us, algbw (GB/s), bound (GB/s), pct (of bound)."""
    out = []
    for r in rows:
        rate = _num(r, "link_rate", lambda x: int(float(x)))
        if not rate or r.get("coll", "allreduce") != "allreduce":
            continue
        n, b = int(r["ranks"]), int(r["bytes"])
        d = dict(r, link_rate=rate, ranks=n, bytes=b, time_us=float(r["time_us"]),
                 algbw=float(r["algbw"]))
        bound = bound_algbw(r["variant"], n, rate, r["dtype"], row_block_elems(r))
        d["bound"] = bound / 1e9 if bound else None
        d["pct"] = 100 * d["algbw"] / d["bound"] if bound else None
        out.append(d)
    return out


def _groups(lr):
    keys = []
    for r in lr:
        k = (r["link_rate"], r["ranks"], r["dtype"])
        if k not in keys:
            keys.append(k)
    return sorted(keys, key=lambda k: (k[2] != "float32", k[2], k[0], k[1]))


def _variants(sub):
    vs = {r["variant"] for r in sub}
    return [v for v in VARIANT_ORDER if v in vs] + sorted(vs - set(VARIANT_ORDER))


def _human(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"


def headline_table(rows):
    """One line per (link rate, N, dtype) at the largest size every variant ran: each variant's
    algbw as % of its bound, INA/ring measured beside the bounds' ratio, and the smallest
    size's time (latency)."""
    lr = link_rows(rows)
    if not lr:
        return ""
    allv = _variants(lr)
    head = ("| link | N | dtype | size | " + " | ".join(f"{v} % of bound" for v in allv) +
            " | INA/ring | bounds' ratio | INA/ring ÷ bounds |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for rate, n, dt in _groups(lr):
        sub = [r for r in lr if (r["link_rate"], r["ranks"], r["dtype"]) == (rate, n, dt)]
        big = max(r["bytes"] for r in sub)
        at = {r["variant"]: r for r in sub if r["bytes"] == big}
        cells = []
        for v in allv:
            r = at.get(v)
            cells.append(f"{r['pct']:.0f}% ({r['algbw'] * 1e3:.1f} of {r['bound'] * 1e3:.1f} MB/s)"
                         if r and r["pct"] is not None else "-")
        ratio = bratio = "-"
        rel = "-"
        if "ina" in at and "host-ring" in at and at["host-ring"]["algbw"] > 0:
            m = at["ina"]["algbw"] / at["host-ring"]["algbw"]
            b = at["ina"]["bound"] / at["host-ring"]["bound"]
            ratio, bratio, rel = f"{m:.2f}", f"{b:.2f}", f"{m / b:.2f}"
        lines.append(f"| {rate_name(rate)} | {n} | {dt} | {_human(big)} | " + " | ".join(cells) +
                     f" | {ratio} | {bratio} | {rel} |")
    return "\n".join(lines)


def latency_table(rows):
    """The smallest size's time (us) per (link rate, N, dtype) and variant."""
    lr = link_rows(rows)
    if not lr:
        return ""
    allv = _variants(lr)
    lines = ["| link | N | dtype | size | " + " | ".join(allv) + " |",
             "|---|---|---|---|" + "---|" * len(allv)]
    for rate, n, dt in _groups(lr):
        sub = [r for r in lr if (r["link_rate"], r["ranks"], r["dtype"]) == (rate, n, dt)]
        small = min(r["bytes"] for r in sub)
        at = {r["variant"]: r for r in sub if r["bytes"] == small}
        lines.append(f"| {rate_name(rate)} | {n} | {dt} | {_human(small)} | " + " | ".join(
            f"{at[v]['time_us']:.0f} us" if v in at else "-" for v in allv) + " |")
    return "\n".join(lines)


def size_tables(rows, min_bytes=1 << 20):
    """Per (link rate, N, dtype): one row per size (the smallest, and those >= min_bytes), each
    variant's algbw in MB/s with its % of bound, INA/ring and the bounds' ratio."""
    lr = link_rows(rows)
    out = []
    for rate, n, dt in _groups(lr):
        sub = [r for r in lr if (r["link_rate"], r["ranks"], r["dtype"]) == (rate, n, dt)]
        vs = _variants(sub)
        sizes = sorted({r["bytes"] for r in sub})
        sizes = [s for s in sizes if s == sizes[0] or s >= min_bytes]
        bounds = {v: next((r["bound"] * 1e9 for r in sub if r["variant"] == v and r["bound"]),
                          None) for v in vs}
        out += [f"#### {rate_name(rate)} links, N = {n}, {dt}", "",
                "| size | " + " | ".join(vs) + " | INA/ring | bounds' ratio |",
                "|---|" + "---|" * (len(vs) + 2),
                "| bound (MB/s) | " + " | ".join(f"{bounds[v] / 1e6:.1f}" if bounds[v] else "-"
                                                 for v in vs) + " | | " +
                (f"{bounds['ina'] / bounds['host-ring']:.2f}"
                 if bounds.get("ina") and bounds.get("host-ring") else "-") + " |"]
        for s in sizes:
            at = {r["variant"]: r for r in sub if r["bytes"] == s}
            cells = []
            for v in vs:
                r = at.get(v)
                if r is None:
                    cells.append("-")
                elif s == sizes[0] and s < min_bytes:
                    cells.append(f"{r['time_us']:.0f} us")
                else:
                    cells.append(f"{r['algbw'] * 1e3:.1f} ({r['pct']:.0f}%)" if r["pct"] is not None
                                 else f"{r['algbw'] * 1e3:.1f}")
            ratio = "-"
            if "ina" in at and "host-ring" in at:
                if s == sizes[0] and s < min_bytes:
                    if at["ina"]["time_us"] > 0:
                        ratio = f"{at['host-ring']['time_us'] / at['ina']['time_us']:.2f} (time)"
                elif at["host-ring"]["algbw"] > 0:
                    ratio = f"{at['ina']['algbw'] / at['host-ring']['algbw']:.2f}"
            out.append(f"| {_human(s)} | " + " | ".join(cells) + f" | {ratio} | |")
        out.append("")
    return "\n".join(out)
