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
import json
import os
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
