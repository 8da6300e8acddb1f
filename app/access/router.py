"""Admin endpoints: tenants and API keys."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.access import service as access
from app.access.auth import AdminKey
from app.access.schemas import KeyCreate, KeyCreated, KeyRead, TenantCreate, TenantRead
from app.bodies import JSONBodyRoute
from app.db import SessionDep

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=JSONBodyRoute)


@router.post(
    "/tenants",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": TenantRead, "description": "The tenant existed already"}},
)
async def create_tenant(
    body: TenantCreate, response: Response, session: SessionDep, _: AdminKey
) -> TenantRead:
    tenant, created = await access.create_tenant(session, name=body.name)
    if not created:
        response.status_code = status.HTTP_200_OK
    return TenantRead.model_validate(tenant, from_attributes=True)


@router.post("/keys", status_code=status.HTTP_201_CREATED)
async def create_key(body: KeyCreate, session: SessionDep, _: AdminKey) -> KeyCreated:
    issued = await access.create_key(session, tenant=body.tenant, scopes=list(body.scopes))
    read = KeyRead.model_validate(issued.key, from_attributes=True)
    return KeyCreated(**read.model_dump(), secret=issued.secret)


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, session: SessionDep, _: AdminKey) -> KeyRead:
    key = await access.revoke_key(session, key_id=key_id)
    return KeyRead.model_validate(key, from_attributes=True)
