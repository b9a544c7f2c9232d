"""The DDP example (examples/ddp_digits.py) with backends ina (in-network, local aggregator) and
gloo: both must train (final test accuracy > 0.9) and end within 0.03 of each other."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    common.import_or_skip()
    try:
        import sklearn  # noqa: F401
    except ImportError as e:
        print(f"SKIP: scikit-learn is not importable (python3-sklearn): {e}")
        return common.SKIP
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                           "ddp_digits.py")
    r = subprocess.run([sys.executable, example, "--world-size", "2", "--epochs", "5",
                        "--tolerance", "0.03", "--timeout", "150"],
                       capture_output=True, text=True, timeout=170)
    print(r.stdout)
    if r.returncode != 0:
        print(r.stderr[-4000:])
        print("FAIL: the example failed or the accuracies differ")
        return 1
    finals = [l for l in r.stdout.splitlines() if "final accuracy" in l and ":" in l]
    accs = [float(l.split("final accuracy ")[1].split(",")[0]) for l in finals
            if l.startswith(("ina:", "gloo:"))]
    if len(accs) != 2 or min(accs) <= 0.9:
        print(f"FAIL: expected both backends above 0.9, got {accs}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
