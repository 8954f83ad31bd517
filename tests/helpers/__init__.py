"""Plain helpers shared by test modules (builders used at module level, e.g. in parametrize lists).

Not test modules and not fixtures: fixtures live in conftest.py files, and no test module imports another
test module or a conftest.py (tests/test_test_layout.py checks both). Import as `from tests.helpers.X import Y`.
"""
