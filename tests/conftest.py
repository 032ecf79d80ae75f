"""Suite-wide settings: hypothesis runs derandomized in CI (CI=true) so a submission's
result does not depend on the draw; locally it explores new examples every run."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
