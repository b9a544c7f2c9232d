#!/usr/bin/python3
"""ina-bench --local-ranks (external mode, ranks as threads of one process) against a running
kernel-UDP ina-aggregator on 127.0.0.1:
* 4 ranks in one process: every size checked, no wrong element, one CSV row per size;
* 4 ranks as 2 + 2 threads in two processes (ranks 0-1 and 2-3): the same;
* --local-ranks past the world size: a non-zero exit whose message names the flag.
usage: test_local_ranks.py BUILD_DIR. Exits 77 (SKIP) when ina-bench or ina-aggregator is not built."""
import csv
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build"
BENCH = os.path.join(BUILD, "testbed", "ina-bench")
AGG = os.path.join(BUILD, "aggregator", "ina-aggregator")
SIZES = ["-b", "8", "-e", "256K", "-f", "32", "-n", "2", "-w", "1"]


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRanks(unittest.TestCase):
    def setUp(self):
        self.port = free_udp_port()
        self.log = tempfile.TemporaryFile()
        self.agg = subprocess.Popen([AGG, "--bind", "127.0.0.1", "--port", str(self.port),
                                     "--world-size", "4", "--stats-interval-ms", "0"],
                                    stdout=self.log, stderr=subprocess.STDOUT)
        time.sleep(0.3)
        self.assertIsNone(self.agg.poll(), "the aggregator exited at start")

    def tearDown(self):
        self.agg.terminate()
        self.agg.wait(timeout=10)
        self.log.close()

    def bench(self, rank, local, extra=()):
        env = dict(os.environ)
        for k in ("INA_AGGREGATOR", "INA_RANK", "INA_WORLD_SIZE", "INA_TRANSPORT"):
            env.pop(k, None)
        return subprocess.Popen([BENCH, "--aggregator", f"127.0.0.1:{self.port}", "--rank",
                                 str(rank), "--workers", "4", "--local-ranks", str(local),
                                 "--timeout-ms", "20000", *SIZES, *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)

    def check_csv(self, path):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([int(r["bytes"]) for r in rows], [8, 256, 8192, 262144])
        self.assertTrue(all(r["ranks"] == "4" and r["wrong"] == "0" for r in rows), rows)
        self.assertTrue(all(float(r["time_us"]) > 0 for r in rows), rows)

    def test_four_ranks_in_one_process(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.csv")
            p = self.bench(0, 4, ["--csv", out])
            so, se = p.communicate(timeout=120)
            print(so[-2000:], se[-2000:])
            self.assertEqual(p.returncode, 0)
            self.assertIn("# ranks 4,", so)
            self.check_csv(out)

    def test_two_processes_of_two_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.csv")
            p0 = self.bench(0, 2, ["--csv", out])
            p2 = self.bench(2, 2)
            so0, se0 = p0.communicate(timeout=120)
            so2, se2 = p2.communicate(timeout=120)
            print(so0[-2000:], se0[-2000:], se2[-2000:])
            self.assertEqual(p0.returncode, 0)
            self.assertEqual(p2.returncode, 0)
            self.assertEqual(so2, "")  # only rank 0 prints the table
            self.check_csv(out)

    def test_past_the_world_size_is_refused(self):
        p = self.bench(2, 3)
        so, se = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--local-ranks 3 from rank 2", se)


if __name__ == "__main__":
    if not (os.access(BENCH, os.X_OK) and os.access(AGG, os.X_OK)):
        print(f"SKIP: {BENCH} or {AGG} is not built")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
