"""The one list shape of the API: ``Page[T]`` with its ``limit`` / ``offset`` query parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

from fastapi import Depends, Query
from pydantic import Field

from steady.server.kit.wire import WireModel

T = TypeVar("T")

MAX_LIMIT = 500
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class PageParams:
    limit: int = DEFAULT_LIMIT
    offset: int = 0


def page_params(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="items per page")] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, description="items to skip")] = 0,
) -> PageParams:
    return PageParams(limit=limit, offset=offset)


PageQuery = Annotated[PageParams, Depends(page_params)]


class Page(WireModel, Generic[T]):
    """One page of a list: the next page is ``offset + limit``; there is none once that reaches ``total``."""

    items: list[T]
    total: int = Field(description="items matching the filters, over all pages")
    limit: int
    offset: int

    @classmethod
    def of(cls, items: list[T], total: int, params: PageParams) -> Page[T]:
        return cls(items=items, total=total, limit=params.limit, offset=params.offset)
