"""A mixture-of-experts layer's communication as a trainer issues it, through torch.distributed:
per step, every rank routes its tokens to the experts (one expert per rank) with Zipf(S)
popularity, exchanges the per-expert counts (all_to_all_single of N int64), dispatches the tokens
(all_to_all_single with uneven input and output splits), and combines them back (the reverse
splits). Times the step (the three calls) per backend, the backends alternated round by round.

    testbed/run.py moe [-- -N 4 --tokens 4096 --hidden 1024 --steps 30 --rounds 3]

The ina backend runs every collective on libina's host TCP mesh (no aggregator set); gloo is
PyTorch's own. Prints the median step time per backend and round, and the ratio ina/gloo; every
step's combine output is checked against the tokens sent (exact: rows come back unchanged).
"""
import argparse
import os
import socket
import statistics
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, a, backend, q):
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    import torch
    import torch.distributed as dist
    if backend == "ina":
        import ina_torch  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group(backend=backend)
    pop = torch.tensor([(j + 1) ** -a.zipf for j in range(world)], dtype=torch.float64)
    times = []
    bad = 0
    for step in range(a.warmup + a.steps):
        g = torch.Generator().manual_seed(step * 1000 + rank)
        expert = torch.multinomial(pop, a.tokens, replacement=True, generator=g)
        order = torch.argsort(expert, stable=True)
        tokens = torch.randn(a.tokens, a.hidden, generator=g)[order]  # grouped by expert
        in_splits = torch.bincount(expert, minlength=world)
        t0 = time.perf_counter()
        out_splits = torch.empty_like(in_splits)
        dist.all_to_all_single(out_splits, in_splits)
        recv = torch.empty(int(out_splits.sum()), a.hidden)
        dist.all_to_all_single(recv, tokens, out_splits.tolist(), in_splits.tolist())
        back = torch.empty_like(tokens)
        dist.all_to_all_single(back, recv, in_splits.tolist(), out_splits.tolist())
        t1 = time.perf_counter()
        if step >= a.warmup:
            times.append((t1 - t0) * 1e6)
        bad += int(not torch.equal(back, tokens))
    t = torch.tensor([statistics.median(times), float(bad)], dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        q.put((t[0].item(), int(t[1].item())))
    dist.destroy_process_group()


def run(world, a, backend):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, a, backend, q))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.is_alive():
            p.kill()
            p.join()
    if any(p.exitcode != 0 for p in procs):
        return None, None
    return q.get(timeout=5)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-N", type=int, default=4)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank per step")
    p.add_argument("--hidden", type=int, default=1024, help="float32 elements per token")
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="ina,gloo")
    a = p.parse_args(argv)
    backends = a.backends.split(",")
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"# MoE step (counts, dispatch, combine) at {a.N} ranks, {a.tokens} tokens x "
          f"{a.hidden} float32 per rank, Zipf({a.zipf}) experts; load {load}")
    med = {b: [] for b in backends}
    failed = 0
    for r in range(a.rounds):
        for b in backends:
            t, bad = run(a.N, a, b)
            if t is None or bad:
                failed += 1
                print(f"round {r} {b}: FAILED ({'ranks failed' if t is None else f'{bad} wrong'})")
                continue
            med[b].append(t)
            print(f"round {r} {b}: median step {t:.0f} us", flush=True)
    for b in backends:
        if med[b]:
            print(f"{b}: median over rounds {statistics.median(med[b]):.0f} us")
    if len(backends) == 2 and all(med[b] for b in backends):
        x, y = backends
        print(f"{x}/{y}: {statistics.median(med[x]) / statistics.median(med[y]):.2f}")
    return 1 if failed else 0
