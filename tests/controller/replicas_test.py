#!/usr/bin/python3
"""ina-controller replicas over a real etcd cluster, with failures during admissions.

    replicas_test.py CONTROLLER AGGREGATOR [--trials N] [--kill leader|etcd|both] [--json FILE]

Starts a 3-member etcd cluster on loopback (free ports, data dirs in a temp dir), three
ina-controller replicas with --store etcd://all three members, and two ina-aggregators registered
with --controller naming all three replicas. Client threads admit jobs (world 2: rank 0 and rank 1
ask separately) through the replica list the way libina does (each replica in turn; a 503 or a
refused connection passes to the next), while the test SIGKILLs the leading replica and, then,
an etcd member (the raft leader: the harder case). Asserts:
  - no admission lost: every job a client was answered for is in the leader's /v1/jobs with the
    same id, and every question was answered "admitted" within the clients' deadline;
  - none answered twice differently: both ranks of a job, and a rank asking again after the
    failures, get the same job id, key and aggregator;
  - no slot range double-assigned: on each aggregator the placements of distinct jobs do not
    overlap, and every job id appears once;
  - running jobs not interrupted: every job admitted before a kill stays in its aggregator's
    served set (its /metrics, sampled every 50 ms) through the failover;
  - a new leader is elected within 10 s of the leader's SIGKILL (about 2.5 s: the 2 s lease
    and a poll; more when etcd itself is electing on a loaded machine);
  - a leader SIGSTOPped until another leads, then SIGCONTed, answers as the new leader does
    (it forwards; its lease ran out while it slept) and gives no slot range twice.
--trials N repeats the leader kill (and the etcd kill with --kill etcd|both) N times and prints the
figures (time until admissions succeed again, lost, duplicated, double-assigned, interrupted).
Exit 77 when etcd is not installed (apt-get install etcd-server).
"""
import argparse
from http.client import HTTPException
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from controller_procs import wait_port_file  # noqa: E402


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


