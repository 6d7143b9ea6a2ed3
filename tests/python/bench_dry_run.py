"""The benchmarks' --dry-run, for the tests of their row selection (no GPU, no peers)."""
import pathlib
import subprocess
import sys

BENCH_DIR = pathlib.Path(__file__).resolve().parents[2] / "bench"


def dry_run(script, *args):
    """bench/<script> --dry-run with args, as a finished subprocess (stdout and stderr as text)."""
    return subprocess.run([sys.executable, str(BENCH_DIR / script), "--dry-run", *args], capture_output=True,
                          text=True)


def table_rows(stdout):
    """The cells of a markdown table's rows past its header."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines[1:]]
