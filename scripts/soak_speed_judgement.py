"""Run the fleet speed-judgement test (tests/test_fleet_speed_judgement.py: three real agents, a
version as fast deployed while every core is busy, a truly slower one deployed busy and idle) RUNS
times, and tally what each agent's health window decided and the ratios it measured.

    python scripts/soak_speed_judgement.py [RUNS]      (default 10; ~100 s a run on 2 cores)

Exit status 0 only when every run passed: the same-speed version converged on every device and the
slower one was rolled back on every device, busy and idle. Each run's whole output (every device's
verdicts and the test's report) is kept in LOGS/run-N.log."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_fleet_speed_judgement.py"
# "door-1: pipeline cam: text-direction@2.0 passed its health window: ... : 1.0x, side by side ..."
VERDICT = re.compile(r"(door-\d): pipeline cam: .*?@(\S+) (passed|failed) its health window: .*?: ([\d.]+)x,")
VERSIONS = {"2.0": "same speed, busy box", "5.0": "slower, busy box", "6.0": "slower, idle box"}


def main(runs: int) -> int:
    ratios: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    passed = 0
    logs = Path(tempfile.mkdtemp(prefix="soak-speed-"))
    print(f"each run's output: {logs}/run-N.log", flush=True)
    for run in range(1, runs + 1):
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST],
            cwd=ROOT, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        (logs / f"run-{run}.log").write_text(done.stdout + done.stderr)
        for line in done.stdout.splitlines():
            found = VERDICT.search(line)
            if found:
                _device, version, verdict, ratio = found.groups()
                case = VERSIONS.get(version, version)
                ratios[case].append(float(ratio))
                outcomes[case][verdict] += 1
        ok = done.returncode == 0
        passed += ok
        took = time.monotonic() - began
        print(f"run {run}/{runs}: {'passed' if ok else 'FAILED'} in {took:.0f} s", flush=True)
        if not ok:  # the devices' verdicts, and why the test failed
            said = done.stdout.splitlines()
            verdicts = [line for line in said if line.startswith("door-") or line[:2] == "E "]
            print("\n".join(verdicts[-30:]), flush=True)
    print(f"\n{passed} of {runs} runs passed")
    for case, values in ratios.items():
        counts = ", ".join(f"{n} {verdict}" for verdict, n in sorted(outcomes[case].items()))
        median = sorted(values)[len(values) // 2]
        print(f"{case}: {counts}; final ratio min {min(values):.1f}x, median {median:.1f}x, "
              f"max {max(values):.1f}x over {len(values)} device verdicts")  # fmt: skip
    return 0 if passed == runs else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
