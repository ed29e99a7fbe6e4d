"""Routes of the inbox in a browser, at the root: /inbox/v1/ (inbox token only) and the demo page."""

from __future__ import annotations

from django.urls import path

from notifier.inbox import browser

urlpatterns = [
    path("inbox/v1/messages", browser.BrowserInboxListApi.as_view(), name="browser-inbox"),
    path("inbox/v1/messages/read-all", browser.BrowserInboxReadAllApi.as_view(), name="browser-inbox-read-all"),
    path("inbox/v1/messages/<id:delivery_id>/read", browser.BrowserInboxReadApi.as_view(), name="browser-inbox-read"),
    path(
        "inbox/v1/messages/<id:delivery_id>/archive",
        browser.BrowserInboxArchiveApi.as_view(),
        name="browser-inbox-archive",
    ),
    path(
        "inbox/v1/messages/<id:delivery_id>/unarchive",
        browser.BrowserInboxUnarchiveApi.as_view(),
        name="browser-inbox-unarchive",
    ),
    path(
        "inbox/v1/messages/<id:delivery_id>/click", browser.BrowserInboxClickApi.as_view(), name="browser-inbox-click"
    ),
    path("inbox/v1/me", browser.BrowserInboxMeApi.as_view(), name="browser-inbox-me"),
    path("inbox/v1/widget.js", browser.widget_js, name="browser-inbox-widget"),
    path("inbox/demo/", browser.demo_page, name="browser-inbox-demo"),
]
