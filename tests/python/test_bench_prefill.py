"""bench/bench_prefill.py's rows and their selection, through --dry-run: no GPU, no peers."""
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_prefill.py"


def dry_run(*args):
    return subprocess.run([sys.executable, str(BENCH), "--dry-run", *args], capture_output=True, text=True)


def rows(stdout):
    # The table's rows past its header: [mix, shape, Q, requests, tokens, lengths, state, scenario, MB, GFLOP,
    # floor].
    lines = [line for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines[1:]]


def test_every_mix_state_dtype_and_scenario():
    r = dry_run()
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert len(got) == 4 * 2 * 2
    assert {row[0] for row in got} == {"chat 16K", "chat 64K", "doc 64K", "chat 32K P128 N256"}
    for row in got:
        assert 16384 <= int(row[4]) <= 65536, row  # 16K to 64K tokens a call
        assert row[1] in ("80, 64, 128, 1", "40, 128, 256, 1"), row
        assert float(row[8]) > 0 and float(row[9]) > 0 and float(row[10]) > 0, row
    # A cached scenario reads half the states more: more bytes than the same row's new one.
    by = {(row[0], row[6], row[7]): float(row[8]) for row in got}
    assert by[("chat 16K", "fp32", "cached")] > by[("chat 16K", "fp32", "new")]
    assert by[("chat 16K", "fp32", "new")] > by[("chat 16K", "bf16", "new")]


def test_selection_narrows_the_rows():
    r = dry_run("--mixes", "doc 64K", "--state-dtypes", "bf16", "--scenarios", "new")
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert [(row[0], row[6], row[7]) for row in got] == [("doc 64K", "bf16", "new")]


def test_unknown_mix_is_refused_by_name():
    r = dry_run("--mixes", "chat 1K")
    assert r.returncode == 2
    assert "unknown mixes ['chat 1K']" in r.stderr
