"""Ops queries over the audit trail: runs, verifications, erasures, one run in full, daily
counts, and a source's blast radius.

Invariants kept here:
- an audit key reads its own tenant only: every statement names that tenant, and row-level
  security binds the session to it besides;
- an admin key reads every tenant (or the one it names) only once its read is recorded, and
  then as the read-only auditor role, for the read's statements only;
- lists are newest first and paginated on a key that orders every row (time, id, tenant), so
  rows written between two pages are never skipped and never repeated;
- every statement is led by the tenant into an index; across tenants, each tenant's rows are
  read by their own index scan (a LATERAL join over `tenants`), never by scanning a table;
- nothing here selects document text, memory text, claims, or plain span hashes.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import (
    Date,
    Row,
    Select,
    and_,
    case,
    cast,
    false,
    func,
    literal,
    or_,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from app.access.service import Principal
from app.audit import service as audit
from app.audit.schemas import (
    AuditCitationRead,
    AuditParams,
    BlastRadiusParams,
    BlastRadiusRead,
    ErasureAuditRead,
    ErasureFilters,
    MemoryAuditRead,
    OutcomeCount,
    Page,
    RunAuditDetail,
    RunAuditRead,
    RunFilters,
    StatsParams,
    StatsRead,
    VerificationAuditRead,
    VerificationFilters,
    WindowParams,
)
from app.errors import InvalidRequest, NotFound
from app.grounding.models import Span
from app.models import (
    CitationRow,
    DocumentVersion,
    Erasure,
    MemoryCitation,
    MemoryRecord,
    Run,
    Tenant,
    Verification,
    VerificationCitation,
)

# Created by the migrations: SELECT on every table, every tenant's rows, nothing else.
AUDITOR_ROLE = "grounding_auditor"

Item = TypeVar("Item", bound=BaseModel)
Statement = Select[*tuple[Any, ...]]
# A statement of one tenant's rows, given the tenant as a bound name or as `tenants.name`.
Build = Callable[[ColumnElement[str]], Statement]
# (label, descending) of each column a statement is ordered by.
Order = tuple[tuple[str, bool], ...]


@dataclass(frozen=True, slots=True)
class Reach:
    """Whose rows a read covers: one tenant, or every tenant when `tenant` is None."""

    tenant: str | None
    # An audit key named another tenant: the read matches nothing.
    nothing: bool = False


@asynccontextmanager
async def _reading(
    session: AsyncSession, reader: Principal, *, route: str, params: AuditParams
) -> AsyncIterator[Reach]:
    """The reach of `reader`; for an admin, its read recorded first and run as the auditor."""
    if "admin" not in reader.scopes:
        yield Reach(reader.tenant, nothing=params.tenant not in (None, reader.tenant))
        return
    await audit.record_admin_read(
        session,
        tenant=reader.tenant,
        key_id=reader.key_id,
        route=route,
        filters=params.model_dump(mode="json", exclude_none=True),
    )
    await session.execute(text(f"SET LOCAL ROLE {AUDITOR_ROLE}"))
    yield Reach(params.tenant)
    # Only when the read succeeded: after a failure the transaction is rolled back anyway.
    await session.execute(text("SET LOCAL ROLE NONE"))


def _ordered(columns: Any, order: Order) -> list[ColumnElement[Any]]:
    return [columns[name].desc() if desc else columns[name].asc() for name, desc in order]


def _across(build: Build, reach: Reach, order: Order, limit: int | None) -> Statement:
    """`build` for the reach's tenant, or, across tenants, for each tenant by its own index."""
    if reach.tenant is not None:
        statement = build(literal(reach.tenant))
        if reach.nothing:
            statement = statement.where(false())
        return statement.order_by(*_ordered(statement.selected_columns, order)).limit(limit)
    inner = build(Tenant.name.expression)
    if limit is not None:
        inner = inner.order_by(*_ordered(inner.selected_columns, order)).limit(limit)
    each = inner.lateral("each_tenant")
    return (
        select(each)
        .select_from(Tenant)
        .join(each, true())
        .order_by(*_ordered(each.c, order))
        .limit(limit)
    )


