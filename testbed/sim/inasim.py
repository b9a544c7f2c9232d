#!/usr/bin/python3
"""Alpha-beta(-gamma) model of AllReduce at scale: host algorithms vs in-network aggregation.

Times of one AllReduce of D bytes per rank over N ranks (seconds):

  ring                  2(N-1) a + 2(N-1)/N D b + (N-1)/N D g
  tree (double binary)  2 ceil(log2 N) a + 2 D b + D g                  (pipelined, NCCL-style)
  hd (Rabenseifner)     2 log2(N') a + 2(N'-1)/N' D b + (N'-1)/N' D g,  N' = 2^floor(log2 N);
                        a non-power-of-two N adds 2 (a + D b) for the extra ranks' fold/unfold
  inc (single level)    2 (ai + c) + D' bi + N p c
  hier (fan-in k)       2 L (ai + c) + D' bi + k p c,  L = ceil(log_k N)  (levels pipelined)

where a, b, g are the host path's per-message latency, per-byte transfer time and per-byte
reduction time; ai, bi the in-network path's per-message latency and per-byte time of a worker's
link (D' = D (P + H) / P: payload P bytes per packet plus H header bytes), p = ceil(D / P)
packets per worker and c the aggregator's per-packet cost. "inc" is one software aggregator
serving all N workers (it handles N p packets, serially: no overlap assumed between the link and
the aggregator, an upper bound); "hier" is a tree of aggregators with fan-in k whose levels work
on different blocks at once, so only one level's k p packets are on the critical path. The
single-level model is the hierarchical one with k = N.

Calibration (least squares, numpy): host rows of a harness CSV (a variant that runs the ring,
default host-ring) fit a, b of the ring formula (g folded into b); INA rows fit x0 = 2(ai + c),
bi and c of the single-level formula. Validation predicts every measured row back and reports the
mean absolute relative error per variant.

AllToAll (blocks of b bytes per pair, N ranks on nodes of G; A2AParams): the host algorithms of
worker/host/alltoall*.cc with a two-tier network, node links (alpha_node, beta_node) and the
network (alpha, beta, each rank's share of its node's NIC), o the CPU cost of each further
message of a window (a send and a receive system call, a wake-up), gc the time per byte of a
memory copy, M = N / G nodes:
  flat pairwise   R alpha + (N-1-R) o + max((G-1) b beta_node, (N-G) b beta)
                  R = ceil((N-1)/W) windows of W = clamp(window / 2b, 4, N-1) rounds, as
                  worker/host/alltoall_exchange.h posts them (8 MiB of sends plus receives in
                  flight, at least 4 rounds); node and network bytes move concurrently
  bruck           ceil(log2 N) (alpha + floor(N/2) b (beta + 2 gc)) + N b gc; considered only
                  while floor(N/2) b <= 4 KiB (kBruckMaxStepBytes, as the cost model)
  hierarchical    (chosen by the cost model only for b <= 4 KiB, kHierarchicalMaxBlockBytes)
                  the pairwise term over G ranks with blocks of M b (node links)
                  + the pairwise term over M ranks with blocks of G b (network)
                  + 2 N b gc                                         (packing before each phase)
Assumptions (printed with every alltoall table): ranks of a node are consecutive; a rank's
network share is its NIC divided by G; a window of messages shares one latency and each further
message costs o of CPU (a send and a receive system call); no incast (the pairwise schedule pairs
every receiver with one sender per round); no loss, no congestion control effects, no
stragglers; every rank's blocks have the same size (AllToAll, not a skewed AllToAllv).

CPU-bound AllReduce (`inasim.py cpu`): where a core, not the link, runs out. The measured CPU
seconds per GB reduced (ina-bench --cpu: the sum over M ranks, and the aggregator serving them)
give a worker's cost per GB of its data cw = ranks / M, the aggregator's per child stream
ca = aggregator / M, and a ring rank's cr = ring / M at M ranks (scaled by (N-1)/N over
(M-1)/M at N ranks: the bytes a ring rank moves and reduces). With C cores per rank for
communication, T aggregator threads, worker NICs of R and aggregator NICs of Ra, one GB per rank
takes:
  ring            max(2(N-1)/N 8/R, cr(N)/C) + 2(N-1) a / D
  hier (fan-in k) max(8/R, cw/C, k ca/T, k 8/Ra) + 2 L (ai + c) / D
so the tree keeps the worker's link busy when T >= k ca R/8 and Ra >= k R (or results go out by
multicast); the printed table gives both, and the tree's speed-up over the ring.

CLI:
  inasim.py cpu --ranks 2.9 --aggregator 2.5 --ring 2.4 -M 4 [--cores 1 --threads 8 ...]
  inasim.py alltoall -N 1024 -G 8 [--alpha 20e-6 ...]             # flat vs hierarchical
  inasim.py formulas --alpha 5e-6 --beta 1e-10 -N 8 -D 1M        # one point, every algorithm
  inasim.py calibrate results.csv [--json params.json]            # fit and validate
  inasim.py crossover [--params params.json] [--plots DIR]        # best algorithm by N and size
"""
import argparse
import json
import math
import sys

