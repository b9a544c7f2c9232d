"""`meson install` puts ina_torch into the interpreter's site-packages under the prefix, and the
installed package works without the build tree.

    install_test.py BUILD_DIR   (suite `torch`; exits 77 without torch)

Installs the build into a temporary DESTDIR (meson install --destdir, no rebuild), then, in a
fresh interpreter whose PYTHONPATH is only the installed site-packages (INA_TORCH_INSTALL_DIR
under DESTDIR) and whose LD_LIBRARY_PATH is the installed libdir (INA_LIBDIR under DESTDIR, which
stands in for the extension's install_rpath, the real prefix): imports ina_torch, checks that the
package and libina come from DESTDIR, and runs a one-rank "ina" process group's all_reduce. Also
checks the installed extension's RUNPATH names the prefix's libdir.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PROBE = r'''
import os, sys
root = os.environ["DESTDIR_ROOT"]
import torch, torch.distributed as dist
import ina_torch
assert os.path.realpath(ina_torch.__file__).startswith(root), ina_torch.__file__
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libina.so" in l]
assert libs and all(os.path.realpath(p).startswith(root) for p in libs), libs
from ina_torch.launch import free_port
os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port())})
dist.init_process_group(backend="ina")
x = torch.arange(10, dtype=torch.float32)
dist.all_reduce(x)
assert torch.equal(x, torch.arange(10, dtype=torch.float32)), x
dist.destroy_process_group()
print("installed ina_torch:", ina_torch.__file__, "libina:", libs[0])
'''


def main():
    common.import_or_skip()
    build = sys.argv[1]
    site = os.environ["INA_TORCH_INSTALL_DIR"]
    libdir = os.environ["INA_LIBDIR"]
    meson = shutil.which("meson")
    if meson is None:
        print("SKIP: meson is not on PATH")
        return common.SKIP
    dest = tempfile.mkdtemp(prefix="ina-torch-install-")
    try:
        p = subprocess.run([meson, "install", "-C", build, "--destdir", dest, "--no-rebuild",
                            "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        if p.returncode != 0:
            print(f"FAIL: meson install --destdir exited {p.returncode}:\n{p.stdout}")
            return 1
        pkg = dest + os.path.join(site, "ina_torch")
        exts = [f for f in os.listdir(pkg) if f.startswith("_C") and f.endswith(".so")] \
            if os.path.isdir(pkg) else []
        if not exts or not os.path.isfile(os.path.join(pkg, "__init__.py")):
            print(f"FAIL: no ina_torch package (__init__.py and _C*.so) in {pkg}")
            return 1
        readelf = shutil.which("readelf")
        if readelf:
            d = subprocess.run([readelf, "-d", os.path.join(pkg, exts[0])],
                               stdout=subprocess.PIPE, text=True).stdout
            runpath = [l for l in d.splitlines() if "RUNPATH" in l or "RPATH" in l]
            if not any(libdir in l for l in runpath):
                print(f"FAIL: the installed extension's run path {runpath} lacks {libdir}")
                return 1
            if any("/worker" in l for l in runpath):
                print(f"FAIL: the installed extension still points into the build tree: {runpath}")
                return 1
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "LD_LIBRARY_PATH") and not k.startswith("INA_")}
        env.update({"PYTHONPATH": dest + site, "LD_LIBRARY_PATH": dest + libdir,
                    "DESTDIR_ROOT": os.path.realpath(dest), "INA_LOG_LEVEL": "warn",
                    "PYTHONDONTWRITEBYTECODE": "1"})
        p = subprocess.run([sys.executable, "-c", PROBE], cwd=dest, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        print(p.stdout)
        if p.returncode != 0:
            print("FAIL: the installed ina_torch does not work on its own")
            return 1
        print("PASS")
        return 0
    finally:
        shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
