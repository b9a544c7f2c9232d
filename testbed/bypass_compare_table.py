#!/usr/bin/python3
"""The README table of a bypass_compare.sh run: per message size, each row's time (us) and bus
bandwidth (GB/s), from the <row>.csv files (the benches' --csv) in the results directory, with
the machine description and each row's status.

usage: testbed/bypass_compare_table.py RESULTS_DIR > RESULTS_DIR/README.md
"""
import csv
import os
import re
import sys

ROWS = [
    ("ina-udp-lo", "INA, kernel-UDP ranks and aggregator, loopback"),
    ("ina-udp-veth", "INA, kernel-UDP ranks -> veth/bridge -> kernel-UDP aggregator"),
    ("ina-xdp-veth", "INA, AF_XDP ranks (copy mode) -> kernel-UDP aggregator"),
    ("ina-udp-dpdk", "INA, kernel-UDP ranks -> DPDK aggregator (net_af_packet, 1 lcore)"),
    ("ina-xdp-dpdk", "INA, AF_XDP ranks -> DPDK aggregator (net_af_packet, 1 lcore)"),
    ("ina-memif-dpdk", "INA, DPDK ranks (threads of one process, net_memif client) -> DPDK "
                       "aggregator (net_memif server, 1 lcore)"),
    ("gloo", "Gloo ring AllReduce, TCP on loopback"),
    ("mpi", "Open MPI AllReduce, TCP on loopback"),
]


def human(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def load(path):
    out = {}
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                out[int(r["bytes"])] = r
    except (OSError, KeyError, ValueError):
        pass
    return out


def main(d):
    status = {}
    try:
        with open(os.path.join(d, "runs.csv"), newline="") as f:
            for r in csv.DictReader(f):
                status[r["row"]] = (r["status"], r["seconds"])
    except OSError:
        pass
    data = {name: load(os.path.join(d, name + ".csv")) for name, _ in ROWS}
    sizes = sorted({b for rows in data.values() for b in rows})
    present = [(n, t) for n, t in ROWS if data[n]]
    print(f"# AllReduce end to end: kernel bypass vs kernel UDP vs Gloo and Open MPI "
          f"({os.path.basename(d)})\n")
    print("Produced by `testbed/bypass_compare.sh`; machine and command:\n")
    print("```")
    with open(os.path.join(d, "machine.txt")) as f:
        print(f.read().rstrip())
    print("```\n")
    print("Indicative only: on one machine every rank, the aggregator and its busy-polling DPDK "
          "lcore share its cores (see `load` and `cpu` above), so this compares CPU cost per "
          "path, not what the network could carry.\n")
    print("Rows:\n")
    for n, t in ROWS:
        st, sec = status.get(n, ("not run", "0"))
        print(f"- `{n}`: {t} ({st}, {sec} s)")
    print()
    if not present:
        print("No row produced results.")
        return

    def table(title, column, fmt):
        """One row per size, one column per result row: `column` of each, or "-"."""
        print(title)
        print("| size | " + " | ".join(n for n, _ in present) + " |")
        print("|---:|" + "---:|" * len(present))
        for b in sizes:
            cells = []
            for n, _ in present:
                r = data[n].get(b)
                cells.append("-" if r is None else format(float(r[column]), fmt))
            print(f"| {human(b)} | " + " | ".join(cells) + " |")

    table("Bus bandwidth, GB/s (nccl-tests definition, 2(N-1)/N x bytes / time; higher is "
          "better):\n", "busbw", ".3f")
    table("\nTime per AllReduce, us (lower is better):\n", "time_us", ".0f")
    print("\nRank 0's packets (INA rows; a retransmit answered by a duplicate result was a "
          "timeout, not a loss):\n")
    for n, _ in present:
        try:
            with open(os.path.join(d, n + ".txt")) as f:
                m = re.search(r"packets sent (\d+), received (\d+), retransmits (\d+), "
                              r"duplicate results (\d+)", f.read())
        except OSError:
            m = None
        if m:
            sent, _, rtx, dup = (int(x) for x in m.groups())
            print(f"- `{n}`: {sent} sent, {rtx} retransmits ({100.0 * rtx / max(sent, 1):.0f}%), "
                  f"{dup} duplicate results")
    wrong = [f"{n} at {human(b)}" for n, _ in present for b, r in data[n].items()
             if r.get("wrong") not in ("0", "NA", None)]
    print("\nWrong elements: " + (", ".join(wrong) if wrong else "none (every row checked its "
                                   "results)") + ".")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
