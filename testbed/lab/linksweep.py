"""sweep.py --link-rate: every variant across network namespaces on the same shaped links.

For each link rate and N: one star topology (topo.Topology: N worker namespaces and two
aggregator namespaces on a bridge, tbf of that rate on both ends of every worker link, the
aggregators' links unshaped), the rate check (linkbound.rate_check; a failure refuses the rest of
the sweep), then every variant in turn, one process per rank in the workers' namespaces:

  ina        ina-bench ranks (kernel UDP) -> ina-aggregator (kernel UDP) in agg0
  ina-dpdk   ina-bench ranks (kernel UDP) -> ina-aggregator --backend dpdk on agg1's eth0
             (net_af_packet, --no-huge, the kernel holds no address there); run last in a
             topology, since it turns the workers' transmit checksum offload off
  ina-xdp    ina-bench ranks over AF_XDP (INA_TRANSPORT=xdp on each worker's eth0, copy mode,
             an address of their own in 10.77.3.0/24 that the kernel does not hold) ->
             ina-aggregator (kernel UDP) in agg0, whose transmit checksum offload it turns off
             (an AF_XDP socket sees frames as they are); run after the kernel variants. AF_XDP's
             transmit path bypasses the qdisc, so a worker's uplink is unshaped here: its
             downlink (tbf on the switch port) still holds INA to the same bound, since each
             worker receives its data once
  host-ring, host-tree, host-hd
             ina-bench --transport host --algo X: libina's host algorithms over its TCP mesh
  gloo       ina-gloo-bench --rank R (external ranks, FileStore in a fresh directory of DIR)
  mpi        mpirun in agg0 (PMIX_MCA_ptl_tcp_remote_connections=1, PMIX_MCA_ptl_tcp_if_include
             and the btl/oob TCP interfaces on the testbed subnet), each rank exec'd into its
             worker's namespace (ip netns exec); Open MPI's own choice of algorithm
  mpi-ring   the same with the tuned component's ring forced (coll_tuned_allreduce_algorithm 4)

With --coll alltoall or alltoallv (--zipf S: expert loads 1/(j+1)^S), the AllToAll variants: host
(libina's host AllToAll, the cost model's choice), gloo (AllToAll only) and mpi.
Every file goes under the sweep's output directory (the Gloo store, Open MPI's session
directory through TMPDIR, rank outputs); DPDK's runtime directory /var/run/dpdk/<prefix> is
removed after each run.
"""
import csv
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
import linkbound  # noqa: E402
import topo  # noqa: E402

LINK_VARIANTS = ["ina", "host", "host-ring", "host-tree", "host-hd", "gloo", "mpi", "mpi-ring",
                 "ina-xdp", "ina-dpdk", "nccl-net"]
LATE = ("ina-xdp", "ina-dpdk")  # run last in a topology, in this order: they change offloads
FLOAT32_ONLY = {"gloo", "mpi", "mpi-ring", "nccl-net"}
SUBNET = "10.77.0.0/16"


class RunFailed(Exception):
    pass


def _wait_text(path, needle, proc, seconds):
    end = time.time() + seconds
    while time.time() < end:
        try:
            with open(path, errors="replace") as f:
                if needle in f.read():
                    return True
        except OSError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


