"""DDP across network namespaces, as torchrun runs a job on 4 hosts: each rank in a namespace of
its own (veth to a bridge, 10.79.0.10 .. 13), given only the launcher's variables (RANK,
WORLD_SIZE, MASTER_ADDR = rank 0's address, MASTER_PORT) and, for the "ina" backend,
INA_AGGREGATOR (an ina-aggregator in rank 0's namespace). No INA_MESH_ADDR: libina finds each
rank's mesh address from the route to MASTER_ADDR. Then the same training with gloo (which needs
GLOO_SOCKET_IFNAME=eth0 here: its default resolves the host name). Prints both backends' per-epoch
loss and accuracy and libina's counters (in-network: no fallback, no host AllReduce).
Root only (exits 77 otherwise).

    testbed/run.py ddp              # PYTHONPATH and --aggregator-bin from the build directory
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORLD = 4


def rank_mode(args):
    sys.path.insert(0, os.path.join(ROOT, "integrations", "torch", "examples"))
    import ddp_digits

    class Out:
        def put(self, item):
            backend, epochs, extra = item
            print("RESULT " + json.dumps({"backend": backend, "epochs": epochs,
                                          "stats": {k: v for k, v in extra.items()}}), flush=True)

    rank = int(os.environ["RANK"])
    ddp_digits.rank_main(rank, WORLD, args.backend, args, {}, Out())


def sh(*cmd):
    subprocess.run(cmd, check=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aggregator-bin", default=os.path.join(ROOT, "build", "aggregator",
                                                             "ina-aggregator"))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    if args.backend:
        return rank_mode(args)
    if os.geteuid() != 0:
        print("SKIP: needs root for network namespaces")
        return 77
    tag = f"inad{os.getpid()}"
    nss = [f"{tag}w{i}" for i in range(WORLD)]
    br = f"{tag}br"
    agg = None
    logdir = tempfile.mkdtemp(prefix=tag)
    try:
        sh("ip", "netns", "add", br)
        sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", br, "link", "set", "br0", "up")
        for i, ns in enumerate(nss):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", br, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", br, "link", "set", f"p{i}", "master", "br0")
            sh("ip", "-n", br, "link", "set", f"p{i}", "up")
            sh("ip", "-n", ns, "addr", "add", f"10.79.0.{10 + i}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        master = "10.79.0.10"
        agg = subprocess.Popen(["ip", "netns", "exec", nss[0], args.aggregator_bin, "--bind",
                                master, "--port", "47474", "--world-size", str(WORLD)],
                               stdout=open(os.path.join(logdir, "agg"), "w"),
                               stderr=subprocess.STDOUT)
        time.sleep(0.5)
        results = {}
        for backend, port in (("ina", 29510), ("gloo", 29511)):
            env_extra = {"RANK": None, "WORLD_SIZE": str(WORLD), "MASTER_ADDR": master,
                         "MASTER_PORT": str(port)}
            if backend == "ina":
                env_extra["INA_AGGREGATOR"] = f"{master}:47474"
            else:
                env_extra["GLOO_SOCKET_IFNAME"] = "eth0"
            procs = []
            t0 = time.time()
            for r, ns in enumerate(nss):
                env = {k: v for k, v in os.environ.items()
                       if not k.startswith("INA_") or k == "INA_LOG_LEVEL"}
                env.update({k: v for k, v in env_extra.items() if v is not None})
                env["RANK"] = str(r)
                cmd = ["ip", "netns", "exec", ns, sys.executable, "-c",
                       f"import sys; sys.path.insert(0, {HERE!r}); import ddp; "
                       "sys.exit(ddp.main(sys.argv[1:]))", "--backend", backend, "--epochs", str(args.epochs), "--batch",
                       str(args.batch), "--hidden", str(args.hidden), "--lr", str(args.lr),
                       "--seed", str(args.seed)]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=args.timeout) for p in procs]
            codes = [p.returncode for p in procs]
            if any(codes):
                for r, (o, e) in enumerate(outs):
                    print(f"--- {backend} rank {r} exit {codes[r]}\n{o[-2000:]}\n{e[-3000:]}")
                print(f"FAIL: {backend}: ranks exited with {codes}")
                return 1
            line = [l for l in outs[0][0].splitlines() if l.startswith("RESULT ")]
            results[backend] = json.loads(line[0][7:])
            results[backend]["wall_s"] = time.time() - t0
            warn = [l for o in outs for l in o[1].splitlines() if "warn" in l]
            results[backend]["warnings"] = warn
        print("epoch | ina loss   ina acc | gloo loss  gloo acc")
        for e in range(args.epochs):
            ia, _, il = results["ina"]["epochs"][e]
            ga, _, gl = results["gloo"]["epochs"][e]
            print(f"{e + 1:5d} | {il:8.5f}  {ia:7.4f} | {gl:8.5f}  {ga:7.4f}")
        for b in ("ina", "gloo"):
            print(f"{b}: wall {results[b]['wall_s']:.1f} s, warnings {len(results[b]['warnings'])}"
                  + (f", libina rank 0: {results[b]['stats']}" if results[b]["stats"] else ""))
        return 0
    finally:
        if agg is not None:
            agg.terminate()
            agg.wait()
        for ns in nss + [br]:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


# ---- step time on the shaped star ----

LAYERS = (784, 2048, 2048, 256)


def steps_rank(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    if args.backend == "ina":
        import ina_torch  # noqa: F401  registers the backend
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dist.init_process_group(backend=args.backend)
    rank = dist.get_rank()
    mods = []
    for i in range(len(LAYERS) - 1):
        mods.append(nn.Linear(LAYERS[i], LAYERS[i + 1]))
        if i < len(LAYERS) - 2:
            mods.append(nn.ReLU())
    model = DDP(nn.Sequential(*mods))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(args.seed + rank)
    batch = int(args.batch)  # one size here (the launcher's --batch lists several)
    x = torch.randn(batch, LAYERS[0], generator=g)
    y = torch.randint(0, LAYERS[-1], (batch,), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    loss = None
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    # Every rank's final loss, so that the two backends' training can be compared.
    t = torch.tensor([float(loss)])
    dist.all_reduce(t)
    if rank == 0:
        steps = times[args.warmup:]
        stats = {}
        if args.backend == "ina":
            import ina_torch
            stats = ina_torch.stats()
        print("RESULT " + json.dumps({"median_s": statistics.median(steps), "min_s": min(steps),
                                      "params": params, "loss_sum": float(t[0]),
                                      "stats": stats}), flush=True)
    dist.destroy_process_group()
    return 0


def one_run(topo, backend, world, batch, args, port):
    workers = topo.workers()[:world]
    agg = topo.aggregators()[0]
    agg_proc = None
    if backend == "ina":
        agg_proc = topo.popen(agg, [args.aggregator_bin, "--bind", agg.ip, "--port", "47474",
                                    "--world-size", str(world), "--stats-interval-ms", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
    procs = []
    for r, w in enumerate(workers):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("INA_") or k == "INA_LOG_LEVEL"}
        env.update(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR=workers[0].ip,
                   MASTER_PORT=str(port))
        if backend == "ina":
            env["INA_AGGREGATOR"] = f"{agg.ip}:47474"
        else:
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import ddp;"
               " sys.exit(ddp.steps(sys.argv[1:]))", "--backend", backend, "--batch",
               str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed",
               str(args.seed)]
        procs.append(topo.popen(w, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True))
    try:
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    finally:
        if agg_proc is not None and agg_proc.poll() is None:
            agg_proc.terminate()
            agg_proc.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        for r, (o, e) in enumerate(outs):
            print(f"--- {backend} rank {r} exit {codes[r]}\n{o[-1500:]}\n{e[-2500:]}", flush=True)
        raise RuntimeError(f"{backend}: ranks exited with {codes}")
    line = [l for l in outs[0][0].splitlines() if l.startswith("RESULT ")]
    res = json.loads(line[0][7:])
    res["warnings"] = sum(1 for _, e in outs for l in e.splitlines() if "warn" in l.lower())
    return res


def steps(argv=None):
    """What a trainer sees: DDP step time with the ina backend against gloo on the shaped star.

