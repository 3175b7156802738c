"""pgdurable.contrib.langgraph: the official conformance suite, leases, retention."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from pgdurable.contrib.langgraph import AsyncPgDurableSaver, PgDurableSaver


def _assert_all_passed(report: Any) -> None:
    for cap in ALL_CAPABILITIES:
        result = report.results[cap.value]
        assert result.detected, f"{cap.value} not detected"
        assert result.passed, f"{cap.value}: {result.failures}"
        assert result.tests_passed > 0 and result.tests_failed == 0, cap.value


async def test_conformance_async_saver(dsn: str) -> None:
    @checkpointer_test(name="AsyncPgDurableSaver")
    async def factory() -> AsyncGenerator[AsyncPgDurableSaver, None]:
        async with AsyncPgDurableSaver(dsn) as saver:
            yield saver

    _assert_all_passed(await validate(factory))


async def test_conformance_sync_saver(dsn: str) -> None:
    @checkpointer_test(name="PgDurableSaver")
    async def factory() -> AsyncGenerator[PgDurableSaver, None]:
        with PgDurableSaver(dsn) as saver:
            yield saver

    _assert_all_passed(await validate(factory))
