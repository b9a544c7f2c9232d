#!/usr/bin/python3
"""Data-parallel training (DistributedDataParallel) on scikit-learn's digits with the "ina"
backend and with gloo, side by side, in one command.

    PYTHONPATH=build/integrations/torch /usr/bin/python3 \\
        integrations/torch/examples/ddp_digits.py --world-size 2 --epochs 10

For each backend it forks --world-size ranks with the launcher's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); for "ina" it first starts a local ina-aggregator and sets
INA_AGGREGATOR, so DDP's gradient AllReduce runs in-network. Both runs see the same data, the
same initial weights and the same shuffling; it prints each epoch's test accuracy and training
time for both, and with --tolerance exits 1 when the final accuracies differ by more than that.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time


def load_digits_split(seed=0, test_fraction=0.2):
    """Standardized digits (1797 8x8 images, 10 classes), a fixed train/test split."""
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    x = d.data.astype("float32")
    y = d.target.astype("int64")
    order = np.random.RandomState(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(0), x[train].std(0) + 1e-3
    x = (x - mean) / std
    return x[train], y[train], x[test], y[test]


def rank_main(rank, world, backend, args, env, results):
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world)})
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    if backend == "ina":
        import ina_torch  # noqa: F401  registers the backend

    torch.set_num_threads(1)
    dist.init_process_group(backend=backend)
    xtr, ytr, xte, yte = load_digits_split()
    xtr, ytr = torch.from_numpy(xtr), torch.from_numpy(ytr)
    xte, yte = torch.from_numpy(xte), torch.from_numpy(yte)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    epochs = []
    for epoch in range(args.epochs):
        # The same global permutation on every rank; rank r takes every world-th sample.
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(epoch))
        mine = perm[rank::world]
        steps = len(mine) // args.batch
        dist.barrier()
        t0 = time.perf_counter()
        ddp.train()
        for s in range(steps):
            idx = mine[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = loss_fn(ddp(xtr[idx]), ytr[idx])
            loss.backward()  # DDP all-reduces (averages) the gradients here
            opt.step()
        dist.barrier()
        elapsed = time.perf_counter() - t0
        with torch.no_grad():
            acc = float((model(xte).argmax(1) == yte).float().mean())
        epochs.append((acc, elapsed, float(loss)))
    if rank == 0:
        extra = {}
        if backend == "ina":
            import ina_torch
            extra = ina_torch.stats()
        results.put((backend, epochs, extra))
    dist.destroy_process_group()


def run_backend(backend, args):
    """Runs one training job of --world-size forked ranks; returns (per-epoch list, stats)."""
    try:
        from ina_torch.launch import Aggregator, find_aggregator, free_port
    except ImportError as e:
        raise SystemExit(f"cannot import ina_torch ({e}): build with meson (-Dtorch=enabled) and "
                         "set PYTHONPATH=<build>/integrations/torch")
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    agg = None
    if backend == "ina" and not args.host_only:
        binary = find_aggregator(args.aggregator_bin)
        if binary is None:
            raise SystemExit("ina-aggregator not found: pass --aggregator-bin, set "
                             "INA_AGGREGATOR_BIN, or use --host-only")
        agg = Aggregator(binary, args.world_size)
        env["INA_AGGREGATOR"] = agg.address
    try:
        procs = [ctx.Process(target=rank_main, args=(r, args.world_size, backend, args, env, results))
                 for r in range(args.world_size)]
        for p in procs:
            p.start()
        out = results.get(timeout=args.timeout)
        for p in procs:
            p.join(args.timeout)
        codes = [p.exitcode for p in procs]
        if any(c != 0 for c in codes):
            raise SystemExit(f"{backend}: ranks exited with {codes}")
        return out[1], out[2]
    finally:
        if agg is not None:
            agg.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default="ina,gloo", help="comma-separated, run in this order")
    ap.add_argument("--aggregator-bin", help="ina-aggregator (default: INA_AGGREGATOR_BIN, PATH, "
                    "or the build tree)")
    ap.add_argument("--host-only", action="store_true",
                    help="ina without an aggregator: every collective on libina's host mesh")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="exit 1 when the final test accuracies differ by more than this")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per backend run")
    args = ap.parse_args()

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    runs = {}
    for b in backends:
        runs[b] = run_backend(b, args)

    header = "epoch" + "".join(f" | {b + ' acc':>9} {b + ' s/epoch':>13}" for b in backends)
    print(header)
    print("-" * len(header))
    for e in range(args.epochs):
        row = f"{e + 1:5d}"
        for b in backends:
            acc, secs, _ = runs[b][0][e]
            row += f" | {acc:9.4f} {secs:13.4f}"
        print(row)
    for b in backends:
        times = [t for _, t, _ in runs[b][0]]
        mean_t = sum(times[1:]) / max(1, len(times) - 1) if len(times) > 1 else times[0]
        note = f"  libina: {runs[b][1]}" if runs[b][1] else ""
        print(f"{b}: final accuracy {runs[b][0][-1][0]:.4f}, mean time per epoch "
              f"{mean_t:.4f} s (epochs 2..{args.epochs}){note}")
    if args.tolerance is not None and len(backends) >= 2:
        accs = [runs[b][0][-1][0] for b in backends]
        spread = max(accs) - min(accs)
        ok = spread <= args.tolerance and min(accs) > 0.5
        print(f"final accuracy spread {spread:.4f} (tolerance {args.tolerance}): "
              f"{'OK' if ok else 'FAIL'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
