#!/usr/bin/python3
"""The link-bound sweep, across network namespaces on tbf-shaped links:
* the rate check passes on a shaped link and catches an unshaped one;
* a 2-worker link-bound sweep: INA/ring measured within 15% of the bounds' ratio;
* the link-bound sweep (run.py ... --link-rate) leaves no namespace, qdisc or process behind after a normal exit, a
  failed run (timeout) and SIGTERM / SIGINT mid-run, and writes nowhere but --out DIR;
* Gloo (external ranks) and Open MPI (mpirun, PMIx over the subnet) rows come out across the
  namespaces, at most at their bound (so their traffic crossed the shaped links).
usage: test_linkbound.py BUILD_DIR. Needs root and `ip netns` (exit 77, SKIP, otherwise)."""
import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTBED = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTBED)
sys.path.insert(0, os.path.join(TESTBED, "lab"))
import linkbound  # noqa: E402
import topo  # noqa: E402

BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
# The sweep through the driver: the compare scenario has no options of its own, so the sweep
# sees exactly the ones given after `--`.
SWEEP = [sys.executable, os.path.join(TESTBED, "run.py"), "compare"]
RATE = "200mbit"  # low enough that a loaded 2-core machine still saturates it
DPDK = "--backend" in subprocess.run([os.path.join(BUILD, "aggregator", "ina-aggregator"),
                                      "--help"], capture_output=True, text=True).stdout \
    if os.access(os.path.join(BUILD, "aggregator", "ina-aggregator"), os.X_OK) else False
XDP = os.path.exists(os.path.join(BUILD, "worker", "libina-xdp.so"))  # the AF_XDP plugin (-Dxdp)


def exe(*p):
    return os.access(os.path.join(BUILD, *p), os.X_OK)


