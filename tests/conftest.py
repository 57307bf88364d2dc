from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# CI profile: derandomized (same examples every run), bounded, no wall-clock deadline on a noisy
# 2-core machine. `HYPOTHESIS_PROFILE=dev` explores more.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,  # no replay of examples saved by earlier runs: CI sees exactly the same examples
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
