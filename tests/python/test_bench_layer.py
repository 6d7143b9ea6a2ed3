"""bench/bench_layer.py's rows and their selection, through --dry-run: no GPU, no peers."""
import functools

from bench_dry_run import dry_run as _dry_run, table_rows

dry_run = functools.partial(_dry_run, "bench_layer.py")


def test_every_row_and_its_sizes():
    r = dry_run()
    assert r.returncode == 0, r.stderr
    got = table_rows(r.stdout)
    assert [row[0] for row in got] == ["370M", "1.3B", "2.7B", "2.7B packed"]
    for row in got:
        assert float(row[2]) > 100, row  # zxbcdt of a training step: over 100 MB in bf16
    assert got[3][3] == "5" and got[0][3] == "-"


def test_kernels_mode_takes_the_same_rows():
    r = dry_run("--kernels", "--rows", "370M,2.7B")
    assert r.returncode == 0, r.stderr
    assert [row[0] for row in table_rows(r.stdout)] == ["370M", "2.7B"]


def test_selection_and_unknown_rows():
    r = dry_run("--rows", "2.7B packed")
    assert r.returncode == 0, r.stderr
    assert [row[0] for row in table_rows(r.stdout)] == ["2.7B packed"]
    r = dry_run("--rows", "7B")
    assert r.returncode != 0 and "unknown row '7B'" in r.stderr
    r = dry_run("--impls", "fla")
    assert r.returncode != 0 and "unknown implementation 'fla'" in r.stderr