def _window(column: Any, params: WindowParams) -> list[ColumnElement[bool]]:
    found = []
    if params.since is not None:
        found.append(column >= params.since)
    if params.until is not None:
        found.append(column < params.until)
    return found


# Cursors: a page's last key as base64url JSON. Opaque to callers, and harmless if forged: a
# cursor only says where to resume among rows the reader may read anyway.
Key = tuple[datetime, str, str]


def _encode(value: Any) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _key_json(key: Key) -> list[str]:
    time, record_id, tenant = key
    return [time.isoformat(), record_id, tenant]


def _bad_cursor() -> InvalidRequest:
    return InvalidRequest("the cursor is not one this service issued")


def _decode(cursor: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, RecursionError) as exc:
        raise _bad_cursor() from exc


def _key(value: Any) -> Key:
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
        raise _bad_cursor()
    try:
        time = datetime.fromisoformat(value[0])
    except ValueError as exc:
        raise _bad_cursor() from exc
    if time.tzinfo is None:
        raise _bad_cursor()
    return time, value[1], value[2]


def _after(columns: Sequence[Any], key: Sequence[Any]) -> ColumnElement[bool]:
    """Rows after `key` in newest-first order of `columns` (time, id, tenant)."""
    bound = [literal(value, column.type) for column, value in zip(columns, key, strict=True)]
    return tuple_(*columns) < tuple_(*bound)


def _validated(model: type[Item], rows: Sequence[Row[Any]]) -> list[Item]:
    """`rows`, one result's, as `model`s."""
    if not rows:
        return []
    # Each row's values by its result's field names: `Row._asdict` reads the row's mapping key
    # by key in Python, and took a page of runs longer than validating it did.
    fields = rows[0]._fields
    return [model.model_validate(dict(zip(fields, row, strict=True))) for row in rows]


def _page(
    rows: Sequence[Row[Any]], limit: int, model: type[Item], key: Callable[[Any], Key]
) -> tuple[list[Item], str | None]:
    """The first `limit` of `rows` (one more was fetched), and the cursor after them if more."""
    items = _validated(model, rows[:limit])
    more = len(rows) > limit
    return items, _encode(_key_json(key(rows[limit - 1]))) if more else None


_NEWEST_RUNS: Order = (("retrieved_at", True), ("run_id", True), ("tenant", True))
_RUN_COLUMNS = (
    Run.tenant,
    Run.run_id,
    Run.key_id,
    Run.query,
    Run.scope,
    Run.retrieved_at,
    Run.citation_count,
)


async def list_runs(
    session: AsyncSession, *, reader: Principal, filters: RunFilters, route: str
) -> Page[RunAuditRead]:
    """Runs, newest first, by time, key, run, or a document they cite."""
    after = _key(_decode(filters.cursor)) if filters.cursor is not None else None

    def build(tenant: ColumnElement[str]) -> Statement:
        statement = select(*_RUN_COLUMNS).where(
            Run.tenant == tenant, *_window(Run.retrieved_at, filters)
        )
        if filters.run_id is not None:
            statement = statement.where(Run.run_id == filters.run_id)
        if filters.key_id is not None:
            statement = statement.where(Run.key_id == filters.key_id)
        if filters.document_id is not None:
            citing = (
                select(CitationRow.run_id)
                .where(CitationRow.tenant == tenant, CitationRow.document_id == filters.document_id)
                .correlate(Tenant)
            )
            statement = statement.where(Run.run_id.in_(citing))
        if after is not None:
            statement = statement.where(_after((Run.retrieved_at, Run.run_id, Run.tenant), after))
        return statement

    async with _reading(session, reader, route=route, params=filters) as reach:
        statement = _across(build, reach, _NEWEST_RUNS, filters.limit + 1)
        rows = (await session.execute(statement)).all()
    items, cursor = _page(
        rows, filters.limit, RunAuditRead, lambda r: (r.retrieved_at, r.run_id, r.tenant)
    )
    return Page[RunAuditRead](items=items, next_cursor=cursor)


