"""Host-path AllReduce SUM error, INA_FALLBACK=float against exact, as a multiple of the
in-network bound qb + ulp_out(|s| + qb) (protocol/QUANTIZATION.md): 8 forked ranks of the "ina"
torch backend with INA_TRANSPORT=host, the same inputs in both modes (Gaussian, 12 decades, and
one rank's +L and another's -L among 1.0s), float32, float16 and bfloat16. The figures in README.md
(INA_FALLBACK) come from it.

usage: testbed/run.py fallback-precision"""
import math
import os
import shutil
import sys
import tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "integrations", "torch", "tests"))
import common

WORLD = 8
N = 1 << 16
BLOCK = 256


def inputs(torch, kind, rank, dt):
    g = torch.Generator().manual_seed(100 + rank)
    if kind == "gauss":
        x = torch.randn(N, generator=g, dtype=torch.float64) * 10
    elif kind == "decades":  # magnitudes over 12 decades, random signs
        span = 8 if dt == torch.float16 else 12  # float16 tops out at 65504
        e = torch.rand(N, generator=g, dtype=torch.float64) * span - span / 2
        s = torch.randint(0, 2, (N,), generator=g) * 2 - 1
        x = s * torch.pow(10.0, e)
    else:  # cancel: one rank +L, one -L, the others 1 (per element, positions rotate)
        i = torch.arange(N)
        plus = i % WORLD
        minus = (plus + 1 + (i // WORLD) % 7) % WORLD
        L = 4096.0 if dt == torch.float16 else 512.0 if dt == torch.bfloat16 else 2.0 ** 25
        x = torch.ones(N, dtype=torch.float64)
        x[plus == rank] = L
        x[minus == rank] = -L
    return x.to(dt)


def rank_main(rank, world, outdir):
    import torch, torch.distributed as dist, ina_torch
    torch.set_num_threads(1)
    dist.init_process_group(backend="ina")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for kind in ("gauss", "decades", "cancel"):
            x = inputs(torch, kind, rank, dt)
            dist.all_reduce(x)
            if rank == 0:
                torch.save(x, os.path.join(outdir, f"{os.environ['INA_FALLBACK']}_{dt}_{kind}.pt"))
    dist.destroy_process_group()


def main(argv=None):
    common.import_or_skip()
    import torch
    out = tempfile.mkdtemp(prefix="ina-fallback-precision-")
    for mode in ("float", "exact"):
        ok = common.run_ranks(WORLD, rank_main, args=(out,),
                              env={"INA_TRANSPORT": "host", "INA_FALLBACK": mode,
                                   "INA_LOG_LEVEL": "warn"})
        assert ok, mode
    B = 30 - math.ceil(math.log2(WORLD))
    print(f"{WORLD} ranks, {N} elements, blocks of {BLOCK}; ratio = max over elements of "
          f"|out - s| / (qb + ulp_out(|s| + qb)), qb = N M 2^-B per block")
    print(f"{'dtype':9} {'inputs':8} {'float: max ratio':>17} {'exact: max ratio':>17} "
          f"{'float max |err|':>15} {'exact max |err|':>15}")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for kind in ("gauss", "decades", "cancel"):
            xs = [inputs(torch, kind, r, dt).double() for r in range(WORLD)]
            s = sum(xs)
            m = torch.stack([x.abs() for x in xs]).max(0).values
            mb = m.view(-1, BLOCK).max(1).values.repeat_interleave(BLOCK)
            qb = WORLD * mb * 2.0 ** -B
            mant = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dt]
            sub = {torch.float32: 2.0 ** -149, torch.float16: 2.0 ** -24,
                   torch.bfloat16: 2.0 ** -133}[dt]
            v = s.abs() + qb
            _, e = torch.frexp(v)
            u = torch.clamp(torch.pow(2.0, (e - 1 - mant).double()), min=sub)
            bound = qb + u
            row = []
            for mode in ("float", "exact"):
                y = torch.load(os.path.join(out, f"{mode}_{dt}_{kind}.pt")).double()
                err = (y - s).abs()
                row.append(((err / bound).max().item(), err.max().item()))
            print(f"{str(dt)[6:]:9} {kind:8} {row[0][0]:17.3g} {row[1][0]:17.3g} "
                  f"{row[0][1]:15.3g} {row[1][1]:15.3g}")
    shutil.rmtree(out, ignore_errors=True)
    return 0
