#!/usr/bin/python3
"""The loss injector (topo.Topology.set_loss: nftables `numgen random` in a namespace) drops
within 20% of the requested rate: UDP datagrams from one namespace to another across the
bridge, counted by sequence number at the receiver, at 5% and 20%. Bounded: a few seconds.
Needs root and `ip netns`: exits 77 (Meson SKIP) with the reason otherwise."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lab"))
import topo  # noqa: E402

RECEIVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# SO_RCVBUFFORCE (root) passes net.core.rmem_max: every datagram of the run fits even if a
# loaded machine does not schedule this receiver, so only the injector loses packets.
s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 32 << 20)
s.bind((sys.argv[1], int(sys.argv[2])))
print("up", flush=True)
s.settimeout(5.0)
seen = set()
try:
    while True:
        d, _ = s.recvfrom(64)
        if d == b"END":
            s.settimeout(0.3)  # late data still counts; stop once quiet
            continue
        seen.add(int(d))
except socket.timeout:
    pass
print(len(seen), flush=True)
"""

SENDER = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = int(sys.argv[3])
for i in range(n):
    s.sendto(str(i).encode(), (sys.argv[1], int(sys.argv[2])))
    if i % 64 == 63:
        time.sleep(0.0005)  # paced: only the injector loses packets, not a full socket buffer
for _ in range(200):
    s.sendto(b"END", (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.001)
"""


class LossInjector(unittest.TestCase):
    def measure(self, percent, count):
        t = topo.Topology(1, 1)
        with t:
            src, dst = t.host("w0"), t.host("agg0")
            t.set_loss(dst, percent, "in")
            rx = t.popen(dst, [sys.executable, "-c", RECEIVER, dst.ip, "41000"],
                         stdout=subprocess.PIPE, text=True)
            self.assertEqual(rx.stdout.readline().strip(), "up")
            r = t.run(src, [sys.executable, "-c", SENDER, dst.ip, "41000", str(count)],
                      capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = int(rx.stdout.readline())
            rx.wait(timeout=10)
            rx.stdout.close()
            rules = t.run(dst, ["nft", "list", "table", "inet", topo.NFT_TABLE],
                          capture_output=True, text=True).stdout
        if percent > 0:
            # The rule's counter must account for every missing datagram (END markers too):
            # a loss elsewhere (socket buffer) would make the measured rate meaningless.
            dropped = int(rules.split("counter packets ")[1].split()[0])
            self.assertGreaterEqual(dropped, count - got)
            self.assertLessEqual(dropped, count - got + 200)
        return 100.0 * (count - got) / count, rules

    def check(self, percent, count):
        measured, rules = self.measure(percent, count)
        print(f"requested {percent}% loss, measured {measured:.2f}% over {count} datagrams")
        self.assertIn("numgen random mod 10000", rules)
        self.assertGreaterEqual(measured, percent * 0.8)
        self.assertLessEqual(measured, percent * 1.2)

    def test_5_percent(self):
        self.check(5, 10000)

    def test_20_percent(self):
        self.check(20, 5000)

    def test_zero_percent_loses_nothing(self):
        measured, rules = self.measure(0, 2000)
        self.assertEqual(measured, 0.0)
        self.assertEqual(rules, "")


if __name__ == "__main__":
    topo.skip_unless_namespaces()
    unittest.main(verbosity=2)
