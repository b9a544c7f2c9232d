"""Straggler location: does the aggregator name the injected straggler, and
its cause?

A star of network namespaces (topo.py: N worker hosts and one aggregator host on one
bridge). Each trial starts a fresh ina-aggregator (--http-port), runs ina-bench on every worker
(external mode) with one straggler injected into one rank chosen at random, reads the
aggregator's /v1/telemetry and scores the first entry of the job's "stragglers" list (the
lost-time ranking): its rank, whether it is named a straggler, and its cause. Kinds, one per
trial, in a shuffled balanced order:

  start  intermittent compute delay: INA_TEST_STRAGGLE=PCT:US, US uniform in [--delay-min-us,
         --delay-max-us] per trial (expected cause "start")
  link   the rank's uplink (its eth0 egress) shaped with tc tbf to half the others' rate
         (every worker uplink gets --rate-mbit, the straggler half of it; expected "link")
  loss   1% loss both ways on the rank's link: nftables `numgen random mod 100 < 1 drop` on
         its namespace's input and output (expected "loss")

With --hog N, N CPU-burning processes (one `python3 -c 'while 1: pass'` each, ended by PID at
the end) run beside the job for the whole run. Prints one line per trial and a table; --json
writes the trials. Needs root, ip, nft and tc (exit 77 with the reason otherwise).

  testbed/run.py stragglers [-- --trials 20 --kinds start,link,loss --ranks 8 --iters 1500
      --hog 1]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import topo as topo_mod  # noqa: E402

KINDS = ("start", "link", "loss")
HTTP_PORT = 47480
DATA_PORT = 47474


def fetch_telemetry(topo, agg, timeout=5.0):
    """The aggregator's /v1/telemetry, read from inside its namespace."""
    code = ("import sys,urllib.request;"
            f"sys.stdout.write(urllib.request.urlopen('http://{agg.ip}:{HTTP_PORT}/v1/telemetry',"
            f"timeout={timeout}).read().decode())")
    r = topo.run(agg, [sys.executable, "-c", code], capture_output=True, text=True,
                 timeout=timeout + 5)
    if r.returncode != 0:
        raise RuntimeError(f"telemetry read failed: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def shape(topo, host, mbit, burst="64kb"):
    """tbf on host's eth0 egress (its uplink); mbit <= 0 removes it."""
    topo.run(host, ["tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True)
    if mbit <= 0:
        return
    # burst: a few packets; latency bounds the queue (a deeper queue only delays more).
    r = topo.run(host, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                        f"{mbit}mbit", "burst", burst, "latency", "50ms"],
                 capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tc tbf on {host.name}: {r.stderr.strip()}")


def set_loss_percent(topo, host, percent):
    """nftables `numgen random mod 100 < percent drop`, both ways, in host's namespace."""
    topo.run(host, ["nft", "delete", "table", "inet", "inatb_straggle"], capture_output=True)
    if percent <= 0:
        return
    rules = "".join(
        f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept; "
        f"numgen random mod 100 < {percent} counter drop; }}\n" for hook in ("input", "output"))
    r = topo.run(host, ["nft", "-f", "-"], input=f"table inet inatb_straggle {{\n{rules}}}\n",
                 capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nft on {host.name}: {r.stderr.strip()}")


def parse_size(text):
    """'64K' -> 65536 (K, M, G: powers of 1024)."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)


def run_trial(topo, args, kind, victim, rng):
    build = os.path.abspath(args.build_dir)
    agg_bin = os.path.join(build, "aggregator", "ina-aggregator")
    bench = os.path.join(build, "testbed", "ina-bench")
    agg = topo.aggregators()[0]
    workers = topo.workers()
    delay_us = 0
    for w in workers:
        shape(topo, w, 0)
        set_loss_percent(topo, w, 0)
    if kind == "link":
        for w in workers:
            if w.index == victim:
                shape(topo, w, args.rate_mbit / 2, args.burst)
            elif args.shape_all:
                shape(topo, w, args.rate_mbit, args.burst)
    elif kind == "loss":
        set_loss_percent(topo, workers[victim], 1)
    elif kind == "start":
        delay_us = rng.randint(args.delay_min_us, args.delay_max_us)
    agg_proc = topo.popen(agg, [agg_bin, "--bind", agg.ip, "--port", str(DATA_PORT),
                                "--world-size", str(args.ranks), "--slots", str(args.window),
                                "--http-port", str(HTTP_PORT),
                                "--stats-interval-ms", "0"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    procs = []
    t0 = time.time()
    for w in workers:
        env = dict(os.environ, INA_AGGREGATOR=f"{agg.ip}:{DATA_PORT}", INA_RANK=str(w.index),
                   INA_WORLD_SIZE=str(args.ranks), INA_MESH_ADDR=w.ip, INA_LOG_LEVEL="error")
        if kind == "start" and w.index == victim:
            env["INA_TEST_STRAGGLE"] = f"{args.delay_percent}:{delay_us}"
        procs.append(topo.popen(w, [bench, "--workers", str(args.ranks), "-b", args.size,
                                    "-e", args.size, "-n", str(args.iters), "-w", "5",
                                    "--window", str(args.window)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=args.trial_timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs.append(124)
    wall = time.time() - t0
    tele = None
    err = ""
    try:
        tele = fetch_telemetry(topo, agg)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        err = str(e)
    agg_proc.send_signal(signal.SIGTERM)
    try:
        agg_proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        agg_proc.kill()
        agg_proc.wait()
    warn = "straggler" in (agg_proc.stderr.read() if agg_proc.stderr else "")
    res = {"kind": kind, "victim": victim, "delay_us": delay_us, "bench_rc": max(rcs),
           "wall_s": round(wall, 2), "warned": warn, "error": err}
    if tele:
        job = tele[0]
        s = job.get("stragglers", [])
        first = s[0] if s else {}
        res.update(first_rank=first.get("rank"), named=first.get("straggler", False),
                   cause=first.get("cause"), lost_ms=first.get("lost_ms"),
                   share=first.get("lost_share"), p=first.get("p"),
                   episodes=first.get("episodes"), by_cause=first.get("lost_ms_by_cause"),
                   rtx_added=first.get("retransmits_added"),
                   resent_completed=first.get("resent_completed"),
                   stragglers=s,
                   second_rank=s[1].get("rank") if len(s) > 1 else None,
                   second_named=s[1].get("straggler", False) if len(s) > 1 else False,
                   collectives=job.get("lost_window", {}).get("collectives"),
                   lag_first=(job.get("lag_ranking") or [None])[0])
    res["rank_ok"] = res.get("first_rank") == victim
    res["named_ok"] = res["rank_ok"] and bool(res.get("named"))
    res["cause_ok"] = res["rank_ok"] and res.get("cause") == kind
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--trials", type=int, default=20, help="trials per kind")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--size", default="64K", help="bytes per AllReduce")
    ap.add_argument("--iters", type=int, default=1500, help="collectives per trial")
    ap.add_argument("--window", type=int, default=128, help="slots (ina-bench --window)")
    ap.add_argument("--delay-percent", type=float, default=10)
    ap.add_argument("--delay-min-us", type=int, default=1000)
    ap.add_argument("--delay-max-us", type=int, default=5000)
    ap.add_argument("--rate-mbit", type=float, default=0,
                    help="kind link: the full rate; the straggler's uplink gets half of it "
                         "(0: calibrate: the rate one rank reaches in a trial without a fault)")
    ap.add_argument("--shape-all", action="store_true",
                    help="kind link: shape the other uplinks to --rate-mbit too (default: only "
                         "the straggler's, to half the rate the others reach)")
    ap.add_argument("--burst", default="16kb",
                    help="tbf burst (well below one collective, so the shaping paces packets)")
    ap.add_argument("--hog", type=int, default=0, help="CPU hogs beside the job")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--trial-timeout", type=float, default=120)
    ap.add_argument("--time-budget", type=float, default=0,
                    help="stop starting trials after this many seconds (0: none)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    ok, why = topo_mod.can_make_namespaces()
    if ok and shutil.which("tc") is None:
        ok, why = False, "'tc' is not installed (iproute2)"
    if not ok:
        print(f"SKIP: {why}")
        return 77
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"--kinds: {k!r} is not one of {', '.join(KINDS)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    schedule = [k for k in kinds for _ in range(args.trials)]
    rng.shuffle(schedule)
    t = topo_mod.Topology(args.ranks, 1)
    topo_mod.install_signal_teardown(t)
    hogs = []
    results = []
    start = time.time()
    print(f"# seed {seed}, {args.ranks} ranks, {args.size} x {args.iters}, window {args.window}, "
          f"hogs {args.hog}, kinds {','.join(kinds)} x {args.trials}", flush=True)
    with t:
        for _ in range(args.hog):
            p = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            hogs.append(p)
        try:
            if "link" in kinds and args.rate_mbit <= 0:
                # What one rank reaches without a fault: payload plus ~5% headers on the wire.
                r = run_trial(t, args, "none", -1, rng)
                size = parse_size(args.size)
                args.rate_mbit = round((args.iters + 5) * size * 8 * 1.05 / r["wall_s"] / 1e6, 1)
                print(f"# calibration: {r['wall_s']} s without a fault -> full rate "
                      f"{args.rate_mbit} Mbit/s, the slow link {args.rate_mbit / 2} Mbit/s",
                      flush=True)
            for i, kind in enumerate(schedule):
                if args.time_budget > 0 and time.time() - start > args.time_budget:
                    print(f"# time budget spent: {i} of {len(schedule)} trials run", flush=True)
                    break
                victim = rng.randrange(args.ranks)
                r = run_trial(t, args, kind, victim, rng)
                results.append(r)
                print(f"trial {i:3d} {kind:5s} victim {victim} -> first {r.get('first_rank')} "
                      f"named {r.get('named')} cause {r.get('cause')} lost {r.get('lost_ms')} ms "
                      f"p {r.get('p')} 2nd {r.get('second_rank')}/{r.get('second_named')} "
                      f"lag-first {r.get('lag_first')} rc {r['bench_rc']} {r['wall_s']} s"
                      + (f" ERR {r['error']}" if r['error'] else ""), flush=True)
        finally:
            for p in hogs:
                p.terminate()
                p.wait()
    print(f"\n{'kind':6s} {'trials':>6s} {'ranked 1st':>10s} {'named 1st':>9s} "
          f"{'cause ok':>8s} {'lag 1st':>7s}")
    for k in kinds:
        rs = [r for r in results if r["kind"] == k]
        print(f"{k:6s} {len(rs):6d} {sum(r['rank_ok'] for r in rs):10d} "
              f"{sum(r['named_ok'] for r in rs):9d} {sum(r['cause_ok'] for r in rs):8d} "
              f"{sum(r.get('lag_first') == r['victim'] for r in rs):7d}")
    print(f"# {time.time() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "args": vars(args), "trials": results}, f, indent=1)
    return 0
