"""The audit log shows tampering: rows altered, deleted or reordered as the owner are reported
at the entry where the log stops verifying. These tests commit, so they run in a scratch
database of their own, dropped afterwards."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
)

from app.db import (
    scope_to_tenant,
)
from tests.conftest import Committed
from tests.factories import policy_chunks, record_run, register_version, results_for


async def _history(c: Committed) -> dict[str, Any]:
    """Two runs, a grounded and a rejected verification, and an erasure."""
    await register_version(c.client, c.keys)
    first = await record_run(c.client, c.keys)
    second = await record_run(c.client, c.keys)
    ids = [x["citation_id"] for x in first["citations"]]
    grounded = await c.client.post(
        f"/v1/runs/{first['run_id']}/answers",
        json={
            "claims": [{"text": "Refunds take a month.", "citation_ids": ids[:1]}],
            "citations": first["citations"],
        },
        headers=c.keys.headers("agent"),
    )
    rejected = await c.client.post(
        f"/v1/runs/{second['run_id']}/answers",
        json={"claims": [{"text": "Unsupported.", "citation_ids": []}], "citations": []},
        headers=c.keys.headers("agent"),
    )
    assert (grounded.status_code, rejected.status_code) == (200, 422)
    await register_version(c.client, c.keys, version="2026-12-01", chunks=policy_chunks())
    erased = await c.client.post(
        "/v1/documents/refund-policy/erase",
        json={"reason": "right to erasure", "request_ref": "DSR-1", "versions": ["2026-12-01"]},
        headers=c.keys.headers("ingest"),
    )
    assert erased.status_code == 200, erased.text
    return {
        "runs": [first["run_id"], second["run_id"]],
        "grounded": grounded.json()["verification_id"],
        "rejected": rejected.json()["verification_id"],
        "erasure": erased.json()["erasure_id"],
    }


async def _integrity(c: Committed) -> dict[str, Any]:
    response = await c.client.get("/v1/audit/integrity", headers=c.keys.headers("audit"))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _as_owner(c: Committed, statement: str, **params: Any) -> None:
    async with c.owner.begin() as connection:
        await connection.execute(text(statement), params)


async def _seq_of(c: Committed, record_id: str) -> int:
    async with c.owner.connect() as connection:
        seq: int = (
            await connection.execute(
                text("SELECT seq FROM audit_entries WHERE record_id = :id"), {"id": record_id}
            )
        ).scalar_one()
        return seq


async def test_untouched_log_verifies_through_an_erasure(committed: Committed) -> None:
    history = await _history(committed)
    report = await _integrity(committed)
    assert report["ok"] is True
    assert report["first_bad"] is None
    assert report["entries"] == report["sealed_entries"] == 5
    assert report["checkpoints"] == 1
    assert report["range"]["first_seq"] == await _seq_of(committed, history["runs"][0])
    again = await _integrity(committed)
    assert (again["ok"], again["head"], again["checkpoints"]) == (True, report["head"], 1)


async def test_runs_with_any_finite_scores_verify(committed: Committed) -> None:
    # What the run's entry hashed is what its stored rows hash to again: negative zero, the
    # smallest subnormal and the largest float included, as scores and as branch scores.
    await register_version(committed.client, committed.keys)
    [result] = results_for(policy_chunks()[:1])
    scores = [-0.0, 0.1 + 0.2, 1e-05, 5e-324, 1.7976931348623157e308]
    await record_run(
        committed.client,
        committed.keys,
        results=[result | {"score": s, "branches": {"bm25": s, "vector": -s}} for s in scores],
    )
    report = await _integrity(committed)
    assert (report["ok"], report["first_bad"], report["entries"]) == (True, None, 1)


async def test_entries_written_after_a_check_are_sealed_by_the_next(committed: Committed) -> None:
    await _history(committed)
    first = await _integrity(committed)
    await record_run(committed.client, committed.keys)
    second = await _integrity(committed)
    assert second["ok"] is True
    assert (second["entries"], second["checkpoints"]) == (first["entries"] + 1, 2)
    assert second["head"] != first["head"]


async def test_altered_verification_is_reported_at_its_entry(committed: Committed) -> None:
    history = await _history(committed)
    assert (await _integrity(committed))["ok"]
    await _as_owner(
        committed,
        "UPDATE verifications SET outcome = 'grounded', code = NULL WHERE verification_id = :id",
        id=history["rejected"],
    )
    report = await _integrity(committed)
    assert report["ok"] is False
    assert report["first_bad"] == {
        "seq": await _seq_of(committed, history["rejected"]),
        "problem": "record_altered",
        "kind": "verification",
        "record_id": history["rejected"],
    }


async def test_altered_citation_score_is_reported_at_its_run(committed: Committed) -> None:
    history = await _history(committed)
    assert (await _integrity(committed))["ok"]
    await _as_owner(
        committed, "UPDATE citations SET score = 1.0 WHERE run_id = :id", id=history["runs"][1]
    )
    bad = (await _integrity(committed))["first_bad"]
    assert (bad["seq"], bad["problem"]) == (
        await _seq_of(committed, history["runs"][1]),
        "record_altered",
    )


async def test_deleted_entry_is_reported_at_its_sequence_number(committed: Committed) -> None:
    history = await _history(committed)
    assert (await _integrity(committed))["ok"]
    seq = await _seq_of(committed, history["grounded"])
    await _as_owner(committed, "DELETE FROM audit_entries WHERE seq = :seq", seq=seq)
    report = await _integrity(committed)
    assert report["first_bad"] == {
        "seq": seq,
        "problem": "entry_deleted",
        "kind": None,
        "record_id": None,
    }


async def test_deleted_record_is_reported_at_its_entry(committed: Committed) -> None:
    history = await _history(committed)
    assert (await _integrity(committed))["ok"]
    await _as_owner(committed, "DELETE FROM erasures WHERE erasure_id = :id", id=history["erasure"])
    bad = (await _integrity(committed))["first_bad"]
    assert (bad["seq"], bad["problem"], bad["record_id"]) == (
        await _seq_of(committed, history["erasure"]),
        "record_deleted",
        history["erasure"],
    )


async def test_reordered_entries_are_reported_at_the_first_moved(committed: Committed) -> None:
    history = await _history(committed)
    assert (await _integrity(committed))["ok"]
    first = await _seq_of(committed, history["runs"][1])
    second = await _seq_of(committed, history["grounded"])
    # Swap the two entries' places in the log (through a free number: seq is the key).
    for old, new in ((first, -1), (second, first), (-1, second)):
        await _as_owner(
            committed, "UPDATE audit_entries SET seq = :new WHERE seq = :old", old=old, new=new
        )
    bad = (await _integrity(committed))["first_bad"]
    assert (bad["seq"], bad["problem"]) == (min(first, second), "entry_altered")


async def test_altered_checkpoint_is_reported(committed: Committed) -> None:
    await _history(committed)
    report = await _integrity(committed)
    await _as_owner(committed, "UPDATE audit_checkpoints SET horizon = horizon + 1000")
    bad = (await _integrity(committed))["first_bad"]
    assert bad["seq"] == report["range"]["first_seq"]
    assert bad["problem"] in ("checkpoint_altered", "entry_deleted", "entry_inserted")


async def test_the_service_role_cannot_update_or_delete_audit_rows(
    connection: AsyncConnection,
) -> None:
    for statement in (
        "UPDATE audit_entries SET kind = 'x'",
        "DELETE FROM audit_entries",
        "UPDATE audit_checkpoints SET root = 'x'",
        "DELETE FROM audit_checkpoints",
        "UPDATE verifications SET outcome = 'grounded'",
        "DELETE FROM runs",
        "DELETE FROM erasures",
    ):
        savepoint = await connection.begin_nested()
        with pytest.raises(DBAPIError, match="permission denied"):
            await connection.execute(text(statement))
        await savepoint.rollback()


async def test_checkpoints_are_visible_to_their_tenant_only(committed: Committed) -> None:
    await _history(committed)
    assert (await _integrity(committed))["checkpoints"] == 1
    async with committed.sessionmaker() as session, session.begin():
        seen = {}
        for tenant in ("acme", "globex"):
            await scope_to_tenant(session, tenant)
            seen[tenant] = (
                await session.execute(text("SELECT count(*) FROM audit_checkpoints"))
            ).scalar()
    assert seen == {"acme": 1, "globex": 0}
