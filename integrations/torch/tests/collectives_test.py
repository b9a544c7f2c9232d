"""Every collective of the "ina" backend against gloo on the same inputs, in 2 or 3 forked ranks.

    collectives_test.py --world-size 3 [--aggregator]   (suite `torch`; exits 77 without torch)

Each rank initializes the default group with backend "ina" and a gloo group over the same ranks,
feeds both the same deterministic inputs and compares. Reductions through the aggregator are
fixed-point (per block: the ranks' largest exponent, int32 words), so float results are compared
within a bound proportional to the block's magnitude; int32 and the data-moving collectives must
be exact. Also: AVG, non-contiguous tensors, asynchronous work objects in flight together, the
errors for an unsupported op and dtype (after which the group still works), and libina's counters
(in-network packets with --aggregator, host collectives without).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16", "int32"]


def inputs(torch, dtype, rank, n, salt):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
    return (torch.randn(n, generator=g) * 10).to(dtype)


def assert_close(torch, got, want, world, what):
    if want.dtype == torch.int32 or not want.is_floating_point():
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"{what}: differs from gloo at {bad}")
        return
    eps = {torch.float32: 2.0 ** -20, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}[want.dtype]
    g = got.float()
    w = want.float()
    scale = max(float(w.abs().max()), 1e-30)
    err = float((g - w).abs().max())
    bound = eps * scale * world
    if not err <= bound:
        raise AssertionError(f"{what}: max |ina - gloo| = {err} > {bound}")


def gloo_all_reduce(torch, dist, t, group, op=None):
    """gloo's all_reduce in place; bfloat16 (which gloo 1.13 cannot reduce) through float32."""
    op = dist.ReduceOp.SUM if op is None else op
    if t.dtype == torch.bfloat16:
        f = t.float()
        dist.all_reduce(f, op=op, group=group)
        t.copy_(f.to(torch.bfloat16))
    else:
        dist.all_reduce(t, op=op, group=group)


def gv(torch, t):
    """A bfloat16 tensor as bytes (same bits, shared storage): gloo 1.13 cannot move bfloat16."""
    return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t


