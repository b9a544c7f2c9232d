"""A vanished peer is an error naming it, within libina's deadline, never a hang: 3 forked ranks
on the "ina" backend (host mesh), rank 2 exits abruptly after one all_reduce, and the next
all_reduce of ranks 0 and 1 must raise a RuntimeError that names rank 2 within INA_TIMEOUT_MS."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WORLD = 3
TIMEOUT_MS = 3000


def rank_main(rank, world):
    import torch
    import torch.distributed as dist
    import ina_torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group(backend="ina")
    x = torch.ones(1000)
    dist.all_reduce(x)
    assert torch.all(x == world), x
    if rank == world - 1:
        os._exit(0)  # vanishes without a word
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
    except RuntimeError as e:
        took = time.monotonic() - t0
        msg = str(e)
        assert f"rank {world - 1}" in msg, f"the error does not name rank {world - 1}: {msg}"
        assert took < TIMEOUT_MS / 1000 * 3, f"the error took {took:.1f} s"
        print(f"rank {rank}: error after {took:.2f} s: {msg.splitlines()[0]}", flush=True)
        time.sleep(1.0)  # let the other survivor see rank 2's loss first, not this rank's exit
        os._exit(0)  # the group is broken: skip its teardown
    raise AssertionError("all_reduce succeeded without rank 2")


def main():
    common.import_or_skip()
    ok = common.run_ranks(WORLD, rank_main, env={"INA_TIMEOUT_MS": str(TIMEOUT_MS)}, timeout=60)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