ALGORITHMS = ("ring", "tree", "hd", "inc", "hier")


class Params:
    """Model parameters (seconds, seconds per byte)."""

    def __init__(self, alpha=20e-6, beta=1 / 10e9, gamma=0.0, alpha_inc=None, beta_inc=None,
                 c_pkt=0.1e-6, payload=1024, header=40, fan_in=32):
        self.alpha, self.beta, self.gamma = alpha, beta, gamma
        self.alpha_inc = alpha if alpha_inc is None else alpha_inc
        self.beta_inc = beta if beta_inc is None else beta_inc
        self.c_pkt, self.payload, self.header, self.fan_in = c_pkt, payload, header, fan_in

    def to_dict(self):
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d):
        p = cls()
        for k, v in d.items():
            if k not in p.__dict__:
                raise ValueError(f"unknown parameter {k!r} (expected one of {sorted(p.__dict__)})")
            setattr(p, k, v)
        return p


def _check(n, d):
    if n < 1 or int(n) != n:
        raise ValueError(f"N {n}: must be an integer >= 1")
    if d < 0:
        raise ValueError(f"D {d}: must be >= 0 bytes")


def t_ring(n, d, p):
    _check(n, d)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * p.alpha + 2 * (n - 1) / n * d * p.beta + (n - 1) / n * d * p.gamma


def t_tree(n, d, p):
    _check(n, d)
    if n == 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * p.alpha + 2 * d * p.beta + d * p.gamma


def t_hd(n, d, p):
    _check(n, d)
    if n == 1:
        return 0.0
    n2 = 1 << (int(n).bit_length() - 1)
    t = 0.0
    if n2 > 1:
        t = 2 * math.log2(n2) * p.alpha + 2 * (n2 - 1) / n2 * d * p.beta + (n2 - 1) / n2 * d * p.gamma
    if n2 != n:
        t += 2 * (p.alpha + d * p.beta) + d * p.gamma
    return t


def packets(d, p):
    return max(1, math.ceil(d / p.payload))


def wire_bytes(d, p):
    return packets(d, p) * p.header + d


def t_hier(n, d, p, k=None):
    _check(n, d)
    k = p.fan_in if k is None else k
    if k < 2:
        raise ValueError(f"fan-in {k}: must be >= 2")
    k = min(k, max(n, 2))
    levels = max(1, math.ceil(math.log(n, k) - 1e-12)) if n > 1 else 1
    pk = packets(d, p)
    return 2 * levels * (p.alpha_inc + p.c_pkt) + wire_bytes(d, p) * p.beta_inc + min(k, n) * pk * p.c_pkt


def t_inc(n, d, p):
    """Single-level in-network aggregation: one aggregator, fan-in N."""
    return t_hier(n, d, p, k=max(n, 2))


MODELS = {"ring": t_ring, "tree": t_tree, "hd": t_hd, "inc": t_inc, "hier": t_hier}


def predict(alg, n, d, p):
    return MODELS[alg](n, d, p)


# ---- calibration ----

def lstsq(rows, targets):
    """Non-negative weighted least squares: every parameter is a cost, so a column whose
    unconstrained coefficient would be negative is held at 0 (exact active-set search over the
    few columns). Rows are weighted by 1/target: relative error matters across 8 B .. 64 MiB."""
    import itertools
    import numpy as np
    a = np.asarray(rows, dtype=float)
    y = np.asarray(targets, dtype=float)
    w = 1.0 / np.maximum(y, 1e-12)
    aw, yw = a * w[:, None], y * w
    k = a.shape[1]
    best, best_res = [0.0] * k, float(np.sum(yw ** 2))
    for r in range(k, 0, -1):
        for cols in itertools.combinations(range(k), r):
            x, *_ = np.linalg.lstsq(aw[:, cols], yw, rcond=None)
            if np.any(x < 0):
                continue
            res = float(np.sum((aw[:, cols] @ x - yw) ** 2))
            if res < best_res - 1e-18:
                best = [0.0] * k
                for c, v in zip(cols, x):
                    best[c] = float(v)
                best_res = res
    return best


