"""bench/sass_hotspots.py on a small ncu source table written here: no GPU, no ncu."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "sass_hotspots.py"
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_barrier", "stall_wait", "stall_long_sb"]
# (address, source, samples, executed, barrier, wait, long_sb): a loop's top barrier, an mbarrier wait
# and the branch that retries it (taken 8 times a pass), the loop's work, its wgmma wait.
ROWS = [
    ("0x7fe6177c0100", "      BAR.SYNC.DEFER_BLOCKING 0x0", 10, 64, 10, 0, 0),
    ("0x7fe6177c0110", "      IMAD R1, R2, R3, RZ", 5, 64, 0, 5, 0),
    ("0x7fe6177c0120", "      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0", 2, 64, 0, 2, 0),
    ("0x7fe6177c0130", "@!P0  BRA 0x300", 40, 512, 0, 0, 40),
    ("0x7fe6177c0140", "      FMUL R4, R5, R6", 30, 64, 0, 30, 0),
    ("0x7fe6177c0150", "      WARPGROUP.DEPBAR.LE gsb0, 0x0", 13, 64, 13, 0, 0),
]


def table(path):
    lines = ['"Kernel Name","walk(Args)"', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{v}"' for v in row) for row in ROWS]
    path.write_text("\n".join(lines) + "\n")


def run(path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), str(path), *args], capture_output=True, text=True)


def test_phases_cut_the_code_at_its_synchronization(tmp_path):
    csv = tmp_path / "sass.csv"
    table(csv)
    r = run(csv, "--phases", "--top", "2", "--buckets", "1")
    assert r.returncode == 0, r.stderr
    phases = r.stdout[r.stdout.index("phases"):].splitlines()[1:]
    landmarks = [line.split()[0] for line in phases if not line.split()[0].endswith("%")]
    assert landmarks == ["7c0100", "7c0120", "7c0150"]  # in address order, the stretches between them
    wait = next(line for line in phases if line.split()[0] == "7c0120")
    assert "x64" in wait and "TRYWAIT" in wait
    # The stretch after the wait (the retry branch and the FMUL): 70 of 100 samples, 576 instructions.
    after_wait = phases[phases.index(wait) + 1]
    assert after_wait.split()[0] == "70.0%" and "576 instr" in after_wait
    assert "wait:30.0%" in after_wait and "long_sb:40.0%" in after_wait


def test_without_phases_there_is_no_phase_table(tmp_path):
    csv = tmp_path / "sass.csv"
    table(csv)
    r = run(csv)
    assert r.returncode == 0, r.stderr
    assert "phases" not in r.stdout and "100 samples" in r.stdout