class Fail(Exception):
    pass


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def http(port, path, method="GET", timeout=2.0, data=None):
    """(status, body); status 0 when the connection failed."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (OSError, urllib.error.URLError, HTTPException):
        return 0, ""  # refused, reset, or cut off mid-answer (a SIGKILLed replica)


class Cluster:
    """etcd members, controller replicas and aggregators; stop() ends every process it started."""

    def __init__(self, ctl_bin, agg_bin, tmp):
        self.ctl_bin, self.agg_bin, self.tmp = ctl_bin, agg_bin, tmp
        self.etcd = {}  # name -> (proc, client port)
        self.ctl = {}  # port -> proc
        self.aggs = []  # (proc, http port)
        self.logs = []

    def log(self, name):
        f = open(os.path.join(self.tmp, name + ".log"), "ab")
        self.logs.append(f)
        return f

    def start_etcd(self, n=3):
        ports = free_ports(2 * n)
        names = [f"e{i}" for i in range(n)]
        peers = ",".join(f"{names[i]}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(n))
        token = "ina-test-%d" % random.getrandbits(32)
        for i, name in enumerate(names):
            c, p = ports[2 * i], ports[2 * i + 1]
            cmd = ["etcd", "--name", name, "--data-dir", os.path.join(self.tmp, name),
                   "--listen-client-urls", f"http://127.0.0.1:{c}",
                   "--advertise-client-urls", f"http://127.0.0.1:{c}",
                   "--listen-peer-urls", f"http://127.0.0.1:{p}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
                   "--initial-cluster", peers, "--initial-cluster-state", "new",
                   "--initial-cluster-token", token, "--log-level", "warn",
                   # a member that rejoins does not depose the raft leader (etcd 3.4: off)
                   "--pre-vote",
                   # every admission writes the state: keep the history short
                   "--auto-compaction-mode", "revision", "--auto-compaction-retention", "100"]
            self.etcd[name] = (subprocess.Popen(cmd, stdout=self.log(name),
                                                stderr=subprocess.STDOUT), c)
        deadline = time.monotonic() + 20
        while True:
            healthy = sum(1 for _, (_, c) in self.etcd.items()
                          if '"health":"true"' in http(c, "/health")[1])
            if healthy == n:
                return
            if time.monotonic() > deadline:
                raise Fail(f"etcd cluster not healthy within 20 s ({healthy} of {n})")
            time.sleep(0.1)

    def etcd_endpoints(self):
        return "etcd://" + ",".join(f"127.0.0.1:{c}" for _, (_, c) in sorted(self.etcd.items()))

    def etcd_raft_leader(self):
        """The name of the etcd member that is the raft leader (None when unknown)."""
        for name, (proc, c) in self.etcd.items():
            if proc.poll() is not None:
                continue
            st, body = http(c, "/v3/maintenance/status", "POST", data=b"{}")
            if st == 200:
                j = json.loads(body)
                if j.get("leader") == j.get("header", {}).get("member_id"):
                    return name
        return None

    def start_controller(self, port=None):
        if port is None:
            (port,) = free_ports(1)
        pf = os.path.join(self.tmp, f"ctl-{port}.port")
        proc = subprocess.Popen([self.ctl_bin, "--bind", "127.0.0.1", "--port", str(port),
                                 "--port-file", pf, "--store", self.etcd_endpoints(),
                                 "--heartbeat-timeout-ms", "5000"],
                                stdout=self.log(f"ctl-{port}"), stderr=subprocess.STDOUT)
        wait_port_file(proc, pf, "ina-controller --store etcd", timeout=15.0)
        self.ctl[port] = proc
        return port

    def ctl_ports(self):
        return sorted(self.ctl)

    def leader(self, timeout=10.0):
        """The port of the leading replica, waiting for one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for port, proc in self.ctl.items():
                if proc.poll() is None:
                    st, body = http(port, "/metrics", timeout=1.0)
                    if st == 200 and re.search(r"^ina_controller_leader 1$", body, re.M):
                        return port
            time.sleep(0.05)
        raise Fail(f"no controller replica leads within {timeout} s")

    def start_aggregator(self, controllers):
        pf = os.path.join(self.tmp, f"agg-{len(self.aggs)}.port")
        hf = os.path.join(self.tmp, f"agg-{len(self.aggs)}.http")
        proc = subprocess.Popen([self.agg_bin, "--bind", "127.0.0.1", "--port", "0",
                                 "--port-file", pf, "--controller", controllers,
                                 "--slot-capacity", "8192", "--http-port", "0",
                                 "--http-port-file", hf, "--heartbeat-ms", "100",
                                 "--stats-interval-ms", "0"],
                                stdout=self.log(f"agg-{len(self.aggs)}"),
                                stderr=subprocess.STDOUT)
        wait_port_file(proc, pf, "ina-aggregator --controller", timeout=15.0)
        self.aggs.append((proc, wait_port_file(proc, hf, "ina-aggregator --http-port-file",
                                                   timeout=15.0)))

    def stop(self):
        procs = [p for p in self.ctl.values()] + [p for p, _ in self.aggs] + \
            [p for p, _ in self.etcd.values()]
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for f in self.logs:
            f.close()


def admit_once(ports, query, deadline):
    """Asks the replicas in turn until one answers 200 or 400 (libina's order); (status, body)."""
    while time.monotonic() < deadline:
        for port in ports:
            st, body = http(port, "/v1/admit?" + query, timeout=3.0)
            if st in (200, 400):
                return st, body
        time.sleep(0.05)
    return 0, "no replica answered before the deadline"


def fields(body):
    out = {}
    for line in body.splitlines()[1:]:
        k, _, v = line.partition(" ")
        out.setdefault(k, v)
    return out


class Clients:
    """`n` threads admitting world-2 jobs, each rank asking separately, until stop()."""

    def __init__(self, ports, n, prefix):
        self.ports, self.prefix = ports, prefix
        self.lock = threading.Lock()
        self.answers = {}  # name -> {rank: (job, key, aggregator)}
        self.ok_times = []  # monotonic time of every successful answer
        self.errors = []
        self.stopping = False
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(n)]

    def start(self):
        for t in self.threads:
            t.start()

    def run(self, i):
        k = 0
        while not self.stopping:
            name = f"{self.prefix}-{i}-{k}"
            k += 1
            for rank in (0, 1):
                st, body = admit_once(self.ports, f"name={name}&world=2&rank={rank}&slots=8&block=256",
                                      time.monotonic() + 15)
                with self.lock:
                    if st != 200 or not body.startswith("admitted"):
                        self.errors.append(f"{name} rank {rank}: {st} {body.strip()}")
                        continue
                    f = fields(body)
                    self.answers.setdefault(name, {})[rank] = (f["job"], f["key"],
                                                               f["aggregator"])
                    self.ok_times.append(time.monotonic())

    def stop(self):
        self.stopping = True
        for t in self.threads:
            t.join()


