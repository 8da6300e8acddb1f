"""The whole API fuzzed with schemathesis, against `grounding serve` as a real process.

`python -m tests.fuzz` (`make fuzz`) starts the service on a fresh embedded PostgreSQL of its
own, creates a tenant and keys with the CLI, and runs `st run` on the committed `openapi.yaml`
once with a key of each scope and once with a key holding every scope. Every operation is
exercised in schemathesis's coverage, fuzzing and stateful phases, and every response is
checked: no 5xx, and status code, content type and body as the document gives them. The run
is bounded (examples per operation, deterministic generation, a time limit per key) and fails
on any failure schemathesis reports or any error the service logs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.served import Served, create_key, grounding, serve

ROOT = Path(__file__).parent.parent
SCOPES = ("ingest", "agent", "support", "audit", "admin")
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "unsupported_method",
)


def _st_run(served: Served, secret: str, *, max_examples: int, timeout: float, cwd: Path) -> str:
    """One `st run` with `secret`; its report, or AssertionError with the report if it failed."""
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        str(ROOT / "openapi.yaml"),
        "--url",
        served.base_url,
        "--header",
        f"Authorization: Bearer {secret}",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "coverage,fuzzing,stateful",
        "--max-examples",
        str(max_examples),
        "--generation-deterministic",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    report = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(report)
    return report


def _logged_errors(served: Served) -> list[str]:
    """The service's log records at ERROR or above (it logs one JSON object a line)."""
    errors = []
    for line in served.log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in {"ERROR", "CRITICAL"}:
            errors.append(line)
    return errors


def main(argv: list[str] | None = None) -> int:
    """Fuzz every operation with a key of each scope; 0 when nothing failed."""
    options = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    options.add_argument("--max-examples", type=int, default=25, help="per operation and phase")
    options.add_argument("--timeout", type=float, default=240, help="seconds per key at most")
    args = options.parse_args(argv)

    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="grounding-fuzz-") as scratch:
        workdir = Path(scratch)
        with serve(workdir / "data") as served:
            grounding(served.data_dir, "tenants", "create", "fuzz")
            keys = {
                scope: create_key(served.data_dir, tenant="fuzz", scopes=scope) for scope in SCOPES
            }
            keys["every scope"] = create_key(
                served.data_dir, tenant="fuzz", scopes=",".join(SCOPES)
            )
            for name, secret in keys.items():
                began = time.monotonic()
                try:
                    report = _st_run(
                        served,
                        secret,
                        max_examples=args.max_examples,
                        timeout=args.timeout,
                        cwd=workdir,
                    )
                    outcome = "passed"
                except AssertionError as failure:
                    report, outcome = str(failure), "FAILED"
                    failed.append(name)
                except subprocess.TimeoutExpired:
                    report, outcome = f"no result within {args.timeout:.0f} s", "FAILED"
                    failed.append(name)
                lines = report.strip().splitlines()
                cases = [line.strip() for line in lines if " generated" in line]
                summary = "; ".join([*cases[-1:], *lines[-1:]])
                print(
                    f"--- key with {name}: {outcome} in {time.monotonic() - began:.0f} s: {summary}"
                )
                if outcome != "passed":
                    print(report)
            errors = _logged_errors(served)
    if errors:
        failed.append("the service's log")
        print(f"--- the service logged {len(errors)} errors:", *errors[:20], sep="\n")
    print(f"fuzz: {len(keys) + 1 - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
