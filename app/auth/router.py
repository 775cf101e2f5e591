from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Request, status
from pydantic import BaseModel, Field

from steady.server.kit import auth as service
from steady.server.kit.auth import Role
from steady.server.kit.deps import AdminCaller, ReadDB, WriteDB, forget_tokens
from steady.server.kit.errors import NotFound
from steady.server.kit.pagination import Page, PageQuery

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


class TokenIn(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    role: Role


class TokenOut(BaseModel):
    id: int
    name: str
    role: Role
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="the secret; shown once, store it now")


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(body: TokenIn, db: WriteDB, caller: AdminCaller) -> TokenCreated:
    row, secret = service.create_token(db, name=body.name, role=body.role)
    return TokenCreated(**TokenOut.model_validate(row, from_attributes=True).model_dump(), token=secret)


@router.get("", response_model=Page[TokenOut])
def list_tokens(db: ReadDB, caller: AdminCaller, page: PageQuery) -> Page[TokenOut]:
    rows, total = service.tokens_page(db, limit=page.limit, offset=page.offset)
    return Page.of([TokenOut.model_validate(r, from_attributes=True) for r in rows], total, page)


@router.delete("/{token_id}", response_model=TokenOut)
def revoke_token(token_id: int, request: Request, caller: AdminCaller) -> TokenOut:
    # Refused at once by this API process, within STEADY_TOKEN_CACHE_SECONDS by the others.
    with request.app.state.database.write() as db:  # committed before this process forgets the token
        row = service.revoke_token(db, token_id)
        if row is None:
            raise NotFound(f"token {token_id} not found")
        out = TokenOut.model_validate(row, from_attributes=True)
    forget_tokens(request)
    return out
