"""Helpers shared by several test modules: inputs, references and comparisons (no tests here).

Test modules import from here (``from tests.helpers.training import small_cfg``), never from one
another; fixtures shared by several modules live in the ``conftest.py`` beside them.
"""
