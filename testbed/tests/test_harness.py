#!/usr/bin/python3
"""Smoke tests of the comparison harness, the report and the aggregator fault driver:
* a tiny sweep (N = 2, three sizes; INA, the host ring, Gloo when built, INA across veth links
  (lab/topo.py) and 1% loss when namespaces can be made) gives rows for every run with no wrong
  element, the machine description and the summary tables; run.py report makes the plots and a
  calibrated simulator section; no namespace is left behind;
* an aggregator killed and restarted mid-run (run.py topo run-ina --fallback): the workers finish;
* the driver: --help lists every scenario of scenarios.toml; `smoke` writes its record (README
  with command, machine, load, revision and exit status; rows with no wrong element; a plot);
  two builds alternated point by point give rows of both and the B/A table; repeated options
  reduce to the last; bad arguments are refused with the reason.
usage: test_harness.py BUILD_DIR. Exits 77 (SKIP) when ina-bench is not built."""
import csv
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTBED = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TESTBED, "lab"))
import topo  # noqa: E402

RUN_PY = os.path.join(TESTBED, "run.py")
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(TESTBED, "..", "build")


def skip_without_namespaces_or_aggregator(test):
    """Skips `test` (with the reason) unless network namespaces can be made and ina-aggregator
    is built: run.py topo run-ina needs both."""
    ok, why = topo.can_make_namespaces()
    if not ok:
        test.skipTest(why)
    if not os.access(os.path.join(BUILD, "aggregator", "ina-aggregator"), os.X_OK):
        test.skipTest("ina-aggregator is not built")


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
            r = subprocess.run([sys.executable, RUN_PY, "compare", "--build-dir", BUILD, "--out", out, "--",
                                "--quick",
                                "-N", "2", "-b", "8", "-e", "64K", "-f", "64", "--loss-stepfactor", "64",
                                "--loss", ",".join(losses), "--variants", ",".join(variants),
                                "--no-report", "--force"],
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
            r = subprocess.run([sys.executable, RUN_PY, "report", out,
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


class AggregatorKillRestart(unittest.TestCase):
    def test_workers_fall_back_and_return(self):
        """run.py topo run-ina: the aggregator is killed 1 s into a run of 150 small AllReduces
        (rank 0 delayed 20 ms each, so the run outlasts the kill on any machine) and restarted
        0.3 s later; with --fallback the ranks redo the collective on the host path, return
        in-network once the new aggregator answers, and finish with no wrong element."""
        skip_without_namespaces_or_aggregator(self)
        r = subprocess.run([sys.executable, RUN_PY, "topo", "run-ina", "-N",
                            "2", "--fallback", "--delay", "0=20000", "--kill-agg-after", "1",
                            "--restart-after", "0.3", "--build-dir", BUILD, "--timeout", "60",
                            "--", "-b", "8", "-e", "64", "-f", "8", "-n", "150", "-w", "1",
                            "--timeout-ms", "1500"],
                           capture_output=True, text=True, timeout=90)
        out = r.stdout + r.stderr
        print(out[-3000:])
        self.assertEqual(r.returncode, 0)
        self.assertIn("# killing aggregator agg0", out)
        self.assertIn("# restarting aggregator agg0", out)
        self.assertIn("redone on the host path", out)
        self.assertIn("Out of bounds values : 0 OK", out)


class OutputLoss(unittest.TestCase):
    def test_loss_in_the_senders_own_firewall(self):
        """run.py topo run-ina with 3% loss in the workers' and the aggregator's *output* hook: the
        kernel answers sendmmsg with EPERM for a datagram nftables drops there. That is loss
        like any other (counted, retransmitted), not a broken transport: every size completes
        with no wrong element."""
        skip_without_namespaces_or_aggregator(self)
        r = subprocess.run([sys.executable, RUN_PY, "topo", "run-ina", "-N",
                            "2", "--loss", "w0=3,w1=3,agg0=3", "--loss-direction", "out",
                            "--build-dir", BUILD, "--timeout", "60", "--", "-b", "1K", "-e",
                            "1M", "-f", "32", "-n", "5", "-w", "1", "-c", "1"],
                           capture_output=True, text=True, timeout=90)
        out = r.stdout + r.stderr
        print(out[-3000:])
        self.assertEqual(r.returncode, 0)
        self.assertNotIn("Operation not permitted", out)
        self.assertIn("Out of bounds values : 0 OK", out)


class Driver(unittest.TestCase):
    def run_py(self, *args, timeout=120):
        return subprocess.run([sys.executable, RUN_PY, *args], capture_output=True, text=True,
                              timeout=timeout)

    def test_help_lists_every_scenario(self):
        import tomllib
        with open(os.path.join(TESTBED, "scenarios.toml"), "rb") as f:
            scenarios = tomllib.load(f)
        r = self.run_py("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for name, s in scenarios.items():
            self.assertRegex(r.stdout, rf"\n  {re.escape(name)} +{re.escape(s['summary'][:30])}")
        for tool in ("report", "index", "topo"):
            self.assertIn(f"\n  {tool} ", r.stdout)

    def test_smoke_writes_its_record(self):
        with tempfile.TemporaryDirectory() as out:
            r = self.run_py("smoke", "--build-dir", BUILD, "--out", out)
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr)
            with open(os.path.join(out, "README.md")) as f:
                readme = f.read()
            for what in ("testbed/run.py smoke", "- machine: ", "cores", "- load (1, 5, 15 min): ",
                         "- git: ", "- exit status: 0", "## Summary", "## Plots"):
                self.assertIn(what, readme)
            with open(os.path.join(out, "results.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
            self.assertEqual(sorted({r["variant"] for r in rows}), ["host-ring", "ina"])
            self.assertTrue(rows and all(r["wrong"] == "0" for r in rows), rows)
            pngs = [f for f in os.listdir(out) if f.endswith(".png")]
            self.assertTrue(pngs)
            self.assertGreater(os.path.getsize(os.path.join(out, pngs[0])), 1000)
            with open(os.path.join(out, "output.txt")) as f:
                self.assertIn("# 2 runs", f.read())

    def test_two_builds_alternated(self):
        with tempfile.TemporaryDirectory() as out:
            r = self.run_py("smoke", "--builds", f"{BUILD},{BUILD}", "--alternate", "--rounds", "2",
                            "--out", out, "--", "--variants", "ina", "-e", "512")
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr)
            with open(os.path.join(out, "results.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
            label = os.path.relpath(BUILD, os.path.dirname(TESTBED))
            label = label if not label.startswith("..") else BUILD
            # 8, 64 and 512 B, each twice per build
            for b in (f"A:{label}", f"B:{label}"):
                got = sorted((int(x["bytes"]), x["round"]) for x in rows if x["build"] == b)
                self.assertEqual(got, [(8, "1"), (8, "2"), (64, "1"), (64, "2"), (512, "1"),
                                       (512, "2")], b)
            with open(os.path.join(out, "README.md")) as f:
                readme = f.read()
            self.assertIn("## Two builds", readme)
            self.assertRegex(readme, r"B/A over 3 points: median [0-9.]+")

    def test_ab_table(self):
        import record
        rows = [{"build": b, "round": r, "variant": "ina", "bytes": "8", "time_us": str(t)}
                for b, r, t in (("a", 1, 10), ("b", 1, 5), ("a", 2, 30), ("b", 2, 15),
                                ("a", 3, 20), ("b", 3, 10))]
        md = record.ab_table(rows, ["a", "b"])
        self.assertIn("| ina | 8 | 20.0 | 10.0 | 0.500 | 3 |", md)
        self.assertEqual(record.ab_table(rows, ["a"]), "")
        # a scenario's options, then --quick's, then the caller's: the last of each wins
        self.assertEqual(record.last_wins(["-e", "4M", "-n", "20", "-v", "-e", "1M", "--zipf",
                                           "-1.5", "-n", "5"]),
                         ["-v", "-e", "1M", "--zipf", "-1.5", "-n", "5"])

    def test_bad_arguments(self):
        for args, why in ((["nosuch"], "invalid choice"),
                          (["smoke", "--alternate"], "--alternate needs --builds A,B"),
                          (["smoke", "--parts", "x"], "smoke has no parts"),
                          (["alltoall", "--parts", "x"], "the parts loopback-uniform"),
                          (["smoke", "--rounds", "0"], "--rounds must be >= 1")):
            r = self.run_py(*args, "--out", os.devnull + "-not-used")
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(why, r.stdout + r.stderr, args)


if __name__ == "__main__":
    if not os.access(os.path.join(BUILD, "testbed", "ina-bench"), os.X_OK):
        print(f"SKIP: {BUILD}/testbed/ina-bench is not built")
        sys.exit(77)
    topo.skip_unless_plotting()
    unittest.main(argv=sys.argv[:1], verbosity=2)
