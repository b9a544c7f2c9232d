"""ina_torch: the INA c10d backend for PyTorch.

    import ina_torch                      # registers the backend "ina"
    torch.distributed.init_process_group(backend="ina")   # RANK, WORLD_SIZE, MASTER_ADDR/PORT

AllReduce runs in-network through the aggregator named by INA_AGGREGATOR=host:port, or the one
ina-controller admits the job to with INA_CONTROLLER=host:port (with libina's host fallback);
with neither every collective runs on libina's host TCP mesh (an info line says why).
The other collectives always run on the host mesh. libina's INA_* variables apply (INA_JOB,
INA_TIMEOUT_MS, INA_BLOCK_ELEMS, ...). Ranks meet through PyTorch's own store.
INA_STRAGGLER_REPORT=1: rank 0 prints the aggregator's straggler ranking at exit (stragglers.py).
"""
import torch.distributed as _dist

from . import _C
from . import stragglers as _stragglers

__all__ = ["BACKEND", "stats", "create_process_group"]

BACKEND = "ina"
create_process_group = _C.create_process_group


def stats(group=None):
    """libina's counters of an "ina" process group (the default group when None)."""
    if group is None:
        group = _dist.distributed_c10d._get_default_group()
    return _C.stats(group)


_stragglers.install()

if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _C.create_process_group)
