"""Routes of the provider callbacks, included by the root URL conf at `/callbacks/`."""

from __future__ import annotations

from django.urls import path

from notifier.callbacks.apis import SesCallbackApi, TwilioCallbackApi

app_name = "callbacks"

urlpatterns = [
    path("ses", SesCallbackApi.as_view(), name="ses"),
    path("twilio", TwilioCallbackApi.as_view(), name="twilio"),
]
