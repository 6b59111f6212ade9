"""The test suite (a package, so that tests and conftest.py share one module: `from tests.conftest import ...`)."""
