from __future__ import annotations

from pathlib import Path

import yaml

from app.cli import openapi_document


def test_committed_openapi_matches_the_app() -> None:
    committed = (Path(__file__).parent.parent / "openapi.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(committed) == yaml.safe_load(openapi_document()), (
        "openapi.yaml is stale: run `make openapi`"
    )
