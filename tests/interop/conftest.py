"""Fixtures shared by the interop test modules."""

from tests.interop.test_interop import client_env

__all__ = ["client_env"]
