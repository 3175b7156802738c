"""Optional integrations, each behind its own extra and imported only on demand.

* :mod:`pgdurable.contrib.sqlalchemy` -- start runs and send signals inside a
  SQLAlchemy transaction; :mod:`pgdurable.contrib.sqlalchemy.tables` -- ``Table``
  objects for the pgdurable schema (``pip install 'pgdurable[sqlalchemy]'``).
* :mod:`pgdurable.contrib.alembic` -- apply pgdurable's migrations from an
  Alembic revision.

``import pgdurable`` never imports these modules (nor SQLAlchemy).
"""
