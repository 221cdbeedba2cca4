"""The chaos suite runs real local jobs the way the end-to-end tests do: their fixtures."""
from elasticdl_tests.e2e.conftest import cli, fashion_mnist  # noqa: F401  (pytest fixtures)
