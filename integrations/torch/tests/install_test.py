"""`meson install` puts ina_torch where the interpreter searches, and the installed package
works without the build tree and without any environment.

    install_test.py BUILD_DIR PYTHON PREFIX   (suite `torch`; exits 77 without torch)

The install folder (INA_TORCH_INSTALL_DIR) must be one of the interpreter's own site folders for
the prefix: in its site.getsitepackages() when it searches the prefix already (Debian 12's
/usr/bin/python3 and the default prefix /usr/local: /usr/local/lib/python3.11/dist-packages), else
in site.getsitepackages([PREFIX]) (where a python3 whose sys.prefix is PREFIX looks).

Then it installs the build into a temporary DESTDIR (meson install --destdir, no rebuild) and
imports it as a user would after `meson install`: as root, in a private mount namespace, the
installed tree is laid over the prefix (a read-only overlay: DESTDIR/PREFIX above PREFIX), and
PYTHON runs with an empty environment (no PYTHONPATH, no LD_LIBRARY_PATH): it imports ina_torch,
checks that the package and libina come from the installed tree, and runs a one-rank "ina" process
group's all_reduce. Without root (or unshare/overlayfs) the same probe runs with PYTHONPATH set to
the installed site folder under DESTDIR and LD_LIBRARY_PATH to the installed libdir, and says so.
Also checks the installed extension's RUNPATH names the prefix's libdir.
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
root = sys.argv[1]
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


def site_folders(python, prefix=None):
    """The interpreter's site folders: searched now, or for `prefix`."""
    arg = "" if prefix is None else repr([prefix])
    out = subprocess.run([python, "-c", "import site; print(chr(10).join(site.getsitepackages(%s)))"
                          % arg], stdout=subprocess.PIPE, text=True, check=True).stdout
    return [os.path.normpath(p) for p in out.split()]


def main():
    common.import_or_skip()
    build, python, prefix = sys.argv[1], sys.argv[2], os.path.normpath(sys.argv[3])
    site = os.path.normpath(os.environ["INA_TORCH_INSTALL_DIR"])
    libdir = os.environ["INA_LIBDIR"]
    searched = site_folders(python)
    prefix_searched = any(p.startswith(prefix + os.sep) for p in searched)
    want = searched if prefix_searched else site_folders(python, prefix)
    if site not in want:
        print(f"FAIL: ina_torch installs into {site}, which {python} does not search for prefix "
              f"{prefix} (its folders: {want})")
        return 1
    print(f"ok: {site} is one of {python}'s site folders for {prefix}")
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
        unshare = shutil.which("unshare")
        overlay = os.geteuid() == 0 and unshare is not None and prefix_searched and \
            "overlay" in open("/proc/filesystems").read()
        if overlay:
            # As after `meson install`: the installed tree over the prefix, no environment.
            env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
                   "INA_LOG_LEVEL": "warn"}
            lower = dest + prefix
            script = ('mount -t overlay overlay -o "lowerdir=$1:$2" "$2" && cd / && '
                      'exec "$3" -c "$4" "$2"')
            cmd = [unshare, "-m", "--propagation", "private", "sh", "-c", script, "sh", lower,
                   prefix, python, PROBE]
            print(f"importing with {python}'s own paths: {dest}{prefix} laid over {prefix}, "
                  "no PYTHONPATH or LD_LIBRARY_PATH")
        else:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "LD_LIBRARY_PATH") and not k.startswith("INA_")}
            env.update({"PYTHONPATH": dest + site, "LD_LIBRARY_PATH": dest + libdir,
                        "INA_LOG_LEVEL": "warn", "PYTHONDONTWRITEBYTECODE": "1"})
            cmd = [python, "-c", PROBE, os.path.realpath(dest)]
            print("note: not root (or no unshare/overlayfs, or a prefix the interpreter does not "
                  "search): importing with PYTHONPATH and LD_LIBRARY_PATH under the DESTDIR")
        p = subprocess.run(cmd, cwd=dest, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
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
