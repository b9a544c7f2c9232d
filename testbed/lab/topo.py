"""Network-namespace topologies for the INA testbed: N worker hosts and M aggregator hosts.

Every host is a network namespace with one veth link (eth0) to a switch namespace that holds the
Linux bridges: one bridge ("bridge" topology), or leaf bridges joined by veth links to a spine
bridge ("leafspine"). The switch namespace has no addresses; the hosts' addresses (10.x.y.z/16)
exist only inside their namespaces, so nothing is added to the root namespace and deleting the
namespaces removes every link, address and nft table. Names carry a per-run id, and
Topology.down() runs on normal exit, exceptions, SIGINT and SIGTERM (install_signal_teardown).

Faults: set_loss() installs `numgen random mod 10000 < N drop` in a host's (or, for a leaf-spine
link, the switch's) namespace with nftables; the ina-bench driver (`run-ina`) can kill an
aggregator mid-run and restart it; per-rank delays and stragglers are the worker's
INA_TEST_DELAY_US / INA_TEST_STRAGGLE hooks, passed through the environment.

CLI (root):
  topo.py check                         # can namespaces be made here? (exit 77 if not)
  topo.py run-ina -N 4 -M 1 [--kind leafspine --leaves 2] [--loss w0=1,agg0=0.5]
          [--straggle 1=10:5000] [--delay 2=300] [--kill-agg-after 2 --restart-after 1]
          [--host-path | --fallback] [--backend kernel] [--build-dir build] -- <ina-bench args>
  topo.py shell -N 2 -M 1               # print the layout and hold it until SIGINT/SIGTERM
"""
import argparse
import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import linkbound  # noqa: E402

NFT_TABLE = "inatb_loss"


