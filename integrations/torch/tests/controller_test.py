"""The "ina" backend follows libina's rules for choosing the in-network path (2 forked ranks).

    controller_test.py   (suite `torch`; exits 77 without torch or ina-controller)

1. INA_CONTROLLER and no INA_AGGREGATOR (a local ina-controller and an ina-aggregator registered
   with it): the job is admitted (the controller counts the admission), all_reduce runs
   in-network (libina's counters: packets sent, in_network) and gives the exact int32 sum.
2. Neither INA_AGGREGATOR nor INA_CONTROLLER, INA_LOG_LEVEL=info: every collective runs on the
   host mesh, and libina says why in one info line on each rank's stderr.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tests"))
import controller_procs  # noqa: E402

WORLD = 2


def rank_main(rank, world, log_dir, expect_in_network):
    if log_dir:
        # libina logs to fd 2: keep this rank's lines for the parent to read.
        fd = os.open(os.path.join(log_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    import torch
    import torch.distributed as dist
    import ina_torch

    dist.init_process_group(backend="ina")
    x = torch.arange(1000, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(x)
    want = torch.arange(1000, dtype=torch.int32) * (world * (world + 1) // 2)
    assert torch.equal(x, want), "all_reduce int32 SUM differs from the exact sum"
    s = ina_torch.stats()
    if expect_in_network:
        assert s["in_network"], f"rank {rank}: not in-network: {s}"
        assert s["packets_sent"] > 0, f"rank {rank}: no packets sent to the aggregator: {s}"
    else:
        assert not s["in_network"] and s["packets_sent"] == 0, f"rank {rank}: {s}"
    dist.destroy_process_group()


def main():
    common.import_or_skip()
    ctl_bin = os.environ.get("INA_CONTROLLER_BIN", "")
    agg_bin = os.environ.get("INA_AGGREGATOR_BIN", "")
    if not (ctl_bin and os.access(ctl_bin, os.X_OK)):
        print("SKIP: ina-controller not built (meson -Dcontroller: cpp-httplib, nlohmann-json)")
        return common.SKIP
    for v in ("INA_AGGREGATOR", "INA_CONTROLLER", "INA_TRANSPORT", "INA_JOB_NAME", "INA_STORE"):
        os.environ.pop(v, None)
    tmp = tempfile.mkdtemp(prefix="ina-torch-ctl-")
    procs = []
    try:
        ctl_port = controller_procs.start_managed(ctl_bin, agg_bin, tmp, procs)
        before = controller_procs.admitted_total(ctl_port)
        if not common.run_ranks(WORLD, rank_main, args=("", True),
                                env={"INA_CONTROLLER": f"127.0.0.1:{ctl_port}"}):
            print("FAIL: ranks with INA_CONTROLLER and no INA_AGGREGATOR")
            return 1
        after = controller_procs.admitted_total(ctl_port)
        if after <= before:
            print(f"FAIL: the controller admitted nothing ({before} -> {after} admissions)")
            return 1
        print(f"INA_CONTROLLER only: admitted ({before} -> {after}), all_reduce in-network")

        logs = os.path.join(tmp, "logs")
        os.mkdir(logs)
        if not common.run_ranks(WORLD, rank_main, args=(logs, False),
                                env={"INA_LOG_LEVEL": "info"}):
            print("FAIL: ranks without INA_AGGREGATOR and INA_CONTROLLER")
            return 1
        for r in range(WORLD):
            with open(os.path.join(logs, f"rank{r}.log")) as f:
                text = f.read()
            lines = [l for l in text.splitlines() if "every collective on the host mesh" in l]
            if len(lines) != 1 or "neither INA_AGGREGATOR nor INA_CONTROLLER" not in lines[0]:
                print(f"FAIL: rank {r} did not say once, at info level, why it runs on the host "
                      f"mesh; its stderr:\n{text}")
                return 1
            print(f"rank {r}: {lines[0]}")
        print("PASS")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