def fit_host(samples):
    """samples: [(N, D, seconds)] of a ring. Returns (alpha, beta)."""
    if len(samples) < 2:
        raise ValueError("host calibration needs at least 2 samples")
    rows = [[2 * (n - 1), 2 * (n - 1) / n * d] for n, d, _ in samples]
    a, b = lstsq(rows, [t for *_, t in samples])
    return a, b


def fit_inc(samples, payload=1024, header=40):
    """samples: [(N, D, seconds)] of single-level INA. Returns (alpha_inc, beta_inc, c_pkt)."""
    if len(samples) < 3:
        raise ValueError("in-network calibration needs at least 3 samples")
    rows = []
    for n, d, _ in samples:
        pk = max(1, math.ceil(d / payload))
        rows.append([1.0, pk * header + d, n * pk])
    x0, b, c = lstsq(rows, [t for *_, t in samples])
    return max(0.0, x0 / 2 - c), b, c


def read_csv(path):
    """The harness CSV (results.csv) or a compare.sh CSV; returns dicts."""
    import csv
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        try:
            out.append(dict(variant=r.get("variant") or r.get("tool"), n=int(r["ranks"]),
                            d=int(r["bytes"]), t=float(r["time_us"]) * 1e-6,
                            loss=float(r.get("loss_pct") or 0), coll=r.get("coll") or "allreduce"))
        except (KeyError, ValueError):
            continue
    return [r for r in out if r["t"] > 0 and r["coll"] == "allreduce"]


VARIANT_MODEL = {"host-ring": "ring", "host-tree": "tree", "host-hd": "hd", "gloo": "ring",
                 "mpi": "ring", "ina": "inc", "ina-veth": "inc"}


def calibrate(rows, host_variant="host-ring", inc_variant="ina", block_elems=256):
    """Fits Params on lossless rows; returns (params, validation dict variant -> error)."""
    p = Params(payload=block_elems * 4)
    clean = [r for r in rows if r["loss"] == 0]
    hv = host_variant
    if not any(r["variant"] == hv for r in clean):
        hv = next((v for v in ("gloo", "mpi") if any(r["variant"] == v for r in clean)), None)
    if hv is None:
        raise ValueError("no host rows (host-ring, gloo or mpi) without loss to calibrate from")
    p.alpha, p.beta = fit_host([(r["n"], r["d"], r["t"]) for r in clean if r["variant"] == hv])
    inc = [(r["n"], r["d"], r["t"]) for r in clean if r["variant"] == inc_variant]
    if inc:
        p.alpha_inc, p.beta_inc, p.c_pkt = fit_inc(inc, p.payload, p.header)
    return p, {"host_variant": hv, "inc_variant": inc_variant if inc else None,
               "errors": validate(rows, p)}


def validate(rows, p):
    """Mean and max |predicted - measured| / measured per variant (lossless rows)."""
    errs = {}
    for r in rows:
        alg = VARIANT_MODEL.get(r["variant"])
        if alg is None or r["loss"] != 0:
            continue
        e = abs(predict(alg, r["n"], r["d"], p) - r["t"]) / r["t"]
        errs.setdefault(r["variant"], []).append(e)
    return {v: {"model": VARIANT_MODEL[v], "rows": len(e), "mean_rel_err": sum(e) / len(e),
                "max_rel_err": max(e)} for v, e in errs.items()}


# ---- link-bound calibration (rows of harness.py --link-rate) ----
#
# Where a shaped link is the bottleneck, each algorithm's time is its per-step latency plus the
# bytes it puts on its busiest link over the link rate R (bytes counted as tbf counts them):
#   ring  2(N-1) a + k (8/R) 2(N-1)/N D W / E
#   hd    2 log2(N') a + k (8/R) H(N) D W / E            H: linkbound.hd_traffic
#   tree  2 ceil(log2 N) a + k (8/R) T(N) D W / E        T: linkbound.tree_traffic (libina's trees)
#   ina   x0 + ki (8/R) p F + c N p                      p packets of F bytes per worker
# with E = 1448/1514 (TCP), W the host path's wire bytes per user byte, F and p from
# linkbound.ina_framing. k and ki are ~1 when the link is the limit; a, x0 (= 2 (ai + c)) and
# c (the aggregator's per-packet cost, serial over the N p packets) are fitted. Link-bound rows
# are the sizes >= LINK_MIN_BYTES (8 x tbf's 128 KiB burst); the smallest size fits the latency.

LINK_MIN_BYTES = 1 << 20
LINK_HOST = {"host-ring": "ring", "host-hd": "hd", "host-tree": "tree", "gloo": "ring",
             "mpi-ring": "ring"}
LINK_INC = ("ina", "ina-xdp", "ina-dpdk")


