"""structlog set-up for the broker process: JSON lines off a terminal, readable on one.

Only the process entry point calls :func:`configure`; library code just asks for a logger.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(*, json: bool | None = None, level: int = logging.INFO) -> None:
    """Configure structlog once for this process (``json`` defaults to "not a terminal")."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A bound logger tagged with the component ``name``."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name)
    return logger
