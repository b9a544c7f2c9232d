"""A two-level aggregation tree against one flat aggregator, on loopback: the same ina-bench size
sweep with 8 external-mode ranks, first through one ina-aggregator (world 8), then through a
root (world 2) and two leaf aggregators (--parent ..., 4 ranks each). Writes results.csv
(variant flat | tree), summary.md with the leaves' forwarding counters. Indicative only: every
process shares this machine's cores."""
import argparse
import csv
import os
import re
import subprocess
import tempfile
import time

import record

WORLD = 8


class Aggs:
    def __init__(self, agg_bin, tmp):
        self.bin, self.tmp, self.procs = agg_bin, tmp, []

    def start(self, name, *args):
        """An aggregator on 127.0.0.1, any free port (--port-file); returns the port."""
        port_file = os.path.join(self.tmp, f"{name}.port")
        log = open(os.path.join(self.tmp, f"{name}.out"), "w")
        p = subprocess.Popen([self.bin, "--bind", "127.0.0.1", "--port", "0", "--port-file",
                              port_file, "--stats-interval-ms", "0", *args], stdout=log,
                             stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(p)
        for _ in range(200):
            if os.path.exists(port_file) and open(port_file).read().strip():
                return int(open(port_file).read())
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"tree: aggregator {name} did not start:\n"
                         + open(os.path.join(self.tmp, f"{name}.out")).read()[-2000:])

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def run_ranks(bench, ports, bench_args, tmp, csv_path, timeout):
    procs = []
    for r, port in enumerate(ports):
        out = open(os.path.join(tmp, f"rank{r}.out"), "w")
        extra = ["--csv", csv_path] if r == 0 else []
        procs.append(subprocess.Popen([bench, "--aggregator", f"127.0.0.1:{port}", "--rank",
                                       str(r), "--workers", str(WORLD), *bench_args, *extra],
                                      stdout=out, stderr=subprocess.STDOUT))
        out.close()
    rc = 0
    for p in procs:
        try:
            rc = rc or p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = 124
    return rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=180)
    a, bench_args = ap.parse_known_args(argv)  # the rest: ina-bench's size options
    bench_args = record.last_wins(bench_args or ["-b", "4K", "-e", "4M", "-f", "4", "-n", "5",
                                                 "-w", "2"])
    agg_bin = os.path.join(a.build_dir, "aggregator", "ina-aggregator")
    bench = os.path.join(a.build_dir, "testbed", "ina-bench")
    for b in (agg_bin, bench):
        if not os.access(b, os.X_OK):
            print(f"tree: {b} is not built (meson compile -C {a.build_dir})")
            return 77
    os.makedirs(a.out, exist_ok=True)
    rows, notes, rc = [], [], 0
    with tempfile.TemporaryDirectory(prefix="ina-tree-") as tmp:
        aggs = Aggs(agg_bin, tmp)
        try:
            for variant in ("flat", "tree"):
                if variant == "flat":
                    ports = [aggs.start("flat", "--world-size", str(WORLD))] * WORLD
                else:
                    root = aggs.start("root", "--world-size", "2")
                    leaves = [aggs.start(f"leaf{i}", "--world-size", str(WORLD), "--parent",
                                         f"127.0.0.1:{root}", "--child-index", str(i),
                                         "--rank-base", str(4 * i), "--local-ranks", "4",
                                         "--parent-world", "2") for i in (0, 1)]
                    ports = [leaves[0]] * 4 + [leaves[1]] * 4
                path = os.path.join(tmp, f"{variant}.csv")
                r = run_ranks(bench, ports, bench_args, tmp, path, a.timeout)
                print(f"## {variant}: {'ok' if r == 0 else f'exit {r}'}")
                print(open(os.path.join(tmp, "rank0.out")).read())
                rc = rc or r
                aggs.stop()
                if os.path.exists(path):
                    for row in csv.DictReader(open(path, newline="")):
                        rows.append({"variant": variant, **row})
                if variant == "tree":
                    for leaf in ("leaf0", "leaf1"):
                        text = open(os.path.join(tmp, f"{leaf}.out")).read()
                        counters = re.findall(r"^ +(completed|forwarded|reforwarded|parent_results"
                                              r"|parent_stale|parent_errors) +(\S+)", text, re.M)
                        counters = dict.fromkeys(counters)  # the report repeats some
                        notes.append(f"{leaf}: " + (", ".join(f"{k} {v}" for k, v in counters)
                                                    or "no counter report"))
        finally:
            aggs.stop()
    if rows:
        with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    md = ["8 ranks on loopback, float32 SUM: one aggregator (flat) against a root and two leaves "
          "of 4 ranks (tree); time per call (us).", "", "| bytes | flat | tree | tree/flat |",
          "|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault(int(r["bytes"]), {})[r["variant"]] = float(r["time_us"])
    for b, t in sorted(by.items()):
        ratio = f"{t['tree'] / t['flat']:.2f}" if "tree" in t and t.get("flat") else "-"
        md.append(f"| {b} | {t.get('flat', '-')} | {t.get('tree', '-')} | {ratio} |")
    md += [""] + [f"- {n}" for n in notes]
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return rc