def state(prefix):
    """(namespaces with prefix, root namespace qdiscs, processes running this build's tools)."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    qd = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    procs = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if BUILD + "/" in cmd and "test_linkbound" not in cmd:
            procs.append(f"{pid}: {cmd[:120]}")
    return ({l.split()[0] for l in ns.splitlines() if l.startswith(prefix)},
            sorted(l for l in qd.splitlines() if "tbf" in l), procs)


def tree_status():
    return subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=all"],
                          capture_output=True, text=True).stdout


def harness(out, prefix, *args, timeout=240, tmpdir=None):
    env = dict(os.environ)
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return subprocess.run([*SWEEP, "--build-dir", BUILD, "--out", out, "--", "--link-rate", RATE,
                           "--force", "--ns-prefix", prefix, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def read(path):
    with open(path) as f:
        return f.read()


def rows_of(out):
    with open(os.path.join(out, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))


class RateCheck(unittest.TestCase):
    def test_shaped_link_passes_unshaped_is_caught(self):
        bps = linkbound.parse_rate(RATE)
        with topo.Topology(2, 1, link_rate=bps, prefix="inatbrc") as t:
            ok, rows = t.rate_check()
            print(linkbound.describe_check(bps, rows))
            self.assertTrue(ok)
            self.assertEqual(len(rows), 2)  # w0 -> w1, w1 -> w0: every link both ways
            for r in rows:
                self.assertGreater(r["ratio"], 0.85)
                self.assertLess(r["ratio"], 1.08)
            qd = t.qdiscs()
            self.assertIn("tbf", qd[t.host("w0").ns])
            self.assertIn("tbf", qd[t.switch_ns])
            self.assertNotIn("tbf", qd[t.host("agg0").ns])  # the aggregator's link: unshaped
        with topo.Topology(4, 1, "leafspine", leaves=2, link_rate=bps, prefix="inatbrc") as t:
            sw = t.qdiscs()[t.switch_ns]
            for dev in ("l0up", "s0down", "l1up", "s1down", "pw0", "pw3"):  # leaf-spine, ports
                self.assertRegex(sw, rf"tbf \S+ dev {dev} root .*rate 200Mbit", dev)
            self.assertNotRegex(sw, r"tbf \S+ dev pagg0 ")
        with topo.Topology(2, 1, link_rate=None, prefix="inatbrc") as t:
            ok, rows = t.rate_check(bps)
            print(linkbound.describe_check(bps, rows))
            self.assertFalse(ok)
            self.assertTrue(all(r["ratio"] > 1.5 and not r["ok"] for r in rows), rows)


class Bounds(unittest.TestCase):
    def test_bounds_and_framing(self):
        user, frame = linkbound.ina_framing("float32")
        self.assertEqual(user, 1024)
        self.assertEqual(frame, 14 + 20 + 8 + linkbound.ina_header_bytes() + 1024)
        # the header size comes from wire.h itself (a renamed constant would silently fall
        # back to the default: caught here)
        import re
        with open(linkbound.WIRE_H) as f:
            m = re.search(r"kHeaderSize\s*=\s*(\d+)", f.read())
        self.assertIsNotNone(m, "wire.h no longer defines kHeaderSize: update ina_header_bytes()")
        self.assertEqual(linkbound.ina_header_bytes(), int(m.group(1)))
        r = 500e6
        ina, ring = linkbound.bound_algbw("ina", 4, r), linkbound.bound_algbw("host-ring", 4, r)
        self.assertAlmostEqual(ina, r / 8 * user / frame)
        self.assertAlmostEqual(ring, r / 8 * 4 / 6 * 1448 / 1514)
        self.assertEqual(linkbound.tree_traffic(2), 1.0)
        self.assertEqual(linkbound.tree_traffic(8), 2.0)
        # wire v2: 16-bit elements travel at their own width, so the bound in user bytes per
        # second is float32's (v1 sent them as 4-byte words: half of it)
        self.assertAlmostEqual(linkbound.bound_algbw("ina", 4, r, "bfloat16"), ina)


class LoadCheck(unittest.TestCase):
    def test_refused_above_the_cores_unless_forced(self):
        import sweep as harness
        real = os.getloadavg
        try:
            os.getloadavg = lambda: (os.cpu_count() + 0.5, 0.0, 0.0)
            ok, line = harness.load_check(False)
            self.assertFalse(ok)
            self.assertIn("refused", line)
            ok, line = harness.load_check(True)
            self.assertTrue(ok)
            self.assertIn("FORCED", line)
            os.getloadavg = lambda: (os.cpu_count() - 0.5, 0.0, 0.0)
            ok, line = harness.load_check(False)
            self.assertTrue(ok)
            self.assertNotIn("FORCED", line)
        finally:
            os.getloadavg = real
        if os.getloadavg()[0] > os.cpu_count() + 0.5:  # the real thing, when the machine is busy
            with tempfile.TemporaryDirectory() as out:
                r = subprocess.run([*SWEEP, "--build-dir", BUILD, "--out", out, "--",
                                    "--link-rate", RATE, "-N", "2"], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
                self.assertIn("run refused", r.stdout)
                # the sweep wrote nothing; the driver's record says why (exit status 3)
                self.assertEqual(sorted(os.listdir(out)), ["README.md", "output.txt"])
                with open(os.path.join(out, "README.md")) as f:
                    self.assertIn("exit status: 3", f.read())


@unittest.skipUnless(exe("testbed", "ina-bench") and exe("aggregator", "ina-aggregator"),
                     "ina-bench and ina-aggregator are needed")
class LinkSweep(unittest.TestCase):
    def test_two_workers_ratio_and_cleanup_on_exit(self):
        """ina and host-ring alternated twice at N = 2, 4 MiB; best of each. Nothing left after,
        nothing written outside --out (the tree, TMPDIR)."""
        prefix = f"inatbl{os.getpid() % 10000}"
        before_tree = tree_status()
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as tmp:
            r = harness(out, prefix, "-N", "2", "-b", "4M", "-e", "4M", "-n", "4", "-w", "1",
                        "-d", "float32", "--variants", "ina,host-ring,ina,host-ring",
                        tmpdir=tmp)
            print(r.stdout[-3000:], r.stderr[-2000:])
            self.assertEqual(r.returncode, 0)
            self.assertIn("rate check at 200mbit", r.stdout)
            rows = rows_of(out)
            best = {}
            for x in rows:
                self.assertEqual(x["wrong"], "0")
                self.assertEqual(x["link_rate"], str(linkbound.parse_rate(RATE)))
                best[x["variant"]] = max(best.get(x["variant"], 0), float(x["algbw"]))
            bps = linkbound.parse_rate(RATE)
            bounds = linkbound.bound_algbw("ina", 2, bps) / linkbound.bound_algbw("host-ring", 2, bps)
            measured = best["ina"] / best["host-ring"]
            print(f"INA/ring {measured:.3f}, bounds' ratio {bounds:.3f}")
            self.assertLess(abs(measured / bounds - 1), 0.15)
            for v in best:  # link-bound: neither above its bound
                self.assertLess(best[v] * 1e9, 1.1 * linkbound.bound_algbw(v, 2, bps), v)
            for f in ("machine.txt", "results.csv", "runs.csv", "ratecheck.csv", "summary.md",
                      "tables.txt", "REPORT.md"):
                self.assertTrue(os.path.exists(os.path.join(out, f)), f)
            # The load check's line agrees with the load it saw at the start (not with the load
            # now: the suite's other tests move it meanwhile).
            machine = read(os.path.join(out, "machine.txt"))
            m = re.search(r"load check: (FORCED: started at load )?([0-9.]+)", machine)
            self.assertIsNotNone(m, machine)
            self.assertEqual(m.group(1) is not None, float(m.group(2)) > os.cpu_count(), machine)
            self.assertIn("## Link-bound comparison", read(os.path.join(out, "REPORT.md")))
            self.assertFalse([e for e in os.listdir(out) if e.startswith(".")], os.listdir(out))
            self.assertEqual(os.listdir(tmp), [])
        self.assertEqual(tree_status(), before_tree)
        self.assertEqual(state(prefix), (set(), [], []))

    def test_failed_run_and_refusal_leave_nothing(self):
        """A run past its --timeout is killed (status failed, the sweep goes on); nothing of
        it is left."""
        prefix = f"inatbf{os.getpid() % 10000}"
        with tempfile.TemporaryDirectory() as out:
            r = harness(out, prefix, "-N", "2", "-b", "64M", "-e", "64M", "-n", "5", "-w", "0",
                        "-d", "float32", "--variants", "host-ring,ina", "--timeout", "2",
                        "--no-report")
            print(r.stdout[-3000:], r.stderr[-2000:])
            with open(os.path.join(out, "runs.csv"), newline="") as f:
                runs = list(csv.DictReader(f))
            self.assertEqual([x["status"] for x in runs], ["failed", "failed"], runs)
            self.assertIn("timeout", runs[0]["note"])
        self.assertEqual(state(prefix), (set(), [], []))

    def test_signals_leave_nothing(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            prefix = f"inatbs{os.getpid() % 10000}{int(sig)}"
            with tempfile.TemporaryDirectory() as out:
                p = subprocess.Popen([*SWEEP, "--build-dir", BUILD, "--out", out, "--",
                                      "--link-rate", RATE, "--force", "--ns-prefix", prefix,
                                      "-N", "2", "-b", "64M", "-e", "64M", "-n", "20", "-d",
                                      "float32", "--variants", "ina,host-ring", "--no-report"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                seen = ""
                end = time.time() + 60
                while time.time() < end:
                    line = p.stdout.readline()
                    seen += line
                    if "rate check at" in line or not line:
                        break
                time.sleep(2)  # the first run is under way
                self.assertTrue(state(prefix)[0], "the sweep's namespaces exist while it runs")
                p.send_signal(sig)
                try:
                    rest, _ = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    rest, _ = p.communicate()
                    self.fail(f"harness ignored signal {sig}")
                print(seen[-1500:], rest[-1500:])
                self.assertNotEqual(p.returncode, 0)
            self.assertEqual(state(prefix), (set(), [], []), f"after signal {sig}")


@unittest.skipUnless(exe("testbed", "ina-gloo-bench") and exe("testbed", "ina-mpi-bench") and
                     exe("aggregator", "ina-aggregator"),
                     "ina-gloo-bench, ina-mpi-bench and ina-aggregator are needed")
class PeersAcrossNamespaces(unittest.TestCase):
    def test_gloo_and_mpi_rows(self):
        prefix = f"inatbp{os.getpid() % 10000}"
        with tempfile.TemporaryDirectory() as out:
            variants = (["gloo", "mpi"] + (["ina-xdp"] if XDP else []) +
                        (["ina-dpdk"] if DPDK else []))
            r = harness(out, prefix, "-N", "2", "-b", "8", "-e", "8M", "-f", "16", "-n", "3",
                        "-w", "1", "-d", "float32", "--variants", ",".join(variants),
                        "--no-report")
            print(r.stdout[-3000:], r.stderr[-2000:])
            self.assertEqual(r.returncode, 0)
            rows = rows_of(out)
            bps = linkbound.parse_rate(RATE)
            for v in variants:
                got = [x for x in rows if x["variant"] == v]
                self.assertEqual(sorted(int(x["bytes"]) for x in got), [8, 128, 2048, 32768,
                                                                        524288, 8388608], v)
                self.assertTrue(all(x["wrong"] == "0" for x in got), got)
                big = max(got, key=lambda x: int(x["bytes"]))
                # through the shaped links: not faster than the ring's bound (loopback or an
                # unshaped veth would be many times faster)
                self.assertLess(float(big["algbw"]) * 1e9,
                                1.15 * linkbound.bound_algbw(v, 2, bps), big)
            tables = read(os.path.join(out, "tables.txt"))
            self.assertIn("== mpi N=2", tables)
        self.assertEqual(state(prefix), (set(), [], []))
        if os.path.isdir("/var/run/dpdk"):
            self.assertFalse([d for d in os.listdir("/var/run/dpdk") if d.startswith(prefix)])


if __name__ == "__main__":
    topo.skip_unless_namespaces()
    topo.skip_unless_plotting()
    unittest.main(argv=sys.argv[:1], verbosity=2)