def _linkbound():
    import os
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if here not in sys.path:
        sys.path.insert(0, here)
    import linkbound
    return linkbound


def link_features(variant, n, d, rate, dtype):
    """The model's columns for one row: host [steps, link seconds at k = 1], INA [1, link
    seconds at ki = 1, N p]."""
    lb = _linkbound()
    per_byte = 8 / rate
    if variant in LINK_INC:
        user, frame = lb.ina_framing(dtype)
        p = max(1, math.ceil(d / user))
        return [1.0, p * frame * per_byte, n * p]
    kind = LINK_HOST[variant]
    traffic = {"ring": 2 * (n - 1) / n, "hd": lb.hd_traffic(n), "tree": lb.tree_traffic(n)}[kind]
    n2 = 1 << (n.bit_length() - 1)
    steps = {"ring": 2 * (n - 1), "hd": 2 * math.log2(n2) + (2 if n2 != n else 0),
             "tree": 2 * math.ceil(math.log2(n))}[kind]
    return [steps, traffic * d * lb.host_wire_factor(dtype) / lb.TCP_EFFICIENCY * per_byte]


def read_link_csv(path):
    """Link-bound rows of a harness results.csv: dicts variant, n, d, t, rate, dtype."""
    import csv
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                rate = float(r.get("link_rate") or 0)
                if rate <= 0 or (r.get("coll") or "allreduce") != "allreduce":
                    continue
                out.append(dict(variant=r["variant"], n=int(r["ranks"]), d=int(r["bytes"]),
                                t=float(r["time_us"]) * 1e-6, rate=rate, dtype=r["dtype"]))
            except (KeyError, ValueError):
                continue
    return [r for r in out if r["t"] > 0]


def calibrate_link(rows, host_variant="host-ring", inc_variant="ina"):
    """Fits the link-bound model per link rate (each rate is a network of its own, with its own
    per-byte factors; the latencies are fitted with them): (a, k) on host_variant's rows,
    (x0, ki, c) on inc_variant's, each on its link-bound sizes plus its smallest size per
    (N, dtype). Returns {"by_rate": {rate: {"host": [a, k], "inc": [x0, ki, c] or None}},
    "host": ..., "inc": ... (those of the highest rate), "host_variant", "inc_variant"}."""
    def fit_rows(v, rate):
        sub = [r for r in rows if r["variant"] == v and r["rate"] == rate]
        smallest = {}
        for r in sub:
            key = (r["n"], r["dtype"])
            smallest[key] = min(smallest.get(key, r["d"]), r["d"])
        return [r for r in sub if r["d"] >= LINK_MIN_BYTES or
                r["d"] == smallest[(r["n"], r["dtype"])]]

    def solve(sub):
        return lstsq([link_features(r["variant"], r["n"], r["d"], r["rate"], r["dtype"])
                      for r in sub], [r["t"] for r in sub])
    by_rate = {}
    for rate in sorted({r["rate"] for r in rows}):
        host = fit_rows(host_variant, rate)
        if len(host) < 2:
            continue
        inc = fit_rows(inc_variant, rate)
        by_rate[rate] = {"host": solve(host), "inc": solve(inc) if len(inc) >= 3 else None}
    if not by_rate:
        raise ValueError(f"link-bound calibration needs {host_variant} rows (>= 2 at a rate)")
    top = by_rate[max(by_rate)]
    return {"by_rate": by_rate, "host": top["host"], "inc": top["inc"],
            "host_variant": host_variant,
            "inc_variant": inc_variant if any(f["inc"] for f in by_rate.values()) else None}


def predict_link(fit, variant, n, d, rate, dtype):
    """The fitted model's time of one row (the fit of that link rate when there is one)."""
    f = link_features(variant, n, d, rate, dtype)
    sel = fit.get("by_rate", {}).get(rate, fit)
    x = sel["inc"] if variant in LINK_INC else sel["host"]
    if x is None:
        return None
    return sum(a * b for a, b in zip(f, x))


def validate_link(rows, fit, min_bytes=LINK_MIN_BYTES):
    """{variant: {rows, mean_rel_err, max_rel_err, small: (rows, mean)}}: the link-bound sizes
    (>= min_bytes), and apart from them the smallest size's (latency) error."""
    big, small = {}, {}
    smallest = {}
    for r in rows:
        key = (r["variant"], r["n"], r["rate"], r["dtype"])
        smallest[key] = min(smallest.get(key, r["d"]), r["d"])
    for r in rows:
        if r["variant"] not in LINK_HOST and r["variant"] not in LINK_INC:
            continue
        t = predict_link(fit, r["variant"], r["n"], r["d"], r["rate"], r["dtype"])
        if t is None:
            continue
        e = abs(t - r["t"]) / r["t"]
        if r["d"] >= min_bytes:
            big.setdefault(r["variant"], []).append(e)
        elif r["d"] == smallest[(r["variant"], r["n"], r["rate"], r["dtype"])]:
            small.setdefault(r["variant"], []).append(e)
    out = {}
    for v, e in big.items():
        s = small.get(v, [])
        out[v] = {"model": "ina" if v in LINK_INC else LINK_HOST[v], "rows": len(e),
                  "mean_rel_err": sum(e) / len(e), "max_rel_err": max(e),
                  "small_rows": len(s), "small_mean_rel_err": sum(s) / len(s) if s else None}
    return out


