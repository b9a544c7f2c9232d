#!/usr/bin/python3
"""Tests of testbed/sim/inasim.py (pure, no network): the models reproduce the textbook
formulas on synthetic parameters, and calibration recovers known alpha/beta (and the
aggregator's per-packet cost) from synthetic measurements with noise."""
import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sim"))
# linkbound.py (the link-bound models read its framing) lives in testbed/lab/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lab"))
import inasim  # noqa: E402


class Formulas(unittest.TestCase):
    def setUp(self):
        self.p = inasim.Params(alpha=7e-6, beta=3e-10, gamma=0.0, c_pkt=5e-8, payload=1024,
                               header=40, fan_in=16)

    def test_ring(self):
        a, b = self.p.alpha, self.p.beta
        for n in (2, 3, 8, 1000, 16384):
            for d in (8, 4096, 1 << 30):
                want = 2 * (n - 1) * a + 2 * (n - 1) / n * d * b
                self.assertAlmostEqual(inasim.t_ring(n, d, self.p), want, delta=want * 1e-12)

    def test_tree(self):
        a, b = self.p.alpha, self.p.beta
        for n in (2, 4, 64, 4096, 16384):
            for d in (8, 1 << 20, 1 << 30):
                want = 2 * math.log2(n) * a + 2 * d * b
                self.assertAlmostEqual(inasim.t_tree(n, d, self.p), want, delta=want * 1e-12)

    def test_hd_power_of_two_and_not(self):
        a, b = self.p.alpha, self.p.beta
        n, d = 1024, 1 << 24
        self.assertAlmostEqual(inasim.t_hd(n, d, self.p),
                               2 * 10 * a + 2 * (n - 1) / n * d * b, delta=1e-15)
        # 1000 ranks: 512-rank core plus fold/unfold of the other 488
        self.assertAlmostEqual(inasim.t_hd(1000, d, self.p),
                               2 * 9 * a + 2 * 511 / 512 * d * b + 2 * (a + d * b), delta=1e-15)

    def test_gamma_adds_reduction(self):
        p = inasim.Params(alpha=0, beta=0, gamma=1e-9)
        self.assertAlmostEqual(inasim.t_ring(4, 1000, p), 0.75 * 1000 * 1e-9)

    def test_inc_and_hier(self):
        p = self.p
        d = 1 << 20
        pk = d // 1024
        n = 8
        want = 2 * (p.alpha_inc + p.c_pkt) + (d + pk * 40) * p.beta_inc + n * pk * p.c_pkt
        self.assertAlmostEqual(inasim.t_inc(n, d, p), want, delta=want * 1e-12)
        # 4096 workers, fan-in 16: 3 levels, 16 inputs per aggregator on the critical path
        n = 4096
        want = 6 * (p.alpha_inc + p.c_pkt) + (d + pk * 40) * p.beta_inc + 16 * pk * p.c_pkt
        self.assertAlmostEqual(inasim.t_hier(n, d, p), want, delta=want * 1e-12)
        self.assertLess(inasim.t_hier(n, d, p), inasim.t_inc(n, d, p))

    def test_bad_input(self):
        with self.assertRaises(ValueError):
            inasim.t_ring(0, 8, self.p)
        with self.assertRaises(ValueError):
            inasim.t_hier(8, 8, self.p, k=1)
        with self.assertRaises(ValueError):
            inasim.Params.from_dict({"alhpa": 1})

    def test_crossover_table_mentions_every_row(self):
        t = inasim.best_table(self.p, ns=(2, 4096), ds=[8, 1 << 30])
        self.assertEqual(len(t.splitlines()), 4)


class Calibration(unittest.TestCase):
    def test_recovers_host_alpha_beta(self):
        rnd = random.Random(7)
        alpha, beta = 35e-6, 1 / 2.5e9
        p = inasim.Params(alpha=alpha, beta=beta)
        samples = []
        for n in (2, 4, 8):
            for d in inasim.sizes(8, 64 << 20, 2):
                samples.append((n, d, inasim.t_ring(n, d, p) * (1 + rnd.uniform(-0.01, 0.01))))
        a, b = inasim.fit_host(samples)
        self.assertLess(abs(a - alpha) / alpha, 0.03, a)
        self.assertLess(abs(b - beta) / beta, 0.03, b)

    def test_recovers_inc_parameters(self):
        rnd = random.Random(11)
        p = inasim.Params(alpha_inc=60e-6, beta_inc=1 / 1.2e9, c_pkt=0.4e-6)
        rows = []
        for n in (2, 4, 8):
            for d in inasim.sizes(8, 64 << 20, 2):
                t = inasim.t_inc(n, d, p) * (1 + rnd.uniform(-0.01, 0.01))
                rows.append(dict(variant="ina", n=n, d=d, t=t, loss=0.0, coll="allreduce"))
                t = inasim.t_ring(n, d, inasim.Params(alpha=30e-6, beta=1e-9))
                rows.append(dict(variant="host-ring", n=n, d=d, t=t, loss=0.0, coll="allreduce"))
        q, info = inasim.calibrate(rows)
        self.assertLess(abs(q.alpha_inc - 60e-6) / 60e-6, 0.05, q.alpha_inc)
        self.assertLess(abs(q.beta_inc - 1 / 1.2e9) * 1.2e9, 0.05, q.beta_inc)
        self.assertLess(abs(q.c_pkt - 0.4e-6) / 0.4e-6, 0.05, q.c_pkt)
        self.assertLess(abs(q.alpha - 30e-6) / 30e-6, 1e-6)
        self.assertLess(info["errors"]["ina"]["mean_rel_err"], 0.02)
        self.assertLess(info["errors"]["host-ring"]["max_rel_err"], 1e-6)

    def test_no_host_rows_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "no host rows"):
            inasim.calibrate([dict(variant="ina", n=2, d=8, t=1e-4, loss=0.0, coll="allreduce")])


