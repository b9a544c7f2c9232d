"""The "ina" backend keeps working when its aggregator dies: 2 forked ranks all-reduce in-network,
the aggregator is killed (SIGKILL) between two phases, and the following all_reduce calls complete
through libina's host fallback with the same results as gloo on the same inputs."""
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WORLD = 2


def rank_main(rank, world, phase_barrier):
    import torch
    import torch.distributed as dist
    import ina_torch

    torch.set_num_threads(1)
    dist.init_process_group(backend="ina")
    gloo = dist.new_group(backend="gloo")

    def check(step):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(3000, generator=g)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        err = float((a - b).abs().max())
        bound = 2.0 ** -20 * float(b.abs().max()) * world
        assert err <= bound, f"step {step}: max |ina - gloo| = {err} > {bound}"

    for step in range(3):
        check(step)
    before = ina_torch.stats()
    assert before["in_network"] and before["fallbacks"] == 0, before
    phase_barrier.wait(60)  # the parent kills the aggregator
    phase_barrier.wait(60)
    for step in range(3, 8):
        check(step)
    after = ina_torch.stats()
    assert not after["in_network"] and after["fallbacks"] >= 1, after
    print(f"rank {rank}: in-network {before['packets_sent']} packets, then host fallback: {after}",
          flush=True)
    dist.destroy_process_group()


def main():
    common.import_or_skip()
    from ina_torch.launch import Aggregator, find_aggregator
    binary = find_aggregator()
    if binary is None:
        print("FAIL: ina-aggregator not found (INA_AGGREGATOR_BIN)")
        return 1
    barrier = mp.get_context("fork").Barrier(WORLD + 1)
    with Aggregator(binary, WORLD) as agg:
        env = {"INA_AGGREGATOR": agg.address, "INA_TIMEOUT_MS": "3000"}
        import threading

        def killer():
            barrier.wait(120)
            agg.proc.kill()
            agg.proc.wait()
            barrier.wait(60)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        ok = common.run_ranks(WORLD, rank_main, (barrier,), env=env, timeout=120)
        t.join(1)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
