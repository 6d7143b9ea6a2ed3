"""bench/bench_prefill.py's rows and their selection, through --dry-run: no GPU, no peers."""
import functools

from bench_dry_run import dry_run as _dry_run, table_rows

dry_run = functools.partial(_dry_run, "bench_prefill.py")


# The table's columns: [mix, shape, Q, requests, tokens, lengths, state, scenario, MB, GFLOP, floor].


def test_every_mix_state_dtype_and_scenario():
    r = dry_run()
    assert r.returncode == 0, r.stderr
    got = table_rows(r.stdout)
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
    got = table_rows(r.stdout)
    assert [(row[0], row[6], row[7]) for row in got] == [("doc 64K", "bf16", "new")]


def test_unknown_mix_is_refused_by_name():
    r = dry_run("--mixes", "chat 1K")
    assert r.returncode == 2
    assert "unknown mixes ['chat 1K']" in r.stderr
