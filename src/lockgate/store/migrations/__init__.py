"""Alembic migrations of lockgate's schema (``versions/``), run by ``Store.migrate``, and
the steps they are made of (:mod:`.steps`)."""