_TREE_CACHE = {}


def _tree_traffic(n):
    if n not in _TREE_CACHE:
        _TREE_CACHE[n] = _linkbound().tree_traffic(n)
    return _TREE_CACHE[n]


def predict_link_scale(fit, alg, n, d, rate, dtype="float32", fan_in=32, c_pkt=None):
    """The link-bound model at scale, on links of `rate`: ring, tree (libina's double binary
    tree) or hier (a tree of aggregators of fan-in k, levels pipelined: L x0 + ki (8/R) p F +
    k p c). c_pkt overrides the fitted aggregator cost (e.g. a hardware pipeline's)."""
    lb = _linkbound()
    per_byte = 8 / rate
    if alg in ("ring", "tree"):
        a, k = fit["host"]
        host_bytes = d * lb.host_wire_factor(dtype) / lb.TCP_EFFICIENCY
        if alg == "ring":
            return 2 * (n - 1) * a + k * per_byte * 2 * (n - 1) / n * host_bytes
        return 2 * math.ceil(math.log2(n)) * a + k * per_byte * _tree_traffic(n) * host_bytes
    if alg == "hier":
        x0, ki, c = fit["inc"]
        c = c if c_pkt is None else c_pkt
        user, frame = lb.ina_framing(dtype)
        p = max(1, math.ceil(d / user))
        k = min(fan_in, max(n, 2))
        levels = max(1, math.ceil(math.log(n, k) - 1e-12)) if n > 1 else 1
        return levels * x0 + ki * per_byte * p * frame + k * p * c
    raise ValueError(f"algorithm {alg!r}: expected ring, tree or hier")


# ---- CPU-bound AllReduce ----

class CpuParams:
    """Measured CPU seconds per GB reduced (ina-bench --cpu, M ranks on loopback) and the
    capacity assumed at scale: cores per rank for communication, aggregator threads, fan-in."""

    def __init__(self, ranks=2.9, aggregator=2.5, ring=2.4, m=4, cores=1.0, threads=8,
                 fan_in=32, alpha=20e-6):
        if m < 2:
            raise ValueError(f"M {m}: the measurement needs at least 2 ranks")
        if min(ranks, aggregator, ring) <= 0 or cores <= 0 or threads <= 0 or fan_in < 2:
            raise ValueError("CPU costs, cores and threads must be positive, the fan-in >= 2")
        self.ranks, self.aggregator, self.ring, self.m = ranks, aggregator, ring, m
        self.cores, self.threads, self.fan_in, self.alpha = cores, threads, fan_in, alpha

    def worker(self):
        return self.ranks / self.m

    def per_stream(self):
        return self.aggregator / self.m

    def ring_rank(self, n):
        return self.ring / self.m * ((n - 1) / n) / ((self.m - 1) / self.m)


def cpu_times(n, rate, q, agg_rate=None):
    """Seconds per GB per rank (ring, hier) at N ranks on worker links of `rate` bit/s, and what
    bounds each: 'link', 'rank CPU', 'aggregator CPU' or 'aggregator NIC'."""
    if n < 2:
        raise ValueError(f"N {n}: must be >= 2")
    gb = 1e9
    ring_terms = {"link": 2 * (n - 1) / n * 8 / rate * gb, "rank CPU": q.ring_rank(n) / q.cores}
    k = min(q.fan_in, n)
    levels = max(1, math.ceil(math.log(n, k) - 1e-12))
    hier_terms = {"link": 8 / rate * gb, "rank CPU": q.worker() / q.cores,
                  "aggregator CPU": k * q.per_stream() / q.threads}
    if agg_rate:
        hier_terms["aggregator NIC"] = k * 8 / agg_rate * gb
    ring_bound = max(ring_terms, key=ring_terms.get)
    hier_bound = max(hier_terms, key=hier_terms.get)
    ring = ring_terms[ring_bound] + 2 * (n - 1) * q.alpha
    hier = hier_terms[hier_bound] + 2 * levels * q.alpha
    return ring, ring_bound, hier, hier_bound


