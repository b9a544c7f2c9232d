"""GPU check of the device-buffer path, for a machine with an NVIDIA GPU (about 2-5 minutes):
builds in build-gpu/ (or --gpu-build) with -Dcuda=enabled (the toolkit at /usr/local/cuda) and
warnings as errors; runs the cuda test suite (device-buffer AllReduce through a local aggregator,
bitwise against host buffers and stream-ordered); times a device-buffer AllReduce (cudaMalloc'ed
float32, 16 Mi elements) through a local ina-aggregator, 2 ranks on loopback, beside the same
AllReduce on host buffers. No quantizer runs on the device: the workers send their values as
they are and the aggregator quantizes. Without a usable GPU it builds, says so and exits 77.
Each step runs under a timeout, the whole check within 15 minutes."""
import argparse
import os
import shutil
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step(argv, timeout, env=None):
    print(f"== {' '.join(argv)}", flush=True)
    return subprocess.run(argv, cwd=ROOT, timeout=timeout, env=env).returncode


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu-build", default="build-gpu")
    a, _ = ap.parse_known_args(argv)  # --build-dir: the GPU build is a build of its own
    env = dict(os.environ)
    if os.path.isdir("/usr/local/cuda/bin"):
        env["PATH"] = "/usr/local/cuda/bin:" + env["PATH"]
    build = a.gpu_build
    t0 = time.monotonic()
    setup = ["meson", "setup"] + (["--reconfigure"] if os.path.exists(
        os.path.join(ROOT, build, "build.ninja")) else []) + [build, "-Dcuda=enabled",
                                                              "-Dwerror=true"]
    if step(setup, 300, env) or step(["meson", "compile", "-C", build], 400, env):
        return 1
    print(f"built in {time.monotonic() - t0:.0f} s")
    with open(os.path.join(ROOT, build, "ina_config.h")) as f:
        if "#define INA_HAVE_CUDA 1" not in f.read():
            print("CUDA was not found (is the toolkit at /usr/local/cuda?)")
            return 1
    gpu = ""
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()[:1]
        gpu = gpu[0] if gpu else ""
    if not gpu:
        print("no usable NVIDIA GPU here (nvidia-smi: none); built only, skipping the GPU checks")
        return 77
    print(f"== GPU: {gpu}")
    if step(["meson", "test", "-C", build, "--suite", "cuda", "--print-errorlogs",
             "--no-rebuild"], 300, env):
        return 1
    env["INA_AGGREGATOR_BIN"] = os.path.join(ROOT, build, "aggregator", "ina-aggregator")
    return step([os.path.join(build, "tests", "integration", "cuda_device_allreduce_test"),
                 "--gtest_filter=CudaDeviceAllreduceThroughput.*"], 180, env)