class Sampler:
    """Samples every aggregator's served job ids (its /metrics) every 50 ms."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.samples = []  # (time, [set of job ids per aggregator])
        self.stopping = False
        self.thread = threading.Thread(target=self.run)

    def run(self):
        while not self.stopping:
            now = time.monotonic()
            sets = []
            for _, hp in self.cluster.aggs:
                st, body = http(hp, "/metrics", timeout=1.0)
                sets.append(None if st != 200 else
                            set(re.findall(r'ina_aggregator_job_packets_total\{ina_job="(\d+)"\}',
                                           body)))
            self.samples.append((now, sets))
            time.sleep(0.05)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping = True
        self.thread.join()


def gap_after(times, t_kill, t_end):
    """The longest stretch without a successful admission from t_kill to t_end (s): from the
    kill to the first success, or between two successes."""
    pts = [t_kill] + sorted(t for t in times if t_kill <= t <= t_end) + [t_end]
    return max(b - a for a, b in zip(pts, pts[1:]))


def check(cluster, clients, sampler, running_before):
    """Returns the figures: lost, duplicated, double-assigned, interrupted (each a count)."""
    figures = {"lost": 0, "duplicated": 0, "double_assigned": 0, "interrupted": 0}
    problems = []
    leader = cluster.leader()
    st, body = http(leader, "/v1/jobs", timeout=5.0)
    if st != 200:
        raise Fail(f"leader /v1/jobs: HTTP {st}")
    jobs = {j["name"]: j for j in json.loads(body)}
    for e in clients.errors:
        figures["lost"] += 1
        problems.append("unanswered admission: " + e)
    for name, ranks in clients.answers.items():
        if len(set(ranks.values())) != 1:
            figures["duplicated"] += 1
            problems.append(f"{name}: ranks got different answers")
        job_id = next(iter(ranks.values()))[0]
        if name not in jobs or str(jobs[name]["id"]) != job_id or jobs[name]["state"] != "active":
            figures["lost"] += 1
            problems.append(f"{name}: answered job {job_id}, the leader has "
                            f"{jobs.get(name, {}).get('id')} ({jobs.get(name, {}).get('state')})")
    # Asked again after the failures: the same answer (id, key, aggregator).
    names = sorted(clients.answers)
    for name in random.sample(names, min(len(names), 40)):
        st, b = admit_once(cluster.ctl_ports(), f"name={name}&world=2&rank=0&slots=8&block=256",
                           time.monotonic() + 10)
        f = fields(b)
        if st != 200 or (f.get("job"), f.get("key"), f.get("aggregator")) != \
                clients.answers[name][0]:
            figures["duplicated"] += 1
            problems.append(f"{name}: asked again, answered differently")
    # Slot ranges: no overlap on any aggregator.
    st, body = http(leader, "/v1/aggregators", timeout=5.0)
    seen_ids = {}
    for a in json.loads(body):
        ranges = sorted((p["slot_base"], p["slot_base"] + p["slots"], p["job"])
                        for p in a["placements"])
        for (b0, e0, j0), (b1, e1, j1) in zip(ranges, ranges[1:]):
            if b1 < e0:
                figures["double_assigned"] += 1
                problems.append(f"{a['id']}: jobs {j0} [{b0},{e0}) and {j1} [{b1},{e1}) overlap")
        for _, _, j in ranges:
            seen_ids[j] = seen_ids.get(j, 0) + 1
    for j, n in seen_ids.items():
        if n > 1:
            figures["double_assigned"] += 1
            problems.append(f"job {j} placed {n} times")
    # Running jobs: each job served before the kill stays served in every later sample.
    for t_kill, served in running_before:
        for t, sets in sampler.samples:
            # A sample where an aggregator's /metrics did not answer in time (a loaded machine)
            # says nothing about its jobs.
            if t < t_kill or any(s is None for s in sets):
                continue
            now = set().union(*sets)
            missing = served - now
            if missing:
                figures["interrupted"] += len(missing)
                problems.append(f"{len(missing)} running jobs left their aggregator "
                                f"{t - t_kill:.2f} s after a kill")
                break
    return figures, problems


def served_now(cluster):
    out = set()
    for _, hp in cluster.aggs:
        st, body = http(hp, "/metrics")
        out |= set(re.findall(r'ina_aggregator_job_packets_total\{ina_job="(\d+)"\}', body))
    return out


def trial(cluster, kind, n_clients, prefix):
    """One failure under admissions; returns (figures, problems, gap_s)."""
    clients = Clients(cluster.ctl_ports(), n_clients, prefix)
    sampler = Sampler(cluster)
    sampler.start()
    clients.start()
    running_before = []
    gaps = []
    try:
        time.sleep(1.5)
        if kind in ("leader", "both"):
            old = cluster.leader()
            running_before.append((time.monotonic(), served_now(cluster)))
            t_kill = time.monotonic()
            cluster.ctl[old].send_signal(signal.SIGKILL)
            cluster.ctl[old].wait()
            new = cluster.leader(timeout=10.0)
            if new == old:
                raise Fail("the killed replica still leads")
            time.sleep(1.5)
            gaps.append(("leader", gap_after(clients.ok_times, t_kill, time.monotonic())))
            # Bring the replica back on its port (the aggregators' lists name it) as a follower.
            del cluster.ctl[old]
            cluster.start_controller(old)
        if kind in ("etcd", "both"):
            raft_leader = cluster.etcd_raft_leader()
            victim = raft_leader or sorted(cluster.etcd)[0]
            running_before.append((time.monotonic(), served_now(cluster)))
            t_kill = time.monotonic()
            proc = cluster.etcd[victim][0]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            time.sleep(3.0)
            gaps.append(("etcd" if raft_leader else "etcd (not the raft leader)",
                         gap_after(clients.ok_times, t_kill, time.monotonic())))
    finally:
        clients.stop()
        sampler.stop()
    figures, problems = check(cluster, clients, sampler, running_before)
    figures["admissions"] = sum(len(r) for r in clients.answers.values())
    # Release the jobs (their slots and their share of the stored state) for the next trial.
    names = sorted(clients.answers)
    leader = cluster.leader()

    def release(part):
        for name in part:
            for rank in (0, 1):
                http(leader, f"/v1/release?name={name}&rank={rank}", timeout=5.0)
    threads = [threading.Thread(target=release, args=(names[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return figures, problems, gaps


def stale_leader(cluster):
    """SIGSTOPs the leader until another replica leads and admits jobs, then SIGCONTs it: the
    woken replica must not answer from its old state (its lease ran out while it slept), so its
    answers equal the new leader's and no slot range is given twice. Returns problems."""
    problems = []
    old = cluster.leader()
    proc = cluster.ctl[old]
    proc.send_signal(signal.SIGSTOP)
    try:
        new = cluster.leader(timeout=8.0)
        others = [p for p in cluster.ctl_ports() if p != old]
        answers = {}
        for i in range(10):
            st, body = admit_once(others, f"name=stale-{i}&world=2&rank=0&slots=8&block=256",
                                  time.monotonic() + 10)
            if st != 200 or not body.startswith("admitted"):
                problems.append(f"stale-{i} through the new leader {new}: {st} {body.strip()}")
            answers[f"stale-{i}"] = fields(body)
    finally:
        proc.send_signal(signal.SIGCONT)
    # Asked at once after waking up, the old leader forwards (or answers 503 until it knows the
    # new leader): the answers are the new leader's, and new names get fresh, disjoint slots.
    for i in range(10, 20):
        st, body = admit_once([old], f"name=stale-{i}&world=2&rank=0&slots=8&block=256",
                              time.monotonic() + 10)
        if st != 200 or not body.startswith("admitted"):
            problems.append(f"stale-{i} through the woken replica: {st} {body.strip()}")
        answers[f"stale-{i}"] = fields(body)
    for i in range(20):
        st, body = admit_once([old], f"name=stale-{i}&world=2&rank=1&slots=8&block=256",
                              time.monotonic() + 10)
        f = fields(body)
        want = answers[f"stale-{i}"]
        if (f.get("job"), f.get("key"), f.get("aggregator")) != \
                (want.get("job"), want.get("key"), want.get("aggregator")):
            problems.append(f"stale-{i}: rank 1 through the woken replica got another answer")
    st, body = http(cluster.leader(), "/v1/aggregators", timeout=5.0)
    for a in json.loads(body):
        ranges = sorted((p["slot_base"], p["slot_base"] + p["slots"], p["job"])
                        for p in a["placements"])
        for (b0, e0, j0), (b1, e1, j1) in zip(ranges, ranges[1:]):
            if b1 < e0:
                problems.append(f"{a['id']}: jobs {j0} and {j1} overlap after the stale leader")
    for i in range(20):
        for rank in (0, 1):
            http(cluster.leader(), f"/v1/release?name=stale-{i}&rank={rank}", timeout=5.0)
    return problems


