#!/usr/bin/python3
"""ina-bench's footer on a short local run (embedded aggregator, 4 ranks): by default one summary
line with what a user needs (bytes on the wire per element, the share of packets resent, the
fallbacks to the host path) and none of the protocol's raw counters, which read like failures on
a clean run ("error reports 29844"); with -v the counters come back, each explained; with
--vs-ring the host ring's sweep follows, and the two side by side.

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
    # --vs-ring: the same sizes on the host ring after the in-network sweep, then both side by
    # side (a row per size with both times and their ratio, and the CPU per GB of each).
    out = run(["--vs-ring"])
    if "# The same sweep on libina's host ring" not in out:
        fail("--vs-ring: no host ring section", out)
    if "every collective on the host mesh" in out:
        fail("--vs-ring: the ring's ranks still announce the host mesh, one line each", out)
    rows = re.findall(r"^#\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
    sizes = [int(r[0]) for r in rows]
    if sizes != [8, 64, 512, 4096, 32768, 262144]:
        fail(f"--vs-ring: side-by-side rows for sizes {sizes}", out)
    for size, ina, ring, ratio in rows:
        if float(ina) <= 0 or float(ring) <= 0 or abs(float(ring) / float(ina) - float(ratio)) > 0.01 + 0.01 * float(ratio):
            fail(f"--vs-ring: row {size}: {ina} / {ring} / {ratio} do not agree", out)
    m = re.search(r"^# CPU per GB reduced: INA ([0-9.]+) s \(ranks ([0-9.]+), aggregator ([0-9.]+)\), "
                  r"ring ([0-9.]+) s: INA / ring ([0-9.]+)x, INA's ranks / ring ([0-9.]+)x$", out, re.M)
    if m is None:
        fail("--vs-ring: no CPU comparison line", out)
    total, ranks, agg, ring, ratio, ranks_ratio = (float(g) for g in m.groups())
    if min(ranks, agg, ring) <= 0 or abs(ranks + agg - total) > 0.002 or \
            abs(total / ring - ratio) > 0.01 + 0.01 * ratio:
        fail(f"--vs-ring: the CPU line's figures do not agree: {m.groups()}", out)
    print(f"--vs-ring: {len(rows)} sizes side by side; {m.group(0)}")
    p = subprocess.run([os.path.join(BUILD, "testbed", "ina-bench"), "--vs-ring", "--transport",
                        "host"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    if p.returncode == 0 or "--vs-ring compares a local in-network AllReduce" not in p.stdout:
        fail(f"--vs-ring --transport host: exit {p.returncode}, expected a clear refusal", p.stdout)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