def _run(argv, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def can_make_namespaces():
    """(ok, reason): root, `ip netns` and nft present."""
    if os.geteuid() != 0:
        return False, "needs root (network namespaces)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' is not installed (iproute2 / nftables)"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"'ip netns' is unavailable: {r.stderr.strip()}"
    # Root in a container may still lack CAP_SYS_ADMIN or nf_tables: try both once.
    probe = f"inatb-probe-{os.getpid()}-{secrets.token_hex(2)}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"cannot create a network namespace: {r.stderr.strip()}"
    try:
        r = subprocess.run(["ip", "netns", "exec", probe, "nft", "list", "tables"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return False, f"nftables unusable in a namespace: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def skip_unless_namespaces():
    """For a test's main: exit 77 (Meson SKIP) with the reason when namespaces cannot be made."""
    ok, why = can_make_namespaces()
    if not ok:
        print(f"SKIP: {why}")
        sys.exit(77)


def skip_unless_plotting():
    """For a test's main: exit 77 (Meson SKIP) without numpy and matplotlib."""
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (apt-get install python3-numpy python3-matplotlib)")
        sys.exit(77)


def loss_rules(percent, hook="input"):
    """nft script body for a random drop of `percent` (0..100, 0.01 steps) on `hook`."""
    if not 0 <= percent <= 100:
        raise ValueError(f"loss percent {percent}: must be in [0, 100]")
    n = int(round(percent * 100))
    return (f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept; "
            f"numgen random mod 10000 < {n} counter drop; }}\n")


class Host:
    def __init__(self, name, ns, ip, role, index):
        self.name, self.ns, self.ip, self.role, self.index = name, ns, ip, role, index

    def __repr__(self):
        return f"{self.name}({self.ns} {self.ip})"


class Topology:
    """N workers + M aggregators. kind: 'bridge' (one bridge) or 'leafspine' (hosts spread
    round-robin over `leaves` leaf bridges, each joined to one spine bridge)."""

    def __init__(self, workers, aggregators=1, kind="bridge", leaves=2, run_id=None,
                 link_rate=None, prefix="inatb", mtu=None, tcp_cc=None):
        """link_rate: bits/s of tbf on both ends of every worker link and on every leaf-spine
        link (None: unshaped); the aggregators' links stay unshaped (the aggregator plays the
        switch). prefix: the first part of every namespace's name. mtu: every veth's MTU (None:
        the kernel's 1500; 9000 for jumbo frames, as data-centre networks carry). tcp_cc: the
        TCP congestion control of every namespace (None: the machine's default, which a new
        namespace inherits); TCP peers (the host mesh, Gloo, Open MPI) behave differently under
        each, so the run records the one in use (describe())."""
        if mtu is not None and not 68 <= mtu <= 65535:
            raise ValueError(f"mtu {mtu}: must be in 68..65535")
        self.mtu = mtu
        if workers < 1 or aggregators < 0 or workers + aggregators > 250:
            raise ValueError(f"workers {workers}, aggregators {aggregators}: need 1..250 hosts")
        if kind not in ("bridge", "leafspine"):
            raise ValueError(f"kind {kind!r}: must be bridge or leafspine")
        if kind == "leafspine" and leaves < 1:
            raise ValueError(f"leaves {leaves}: must be >= 1")
        self.run_id = run_id or f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.prefix = f"{prefix}-{self.run_id}"
        self.kind, self.leaves = kind, leaves
        self.link_rate = link_rate
        self.tcp_cc = tcp_cc
        self.tcp_cc_in_use = None
        self._allowed_cc = None  # the machine's allowed list, where up() had to widen it
        self.switch_ns = f"{self.prefix}-sw"
        self.hosts = []
        for i in range(workers):
            self.hosts.append(Host(f"w{i}", f"{self.prefix}-w{i}", f"10.77.1.{i + 1}", "worker", i))
        for j in range(aggregators):
            self.hosts.append(Host(f"agg{j}", f"{self.prefix}-a{j}", f"10.77.2.{j + 1}", "agg", j))
        self.namespaces = []   # created, in order
        self.procs = []        # Popen objects started in the namespaces
        self._down = False

    # ---- lifecycle ----
    def workers(self):
        return [h for h in self.hosts if h.role == "worker"]

    def aggregators(self):
        return [h for h in self.hosts if h.role == "agg"]

    def host(self, name):
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def _ns(self, ns, *argv, check=True):
        return _run(["ip", "netns", "exec", ns, *argv], check=check)

    def _add_ns(self, ns):
        _run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        self._ns(ns, "ip", "link", "set", "lo", "up")
        if self.tcp_cc:
            self._ns(ns, "sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={self.tcp_cc}")
        if self.tcp_cc_in_use is None:  # every namespace has the same: read it from the first
            self.tcp_cc_in_use = self._ns(ns, "sysctl", "-n", "net.ipv4.tcp_congestion_control",
                                          check=False).stdout.strip() or None

    def _allow_cc(self):
        """A namespace other than the first may take as its default only a congestion control
        in net.ipv4.tcp_allowed_congestion_control: adds tcp_cc to that list for the run (down()
        restores it)."""
        key = "net.ipv4.tcp_allowed_congestion_control"

        def listed(k):
            r = subprocess.run(["sysctl", "-n", k], capture_output=True, text=True)
            return r.stdout.split()

        available = "net.ipv4.tcp_available_congestion_control"
        if self.tcp_cc not in listed(available):
            modprobe = shutil.which("modprobe") or "/usr/sbin/modprobe"
            if os.access(modprobe, os.X_OK):
                subprocess.run([modprobe, f"tcp_{self.tcp_cc}"], capture_output=True)
            if self.tcp_cc not in listed(available):
                raise RuntimeError(f"tcp_cc {self.tcp_cc!r}: not available here "
                                   f"({' '.join(listed(available))})")
        allowed = listed(key)
        if self.tcp_cc not in allowed:
            self._allowed_cc = " ".join(allowed)
            _run(["sysctl", "-q", "-w", f"{key}={' '.join(allowed + [self.tcp_cc])}"])

    def up(self):
        atexit.register(self.down)
        try:
            if self.tcp_cc:
                self._allow_cc()
            self._add_ns(self.switch_ns)
            sw = self.switch_ns
            if self.kind == "bridge":
                self._ns(sw, "ip", "link", "add", "br0", "type", "bridge")
                self._ns(sw, "ip", "link", "set", "br0", "up")
            else:
                self._ns(sw, "ip", "link", "add", "spine", "type", "bridge")
                self._ns(sw, "ip", "link", "set", "spine", "up")
                for l in range(self.leaves):
                    self._ns(sw, "ip", "link", "add", f"leaf{l}", "type", "bridge")
                    self._ns(sw, "ip", "link", "set", f"leaf{l}", "up")
                    # leaf l <-> spine: both ends in the switch namespace
                    self._ns(sw, "ip", "link", "add", f"l{l}up", "type", "veth", "peer", "name",
                             f"s{l}down")
                    if self.mtu:
                        for dev in (f"l{l}up", f"s{l}down"):
                            self._ns(sw, "ip", "link", "set", dev, "mtu", str(self.mtu))
                    self._ns(sw, "ip", "link", "set", f"l{l}up", "master", f"leaf{l}", "up")
                    self._ns(sw, "ip", "link", "set", f"s{l}down", "master", "spine", "up")
                    if self.link_rate:
                        linkbound.shape(sw, f"l{l}up", self.link_rate)
                        linkbound.shape(sw, f"s{l}down", self.link_rate)
            for k, h in enumerate(self.hosts):
                self._add_ns(h.ns)
                port = f"p{h.name}"
                _run(["ip", "link", "add", "name", "eth0", "netns", h.ns, "type", "veth", "peer",
                      "name", port, "netns", sw])
                bridge = "br0" if self.kind == "bridge" else f"leaf{k % self.leaves}"
                if self.mtu:  # both ends; the bridges follow their ports
                    self._ns(sw, "ip", "link", "set", port, "mtu", str(self.mtu))
                    self._ns(h.ns, "ip", "link", "set", "eth0", "mtu", str(self.mtu))
                self._ns(sw, "ip", "link", "set", port, "master", bridge, "up")
                self._ns(h.ns, "ip", "addr", "add", f"{h.ip}/16", "dev", "eth0")
                self._ns(h.ns, "ip", "link", "set", "eth0", "up")
                if self.link_rate and h.role == "worker":  # both ends of the worker's link
                    linkbound.shape(h.ns, "eth0", self.link_rate)
                    linkbound.shape(sw, port, self.link_rate)
        except BaseException:
            self.down()
            raise
        return self

    def rate_check(self, bps=None):
        """(ok, rows): TCP streams over every worker link, both ways, against the link rate
        (linkbound.rate_check)."""
        return linkbound.rate_check(self, bps or self.link_rate)

    def qdiscs(self):
        """{namespace: `tc qdisc show` output} of this run's namespaces."""
        return {ns: self._ns(ns, "tc", "qdisc", "show", check=False).stdout
                for ns in self.namespaces}

    def leaf_of(self, host):
        if self.kind != "leafspine":
            return None
        return self.hosts.index(host) % self.leaves

    def down(self):
        """Ends the processes started in the namespaces (by PID), then deletes the namespaces
        (which removes their links, addresses and nft tables). Idempotent."""
        if self._down:
            return
        self._down = True
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 3
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for ns in reversed(self.namespaces):
            # Anything still inside one of this run's namespaces was started by this run.
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces = []
        if self._allowed_cc is not None:
            subprocess.run(["sysctl", "-q", "-w",
                            f"net.ipv4.tcp_allowed_congestion_control={self._allowed_cc}"],
                           capture_output=True)
            self._allowed_cc = None

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()

    # ---- processes ----
    def popen(self, host, argv, env=None, **kw):
        """Starts argv inside host's namespace; the process is ended by down()."""
        p = subprocess.Popen(["ip", "netns", "exec", host.ns, *argv], env=env, **kw)
        self.procs.append(p)
        return p

    def run(self, host, argv, **kw):
        return subprocess.run(["ip", "netns", "exec", host.ns, *argv], **kw)

    # ---- faults ----
    def set_loss(self, host, percent, direction="in"):
        """Random loss of `percent` of the packets host receives ('in'), sends ('out') or both,
        with nftables in its namespace. 0 removes the table."""
        self._ns(host.ns, "nft", "delete", "table", "inet", NFT_TABLE, check=False)
        if percent <= 0:
            return
        body = ""
        if direction in ("in", "both"):
            body += loss_rules(percent, "input")
        if direction in ("out", "both"):
            body += loss_rules(percent, "output")
        if not body:
            raise ValueError(f"direction {direction!r}: must be in, out or both")
        subprocess.run(["ip", "netns", "exec", host.ns, "nft", "-f", "-"], check=True, text=True,
                       input=f"table inet {NFT_TABLE} {{\n{body}}}\n")

    def set_link_loss(self, leaf, percent):
        """Leaf-spine topologies: random loss of `percent` of the frames crossing the link
        between leaf `leaf` and the spine (both directions), nft bridge family in the switch."""
        if self.kind != "leafspine":
            raise ValueError("link loss needs the leafspine topology")
        n = int(round(percent * 100))
        table = f"{NFT_TABLE}_l{leaf}"
        self._ns(self.switch_ns, "nft", "delete", "table", "bridge", table, check=False)
        if percent <= 0:
            return
        script = (f"table bridge {table} {{\n  chain linkloss {{ type filter hook forward priority 0; "
                  f"policy accept; iifname {{ \"l{leaf}up\", \"s{leaf}down\" }} "
                  f"numgen random mod 10000 < {n} counter drop; }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", self.switch_ns, "nft", "-f", "-"], check=True,
                       text=True, input=script)

    def reachable(self, src, dst, port=40999, timeout=3.0):
        """True when a UDP datagram from src reaches dst and the echo comes back (no ping
        needed): an echo server in dst's namespace (until 0.5 s without a datagram), a client
        in src's that retries every 0.2 s, so a lossy path still answers."""
        server = ("import socket,sys;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                  f"s.bind(('{dst.ip}',{port}));s.settimeout({timeout});print('up',flush=True)\n"
                  "try:\n while True:\n  d,a=s.recvfrom(64);s.sendto(d,a);s.settimeout(0.5)\n"
                  "except OSError: pass")
        client = ("import socket,sys,time;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                  "s.settimeout(0.2);end=time.time()+" + str(timeout) + "\n"
                  "while time.time()<end:\n"
                  f" s.sendto(b'probe',('{dst.ip}',{port}))\n"
                  " try:\n  s.recvfrom(64);sys.exit(0)\n except OSError: pass\n"
                  "sys.exit(1)")
        srv = self.popen(dst, [sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
        srv.stdout.readline()
        r = self.run(src, [sys.executable, "-c", client], capture_output=True)
        try:
            srv.wait(timeout=timeout + 1)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
        return r.returncode == 0

    def describe(self):
        lines = [f"topology {self.kind} run {self.run_id}: switch namespace {self.switch_ns}" +
                 (f", worker links shaped to {linkbound.rate_name(self.link_rate)} (tbf burst "
                  f"{linkbound.TBF_BURST} limit {linkbound.TBF_LIMIT}, both ends)"
                  if self.link_rate else "") +
                 (f", TCP congestion control {self.tcp_cc_in_use}" if self.tcp_cc_in_use else "")]
        for h in self.hosts:
            leaf = self.leaf_of(h)
            lines.append(f"  {h.name:6s} {h.ns:24s} {h.ip:12s}" +
                         (f" leaf{leaf}" if leaf is not None else ""))
        return "\n".join(lines)


def install_signal_teardown(topo):
    """SIGINT/SIGTERM: tear down, then exit 130/143."""
    def handler(signum, _frame):
        topo.down()
        sys.exit(128 + signum)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def parse_assignments(text, what, value_parser):
    """'a=1,b=2' -> {a: parsed}; clear errors naming the option and the form."""
    out = {}
    if not text:
        return out
    for item in text.split(","):
        k, sep, v = item.partition("=")
        if not sep or not k or not v:
            raise SystemExit(f"topo.py: {what}: '{item}' must be NAME=VALUE")
        try:
            out[k] = value_parser(v)
        except ValueError as e:
            raise SystemExit(f"topo.py: {what}: '{item}': {e}")
    return out


def wait_with_cpu(p, timeout):
    """Waits for p like Popen.wait, and returns (exit status, its CPU seconds: user, system)
    from wait4's rusage (ip netns exec execs the command, so that is the command's own)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return p.returncode, ru.ru_utime, ru.ru_stime
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(p.args, timeout)
        time.sleep(0.02)


def cpu_line(ranks, agg, wall):
    """The run's CPU time, for CPU seconds per GB: each side's processes (user + system; the
    kernel's softirq work on packets is charged to whichever process it interrupts, so it is
    approximate), and the share of the machine's cores over the ranks' wall time."""
    cores = os.cpu_count() or 1
    ru = sum(u + s for u, s in ranks)
    text = (f"# cpu: ranks {ru:.2f} s (user {sum(u for u, _ in ranks):.2f}, system "
            f"{sum(s for _, s in ranks):.2f})")
    total = ru
    if agg is not None:
        text += f", aggregator {agg[0] + agg[1]:.2f} s (user {agg[0]:.2f}, system {agg[1]:.2f})"
        total += agg[0] + agg[1]
    text += f"; {wall:.2f} s wall, {100 * total / (wall * cores):.0f}% of {cores} cores"
    return text


def run_ina(args, bench_args):
    """ina-bench in external mode, one process per worker namespace, against ina-aggregator
    in the first aggregator namespace. Prints rank 0's table; returns the worst exit status."""
    build = os.path.abspath(args.build_dir)
    if args.backend != "kernel":
        raise SystemExit(f"topo.py: --backend {args.backend}: only 'kernel' is available "
                         "(the DPDK backend and the controller hook in here once they land)")
    agg_bin = os.path.join(build, "aggregator", "ina-aggregator")
    bench = os.path.join(build, "testbed", "ina-bench")
    for b in (agg_bin, bench):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"topo.py: {b} is not built (ninja -C {args.build_dir})")
    topo = Topology(args.workers, max(1, args.aggregators), args.kind, args.leaves,
                    link_rate=args.link_rate)
    install_signal_teardown(topo)
    loss = parse_assignments(args.loss, "--loss", float)
    delay = parse_assignments(args.delay, "--delay", int)
    def straggle_form(v):
        pct, sep, us = v.partition(":")
        if not sep or not 0 <= float(pct) <= 100 or not us.isdigit():
            raise ValueError("expected PROB_PERCENT:DELAY_US, e.g. 10:5000")
        return v
    straggle = parse_assignments(args.straggle, "--straggle", straggle_form)
    with topo:
        print(topo.describe(), flush=True)
        if args.link_rate:
            ok, rows = topo.rate_check()
            print(linkbound.describe_check(args.link_rate, rows), flush=True)
            if not ok:
                print("topo.py: the links do not hold their rate: run refused", flush=True)
                return 2
        for name, pct in loss.items():
            topo.set_loss(topo.host(name), pct, args.loss_direction)
        agg = topo.aggregators()[0]
        port = 47474
        agg_argv = [agg_bin, "--bind", agg.ip, "--port", str(port), "--world-size",
                    str(args.workers), "--stats-interval-ms", "0"]
        agg_proc = topo.popen(agg, agg_argv, stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        ranks = []
        started = time.monotonic()
        for w in topo.workers():
            env = dict(os.environ, INA_AGGREGATOR=f"{agg.ip}:{port}", INA_RANK=str(w.index),
                       INA_WORLD_SIZE=str(args.workers), INA_MESH_ADDR=w.ip)
            if args.host_path or args.fallback:
                env.update(INA_STORE=f"{topo.workers()[0].ip}:29500", INA_FALLBACK="float")
            if args.host_path:
                env["INA_TRANSPORT"] = "host"
            if str(w.index) in delay:
                env["INA_TEST_DELAY_US"] = str(delay[str(w.index)])
            if str(w.index) in straggle:
                env["INA_TEST_STRAGGLE"] = straggle[str(w.index)]
            out = None if w.index == 0 else subprocess.DEVNULL
            ranks.append(topo.popen(w, [bench, "--workers", str(args.workers), *bench_args],
                                    env=env, stdout=out))
        if args.kill_agg_after > 0:
            time.sleep(args.kill_agg_after)
            print(f"# killing aggregator {agg.name} (pid {agg_proc.pid})", flush=True)
            agg_proc.kill()
            agg_proc.wait()
            if args.restart_after >= 0:
                time.sleep(args.restart_after)
                print(f"# restarting aggregator {agg.name}", flush=True)
                topo.popen(agg, agg_argv, stdout=subprocess.DEVNULL)
        worst = 0
        cpu = []
        for r, p in enumerate(ranks):
            try:
                rc, user, system = wait_with_cpu(p, args.timeout)
                cpu.append((user, system))
            except subprocess.TimeoutExpired:
                print(f"# rank {r} did not finish within {args.timeout}s", flush=True)
                rc = 124
            if rc != 0:
                print(f"# rank {r} exited with status {rc}", flush=True)
            worst = max(worst, rc)
        wall = time.monotonic() - started
        agg_cpu = None
        if agg_proc.poll() is None:
            agg_proc.terminate()
            try:
                _, user, system = wait_with_cpu(agg_proc, 10)
                agg_cpu = (user, system)
            except subprocess.TimeoutExpired:
                pass
        if len(cpu) == len(ranks):
            print(cpu_line(cpu, agg_cpu, wall), flush=True)
    return worst


def rate_arg(text):
    try:
        return linkbound.parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="exit 0 when namespaces can be made here, 77 otherwise")
    for name in ("run-ina", "shell"):
        p = sub.add_parser(name)
        p.add_argument("-N", "--workers", type=int, default=4)
        p.add_argument("-M", "--aggregators", type=int, default=1)
        p.add_argument("--kind", default="bridge", choices=["bridge", "leafspine"])
        p.add_argument("--leaves", type=int, default=2)
        p.add_argument("--loss", default="", help="HOST=PERCENT,... (w0, agg0, ...)")
        p.add_argument("--loss-direction", default="in", choices=["in", "out", "both"])
        p.add_argument("--link-loss", default="", help="leafspine: LEAF=PERCENT,...")
        p.add_argument("--link-rate", type=rate_arg, default=None,
                       help="tbf on both ends of every worker link (and leaf-spine link), e.g. "
                            "500mbit; run-ina checks it holds first")
        if name == "run-ina":
            p.add_argument("--delay", default="", help="RANK=US,...: INA_TEST_DELAY_US")
            p.add_argument("--straggle", default="",
                           help="RANK=PCT:US,...: INA_TEST_STRAGGLE (intermittent straggler)")
            p.add_argument("--kill-agg-after", type=float, default=0,
                           help="kill the aggregator this many seconds after the start")
            p.add_argument("--restart-after", type=float, default=-1,
                           help="restart it this many seconds after the kill (<0: never)")
            p.add_argument("--host-path", action="store_true",
                           help="INA_TRANSPORT=host: the host algorithms over the veth links")
            p.add_argument("--fallback", action="store_true",
                           help="INA_STORE on w0: the workers fall back to the host path when "
                                "the aggregator goes away, and probe to return")
            p.add_argument("--backend", default="kernel", help="aggregator backend (kernel)")
            p.add_argument("--build-dir", default="build")
            p.add_argument("--timeout", type=float, default=300)
            p.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    ok, why = can_make_namespaces()
    if args.cmd == "check":
        print("ok" if ok else f"SKIP: {why}")
        return 0 if ok else 77
    if not ok:
        print(f"topo.py: {why}", file=sys.stderr)
        return 77
    if args.cmd == "run-ina":
        bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
        return run_ina(args, bench_args)
    topo = Topology(args.workers, args.aggregators, args.kind, args.leaves,
                    link_rate=args.link_rate)
    install_signal_teardown(topo)
    with topo:
        for name, pct in parse_assignments(args.loss, "--loss", float).items():
            topo.set_loss(topo.host(name), pct, args.loss_direction)
        for leaf, pct in parse_assignments(args.link_loss, "--link-loss", float).items():
            topo.set_link_loss(int(leaf), pct)
        print(topo.describe(), flush=True)
        print("ready", flush=True)
        while True:
            time.sleep(3600)
