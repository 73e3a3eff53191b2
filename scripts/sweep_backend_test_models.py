#!/usr/bin/env python3
"""The outside tester's sweep over the ONNX backend test models that ship in the onnx wheel (the
`simple`, `pytorch-converted` and `pytorch-operator` suites, each model with its test_data_set_0),
run through the `edge-agent` CLI as a user would:

    edge-agent registry publish model.onnx --name N --version 1 --test-data test_data_set_0/
    edge-agent models pull N@1 -c agent.yaml
    edge-agent infer N@1 inputs.npz -c agent.yaml --json --raw
    edge-agent models validate N@1 -c agent.yaml --json
    edge-agent explain N@1 -c agent.yaml --json
    edge-agent infer N@1 inputs.npz -c agent.yaml --json --raw

For each model it checks that infer's outputs are within rtol 1e-3 / atol 1e-5 of the expected
outputs, both before validation (nothing proven: what a first start serves) and after it, and that
validate, explain and infer name the same backend and artifact. A model that no
backend of this box runs right is refused at publish: that is counted, not an error.

    scripts/sweep_backend_test_models.py [--jobs 2] [--only GLOB] [--report docs/sweep-backend-test-models.md]

Exit 0 when no model comes back wrong, none disagrees, and at least --min-correct are correct.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.testdata import model_zoo_testdata, onnx_io_names  # noqa: E402

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
SUITES = ("simple", "pytorch-converted", "pytorch-operator")
RTOL, ATOL = 1e-3, 1e-5
EDGE_AGENT = [str(Path(sys.executable).parent / "edge-agent")]  # the venv's console script


@dataclass
class Outcome:
    model: str
    name: str
    status: str  # correct, wrong, refused (at publish), failed (a step errored), disagree
    validate: str = ""  # "backend on artifact" each named
    explain: str = ""
    infer: str = ""
    detail: str = ""
    seconds: float = 0.0


def model_dirs(only: str | None) -> list[Path]:
    found = sorted(d for suite in SUITES for d in (DATA / suite).iterdir() if (d / "model.onnx").is_file())
    return [d for d in found if only is None or fnmatch.fnmatch(f"{d.parent.name}/{d.name}", only)]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EDGE_AGENT, *args], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )


def expected_outputs(set_dir: Path) -> list[np.ndarray]:
    files = sorted(set_dir.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def from_raw(entry: dict[str, Any]) -> np.ndarray:
    values = [np.nan if v is None else v for v in entry["values"]]
    dtype = entry["dtype"]
    if dtype.startswith("<U") or dtype == "object":
        return np.array(values, dtype=object).reshape(entry["shape"])
    return np.array(values, dtype=np.float64 if np.dtype(dtype).kind == "f" else dtype).reshape(
        entry["shape"]
    )


def within(outputs: list[np.ndarray], expected: list[np.ndarray]) -> str:
    """ "" when every output is within RTOL/ATOL of the expected one (NaN only where NaN is expected)."""
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, {len(expected)} expected"
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        if out.shape != ref.shape:
            return f"output {i}: shape {list(out.shape)}, expected {list(ref.shape)}"
        if ref.dtype.kind in "fc":
            if not np.allclose(out.astype(np.float64), ref.astype(np.float64), RTOL, ATOL, equal_nan=True):
                diff = np.nanmax(np.abs(out.astype(np.float64) - ref.astype(np.float64)))
                return f"output {i}: off by up to {diff:.3g}"
        elif not np.array_equal(out.astype(ref.dtype) if ref.dtype.kind != "O" else out, ref):
            return f"output {i}: values differ"
    return ""


def _error(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said: its JSON errors (with --json), else its stderr; clipped."""
    try:
        said = "; ".join(json.loads(done.stdout)["errors"])
    except (ValueError, KeyError, TypeError):
        said = done.stderr.strip()
    return said[:400]


def infer_once(name: str, npz: Path, config: Path, expected: list[np.ndarray]) -> tuple[str | None, str]:
    """(what ran: "backend on artifact", or None when infer failed; "" or what is wrong)."""
    inferred = run("infer", f"{name}@1", str(npz), "-c", str(config), "--json", "--raw")
    if inferred.returncode != 0:
        return None, _error(inferred)
    result = json.loads(inferred.stdout)
    ran = f"{result['backend']} on {result['artifact']}"
    got = [from_raw(entry) for entry in result["raw_outputs"].values()]
    problem = within(got, expected)
    return ran, f"{ran}: {problem}" if problem else ""


