"""Routes of the in-app inbox, included by the root URL conf under `/api/v1/`."""

from __future__ import annotations

from django.urls import path

from notifier.inbox.apis import (
    InboxItemArchiveApi,
    InboxItemClickApi,
    InboxItemReadApi,
    InboxItemUnarchiveApi,
    InboxListApi,
    InboxReadAllApi,
)
from notifier.inbox.browser import InboxTokenApi

urlpatterns = [
    path("recipients/<str:user_id>/inbox", InboxListApi.as_view(), name="inbox"),
    path("recipients/<str:user_id>/inbox/read-all", InboxReadAllApi.as_view(), name="inbox-read-all"),
    path("recipients/<str:user_id>/inbox/<id:delivery_id>/read", InboxItemReadApi.as_view(), name="inbox-read"),
    path(
        "recipients/<str:user_id>/inbox/<id:delivery_id>/archive", InboxItemArchiveApi.as_view(), name="inbox-archive"
    ),
    path(
        "recipients/<str:user_id>/inbox/<id:delivery_id>/unarchive",
        InboxItemUnarchiveApi.as_view(),
        name="inbox-unarchive",
    ),
    path("recipients/<str:user_id>/inbox/<id:delivery_id>/click", InboxItemClickApi.as_view(), name="inbox-click"),
    path("recipients/<str:user_id>/inbox-token", InboxTokenApi.as_view(), name="inbox-token"),
]
