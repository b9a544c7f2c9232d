#!/usr/bin/python3
"""Topology create/teardown (testbed/lab/topo.py) leaves nothing behind: namespaces, links and nft
tables, after a normal exit, an exception, and SIGTERM/SIGINT of the CLI. Needs root and
`ip netns`: exits 77 (Meson SKIP) with the reason otherwise."""
import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lab"))
import topo  # noqa: E402

RUN_PY = os.path.join(HERE, "..", "run.py")


def snapshot():
    """Namespaces, root-namespace links and root nft tables now."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    nft = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return ({l.split()[0] for l in ns.splitlines() if l.strip()},
            {l.split(":")[1].strip().split("@")[0] for l in links.splitlines()},
            set(nft.splitlines()))


class TopologyTeardown(unittest.TestCase):
    def assert_clean(self, before, run_id):
        ns, links, nft = snapshot()
        self.assertEqual([n for n in ns - before[0]], [])
        self.assertFalse([n for n in ns if run_id in n], ns)
        self.assertEqual(links - before[1], set())
        self.assertEqual(nft - before[2], set())

    def test_bridge_up_ping_down(self):
        before = snapshot()
        t = topo.Topology(3, 1, "bridge")
        with t:
            ns, _, _ = snapshot()
            self.assertEqual(len([n for n in ns if t.run_id in n]), 5)  # 4 hosts + switch
            t.set_loss(t.host("w1"), 5)
            self.assertTrue(t.reachable(t.host("w0"), t.host("agg0")))
            # the address exists only inside the namespace
            self.assertNotIn(t.host("w0").ip, subprocess.run(["ip", "-o", "addr"],
                             capture_output=True, text=True).stdout)
            nft = t.run(t.host("w1"), ["nft", "list", "tables"], capture_output=True, text=True)
            self.assertIn(topo.NFT_TABLE, nft.stdout)
            t.set_loss(t.host("w1"), 0)
            nft = t.run(t.host("w1"), ["nft", "list", "tables"], capture_output=True, text=True)
            self.assertNotIn(topo.NFT_TABLE, nft.stdout)
        self.assert_clean(before, t.run_id)

    def test_tcp_congestion_control(self):
        def sysctl(key, ns=None):
            argv = ["sysctl", "-n", key]
            if ns:
                argv = ["ip", "netns", "exec", ns] + argv
            return subprocess.run(argv, capture_output=True, text=True).stdout.split()
        available = sysctl("net.ipv4.tcp_available_congestion_control")
        allowed = sysctl("net.ipv4.tcp_allowed_congestion_control")
        machine = sysctl("net.ipv4.tcp_congestion_control")[0]
        # one the machine does not use by default, restricted where possible (the topology must
        # then widen the allowed list for the run and put it back)
        others = [c for c in available if c != machine]
        if not others:
            self.skipTest(f"one congestion control only here ({machine})")
        cc = next((c for c in others if c not in allowed), others[0])
        before = snapshot()
        t = topo.Topology(2, 1, tcp_cc=cc)
        with t:
            for h in t.hosts:
                self.assertEqual(sysctl("net.ipv4.tcp_congestion_control", h.ns), [cc])
            self.assertEqual(t.tcp_cc_in_use, cc)
            self.assertIn(f"TCP congestion control {cc}", t.describe())
        self.assertEqual(sysctl("net.ipv4.tcp_allowed_congestion_control"), allowed)
        self.assertEqual(sysctl("net.ipv4.tcp_congestion_control"), [machine])
        self.assert_clean(before, t.run_id)
        with self.assertRaises(RuntimeError):
            with topo.Topology(1, 0, tcp_cc="no-such-cc"):
                pass
        self.assertEqual(sysctl("net.ipv4.tcp_allowed_congestion_control"), allowed)

    def test_leafspine_and_exception(self):
        before = snapshot()
        t = topo.Topology(4, 2, "leafspine", leaves=2)
        with self.assertRaises(RuntimeError):
            with t:
                t.set_link_loss(1, 10)
                # w0 on leaf0, w1 on leaf1: across the spine (10% loss on it; a longer retry
                # window than the default 3 s: under CI's load the probe's interpreter can take
                # seconds to start, and it failed once so)
                self.assertTrue(t.reachable(t.host("w0"), t.host("w1"), timeout=10.0))
                p = t.popen(t.host("agg0"), ["sleep", "60"])
                raise RuntimeError("boom")
        self.assertIsNotNone(p.poll())  # the process started in the namespace was ended
        self.assert_clean(before, t.run_id)

    def test_cli_signal_teardown(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            before = snapshot()
            p = subprocess.Popen([sys.executable, RUN_PY, "topo", "shell", "-N", "2", "-M", "1",
                                  "--loss", "w0=1"], stdout=subprocess.PIPE, text=True)
            out = ""
            deadline = time.time() + 30
            while "ready" not in out and time.time() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                out += line
            self.assertIn("ready", out)
            run_id = out.split("run ")[1].split(":")[0]
            p.send_signal(sig)
            self.assertEqual(p.wait(timeout=30), 128 + sig)
            p.stdout.close()
            self.assert_clean(before, run_id)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            topo.Topology(0, 1)
        with self.assertRaises(ValueError):
            topo.Topology(2, 1, "mesh")
        with self.assertRaises(ValueError):
            topo.loss_rules(101)


class CpuAccounting(unittest.TestCase):
    def test_wait_with_cpu_reports_the_childs_time(self):
        p = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.2: pass\nraise SystemExit(3)"])
        rc, user, system = topo.wait_with_cpu(p, 30)
        self.assertEqual(rc, 3)
        self.assertEqual(p.returncode, 3)
        self.assertGreaterEqual(user + system, 0.19)
        with self.assertRaises(subprocess.TimeoutExpired):
            q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
            try:
                topo.wait_with_cpu(q, 0.1)
            finally:
                q.kill()
                q.wait()

    def test_cpu_line_sums_both_sides(self):
        line = topo.cpu_line([(1.0, 0.5), (2.0, 0.5)], (0.75, 0.25), 2.0)
        cores = os.cpu_count() or 1
        self.assertIn("ranks 4.00 s (user 3.00, system 1.00)", line)
        self.assertIn("aggregator 1.00 s (user 0.75, system 0.25)", line)
        self.assertIn(f"{100 * 5.0 / (2.0 * cores):.0f}% of {cores} cores", line)
        self.assertNotIn("aggregator", topo.cpu_line([(1.0, 0.0)], None, 1.0))


if __name__ == "__main__":
    topo.skip_unless_namespaces()
    unittest.main(verbosity=2)