_NEWEST_VERIFICATIONS: Order = (("created_at", True), ("verification_id", True), ("tenant", True))
_VERIFICATION_COLUMNS = (
    Verification.tenant,
    Verification.verification_id,
    Verification.run_id,
    Verification.key_id,
    Verification.outcome,
    Verification.code,
    Verification.claim_count,
    Verification.citation_count,
    func.jsonb_array_length(Verification.violations).label("violation_count"),
    Verification.created_at,
)
_VERIFICATION_KEY = (Verification.created_at, Verification.verification_id, Verification.tenant)


def _resting_on(tenant: ColumnElement[str], document_id: str, version: str | None) -> Statement:
    """The ids of verifications whose claims rest on a citation of the document (version)."""
    statement = (
        select(VerificationCitation.verification_id)
        .join(
            CitationRow,
            and_(
                CitationRow.tenant == VerificationCitation.tenant,
                CitationRow.citation_id == VerificationCitation.citation_id,
            ),
        )
        .where(
            VerificationCitation.tenant == tenant,
            CitationRow.tenant == tenant,
            CitationRow.document_id == document_id,
        )
        .correlate(Tenant)
    )
    if version is not None:
        statement = statement.where(CitationRow.document_version == version)
    return statement


async def list_verifications(
    session: AsyncSession, *, reader: Principal, filters: VerificationFilters, route: str
) -> Page[VerificationAuditRead]:
    """Verification attempts, newest first, by time, outcome, code, run, key or document."""
    after = _key(_decode(filters.cursor)) if filters.cursor is not None else None

    def build(tenant: ColumnElement[str]) -> Statement:
        statement = select(*_VERIFICATION_COLUMNS).where(
            Verification.tenant == tenant, *_window(Verification.created_at, filters)
        )
        for column, value in (
            (Verification.outcome, filters.outcome),
            (Verification.code, filters.code),
            (Verification.run_id, filters.run_id),
            (Verification.key_id, filters.key_id),
        ):
            if value is not None:
                statement = statement.where(column == value)
        if filters.document_id is not None:
            resting = _resting_on(tenant, filters.document_id, None)
            statement = statement.where(Verification.verification_id.in_(resting))
        if after is not None:
            statement = statement.where(_after(_VERIFICATION_KEY, after))
        return statement

    async with _reading(session, reader, route=route, params=filters) as reach:
        statement = _across(build, reach, _NEWEST_VERIFICATIONS, filters.limit + 1)
        rows = (await session.execute(statement)).all()
    items, cursor = _page(
        rows,
        filters.limit,
        VerificationAuditRead,
        lambda r: (r.created_at, r.verification_id, r.tenant),
    )
    return Page[VerificationAuditRead](items=items, next_cursor=cursor)


_NEWEST_ERASURES: Order = (("erased_at", True), ("erasure_id", True), ("tenant", True))


async def list_erasures(
    session: AsyncSession, *, reader: Principal, filters: ErasureFilters, route: str
) -> Page[ErasureAuditRead]:
    """Erasures, newest first, by time, key or document."""
    after = _key(_decode(filters.cursor)) if filters.cursor is not None else None

    def build(tenant: ColumnElement[str]) -> Statement:
        statement = select(
            Erasure.tenant,
            Erasure.erasure_id,
            Erasure.document_id,
            Erasure.versions,
            Erasure.request_ref,
            Erasure.key_id,
            Erasure.erased_at,
        ).where(Erasure.tenant == tenant, *_window(Erasure.erased_at, filters))
        if filters.document_id is not None:
            statement = statement.where(Erasure.document_id == filters.document_id)
        if filters.key_id is not None:
            statement = statement.where(Erasure.key_id == filters.key_id)
        if after is not None:
            key = (Erasure.erased_at, Erasure.erasure_id, Erasure.tenant)
            statement = statement.where(_after(key, after))
        return statement

    async with _reading(session, reader, route=route, params=filters) as reach:
        statement = _across(build, reach, _NEWEST_ERASURES, filters.limit + 1)
        rows = (await session.execute(statement)).all()
    items, cursor = _page(
        rows, filters.limit, ErasureAuditRead, lambda r: (r.erased_at, r.erasure_id, r.tenant)
    )
    return Page[ErasureAuditRead](items=items, next_cursor=cursor)


