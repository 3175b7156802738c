"""Optional integrations, each behind its own extra and imported only on demand.

* :mod:`pgdurable.contrib.sqlalchemy` -- start runs and send signals inside a
  SQLAlchemy transaction; :mod:`pgdurable.contrib.sqlalchemy.tables` -- ``Table``
  objects for the pgdurable schema (``pip install 'pgdurable[sqlalchemy]'``).
* :mod:`pgdurable.contrib.alembic` -- apply pgdurable's migrations from an
  Alembic revision.

* :mod:`pgdurable.contrib.langgraph` -- LangGraph checkpointers with one
  writer per thread, retention and durable graph runs
  (``pip install 'pgdurable[langgraph]'``).
* :mod:`pgdurable.contrib.openai_agents` -- an OpenAI Agents SDK session and
  durable agent runs (``pip install 'pgdurable[openai-agents]'``).

``import pgdurable`` never imports these modules (nor SQLAlchemy, LangGraph or
the Agents SDK).
"""
