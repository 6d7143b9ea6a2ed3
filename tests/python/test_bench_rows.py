"""bench/bench.py's row selection (--rows, --category), through --dry-run: no GPU, no peers."""
import functools

from bench_dry_run import dry_run as _dry_run

dry_run = functools.partial(_dry_run, "bench.py")


def row_names(stdout):
    # The shape table's rows: "| category | row | ..." (matrix) or "| row | ..." (plain).
    return [line.split("|")[1:3] for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]


def test_rows_pick_matrix_rows_by_name():
    r = dry_run("--matrix", "--rows", "P128 N128,P32 N128")
    assert r.returncode == 0, r.stderr
    names = [cells[1].strip() for cells in row_names(r.stdout)[1:]]  # past the header
    assert names == ["P128 N128", "P32 N128"]


def test_rows_run_in_the_order_named():
    r = dry_run("--matrix", "--rows", "P32 N128,P128 N128,P32 N128")
    assert r.returncode == 0, r.stderr
    assert [cells[1].strip() for cells in row_names(r.stdout)[1:]] == ["P32 N128", "P128 N128"]


def test_rows_and_category_together_narrow_further():
    r = dry_run("--matrix", "--category", "head-dim", "--rows", "P128 N256")
    assert r.returncode == 0, r.stderr
    assert [cells[1].strip() for cells in row_names(r.stdout)[1:]] == ["P128 N256"]


def test_rows_pick_plain_rows():
    r = dry_run("--rows", "2.7B")
    assert r.returncode == 0, r.stderr
    assert "2.7B" in r.stdout and "16K headline" not in r.stdout


def test_unknown_row_is_refused_by_name():
    r = dry_run("--matrix", "--rows", "P256 N128")
    assert r.returncode == 2
    assert "unknown rows ['P256 N128']" in r.stderr


def test_matrix_backward_times_the_plain_calls_and_names_the_others():
    r = dry_run("--matrix", "--backward")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    left = [line for line in lines if line.startswith("left out of --backward")]
    assert len(left) == 1
    assert left[0].split(": ", 1)[1].split(", ") == [
        "64K chat reqs H80", "64K doc reqs H80", "16K reqs H128 G8",
        "layer H128 G8 Q256", "layer H128 G8 Q64", "layer 2.7B Q256"]
    table = [line.split()[0] for line in lines[lines.index(left[0]) + 2:] if line and not line.startswith("tensors")]
    assert table == ["P128", "P128", "P32", "P80", "fp32", "fp32", "1K", "1K", "1K"]


def test_matrix_backward_with_only_packed_rows_is_refused():
    r = dry_run("--matrix", "--backward", "--category", "packed")
    assert r.returncode == 2
    assert "none of the chosen rows is a plain call" in r.stderr