def rank_main(rank, world, aggregator):
    import torch
    import torch.distributed as dist
    import ina_torch

    torch.set_num_threads(1)
    dist.init_process_group(backend="ina")
    assert dist.get_backend() == "ina", dist.get_backend()
    gloo = dist.new_group(backend="gloo")
    n = 1000 + 7  # several aggregator blocks and a partial one
    checks = 0

    for salt, name in enumerate(DTYPES):
        dt = getattr(torch, name)
        x = inputs(torch, dt, rank, n, salt)
        ops = [("SUM", dist.ReduceOp.SUM), ("MIN", dist.ReduceOp.MIN), ("MAX", dist.ReduceOp.MAX)]
        for opname, op in ops:
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op)
            gloo_all_reduce(torch, dist, b, gloo, op)
            assert_close(torch, a, b, world, f"all_reduce {name} {opname}")
            checks += 1
        if dt != torch.int32:
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=dist.ReduceOp.AVG)
            gloo_all_reduce(torch, dist, b, gloo)  # gloo has no AVG: SUM / world
            assert_close(torch, a, b / world, world, f"all_reduce {name} AVG")
            checks += 1

        # broadcast from the last rank: exact
        a, b = x.clone(), x.clone()
        dist.broadcast(a, src=world - 1)
        dist.broadcast(gv(torch, b), src=world - 1, group=gloo)
        assert torch.equal(a, b), f"broadcast {name}"
        # all_gather (list) and the flat form
        la = [torch.empty_like(x) for _ in range(world)]
        lb = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(la, x)
        dist.all_gather([gv(torch, t) for t in lb], gv(torch, x), group=gloo)
        assert all(torch.equal(p, q) for p, q in zip(la, lb)), f"all_gather {name}"
        flat = torch.empty(world * n, dtype=dt)
        (getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base)(flat, x)
        assert torch.equal(flat, torch.cat(lb)), f"_all_gather_base {name}"
        checks += 3

        # reduce_scatter (gloo 1.13 has none: its all_reduce, then this rank's chunk)
        chunks = [inputs(torch, dt, rank, n, 50 + salt + 7 * r) for r in range(world)]
        ref = torch.cat(chunks)
        gloo_all_reduce(torch, dist, ref, gloo)
        ref = ref.narrow(0, rank * n, n)
        out = torch.empty(n, dtype=dt)
        dist.reduce_scatter(out, chunks)
        assert_close(torch, out, ref, world, f"reduce_scatter {name}")
        out2 = torch.empty(n, dtype=dt)
        (getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base)(out2, torch.cat(chunks))
        assert_close(torch, out2, ref, world, f"_reduce_scatter_base {name}")
        if dt != torch.int32:
            out3 = torch.empty(n, dtype=dt)
            dist.reduce_scatter(out3, chunks, op=dist.ReduceOp.AVG)
            assert_close(torch, out3, ref / world, world, f"reduce_scatter {name} AVG")
        checks += 2

        # all_to_all_single: equal parts and uneven split sizes (with a zero), rows of 3
        rows = 4 * world
        s = inputs(torch, dt, rank, rows * 3, 90 + salt).view(rows, 3)
        a, b = torch.empty_like(s), torch.empty_like(s)
        dist.all_to_all_single(a, s)
        dist.all_to_all_single(gv(torch, b), gv(torch, s), group=gloo)
        assert torch.equal(a, b), f"all_to_all_single equal {name}"
        # rank r sends (r + j) % (world + 1) rows to rank j
        in_splits = [(rank + j) % (world + 1) for j in range(world)]
        out_splits = [(j + rank) % (world + 1) for j in range(world)]
        s2 = inputs(torch, dt, rank, sum(in_splits) * 3, 95 + salt).view(-1, 3)
        a = torch.empty(sum(out_splits), 3, dtype=dt)
        b = torch.empty_like(a)
        dist.all_to_all_single(a, s2, out_splits, in_splits)
        dist.all_to_all_single(gv(torch, b), gv(torch, s2), out_splits, in_splits, group=gloo)
        assert torch.equal(a, b), f"all_to_all_single splits {name}"
        # all_to_all (lists, uneven sizes); reference: the same exchange through gloo's single form
        send = [inputs(torch, dt, rank, rank + j + 1, 99 + salt) for j in range(world)]
        recv = [torch.empty(j + rank + 1, dtype=dt) for j in range(world)]
        dist.all_to_all(recv, send)
        ref = torch.empty(sum(t.numel() for t in recv), dtype=dt)
        dist.all_to_all_single(gv(torch, ref.view(-1, 1)), gv(torch, torch.cat(send).view(-1, 1)), [t.numel() for t in recv],
                               [t.numel() for t in send], group=gloo)
        assert torch.equal(torch.cat(recv), ref), f"all_to_all {name}"
        checks += 3

    # int64 and float64 move (DDP exchanges int64 metadata); they cannot be reduced
    for dt in (torch.int64, torch.float64):
        x = torch.arange(10, dtype=dt) * (rank + 1)
        la = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(la, x)
        assert all(torch.equal(la[r], torch.arange(10, dtype=dt) * (r + 1)) for r in range(world))
        y = x.clone()
        dist.broadcast(y, src=0)
        assert torch.equal(y, torch.arange(10, dtype=dt))
        checks += 2

    # a non-contiguous tensor (a transposed view) is reduced in place
    m = inputs(torch, torch.float32, rank, 12, 7).view(3, 4)
    a, b = m.t(), m.clone().t()
    assert not a.is_contiguous()
    dist.all_reduce(a)
    gloo_all_reduce(torch, dist, b, gloo)
    assert_close(torch, a.contiguous(), b.contiguous(), world, "all_reduce non-contiguous")
    assert_close(torch, m.t().contiguous(), b.contiguous(), world, "all_reduce wrote the view")
    checks += 1

    # asynchronous work objects: several in flight, completed in order, futures carry the output
    xs = [inputs(torch, torch.float32, rank, 5000, 200 + i) for i in range(6)]
    refs = [t.clone() for t in xs]
    works = [dist.all_reduce(t, async_op=True) for t in xs]
    fut = works[-1].get_future()
    for w in works:
        w.wait()
        assert w.is_completed()
    for r in refs:
        gloo_all_reduce(torch, dist, r, gloo)
    for t, r in zip(xs, refs):
        assert_close(torch, t, r, world, "async all_reduce")
    assert_close(torch, fut.value()[0], refs[-1], world, "future value")
    checks += 1

    dist.barrier()

    # clear errors, raised at the call; the group keeps working afterwards
    def expect_error(fn, words):
        try:
            fn()
        except RuntimeError as e:
            msg = str(e)
            assert all(w in msg for w in words), f"error {msg!r} lacks {words}"
            return
        raise AssertionError(f"no error for {words}")

    expect_error(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.PRODUCT),
                 ["ProcessGroupINA allreduce", "ReduceOp.PRODUCT is not supported", "SUM, MIN, MAX or AVG"])
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.float64)),
                 ["ProcessGroupINA allreduce", "dtype Double is not supported", "float32, float16, bfloat16 or int32"])
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG),
                 ["ReduceOp.AVG needs a floating-point tensor"])
    expect_error(lambda: dist.reduce_scatter(torch.empty(2, dtype=torch.int64),
                                             [torch.ones(2, dtype=torch.int64)] * world),
                 ["ProcessGroupINA reduce_scatter", "dtype Long is not supported"])
    y = torch.full((3,), float(rank + 1))
    dist.all_reduce(y)
    assert torch.allclose(y, torch.full((3,), world * (world + 1) / 2.0)), y
    checks += 5

    st = ina_torch.stats()
    if aggregator:
        assert st["in_network"] and st["packets_sent"] > 0, st
    else:
        assert not st["in_network"] and st["packets_sent"] == 0 and st["host_collectives"] > 0, st
    print(f"rank {rank}: {checks} checks passed; libina counters {st}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--world-size", type=int, default=3)
    ap.add_argument("--aggregator", action="store_true",
                    help="AllReduce in-network through a local ina-aggregator")
    args = ap.parse_args()
    common.import_or_skip()
    from ina_torch.launch import Aggregator, find_aggregator

    env = {"INA_TIMEOUT_MS": "30000"}
    if not args.aggregator:
        ok = common.run_ranks(args.world_size, rank_main, (False,), env=env)
    else:
        binary = find_aggregator()
        if binary is None:
            print("FAIL: ina-aggregator not found (INA_AGGREGATOR_BIN)")
            return 1
        with Aggregator(binary, args.world_size) as agg:
            env["INA_AGGREGATOR"] = agg.address
            ok = common.run_ranks(args.world_size, rank_main, (True,), env=env)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