def sweep_one(model_dir: Path, work: Path, config: Path, registry: Path) -> Outcome:
    started = time.monotonic()
    name = f"{model_dir.parent.name}.{model_dir.name}".replace("_", "-")[:64].lower()
    outcome = Outcome(f"{model_dir.parent.name}/{model_dir.name}", name, "failed")
    set_dir = model_dir / "test_data_set_0"
    try:
        published = run(
            "registry", "publish", str(model_dir / "model.onnx"), "--name", name, "--version", "1",
            "--registry", f"file://{registry}", "--test-data", str(set_dir), "--json",
        )  # fmt: skip
        if published.returncode != 0:
            outcome.status, outcome.detail = "refused", _error(published)
            return outcome
        pulled = run("models", "pull", f"{name}@1", "-c", str(config))
        if pulled.returncode != 0:
            outcome.detail = f"pull: {_error(pulled)}"
            return outcome
        inputs, outputs = onnx_io_names(model_dir / "model.onnx")
        npz = work / f"{name}.npz"
        npz.write_bytes(model_zoo_testdata(set_dir, inputs, outputs))  # expected:* arrays are ignored
        expected = expected_outputs(set_dir)
        # Before anything is proven: what a first start serves (the full-precision reference).
        first, problem = infer_once(name, npz, config, expected)
        if problem:
            outcome.status, outcome.detail = (
                ("failed" if first is None else "wrong"),
                f"first infer: {problem}",
            )
            return outcome
        validated = run("models", "validate", f"{name}@1", "-c", str(config), "--json")
        report = json.loads(validated.stdout) if validated.stdout.strip() else {}
        outcome.validate = report.get("activated") or ""
        explained = run("explain", f"{name}@1", "-c", str(config), "--json")
        if explained.returncode != 0:
            outcome.detail = f"explain: {_error(explained)}"
            return outcome
        [record] = json.loads(explained.stdout)
        decision = record.get("decision") or {}
        outcome.explain = f"{decision.get('backend')} on {decision.get('artifact')}"
        # After validation: the decision it kept.
        ran, problem = infer_once(name, npz, config, expected)
        outcome.infer = ran or ""
        if problem:
            outcome.status, outcome.detail = ("failed" if ran is None else "wrong"), f"infer: {problem}"
        elif len({outcome.validate, outcome.explain, outcome.infer}) != 1:
            outcome.status = "disagree"
        else:
            outcome.status = "correct"
        return outcome
    except (subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        outcome.detail = f"{type(exc).__name__}: {exc}"
        return outcome
    finally:
        outcome.seconds = round(time.monotonic() - started, 1)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2, help="models swept at once (default 2)")
    parser.add_argument("--only", help="a glob over SUITE/MODEL, e.g. 'simple/test_sequence_model*'")
    parser.add_argument("--report", type=Path, help="write a Markdown report here")
    parser.add_argument("--json", type=Path, help="write every outcome as JSON here")
    parser.add_argument("--min-correct", type=int, default=0, help="fail below this many correct")
    args = parser.parse_args()

    dirs = model_dirs(args.only)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edge-agent-sweep-") as tmp:
        work = Path(tmp)
        registry, config = work / "registry", work / "agent.yaml"
        config.write_text(
            f"device: {{id: sweep}}\nstate_dir: {work / 'state'}\nregistry: {{url: 'file://{registry}'}}\n"
        )
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            outcomes = []
            for i, outcome in enumerate(pool.map(lambda d: sweep_one(d, work, config, registry), dirs), 1):
                outcomes.append(outcome)
                print(f"[{i}/{len(dirs)}] {outcome.model}: {outcome.status} ({outcome.seconds} s) "
                      f"{outcome.infer or outcome.detail[:120]}", flush=True)  # fmt: skip
    elapsed = time.monotonic() - started
    counts = {
        s: sum(o.status == s for o in outcomes) for s in ("correct", "wrong", "refused", "failed", "disagree")
    }
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"{len(outcomes)} models in {elapsed / 60:.1f} min: {summary}")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    if args.report:
        write_report(args.report, outcomes, counts, elapsed, args.jobs)
    bad = counts["wrong"] + counts["failed"] + counts["disagree"]
    return 0 if bad == 0 and counts["correct"] >= args.min_correct else 1


def _ran_on(outcomes: list[Outcome]) -> dict[str, int]:
    """How many correct models ran on each backend, twins counted apart from the files they come from."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.status == "correct":
            backend, _, artifact = o.infer.partition(" on ")
            key = f"{backend}, upgraded twin" if "(upgraded" in artifact else backend
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def write_report(
    path: Path, outcomes: list[Outcome], counts: dict[str, int], elapsed: float, jobs: int
) -> None:
    from agent.backend_choice import providers_report

    versions = sorted(
        {f"{k} {v}" for row in providers_report()["backends"] for k, v in row["versions"].items()}
    )
    lines = [
        "# The onnx wheel's backend test models through the CLI",
        "",
        f"Written by `scripts/sweep_backend_test_models.py` on {time.strftime('%Y-%m-%d %H:%M')} "
        f"({', '.join(versions)}); {len(outcomes)} models in {elapsed / 60:.1f} min with {jobs} at once.",
        "Each model is published with its test_data_set_0, pulled, run with `edge-agent infer NAME@1 "
        "inputs.npz --json` (nothing proven yet: what a first start serves), validated, explained and "
        "run again (the decision validation kept); outputs compared at "
        f"rtol {RTOL:g} / atol {ATOL:g}, both times.",
        "",
        "| outcome | models |",
        "|---|---|",
        *(f"| {status} | {n} |" for status, n in counts.items()),
        "",
        "| ran on (validate, explain and infer alike) | models |",
        "|---|---|",
        *(f"| {ran} | {n} |" for ran, n in _ran_on(outcomes).items()),
        "",
        "| model | outcome | validate, explain and infer ran | detail |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        named = (
            o.infer if o.status == "correct" else " / ".join(x for x in (o.validate, o.explain, o.infer) if x)
        )
        detail = o.detail.replace("|", "\\|").replace("\n", " ")[:200]
        lines.append(f"| {o.model} | {o.status} | {named} | {detail} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