class LinkSweep:
    def __init__(self, harness):
        self.h = harness
        self.a = harness.a
        self.out = harness.out
        self.scratch = os.path.join(self.out, ".run")
        self.port = 31000 + os.getpid() % 2000
        self.topo = None

    # ---- planning ----
    def plan(self, variants, dtypes):
        """[(rate, n, dtype, variant)] in run order: per topology every dtype's variants, the
        kernel-bypass ones (LATE) last."""
        out = []
        for rate in self.a.link_rate:
            for n in self.a.ranks:
                later = {v: [] for v in LATE}
                for dt in dtypes:
                    for v in variants:
                        if v in FLOAT32_ONLY and dt != "float32":
                            continue
                        (later[v] if v in later else out).append((rate, n, dt, v))
                for v in LATE:
                    out += later[v]
        return out

    def unavailable(self, variant):
        if not self.h.root_ok:
            return self.h.root_why
        exe = lambda k: os.access(self.h.bin[k], os.X_OK)  # noqa: E731
        if variant in ("ina", "ina-dpdk", "ina-xdp") and not exe("agg"):
            return f"{self.h.bin['agg']} is not built"
        if variant == "ina-xdp" and not os.path.exists(self.xdp_plugin()):
            return f"{self.xdp_plugin()} is not built (libxdp-dev, libbpf-dev, -Dxdp)"
        if variant == "ina-dpdk" and "--backend" not in self.h.agg_help:
            return "ina-aggregator has no DPDK backend in this build (-Ddpdk)"
        if variant == "nccl-net" and not os.path.exists(self.nccl_plugin()):
            return f"{self.nccl_plugin()} is not built (-Dnccl_plugin)"
        return self.h.unavailable(variant if variant != "mpi-ring" else "mpi")

    def nccl_plugin(self):
        return os.path.join(self.h.build, "integrations", "nccl", "libnccl-net-ina.so")

    def xdp_plugin(self):
        return os.path.join(self.h.build, "worker", "libina-xdp.so")

    # ---- one run ----
    def _env(self, **kw):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("INA_", "OMPI_", "PMIX_", "MASTER_"))}
        env["TMPDIR"] = self.tmpdir
        env.update({k: str(v) for k, v in kw.items()})
        return env

    def _sizes(self, dtype):
        coll = getattr(self.a, "coll", "allreduce")
        extra = [] if coll == "allreduce" else ["--coll", coll]
        if coll == "alltoallv":
            extra += ["--zipf", str(self.a.zipf)]
        return self.h.sizes_args(0) + ["-d", dtype] + extra

    def _ranks(self, argvs_envs, timeout, log):
        """Starts one process per worker (argv, env); waits for all within timeout. Returns the
        worst exit status (124 on timeout); rank 0's output goes to log, the others' tails on
        failure."""
        t, procs, outs = self.topo, [], []
        for w, (argv, env) in zip(t.workers(), argvs_envs):
            path = os.path.join(self.scratch, f"rank{w.index}.txt")
            f = open(path, "w")
            outs.append(path)
            procs.append(t.popen(w, argv, env=env, stdout=f, stderr=subprocess.STDOUT))
            f.close()
        return self._wait(procs, timeout, outs, log)

    def _wait(self, procs, timeout, outs, log):
        end, worst = time.time() + timeout, 0
        for p in procs:
            try:
                rc = p.wait(timeout=max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                rc = 124
            worst = worst if rc == 0 else (rc if worst == 0 else worst)
        if worst == 124:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            log.write(f"# timed out after {timeout:.0f}s\n")
        for k, path in enumerate(outs):
            with open(path, errors="replace") as f:
                text = f.read()
            if k == 0:
                log.write(text)
            elif worst != 0:
                log.write(f"# rank {k}:\n" + "".join(text.splitlines(True)[-8:]))
        return worst

    def _stop(self, proc, log_path, log, what):
        if proc.poll() is None:
            proc.send_signal(2)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with open(log_path, errors="replace") as f:
            tail = f.read().splitlines()[-30:]
        log.write(f"# {what}:\n" + "\n".join(tail) + "\n")

    def run_variant(self, variant, n, dtype, tmpcsv, log):
        t = self.topo
        ws = t.workers()
        self.port += 1
        port = self.port
        sizes = self._sizes(dtype)
        timeout = self.a.timeout
        bench, agg_bin = self.h.bin["ina"], self.h.bin["agg"]
        csv_of = lambda r: ["--csv", tmpcsv] if r == 0 else []  # noqa: E731
        if variant in ("ina", "ina-dpdk", "ina-xdp"):
            agg_log = os.path.join(self.scratch, "aggregator.txt")
            if variant in ("ina", "ina-xdp"):
                agg = t.aggregators()[0]
                port_file = os.path.join(self.scratch, f"agg-port-{port}")
                argv = [agg_bin, "--bind", agg.ip, "--port", str(port), "--world-size", str(n),
                        "--stats-interval-ms", "0", "--port-file", port_file]
                ready = lambda p: _wait_text(port_file, "", p, 10)  # noqa: E731
            else:
                agg = t.aggregators()[1]
                prefix = f"{t.prefix}-dpdk"
                self.dpdk_prefixes.append(prefix)
                lcores = "0-1" if (os.cpu_count() or 1) > 1 else "0"
                argv = [agg_bin, "--backend", "dpdk", "--world-size", str(n), "--ip", agg.ip,
                        "--port", str(port), "--dpdk-port", "net_af_packet0",
                        "--stats-interval-ms", "0", "--", "--no-huge", "-m", "512",
                        "--no-shconf", "--no-pci", "--no-telemetry", "--file-prefix", prefix,
                        "-l", lcores, "--vdev", "net_af_packet0,iface=eth0,framecnt=4096",
                        "--log-level=3"]
                ready = lambda p: _wait_text(agg_log, "ina-aggregator (dpdk) on port", p, 30)  # noqa: E731
            with open(agg_log, "w") as f:
                ap = t.popen(agg, argv, env=self._env(), stdout=f, stderr=subprocess.STDOUT)
            try:
                if not ready(ap):
                    raise RunFailed(f"the aggregator did not start (see {agg_log})")
                # Defaults only: the engine's window and timer adapt to the link (a figure that
                # needs a tuning variable does not count).
                def env_of(w):
                    if variant != "ina-xdp":
                        return self._env(INA_TRANSPORT="udp", INA_TIMEOUT_MS=20000)
                    return self._env(INA_TRANSPORT="xdp", INA_XDP_IFACE="eth0",
                                     INA_LOCAL_IP=f"10.77.3.{w.index + 1}",
                                     INA_PLUGIN_DIR=os.path.dirname(self.xdp_plugin()),
                                     INA_TIMEOUT_MS=20000)
                jobs = [([bench, "--aggregator", f"{agg.ip}:{port}", "--rank", str(w.index),
                          "--workers", str(n), "--transport", "inc", *sizes, *csv_of(w.index)],
                         env_of(w)) for w in ws]
                return self._ranks(jobs, timeout, log)
            finally:
                self._stop(ap, agg_log, log, f"aggregator ({variant})")
        if variant == "host" or variant.startswith("host-"):
            algo = ["--algo", variant.split("-", 1)[1]] if "-" in variant else []
            jobs = [([bench, "--transport", "host", *algo, "--rank", str(w.index),
                      "--workers", str(n), *sizes, *csv_of(w.index)],
                     self._env(INA_STORE=f"{ws[0].ip}:{port}", INA_MESH_ADDR=w.ip,
                               INA_TIMEOUT_MS=60000)) for w in ws]
            return self._ranks(jobs, timeout, log)
        if variant == "nccl-net":  # AllToAll over the NCCL plugin's point-to-point net
            store = os.path.join(self.tmpdir, f"nccl-net-store-{port}")
            os.makedirs(store)
            jobs = [([self.h.bin["nccl-net"], "--plugin", self.nccl_plugin(), "--rank",
                      str(w.index), "--world-size", str(n), "--store-dir", store, "--bind", w.ip,
                      *sizes, *csv_of(w.index)], self._env()) for w in ws]
            try:
                return self._ranks(jobs, timeout, log)
            finally:
                shutil.rmtree(store, ignore_errors=True)
        if variant == "gloo":
            store = os.path.join(self.tmpdir, f"gloo-store-{port}")
            os.makedirs(store)
            jobs = [([self.h.bin["gloo"], "--rank", str(w.index), "--world-size", str(n),
                      "--store-dir", store, "--bind", w.ip, "--timeout-ms", "60000", *sizes,
                      *csv_of(w.index)], self._env()) for w in ws]
            try:
                return self._ranks(jobs, timeout, log)
            finally:
                shutil.rmtree(store, ignore_errors=True)
        if variant in ("mpi", "mpi-ring"):
            agg = t.aggregators()[0]
            flags = ["--allow-run-as-root", "-np", str(n), "--oversubscribe",
                     "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", SUBNET,
                     "--mca", "oob_tcp_if_include", SUBNET,
                     "--mca", "orte_tmpdir_base", self.tmpdir]
            if variant == "mpi-ring":
                flags += ["--mca", "coll_tuned_use_dynamic_rules", "1",
                          "--mca", "coll_tuned_allreduce_algorithm", "4"]
            # each rank enters its worker's namespace: <prefix>-w<rank>
            wrap = ["/bin/sh", "-c", 'exec ip netns exec "$0-w$OMPI_COMM_WORLD_RANK" "$@"',
                    t.prefix]
            argv = ["mpirun", *flags, *wrap, self.h.bin["mpi"], *sizes, "--csv", tmpcsv]
            env = self._env(PMIX_MCA_ptl_tcp_remote_connections=1,
                            PMIX_MCA_ptl_tcp_if_include=SUBNET)
            path = os.path.join(self.scratch, "mpirun.txt")
            with open(path, "w") as f:
                p = t.popen(agg, argv, env=env, stdout=f, stderr=subprocess.STDOUT)
            return self._wait([p], timeout, [path], log)
        raise ValueError(variant)

    # ---- the sweep ----
    def run(self, plan, tables, rw, uw, rcw, t0, csv_fields):
        """Runs the plan; writes rows (rw), runs (uw) and rate checks (rcw). Returns (runs,
        refused): refused names the rate check that failed, if one did."""
        self.tmpdir = os.path.join(self.out, ".tmp")
        os.makedirs(self.tmpdir, exist_ok=True)
        os.makedirs(self.scratch, exist_ok=True)
        self.dpdk_prefixes = []
        done, refused, i = 0, None, 0
        groups = []
        for item in plan:
            if not groups or groups[-1][0] != item[:2]:
                groups.append((item[:2], []))
            groups[-1][1].append(item)
        try:
            for (rate, n), items in groups:
                if refused or (self.a.budget_min > 0 and time.time() - t0 > self.a.budget_min * 60):
                    why = (f"not started: {refused}" if refused else
                           f"not started: the sweep's budget of {self.a.budget_min:g} min was spent")
                    for (_, _, dt, v) in items:
                        i += 1
                        uw.writerow([v, self.a.coll, n, 0, "skipped", 0, why, rate, dt])
                        print(f"[{i}/{len(plan)}] {v:10s} N={n} {linkbound.rate_name(rate)} "
                              f"{dt} skipped ({why})", flush=True)
                    continue
                self.topo = topo.Topology(n, 2, "bridge", link_rate=rate, mtu=self.a.mtu,
                                          prefix=self.a.ns_prefix, tcp_cc=self.a.tcp_cc)
                with self.topo:
                    t = self.topo
                    layout = t.describe().splitlines()[0]  # links, rate, congestion control
                    print(f"# N={n}: {layout}", flush=True)
                    tables.write(f"== topology N={n}\n{layout}\n\n")
                    # agg1 carries the DPDK aggregator: no kernel address on its eth0
                    t._ns(t.aggregators()[1].ns, "ip", "addr", "flush", "dev", "eth0")
                    ok, rows = t.rate_check()
                    text = linkbound.describe_check(rate, rows)
                    print(f"# N={n}: {text}", flush=True)
                    tables.write(f"== rate check N={n}\n{text}\n\n")
                    for r in rows:
                        rcw.writerow([rate, n, r["src"], r["dst"], f"{r['expected']:.0f}",
                                      f"{r['measured']:.0f}", f"{r['ratio']:.3f}",
                                      "ok" if r["ok"] else "failed"])
                    if not ok:
                        refused = (f"the rate check at {linkbound.rate_name(rate)}, N={n} failed "
                                   "(see ratecheck.csv): the links do not hold their rate, so the "
                                   "sweep would not be link-bound")
                        print(f"# REFUSED: {refused}", flush=True)
                        for (_, _, dt, v) in items:
                            i += 1
                            uw.writerow([v, self.a.coll, n, 0, "refused", 0, refused, rate, dt])
                        continue
                    csum_off, agg_csum_off = False, False
                    for (_, _, dt, v) in items:
                        i += 1
                        if self.a.budget_min > 0 and time.time() - t0 > self.a.budget_min * 60:
                            why = (f"not started: the sweep's budget of {self.a.budget_min:g} "
                                   "min was spent")
                            uw.writerow([v, self.a.coll, n, 0, "skipped", 0, why, rate, dt])
                            print(f"[{i}/{len(plan)}] {v:10s} N={n} skipped ({why})", flush=True)
                            continue
                        if v == "ina-xdp" and not agg_csum_off:
                            t._ns(t.aggregators()[0].ns, sys.executable,
                                  os.path.join(ROOT, "scripts", "tx_checksum_off.py"), "eth0")
                            agg_csum_off = True
                        if v == "ina-dpdk" and not csum_off:
                            for w in t.workers():
                                t._ns(w.ns, sys.executable,
                                      os.path.join(ROOT, "scripts", "tx_checksum_off.py"), "eth0")
                            csum_off = True
                        for rnd, label in self.h.ab_points(i):
                            s0 = time.time()
                            status, rows_, note = self.one(v, n, dt, rate, tables)
                            dt_s = time.time() - s0
                            for r in rows_:
                                rw.writerow({**r, "build": label,
                                             "round": rnd if label else ""})
                            uw.writerow([v, self.a.coll, n, 0, status, f"{dt_s:.1f}", note, rate,
                                         dt, label])
                            done += 1
                            el = time.time() - t0
                            print(f"[{i}/{len(plan)}] {v:10s} N={n} "
                                  f"{linkbound.rate_name(rate):8s} {dt:8s} {status:6s} "
                                  f"{len(rows_):2d} sizes {dt_s:6.1f}s  elapsed {el:5.0f}s"
                                  + (f"  [{label} round {rnd}]" if label else "")
                                  + (f"  ({note})" if note else ""), flush=True)
                self.topo = None
                self._cleanup_dpdk()
        finally:
            self._cleanup_dpdk()
            shutil.rmtree(self.scratch, ignore_errors=True)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        return done, refused

    def _cleanup_dpdk(self):
        for p in self.dpdk_prefixes:
            shutil.rmtree(os.path.join("/var/run/dpdk", p), ignore_errors=True)

    def one(self, v, n, dtype, rate, tables):
        tmpcsv = os.path.join(self.scratch, f"{v}-{n}.csv")
        if os.path.exists(tmpcsv):
            os.remove(tmpcsv)
        import io
        log = io.StringIO()
        try:
            rc = self.run_variant(v, n, dtype, tmpcsv, log)
            note = "" if rc == 0 else f"exit {rc}{' (timeout)' if rc == 124 else ''}"
        except RunFailed as e:
            rc, note = 1, str(e)
        text = log.getvalue()
        tables.write(f"== {v} N={n} link={linkbound.rate_name(rate)} dtype={dtype}\n{text}"
                     + (f"# {note}\n" if note else "") + "\n")
        tables.flush()
        rows = []
        # INA's block as the job cut it (ina-bench's config line, rank 0): the payload per frame
        # that its bound counts (linkbound.ina_framing).
        m = re.search(r"^# ranks \d+, .*, block (\d+) elems", text, re.M)
        block_bytes = 4 * int(m.group(1)) if m and v.startswith("ina") else ""
        if os.path.exists(tmpcsv):
            with open(tmpcsv, newline="") as f:
                for r in csv.DictReader(f):
                    rows.append({"variant": v, "coll": self.a.coll, "loss_pct": 0,
                                 "link_rate": rate, "block_bytes": block_bytes,
                                 **{k: r[k] for k in ("ranks", "bytes", "count", "dtype", "op",
                                                      "time_us", "algbw", "busbw", "wrong")}})
            os.remove(tmpcsv)
        if rc != 0 and not note:
            note = "failed"
        if rc != 0:
            last = [l for l in text.strip().splitlines() if l.strip()][-1:] or [""]
            note = f"{note}: {last[0][:160]}"
        return ("ok" if rc == 0 else "failed"), rows, note
