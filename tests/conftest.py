"""Shared test configuration.

The machines are shared and noisy, so Hypothesis runs without per-example deadlines;
``HYPOTHESIS_PROFILE=thorough`` raises the example counts for a longer local run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
