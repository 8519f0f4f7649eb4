"""Request-scoped dependencies: settings, a PostgreSQL connection from the pool, Redis, the
merged view and the metrics registry — all built once by the app factory."""

from __future__ import annotations

from typing import Annotated, NamedTuple

from fastapi import Depends, Request

from serving_layer.merged_view import MergedView
from serving_layer.observability import ServingMetrics
from serving_layer.pools import AsyncDb, Db
from shared.config import Settings


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_db(request: Request) -> Db:
    db: Db = request.app.state.db
    return db


async def get_batch_view_db(request: Request) -> Db:
    """The blocking pool on the batch view (a streaming replica when configured)."""
    db: Db = request.app.state.view_db
    return db


async def get_async_db(request: Request) -> AsyncDb:
    db: AsyncDb = request.app.state.async_db
    return db


async def get_view(request: Request) -> MergedView:
    view: MergedView = request.app.state.view
    return view


async def get_observer(request: Request) -> ServingMetrics:
    metrics: ServingMetrics = request.app.state.metrics
    return metrics


class QueryContext(NamedTuple):
    """What a query route reads with, as one dependency: FastAPI solves every `Depends` of a
    route on each request (tens of microseconds each), and every query route needs all four."""

    settings: Settings
    db: AsyncDb
    view: MergedView
    observer: ServingMetrics


async def get_query_context(request: Request) -> QueryContext:
    state = request.app.state
    return QueryContext(state.settings, state.async_db, state.view, state.metrics)


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Db, Depends(get_db)]
BatchViewDbDep = Annotated[Db, Depends(get_batch_view_db)]
AsyncDbDep = Annotated[AsyncDb, Depends(get_async_db)]
ViewDep = Annotated[MergedView, Depends(get_view)]
ObserverDep = Annotated[ServingMetrics, Depends(get_observer)]
QueryDep = Annotated[QueryContext, Depends(get_query_context)]
