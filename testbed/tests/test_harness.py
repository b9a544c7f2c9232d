#!/usr/bin/python3
"""Smoke test of the comparison harness and the report: a tiny sweep (N = 2, three sizes,
INA, the host ring, Gloo when built, INA across veth links (topo.py) when namespaces can be
made, and then also with 1% loss) must give rows
for every run with no wrong element, the machine description, the summary tables, and a report
with plots and a calibrated simulator; no namespace is left behind.
usage: test_harness.py BUILD_DIR. Exits 77 (SKIP) when ina-bench is not built."""
import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTBED = os.path.dirname(HERE)
sys.path.insert(0, TESTBED)
import topo  # noqa: E402

BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(TESTBED, "..", "build")


class HarnessSmoke(unittest.TestCase):
    def test_quick_sweep_and_report(self):
        variants = ["ina", "host-ring"]
        if os.access(os.path.join(BUILD, "testbed", "ina-gloo-bench"), os.X_OK):
            variants.append("gloo")
        root_ok, _ = topo.can_make_namespaces()
        if root_ok and os.access(os.path.join(BUILD, "aggregator", "ina-aggregator"), os.X_OK):
            variants.append("ina-veth")  # workers and aggregator in namespaces on a bridge
        losses = ["0", "1"] if root_ok else ["0"]
        before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, os.path.join(TESTBED, "harness.py"), "--quick",
                                "-N", "2", "-b", "8", "-e", "64K", "-f", "64", "--loss-stepfactor", "64",
                                "--loss", ",".join(losses), "--variants", ",".join(variants),
                                "--build-dir", BUILD, "--out", out, "--no-report"],
                               capture_output=True, text=True, timeout=120)
            print(r.stdout[-3000:], r.stderr[-2000:])
            self.assertEqual(r.returncode, 0)
            self.assertIn(f"[{len(variants) * len(losses)}/{len(variants) * len(losses)}]",
                          r.stdout)  # progress lines
            with open(os.path.join(out, "results.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
            for v in variants:
                for loss in losses:
                    got = [x for x in rows if x["variant"] == v and float(x["loss_pct"]) == float(loss)]
                    self.assertEqual(sorted(int(x["bytes"]) for x in got), [8, 512, 32768],
                                     f"{v} loss {loss}")
                    self.assertTrue(all(x["wrong"] == "0" for x in got), got)
                    self.assertTrue(all(float(x["time_us"]) > 0 for x in got), got)
            machine = open(os.path.join(out, "machine.txt")).read()
            for key in ("cpu:", "cores:", "kernel:", "date:", "git:"):
                self.assertIn(key, machine)
            summary = open(os.path.join(out, "summary.md")).read()
            self.assertIn("### ina (allreduce), N = 2", summary)
            report = os.path.join(out, "REPORT.md")
            r = subprocess.run([sys.executable, os.path.join(TESTBED, "report.py"), out,
                                "--report", report], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            text = open(report).read()
            self.assertIn("## Simulator", text)
            self.assertIn("| 4096 | 1 GiB |", text)
            for png in ("busbw-vs-size-N2.png", "latency-vs-N.png", "sim-time-vs-size-N4096.png"):
                self.assertGreater(os.path.getsize(os.path.join(out, png)), 1000, png)
            if root_ok:
                self.assertTrue(os.path.exists(os.path.join(out, "throughput-vs-loss.png")))
        after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        self.assertEqual(sorted(l for l in after.splitlines() if "inatb-" in l),
                         sorted(l for l in before.splitlines() if "inatb-" in l))


if __name__ == "__main__":
    if not os.access(os.path.join(BUILD, "testbed", "ina-bench"), os.X_OK):
        print(f"SKIP: {BUILD}/testbed/ina-bench is not built")
        sys.exit(77)
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (apt-get install python3-numpy python3-matplotlib)")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
