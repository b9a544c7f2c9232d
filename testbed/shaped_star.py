#!/usr/bin/python3
"""INA on a shaped star, by hand until topo.py has --link-rate (issue 17): N worker namespaces on
veth links shaped by tc tbf on both ends (rate R, burst 128kb, limit 1mb), one bridge, the
aggregator's link unshaped. Runs ina-bench in external mode (one process per worker) against
ina-aggregator at defaults (no tuning variables) and prints, per size, INA's algbw as % of its
bound R x payload/frame, and rank 0's resends as % of its packets. Root; namespaces, qdiscs and
processes are removed on exit (topo.Topology.down).

  testbed/shaped_star.py --build-dir build -N 4 --rate 500mbit -- -b 16M -e 64M -d float32
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import topo  # noqa: E402


def rate_bits(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", text)
    if not m:
        raise SystemExit(f"--rate {text!r}: expected e.g. 500mbit or 1gbit")
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", default="build")
    p.add_argument("-N", "--workers", type=int, default=4)
    p.add_argument("--rate", default="500mbit")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    ok, why = topo.can_make_namespaces()
    if not ok:
        print(f"shaped_star: {why}")
        return 77
    build = os.path.abspath(a.build_dir)
    agg_bin = os.path.join(build, "aggregator", "ina-aggregator")
    bench = os.path.join(build, "testbed", "ina-bench")
    bench_args = [x for x in a.bench_args if x != "--"]
    t = topo.Topology(a.workers, 1)
    topo.install_signal_teardown(t)
    with t:
        for w in t.workers():
            for ns, dev in ((w.ns, "eth0"), (t.switch_ns, f"p{w.name}")):
                topo._run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                           "tbf", "rate", a.rate, "burst", "128kb", "limit", "1mb"])
        agg = t.aggregators()[0]
        agg_proc = t.popen(agg, [agg_bin, "--bind", agg.ip, "--port", "47474", "--world-size",
                                 str(a.workers), "--stats-interval-ms", "0"],
                           stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        ranks = []
        for w in t.workers():
            env = {k: v for k, v in os.environ.items() if not k.startswith("INA_")}
            env.update(INA_AGGREGATOR=f"{agg.ip}:47474", INA_RANK=str(w.index),
                       INA_WORLD_SIZE=str(a.workers))
            out = subprocess.PIPE if w.index == 0 else subprocess.DEVNULL
            ranks.append(t.popen(w, [bench, "--workers", str(a.workers), *bench_args], env=env,
                                 stdout=out, text=True))
        text, _ = ranks[0].communicate(timeout=a.timeout)
        for r in ranks[1:]:
            r.wait(timeout=a.timeout)
        agg_proc.terminate()
    bits = rate_bits(a.rate)
    wire = None
    for line in text.splitlines():
        m = re.search(r"on the wire to the aggregator ([\d.]+) B per element", line)
        if m:
            wire = float(m.group(1))
    print(text, end="")
    # The frame on the link: the UDP payload (wire bytes per element x elements per packet) plus
    # UDP 8, IPv4 20 and Ethernet 14 bytes; tbf counts the Ethernet frame.
    block = 256
    m = re.search(r"block (\d+) elems", text)
    if m:
        block = int(m.group(1))
    esize = 4
    if wire is not None:
        payload = block * esize
        frame = wire * block + 8 + 20 + 14
        bound = bits / 8 * payload / frame
        m = re.search(r"rank 0: collectives \d+, packets sent (\d+), received \d+, retransmits (\d+)",
                      text)
        resend = 100.0 * int(m.group(2)) / int(m.group(1)) if m else float("nan")
        print(f"# shaped star: {a.workers} workers, tbf {a.rate} both ends; INA bound "
              f"{bound / 1e6:.2f} MB/s (payload {payload} B / frame {frame:.0f} B); rank 0 resent "
              f"{resend:.2f}% of its packets")
        for line in text.splitlines():
            f = line.split()
            if len(f) >= 8 and f[0].isdigit():
                algbw = int(f[0]) / (float(f[4]) * 1e-6)  # size / time
                print(f"#   {int(f[0]):>10} B: algbw {algbw / 1e6:7.2f} MB/s = "
                      f"{100 * algbw / bound:5.1f}% of the bound")
    return max(r.returncode or 0 for r in ranks)


if __name__ == "__main__":
    sys.exit(main())
