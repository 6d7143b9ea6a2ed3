"""bench/bench_layer.py's rows and their selection, through --dry-run: no GPU, no peers."""
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_layer.py"


def dry_run(*args):
    return subprocess.run([sys.executable, str(BENCH), "--dry-run", *args], capture_output=True, text=True)


def rows(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines[1:]]


def test_every_row_and_its_sizes():
    r = dry_run()
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert [row[0] for row in got] == ["370M", "1.3B", "2.7B", "2.7B packed"]
    for row in got:
        assert float(row[2]) > 100, row  # zxbcdt of a training step: over 100 MB in bf16
    assert got[3][3] == "5" and got[0][3] == "-"


def test_selection_and_unknown_rows():
    r = dry_run("--rows", "2.7B packed")
    assert r.returncode == 0, r.stderr
    assert [row[0] for row in rows(r.stdout)] == ["2.7B packed"]
    r = dry_run("--rows", "7B")
    assert r.returncode != 0 and "unknown row '7B'" in r.stderr
    r = dry_run("--impls", "fla")
    assert r.returncode != 0 and "unknown implementation 'fla'" in r.stderr