async def get_run(
    session: AsyncSession, *, reader: Principal, run_id: str, params: AuditParams, route: str
) -> RunAuditDetail:
    """One run with its citations (erased or not) and every verification of it, or NotFound."""

    def build(tenant: ColumnElement[str]) -> Statement:
        return select(*_RUN_COLUMNS).where(Run.tenant == tenant, Run.run_id == run_id)

    async with _reading(session, reader, route=route, params=params) as reach:
        run = (await session.execute(_across(build, reach, (("tenant", False),), 1))).first()
        if run is None:
            raise NotFound("no such run")
        citations = await session.execute(
            select(
                CitationRow.citation_id,
                CitationRow.ordinal,
                CitationRow.document_id,
                CitationRow.document_version,
                CitationRow.chunk_id,
                CitationRow.span_start,
                CitationRow.span_end,
                CitationRow.score,
                DocumentVersion.erased_at,
                DocumentVersion.erasure_id,
            )
            .outerjoin(
                DocumentVersion,
                and_(
                    DocumentVersion.tenant == CitationRow.tenant,
                    DocumentVersion.document_id == CitationRow.document_id,
                    DocumentVersion.version == CitationRow.document_version,
                ),
            )
            .where(CitationRow.tenant == run.tenant, CitationRow.run_id == run_id)
            .order_by(CitationRow.ordinal)
        )
        verifications = await session.execute(
            select(*_VERIFICATION_COLUMNS)
            .where(Verification.tenant == run.tenant, Verification.run_id == run_id)
            .order_by(*(column.desc() for column in _VERIFICATION_KEY))
        )
    return RunAuditDetail(
        **run._asdict(),
        citations=[
            AuditCitationRead(
                citation_id=c.citation_id,
                ordinal=c.ordinal,
                document_id=c.document_id,
                document_version=c.document_version,
                chunk_id=c.chunk_id,
                span=Span(start=c.span_start, end=c.span_end),
                score=c.score,
                erased=c.erased_at is not None,
                erased_at=c.erased_at,
                erasure_id=c.erasure_id,
            )
            for c in citations
        ],
        verifications=_validated(VerificationAuditRead, verifications.all()),
    )


async def stats(
    session: AsyncSession, *, reader: Principal, params: StatsParams, route: str
) -> StatsRead:
    """Verification counts by UTC day, tenant, outcome and code."""
    day = cast(func.timezone("UTC", Verification.created_at), Date).label("day")

    def build(tenant: ColumnElement[str]) -> Statement:
        return (
            select(
                Verification.tenant,
                day,
                Verification.outcome,
                Verification.code,
                func.count().label("count"),
            )
            .where(Verification.tenant == tenant, *_window(Verification.created_at, params))
            .group_by(Verification.tenant, day, Verification.outcome, Verification.code)
        )

    order: Order = (("day", True), ("tenant", False), ("outcome", False), ("code", False))
    async with _reading(session, reader, route=route, params=params) as reach:
        rows = (await session.execute(_across(build, reach, order, None))).all()
    return StatsRead(
        since=params.since,
        until=params.until,
        items=_validated(OutcomeCount, rows),
    )


def _rank() -> ColumnElement[int]:
    """0 for a grounded verification, else 1: grounded answers went out resting on the source."""
    return case((Verification.outcome == "grounded", 0), else_=1)


_BLAST_VERIFICATIONS: Order = (("rank", False), *_NEWEST_VERIFICATIONS)
_NEWEST_MEMORY: Order = (("created_at", True), ("memory_id", True), ("tenant", True))