def cpu_table(q, ns=(8, 64, 1024), rates=(10e9, 25e9, 100e9, 400e9)):
    lines = ["| N | worker link | ring s/GB | bound | hier s/GB | bound | ring / hier |"
             " aggregator threads for the link | worker cores for the link |",
             "|---" * 9 + "|"]
    for n in ns:
        for r in rates:
            ring, rb, hier, hb = cpu_times(n, r, q)
            k = min(q.fan_in, n)
            threads = k * q.per_stream() * r / 8 / 1e9
            cores = q.worker() * r / 8 / 1e9
            lines.append(f"| {n} | {r / 1e9:g} Gbit/s | {ring:.3f} | {rb} | {hier:.3f} | {hb} |"
                         f" {ring / hier:.2f} | {threads:.1f} | {cores:.1f} |")
    return "\n".join(lines)


def cpu_assumptions(q):
    return [
        f"a worker spends {q.worker():.3f} s per GB of its data (ranks {q.ranks:g} s / M = {q.m}),"
        f" a ring rank {q.ring / q.m:.3f} s at M ranks, scaled by the bytes it moves at N",
        f"the aggregator {q.per_stream():.3f} s per GB per child stream, {q.threads:g} threads "
        f"that scale linearly, fan-in {q.fan_in}, its NIC not the limit (results by multicast or "
        f"an NIC of fan-in x the worker's rate)",
        f"{q.cores:g} core(s) per rank for communication; CPU and link overlap fully (the larger "
        f"bounds); latency {q.alpha * 1e6:g} us per step or level; no loss, no stragglers",
    ]


# ---- crossover ----

class A2AParams:
    """AllToAll model parameters (seconds, seconds per byte). Defaults: a cluster of nodes of 8
    ranks, 100 Gbit/s NICs (12.5 GB/s shared by the node's 8 ranks), kernel TCP latency between
    nodes, shared-memory-speed links inside a node; o from the loopback measurements of the host
    path (about one alpha per further message there; here the CPU part only, 5 us)."""

    def __init__(self, alpha=20e-6, beta=8 / 12.5e9, alpha_node=5e-6, beta_node=1 / 10e9,
                 o=5e-6, gc=1 / 10e9):
        self.alpha, self.beta, self.alpha_node, self.beta_node = alpha, beta, alpha_node, beta_node
        self.o, self.gc = o, gc


def _a2a_check(n, g, b):
    if n < 1 or g < 1 or n % g:
        raise ValueError(f"N {n}, G {g}: G must divide N")
    if b < 0:
        raise ValueError(f"b {b}: must be >= 0 bytes")


A2A_WINDOW_BYTES = 8 << 20   # kAlltoallWindowBytes (worker/host/alltoall.h)
A2A_MIN_ROUNDS = 4           # kAlltoallMinRounds
BRUCK_MAX_STEP_BYTES = 4 << 10  # kBruckMaxStepBytes
HIER_MAX_BLOCK_BYTES = 4 << 10  # kHierarchicalMaxBlockBytes


