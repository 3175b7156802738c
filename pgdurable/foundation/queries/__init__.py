"""Every statement the package sends, named, one module per noun, with typed results.

Each module here holds the SQL of one noun (``children``, ``fork``, ``threads``,
``schedules``, ``retention``, ...): every statement is a :class:`~.core.Query`
with a one-line contract comment (what it does, what it returns), and its rows
are decoded once, in that module, into a frozen dataclass (or a scalar through
:func:`~.core.scalar`). The modules above call a query and get records; this
package is the only place that reads a row by position
(``tests/test_no_positional_rows.py``).
"""
