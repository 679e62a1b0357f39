"""Alembic migrations for orchard-rec's schema, run by ``orchard-rec db upgrade``."""
