"""Serving layer: FastAPI merging the batch view (PostgreSQL) and the speed view (Redis)."""

from serving_layer.app import create_app, run_server

__all__ = ["create_app", "run_server"]