class LinkCalibration(unittest.TestCase):
    def test_recovers_link_model_parameters(self):
        """Rows made from the link-bound model (ring and INA at 200 Mbit/s and 1 Gbit/s,
        N = 2..8) with 3% noise: calibrate_link recovers a, k, x0, ki within 10% and the
        validation error stays near the noise."""
        truth = {"host": [30e-6, 1.02], "inc": [80e-6, 1.01, 2e-8]}
        rng = random.Random(7)
        rows = []
        for rate in (200e6, 1e9):
            for n in (2, 4, 8):
                for d in [8] + [1 << k for k in range(20, 27)]:
                    for v in ("host-ring", "ina", "host-tree", "host-hd"):
                        t = inasim.predict_link(truth, v, n, d, rate, "float32")
                        rows.append(dict(variant=v, n=n, d=d, rate=rate, dtype="float32",
                                         t=t * (1 + rng.uniform(-0.03, 0.03))))
        fit = inasim.calibrate_link(rows)
        for got, want in zip(fit["host"] + fit["inc"][:2], truth["host"] + truth["inc"][:2]):
            self.assertAlmostEqual(got / want, 1, delta=0.1)
        for v, e in inasim.validate_link(rows, fit).items():
            self.assertLess(e["mean_rel_err"], 0.05, v)
        t = inasim.predict_link_scale(fit, "ring", 16384, 1 << 30, 1e9)
        self.assertGreater(t, 2 * (1 << 30) * 8 / 1e9)  # at least the ring's bytes at 1 Gbit/s


class Alltoall(unittest.TestCase):
    def setUp(self):
        self.p = inasim.A2AParams(alpha=20e-6, beta=6e-10, alpha_node=5e-6, beta_node=1e-10,
                                  o=5e-6, gc=1e-10)

    def test_pairwise_formula(self):
        p = self.p
        # Small blocks: every round in one window, one latency.
        for n, g, b in ((8, 8, 64), (1024, 8, 4096)):
            lat = (p.alpha if n > g else p.alpha_node) + (n - 2) * p.o
            want = lat + max((g - 1) * b * p.beta_node, (n - g) * b * p.beta)
            self.assertAlmostEqual(inasim.t_a2a_pairwise(n, g, b, p), want, delta=want * 1e-12)
        # 1 MiB blocks over 64 ranks: 2 MiB per round, an 8 MiB window of 4 rounds, 16 windows.
        self.assertEqual(inasim.a2a_windows(64, 1 << 20), 16)
        want = 16 * p.alpha + 47 * p.o + max(3 * (1 << 20) * p.beta_node, 60 * (1 << 20) * p.beta)
        self.assertAlmostEqual(inasim.t_a2a_pairwise(64, 4, 1 << 20, p), want, delta=want * 1e-12)
        self.assertEqual(inasim.t_a2a_pairwise(1, 1, 1 << 20, p), 0.0)

    def test_hierarchical_pays_fewer_latencies_and_moves_bytes_twice(self):
        p = self.p
        # 1,024 ranks on nodes of 8: (8-1) + (128-1) messages instead of 1,023.
        flat, hier = inasim.t_a2a_pairwise(1024, 8, 8, p), inasim.t_a2a_hier(1024, 8, 8, p)
        self.assertGreater(flat / hier, 5)
        # Large blocks: the node phase and the packing are extra, the network bytes the same.
        self.assertGreater(inasim.t_a2a_hier(1024, 8, 1 << 20, p),
                           inasim.t_a2a_pairwise(1024, 8, 1 << 20, p))
        # Nothing to group: the flat schedule.
        self.assertEqual(inasim.t_a2a_hier(8, 8, 64, p), inasim.t_a2a_pairwise(8, 8, 64, p))
        with self.assertRaises(ValueError):
            inasim.t_a2a_hier(1000, 24, 64, p)

    def test_bruck_wins_tiny_blocks_only(self):
        p = self.p
        self.assertLess(inasim.t_a2a_bruck(1024, 8, 8, p), inasim.t_a2a_pairwise(1024, 8, 8, p))
        self.assertGreater(inasim.t_a2a_bruck(1024, 8, 1 << 16, p),
                           inasim.t_a2a_pairwise(1024, 8, 1 << 16, p))
        table = inasim.a2a_table(1024, 8, p, blocks=[8, 1 << 20])
        self.assertEqual(len(table.splitlines()), 4)
        # The choice mirrors the cost model: Bruck for 8 B blocks (512 x 8 B per step, under
        # 4 KiB), never beyond its bound; the flat schedule for 1 MiB blocks.
        self.assertEqual(inasim.a2a_choice(1024, 8, 8, p), "bruck")
        self.assertEqual(inasim.a2a_choice(1024, 8, 1 << 20, p), "pairwise")
        self.assertNotEqual(inasim.a2a_choice(1024, 8, 64, p), "bruck")

    def test_assumptions_are_printed(self):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(inasim.main(["alltoall", "-N", "1024", "-G", "8"]), 0)
        text = out.getvalue()
        self.assertIn("# assumptions:", text)
        self.assertIn("no incast", text)
        self.assertIn("1023 messages per rank, hierarchical 134", text)
        self.assertIn("hierarchical faster than flat pairwise up to blocks of", text)


if __name__ == "__main__":
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: numpy is not installed (apt-get install python3-numpy)")
        sys.exit(77)
    unittest.main(verbosity=2)
