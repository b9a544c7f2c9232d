"""Shared by the suite `torch`: skip (exit 77) with the reason when torch or the extension is
absent, and run a function in N forked ranks with the launcher's environment."""
import os
import sys
import traceback

SKIP = 77


def import_or_skip():
    """Imports torch and ina_torch, or exits 77 naming what is missing."""
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the machine
        print(f"SKIP: torch is not importable by {sys.executable}: {e}")
        sys.exit(SKIP)
    if not os.environ.get("INA_TORCH_BUILT", "1") == "1":
        print("SKIP: the ina_torch extension was not built (meson -Dtorch=disabled, or "
              "libtorch-dev/python3-dev/pybind11-dev missing at configure time)")
        sys.exit(SKIP)
    try:
        import ina_torch  # noqa: F401
    except Exception as e:
        print(f"SKIP: the ina_torch extension is not importable: {e}")
        sys.exit(SKIP)


def run_ranks(world_size, fn, args=(), env=None, timeout=120.0):
    """Forks world_size ranks that call fn(rank, world_size, *args) with RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT set (plus `env`). Returns True when every rank exited 0."""
    import multiprocessing as mp
    from ina_torch.launch import free_port
    ctx = mp.get_context("fork")
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = {"RANK": str(rank), "WORLD_SIZE": str(world_size),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        rank_env.update(env or {})
        p = ctx.Process(target=_rank_main, args=(rank_env, fn, rank, world_size, args))
        p.start()
        procs.append(p)
    ok = True
    for rank, p in enumerate(procs):
        p.join(timeout)
        if p.is_alive():
            print(f"rank {rank} did not finish within {timeout} s")
            p.kill()
            p.join()
            ok = False
        elif p.exitcode != 0:
            print(f"rank {rank} exited with {p.exitcode}")
            ok = False
    return ok


def _rank_main(rank_env, fn, rank, world_size, args):
    os.environ.update(rank_env)
    try:
        fn(rank, world_size, *args)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