def _blast_positions(cursor: str | None) -> tuple[tuple[int, Key] | None, Key | None, bool, bool]:
    """Where each list resumes, and whether each is still to be read."""
    if cursor is None:
        return None, None, True, True
    value = _decode(cursor)
    if not (isinstance(value, dict) and set(value) == {"v", "m"}):
        raise _bad_cursor()
    verifications: tuple[int, Key] | None = None
    if value["v"] is not None:
        if not (isinstance(value["v"], list) and len(value["v"]) == 2 and value["v"][0] in (0, 1)):
            raise _bad_cursor()
        verifications = (int(value["v"][0]), _key(value["v"][1]))
    memory = _key(value["m"]) if value["m"] is not None else None
    return verifications, memory, value["v"] is not None, value["m"] is not None


async def blast_radius(
    session: AsyncSession, *, reader: Principal, params: BlastRadiusParams, route: str
) -> BlastRadiusRead:
    """Every verification and memory record resting on a document (version), a page of each."""
    v_after, m_after, v_open, m_open = _blast_positions(params.cursor)
    limit = params.limit

    def verifications(tenant: ColumnElement[str]) -> Statement:
        resting = _resting_on(tenant, params.document_id, params.version)
        statement = select(*_VERIFICATION_COLUMNS, _rank().label("rank")).where(
            Verification.tenant == tenant, Verification.verification_id.in_(resting)
        )
        if v_after is not None:
            rank, key = v_after
            statement = statement.where(
                or_(
                    _rank() > rank,
                    and_(_rank() == rank, _after(_VERIFICATION_KEY, key)),
                )
            )
        return statement

    def memory(tenant: ColumnElement[str]) -> Statement:
        resting = (
            select(MemoryCitation.memory_id)
            .join(
                CitationRow,
                and_(
                    CitationRow.tenant == MemoryCitation.tenant,
                    CitationRow.citation_id == MemoryCitation.citation_id,
                ),
            )
            .where(
                MemoryCitation.tenant == tenant,
                CitationRow.tenant == tenant,
                CitationRow.document_id == params.document_id,
            )
            .correlate(Tenant)
        )
        if params.version is not None:
            resting = resting.where(CitationRow.document_version == params.version)
        statement = select(
            MemoryRecord.tenant,
            MemoryRecord.memory_id,
            MemoryRecord.key_id,
            MemoryRecord.verification_id,
            func.cardinality(MemoryRecord.citation_ids).label("citation_count"),
            MemoryRecord.created_at,
        ).where(MemoryRecord.tenant == tenant, MemoryRecord.memory_id.in_(resting))
        if m_after is not None:
            key = (MemoryRecord.created_at, MemoryRecord.memory_id, MemoryRecord.tenant)
            statement = statement.where(_after(key, m_after))
        return statement

    v_rows: Sequence[Row[Any]] = []
    m_rows: Sequence[Row[Any]] = []
    async with _reading(session, reader, route=route, params=params) as reach:
        if v_open:
            statement = _across(verifications, reach, _BLAST_VERIFICATIONS, limit + 1)
            v_rows = (await session.execute(statement)).all()
        if m_open:
            statement = _across(memory, reach, _NEWEST_MEMORY, limit + 1)
            m_rows = (await session.execute(statement)).all()
    v_next = v_rows[limit - 1] if len(v_rows) > limit else None
    m_next = m_rows[limit - 1] if len(m_rows) > limit else None
    cursor = None
    if v_next is not None or m_next is not None:
        cursor = _encode(
            {
                "v": [
                    v_next.rank,
                    _key_json((v_next.created_at, v_next.verification_id, v_next.tenant)),
                ]
                if v_next is not None
                else None,
                "m": _key_json((m_next.created_at, m_next.memory_id, m_next.tenant))
                if m_next is not None
                else None,
            }
        )
    return BlastRadiusRead(
        document_id=params.document_id,
        version=params.version,
        verifications=_validated(VerificationAuditRead, v_rows[:limit]),
        memory_records=_validated(MemoryAuditRead, m_rows[:limit]),
        next_cursor=cursor,
    )