Every rank in a network namespace of its own on a star (topo.py: worker links shaped with tbf at
both ends, the aggregator's link unshaped, as a switch), given only the launcher's variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and INA_AGGREGATOR for the ina backend. The model
is an MLP of 784 -> 2048 -> 2048 -> 256 (6,328,576 float32 parameters: 25.3 MB of gradients per
step, DDP's default 25 MB buckets), trained with SGD on a fixed random batch, one thread per
rank. Per world size and batch the backends alternate (ina, gloo, ina, gloo, ...), each run a
fresh job (and, for ina, a fresh ina-aggregator); rank 0 reports the median step time over the
steps after the warm-up and the final loss, which must agree between backends to within the
in-network float SUM's rounding. Root only (exits 77 otherwise).

    testbed/run.py ddp-steps [-- --world 4,8 --batch 2,32 --link-rate 1gbit --rounds 2]

Prints a table (world, batch, round, backend, median step in s, loss) and gloo/ina per pair, and
writes results.csv to --out when given.
    """
    ap = argparse.ArgumentParser(description=steps.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aggregator-bin", default=os.path.join(ROOT, "build", "aggregator",
                                                             "ina-aggregator"))
    ap.add_argument("--world", default="4,8", help="world sizes, comma-separated")
    ap.add_argument("--batch", default="2,32", help="batch sizes per rank, comma-separated")
    ap.add_argument("--link-rate", default="1gbit", help="worker links (tbf), e.g. 1gbit")
    ap.add_argument("--rounds", type=int, default=2, help="alternated pairs per point")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", help="directory for results.csv")
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.backend:
        return steps_rank(args)
    if os.geteuid() != 0:
        print("SKIP: needs root for network namespaces")
        return 77
    sys.path.insert(0, HERE)
    import linkbound
    import topo as topo_mod
    worlds = [int(w) for w in args.world.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    rate = linkbound.parse_rate(args.link_rate)
    if not os.access(args.aggregator_bin, os.X_OK):
        print(f"ddp_steps: {args.aggregator_bin} is not built")
        return 2
    rows = []
    port = 29600
    topo = topo_mod.Topology(max(worlds), 1, link_rate=rate, prefix="inaddp")
    topo_mod.install_signal_teardown(topo)
    with topo:
        print(topo.describe(), flush=True)
        print("| world | batch | round | backend | median step (s) | min step (s) | loss sum |")
        print("|---|---|---|---|---|---|---|", flush=True)
        for world in worlds:
            for batch in batches:
                for rnd in range(args.rounds):
                    for backend in ("ina", "gloo"):
                        port += 1
                        r = one_run(topo, backend, world, batch, args, port)
                        rows.append(dict(world=world, batch=batch, round=rnd, backend=backend,
                                         median_s=r["median_s"], min_s=r["min_s"],
                                         loss_sum=r["loss_sum"], params=r["params"],
                                         warnings=r["warnings"], stats=json.dumps(r["stats"])))
                        print(f"| {world} | {batch} | {rnd} | {backend} | {r['median_s']:.4f} |"
                              f" {r['min_s']:.4f} | {r['loss_sum']:.6f} |", flush=True)
                        if r["stats"]:
                            print(f"<!-- libina rank 0: {r['stats']} -->", flush=True)
    print("\n| world | batch | gloo / ina step time per pair | loss sums (ina, gloo) |")
    print("|---|---|---|---|")
    for world in worlds:
        for batch in batches:
            pts = [r for r in rows if r["world"] == world and r["batch"] == batch]
            ina = [r for r in pts if r["backend"] == "ina"]
            gloo = [r for r in pts if r["backend"] == "gloo"]
            ratios = ", ".join(f"{g['median_s'] / i['median_s']:.2f}" for i, g in zip(ina, gloo))
            print(f"| {world} | {batch} | {ratios} | {ina[-1]['loss_sum']:.6f},"
                  f" {gloo[-1]['loss_sum']:.6f} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0

