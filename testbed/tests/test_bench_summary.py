#!/usr/bin/python3
"""ina-bench's footer on a short local run (embedded aggregator, 4 ranks): by default one summary
line with what a user needs (bytes on the wire per element, the share of packets resent, the
fallbacks to the host path) and none of the protocol's raw counters, which read like failures on
a clean run ("error reports 29844"); with -v the counters come back, each explained.

usage: test_bench_summary.py BUILD_DIR. Exits 77 (SKIP) when ina-bench is not built."""
import os
import re
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
ARGS = ["-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1"]


def fail(why, out):
    print(f"FAIL: {why}\n--- ina-bench output ---\n{out}")
    sys.exit(1)


def run(extra):
    p = subprocess.run([os.path.join(BUILD, "testbed", "ina-bench")] + ARGS + extra,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"ina-bench {' '.join(ARGS + extra)} exited {p.returncode}", p.stdout)
    return p.stdout


def main():
    if not os.access(os.path.join(BUILD, "testbed", "ina-bench"), os.X_OK):
        print(f"SKIP: {BUILD}/testbed/ina-bench is not built")
        return 77
    for dtype, width in (("float32", 4), ("bfloat16", 2)):
        out = run(["-d", dtype])
        m = re.search(r"^# summary: 4 ranks, (\S+) %s elements reduced per rank; on the wire to "
                      r"the aggregator ([0-9.]+) B per element \(the data: %d B; .*\), ([0-9.]+)%% "
                      r"of packets resent, (\d+) fallbacks to the host path$" % (dtype, width),
                      out, re.M)
        if m is None:
            fail(f"{dtype}: no summary line", out)
        elements, per_element, resent, fallbacks = (float(g) for g in m.groups())
        # Words of the data's width on the wire (wire v2) plus a 40-byte header per block (8 KiB
        # on loopback: 0.5%); the count includes resent packets, taken out here only roughly
        # (resent packets may be a size's shorter last block), hence the 5% below the width.
        first = per_element / (1 + resent / 100)
        if not width * 0.95 < first < width * 1.25:  # resent packets are larger ones under load
            fail(f"{dtype}: {per_element} B per element ({first:.2f} without resends) is not "
                 f"{width} B plus headers", out)
        if elements <= 0 or not 0 <= resent <= 100 or fallbacks != 0:
            fail(f"{dtype}: implausible summary {m.groups()}", out)
        for alarming in ("error reports", "retransmits", "# workers:", "# aggregator: packets in"):
            if alarming in out:
                fail(f"{dtype}: the default footer still prints '{alarming}'", out)
        print(f"{dtype}: {m.group(0)}")
    out = run(["-v"])
    for wanted in (r"^# workers: collectives \d+, packets sent \d+, .*error reports \d+",
                   r"^#   retransmits: ", r"^#   error reports: .*not failures",
                   r"^# aggregator: packets in \d+"):
        if re.search(wanted, out, re.M) is None:
            fail(f"-v: no line matching {wanted!r}", out)
    print("-v: the protocol counters, explained")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