def restart_etcd_member(cluster, name):
    """Restarts a killed member on its data dir (it rejoins the cluster)."""
    proc, c = cluster.etcd[name]
    args = proc.args
    cluster.etcd[name] = (subprocess.Popen(args, stdout=cluster.log(name),
                                           stderr=subprocess.STDOUT), c)
    deadline = time.monotonic() + 20
    while '"health":"true"' not in http(c, "/health")[1]:
        if time.monotonic() > deadline:
            raise Fail(f"etcd member {name} did not rejoin within 20 s")
        time.sleep(0.1)


def latency(cluster, ctl_bin, agg_bin, tmp, n):
    """Admission latency, client side, of `n` new jobs each (rank 0 of world 1, one client): a
    controller with --state-file against the etcd leader, alternated in blocks of 25."""
    (port,) = free_ports(1)
    pf = os.path.join(tmp, "file-ctl.port")
    ctl = subprocess.Popen([ctl_bin, "--bind", "127.0.0.1", "--port", str(port), "--port-file", pf,
                            "--state-file", os.path.join(tmp, "controller.json")],
                           stdout=cluster.log("file-ctl"), stderr=subprocess.STDOUT)
    cluster.ctl_file = ctl
    wait_port_file(ctl, pf, "ina-controller --state-file", timeout=15.0)
    agg = subprocess.Popen([agg_bin, "--bind", "127.0.0.1", "--port", "0", "--controller",
                            f"127.0.0.1:{port}", "--slot-capacity", "65536", "--http-port", "-1",
                            "--heartbeat-ms", "100", "--stats-interval-ms", "0"],
                           stdout=cluster.log("file-agg"), stderr=subprocess.STDOUT)
    cluster.aggs.append((agg, 0))
    deadline = time.monotonic() + 10
    while http(port, "/v1/aggregators")[1].strip() in ("", "[]"):
        if time.monotonic() > deadline:
            raise Fail("the aggregator did not register with the state-file controller")
        time.sleep(0.05)
    lat = {"file": [], "etcd": []}
    targets = {"file": port, "etcd": cluster.leader()}
    for block in range(0, n, 25):
        for kind in ("file", "etcd"):
            for i in range(block, min(n, block + 25)):
                t0 = time.perf_counter()
                st, body = http(targets[kind], f"/v1/admit?name=lat-{kind}-{i}&world=1&rank=0"
                                "&slots=1&block=256", timeout=5.0)
                dt = time.perf_counter() - t0
                if st != 200 or not body.startswith("admitted"):
                    raise Fail(f"latency run ({kind}): {st} {body}")
                lat[kind].append(dt)
    ctl.kill()
    ctl.wait()
    size = os.path.getsize(os.path.join(tmp, "controller.json"))
    print(f"state file: {size} bytes for {n} jobs ({size / n:.0f} bytes per job)")
    out = {"state_bytes_per_job": size / n}
    for kind, v in lat.items():
        v.sort()
        out[kind] = {"n": len(v), "median_ms": 1e3 * v[len(v) // 2],
                     "p99_ms": 1e3 * v[min(len(v) - 1, int(0.99 * len(v)))],
                     "max_ms": 1e3 * v[-1]}
        print(f"admission latency, {kind}: n {len(v)} median {out[kind]['median_ms']:.2f} ms "
              f"p99 {out[kind]['p99_ms']:.2f} ms max {out[kind]['max_ms']:.2f} ms")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("controller")
    ap.add_argument("aggregator")
    ap.add_argument("--trials", type=int, default=0)
    ap.add_argument("--kill", default="both", choices=["leader", "etcd", "both"])
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--json")
    ap.add_argument("--latency", type=int, default=0,
                    help="instead of failures: N admissions each with --state-file and etcd")
    args = ap.parse_args()
    # meson's timeout (and a user's kill) end the processes through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if shutil.which("etcd") is None:
        skip("etcd is not installed (apt-get install etcd-server)")
    tmp = tempfile.mkdtemp(prefix="ina-replicas-")
    cluster = Cluster(os.path.abspath(args.controller), os.path.abspath(args.aggregator), tmp)
    ok = False
    try:
        cluster.start_etcd(3)
        for _ in range(3):
            cluster.start_controller()
        first = cluster.leader()
        ctl_list = ",".join(f"127.0.0.1:{p}" for p in cluster.ctl_ports())
        cluster.start_aggregator(ctl_list)
        cluster.start_aggregator(ctl_list)
        deadline = time.monotonic() + 10
        while len(json.loads(http(first, "/v1/aggregators")[1] or "[]")) < 2:
            if time.monotonic() > deadline:
                raise Fail("the aggregators did not register through the replica list")
            time.sleep(0.05)
        # A follower answers reads from the stored state and forwards writes.
        follower = next(p for p in cluster.ctl_ports() if p != first)
        st, body = admit_once([follower], "name=probe&world=2&rank=0&slots=8&block=256",
                              time.monotonic() + 5)
        if st != 200 or not body.startswith("admitted"):
            raise Fail(f"admission through a follower: {st} {body}")
        deadline = time.monotonic() + 3
        while '"probe"' not in http(follower, "/v1/jobs")[1]:
            if time.monotonic() > deadline:
                raise Fail("a follower does not show the job its leader admitted")
            time.sleep(0.05)
        if args.latency > 0:
            res = latency(cluster, os.path.abspath(args.controller),
                          os.path.abspath(args.aggregator), tmp, args.latency)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)
            ok = True
            return
        problems = stale_leader(cluster)
        for p in problems:
            print("  " + p)
        if problems:
            raise Fail(f"a stopped and woken leader: {len(problems)} problems (above)")
        print("stale leader: SIGSTOPped, replaced, SIGCONTed: its answers are the new leader's")
        trials = max(args.trials, 1)
        results = []
        for t in range(trials):
            figures, problems, gaps = trial(cluster, args.kill, args.clients, f"t{t}")
            results.append({"figures": figures, "gaps": gaps})
            print(f"trial {t + 1}: {figures} " +
                  " ".join(f"{k}: admissions again after {g:.2f} s" for k, g in gaps))
            for p in problems[:20]:
                print("  " + p)
            if problems:
                raise Fail(f"trial {t + 1}: {len(problems)} problems (above)")
            # Restore the cluster for the next trial: the etcd member returns, the jobs are released.
            for name, (proc, _) in list(cluster.etcd.items()):
                if proc.poll() is not None:
                    restart_etcd_member(cluster, name)
            ctl_ports = cluster.ctl_ports()
            if len(ctl_ports) != 3:
                raise Fail("replica restart failed")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        for kind in ("leader", "etcd"):
            g = [x for r in results for k, x in r["gaps"] if k.startswith(kind)]
            if g:
                print(f"{kind} killed, {len(g)} trials: admissions succeed again after max "
                      f"{max(g):.2f} s (median {sorted(g)[len(g) // 2]:.2f} s)")
        total = {k: sum(r["figures"][k] for r in results) for k in results[0]["figures"]}
        print("totals:", total)
        ok = True
    except (Fail, RuntimeError) as e:  # RuntimeError: wait_port_file (controller_procs)
        print("FAIL: " + str(e))
    finally:
        cluster.stop()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs kept in " + tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
