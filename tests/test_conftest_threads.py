"""MRCNN_TEST_THREADS: torch's threads in the test process, from ``make unit UNIT_THREADS=N``."""

from __future__ import annotations

import os

import pytest

from tests.conftest import _test_threads


def test_unset_or_empty_means_up_to_two(monkeypatch):
    monkeypatch.delenv("MRCNN_TEST_THREADS", raising=False)
    assert _test_threads() == max(1, min(2, os.cpu_count() or 1))
    monkeypatch.setenv("MRCNN_TEST_THREADS", "")  # `make unit` without UNIT_THREADS passes it empty
    assert _test_threads() == max(1, min(2, os.cpu_count() or 1))


def test_a_count_is_taken_and_anything_else_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("MRCNN_TEST_THREADS", "3")
    assert _test_threads() == 3
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("MRCNN_TEST_THREADS", bad)
        with pytest.raises(pytest.UsageError, match=f"MRCNN_TEST_THREADS must be a whole number >= 1, not '{bad}'"):
            _test_threads()
