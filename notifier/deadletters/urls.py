"""Routes of the dead-letter endpoints, included by notifier.urls under /api/v1/."""

from __future__ import annotations

from django.urls import path

from notifier.deadletters import apis

urlpatterns = [
    path("dead-letters", apis.DeadLetterListApi.as_view(), name="dead-letters"),
    path("dead-letters/replay", apis.DeadLetterBulkReplayApi.as_view(), name="dead-letters-replay"),
    path("dead-letters/<id:dead_letter_id>/replay", apis.DeadLetterReplayApi.as_view(), name="dead-letter-replay"),
    path("dead-letters/<id:dead_letter_id>/discard", apis.DeadLetterDiscardApi.as_view(), name="dead-letter-discard"),
]
