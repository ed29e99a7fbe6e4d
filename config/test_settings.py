"""Settings of the test suite: the project's own, in development mode (named by pyproject's pytest options).

Development mode lets the suite run without a SECRET_KEY. It is set in the environment, not only here, so
that the workers, API servers and beat processes the tests start inherit it.
"""

from __future__ import annotations

import os

os.environ.setdefault("DEVELOPMENT", "true")
# Tests wait for Celery's per-task lines in worker logs (a task succeeded, a retry was scheduled).
os.environ.setdefault("CELERY_TASK_LOGS", "true")

from config.settings import *  # noqa: F403