def a2a_windows(n, b):
    """Windows of the pairwise schedule over n ranks with blocks of b bytes (alltoall_exchange.h:
    rounds posted while the sends plus receives in flight stay under the window, at least
    A2A_MIN_ROUNDS rounds)."""
    if n <= 1:
        return 0
    per_round = 2 * b
    w = n - 1 if per_round == 0 else max(A2A_MIN_ROUNDS, A2A_WINDOW_BYTES // per_round)
    return math.ceil((n - 1) / min(w, n - 1))


def _pairwise_latency(n, b, alpha, o):
    r = a2a_windows(n, b)
    return r * alpha + (n - 1 - r) * o


def t_a2a_pairwise(n, g, b, p):
    _a2a_check(n, g, b)
    if n == 1:
        return 0.0
    lat = _pairwise_latency(n, b, p.alpha if n > g else p.alpha_node, p.o)
    return lat + max((g - 1) * b * p.beta_node, (n - g) * b * p.beta)


def t_a2a_bruck(n, g, b, p):
    _a2a_check(n, g, b)
    if n == 1:
        return 0.0
    steps = math.ceil(math.log2(n))
    return steps * (p.alpha + (n // 2) * b * (p.beta + 2 * p.gc)) + n * b * p.gc


def t_a2a_hier(n, g, b, p):
    _a2a_check(n, g, b)
    m = n // g
    if g == 1 or m == 1:
        return t_a2a_pairwise(n, g, b, p)
    node = _pairwise_latency(g, m * b, p.alpha_node, p.o) + (g - 1) * m * b * p.beta_node
    glob = _pairwise_latency(m, g * b, p.alpha, p.o) + (m - 1) * g * b * p.beta
    return node + glob + 2 * n * b * p.gc


def a2a_choice(n, g, b, p):
    """What the cost model would run: the cheapest of pairwise, Bruck (within its step bound) and
    hierarchical (when G groups N into more than one node of more than one rank)."""
    t = {"pairwise": t_a2a_pairwise(n, g, b, p)}
    if (n // 2) * b <= BRUCK_MAX_STEP_BYTES:
        t["bruck"] = t_a2a_bruck(n, g, b, p)
    if 1 < g < n and b <= HIER_MAX_BLOCK_BYTES:
        t["hier"] = t_a2a_hier(n, g, b, p)
    return min(t, key=t.get)


def a2a_assumptions(n, g, p):
    """The model's assumptions, as lines (printed with every alltoall table)."""
    m = n // g
    return [
        f"N = {n} ranks on {m} nodes of G = {g} consecutive ranks; blocks of b bytes per pair, "
        "the same for every pair (AllToAll, no skew)",
        f"network: alpha {p.alpha * 1e6:g} us per message, each rank's share of its node's NIC "
        f"{1 / p.beta / 1e9:.3g} GB/s (the NIC divided by G); inside a node: alpha_node "
        f"{p.alpha_node * 1e6:g} us, {1 / p.beta_node / 1e9:.3g} GB/s",
        f"o = {p.o * 1e6:g} us of CPU for each further message of a window (a send and a receive "
        f"system call; loopback measurements: one sendmsg and one recvmsg per message); memory "
        f"copies {1 / p.gc / 1e9:.3g} GB/s" if p.gc > 0 else "no copy cost",
        f"pairwise: windows of 8 MiB (sends plus receives) or at least 4 rounds, one alpha per "
        f"window; flat pairwise sends {n - 1} messages per rank, hierarchical "
        f"{(g - 1) + (m - 1)} ({g - 1} in the node, {m - 1} across nodes)",
        "no incast (each round pairs every receiver with one sender), no loss, no congestion "
        "control, no stragglers, no overlap of the two hierarchical phases",
        "the cost model's choice: Bruck only while floor(N/2) b <= 4 KiB, the hierarchical "
        "exchange only for blocks <= 4 KiB (its bounds in worker/host/alltoall.h)",
    ]


A2A_ALGORITHMS = {"pairwise": t_a2a_pairwise, "bruck": t_a2a_bruck, "hier": t_a2a_hier}


def a2a_table(n, g, p, blocks=None):
    """Markdown: predicted time per algorithm per block size, and flat/hierarchical."""
    blocks = list(blocks or sizes(8, 1 << 20, 4))
    lines = [f"| block per pair | " + " | ".join(A2A_ALGORITHMS) +
             " | flat pairwise / hier | cost model's choice |",
             "|---" * (len(A2A_ALGORITHMS) + 3) + "|"]
    for b in blocks:
        t = {a: f(n, g, b, p) for a, f in A2A_ALGORITHMS.items()}
        lines.append(f"| {human(b)} | " + " | ".join(f"{t[a] * 1e3:.3f} ms" for a in t) +
                     f" | {t['pairwise'] / t['hier']:.2f} | {a2a_choice(n, g, b, p)} |")
    return "\n".join(lines)


def sizes(lo=8, hi=1 << 30, factor=4):
    s = lo
    while s <= hi:
        yield s
        s *= factor


def best_table(p, ns=(2, 8, 64, 256, 1024, 4096, 16384), ds=None):
    ds = list(ds or sizes())
    lines = ["| N \\ size | " + " | ".join(human(d) for d in ds) + " |",
             "|---" * (len(ds) + 1) + "|"]
    for n in ns:
        cells = []
        for d in ds:
            t = {a: predict(a, n, d, p) for a in ALGORITHMS}
            cells.append(min(t, key=t.get))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def crossover_size(p, n, a, b, ds=None):
    """Smallest size in ds from which algorithm a is faster than b (None: never)."""
    for d in ds or sizes(factor=2):
        if predict(a, n, d, p) < predict(b, n, d, p):
            return d
    return None


def human(d):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if d >= s and d % s == 0:
            return f"{d // s} {unit}"
    return f"{d} B"


def plots(p, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    ns = [2 ** i for i in range(1, 15)]
    for d in (8, 1 << 30):
        fig, ax = plt.subplots(figsize=(6, 4))
        for a in ALGORITHMS:
            ax.plot(ns, [predict(a, n, d, p) for n in ns], marker=".", label=a)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers N")
        ax.set_ylabel("predicted time (s)")
        ax.set_title(f"model: AllReduce of {human(d)} vs N")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        f = f"{outdir}/sim-time-vs-N-{d}B.png"
        fig.tight_layout()
        fig.savefig(f, dpi=100)
        plt.close(fig)
        made.append(f)
    ds = list(sizes(factor=2))
    for n in (1024, 4096):
        fig, ax = plt.subplots(figsize=(6, 4))
        for a in ALGORITHMS:
            ax.plot(ds, [predict(a, n, d, p) for d in ds], label=a)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("predicted time (s)")
        ax.set_title(f"model: AllReduce at N = {n}")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        f = f"{outdir}/sim-time-vs-size-N{n}.png"
        fig.tight_layout()
        fig.savefig(f, dpi=100)
        plt.close(fig)
        made.append(f)
    return made


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    try:
        if s[-1:].upper() in mult:
            return int(float(s[:-1]) * mult[s[-1].upper()])
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {s!r}: expected bytes with an optional K/M/G suffix")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("formulas")
    f.add_argument("--alpha", type=float, default=20e-6)
    f.add_argument("--beta", type=float, default=1e-10)
    f.add_argument("--c-pkt", type=float, default=1e-7)
    f.add_argument("--fan-in", type=int, default=32)
    f.add_argument("-N", type=int, default=8)
    f.add_argument("-D", type=parse_size, default=1 << 20)
    c = sub.add_parser("calibrate")
    c.add_argument("csv")
    c.add_argument("--json")
    c.add_argument("--host-variant", default="host-ring")
    t = sub.add_parser("alltoall")
    t.add_argument("-N", type=int, default=1024)
    t.add_argument("-G", type=int, default=8)
    for name, default in A2AParams().__dict__.items():
        t.add_argument("--" + name.replace("_", "-"), type=float, default=default)
    u = sub.add_parser("cpu", help="CPU-bound AllReduce from measured CPU seconds per GB")
    for name, default in CpuParams().__dict__.items():
        u.add_argument("-M" if name == "m" else "--" + name.replace("_", "-"), dest=name,
                       type=type(default), default=default)
    x = sub.add_parser("crossover")
    x.add_argument("--params", help="JSON written by calibrate --json")
    x.add_argument("--plots", help="directory for PNG plots")
    args = ap.parse_args(argv)
    if args.cmd == "formulas":
        p = Params(alpha=args.alpha, beta=args.beta, c_pkt=args.c_pkt, fan_in=args.fan_in)
        for a in ALGORITHMS:
            print(f"{a:5s} {predict(a, args.N, args.D, p) * 1e6:14.3f} us")
        return 0
    if args.cmd == "alltoall":
        p = A2AParams(**{k: getattr(args, k) for k in A2AParams().__dict__})
        print(f"# AllToAll, N = {args.N} ranks on nodes of G = {args.G}: predicted time of one "
              f"call (inasim.py's A2AParams: {p.__dict__})")
        print("# assumptions:")
        for line in a2a_assumptions(args.N, args.G, p):
            print(f"#   - {line}")
        print(a2a_table(args.N, args.G, p))
        wins = [b for b in sizes(8, 1 << 20, 2)
                if t_a2a_hier(args.N, args.G, b, p) < t_a2a_pairwise(args.N, args.G, b, p)]
        print(f"# hierarchical faster than flat pairwise up to blocks of "
              f"{human(max(wins)) if wins else 'none'} (searched 8 B - 1 MiB by powers of 2)")
        return 0
    if args.cmd == "cpu":
        try:
            q = CpuParams(**{k: getattr(args, k) for k in CpuParams().__dict__})
        except ValueError as e:
            ap.error(str(e))
        print("# CPU-bound AllReduce: seconds per GB per rank, ring against a tree of software "
              "aggregators (inasim.py cpu)")
        print("# assumptions:")
        for line in cpu_assumptions(q):
            print(f"#   - {line}")
        print(cpu_table(q))
        return 0
    if args.cmd == "calibrate":
        p, info = calibrate(read_csv(args.csv), args.host_variant)
        print(json.dumps({"params": p.to_dict(), **info}, indent=2))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"params": p.to_dict(), **info}, fh, indent=2)
        return 0
    p = Params()
    if args.params:
        with open(args.params) as fh:
            d = json.load(fh)
        p = Params.from_dict(d.get("params", d))
    print(best_table(p))
    for n in (1024, 4096):
        s = crossover_size(p, n, "hier", "ring")
        print(f"N={n}: hier faster than ring from {human(s) if s else 'never (up to 1 GiB)'}; "
              f"speed-up at 1 GiB {predict('ring', n, 1 << 30, p) / predict('hier', n, 1 << 30, p):.2f}x")
    if args.plots:
        for f in plots(p, args.plots):
            print("wrote", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
