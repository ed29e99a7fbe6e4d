"""Answers of the project endpoint (docs/api.md, "Projects and environments")."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class QuotaOutput(serializers.Serializer[Any]):
    """One channel's daily quota."""

    limit = serializers.IntegerField(help_text="Messages a UTC day on this channel.")
    used = serializers.IntegerField(help_text="Counted today (sends accepted; a topic send counts its subscribers).")
    resets_at = serializers.DateTimeField(help_text="When the count starts again: the next midnight UTC.")


class ProjectOutput(serializers.Serializer[Any]):
    """The calling key's project and environment."""

    slug = serializers.CharField()
    name = serializers.CharField()
    environment = serializers.ChoiceField(choices=["live", "test"], help_text="The key's environment (its mode).")
    quotas = serializers.DictField(
        child=QuotaOutput(),
        help_text="The environment's daily quotas by channel; a channel not listed has none.",
    )
    promotion = serializers.ChoiceField(
        choices=["direct", "required"],
        help_text="`required`: live's templates, layouts and workflows change only by promotion from test.",
    )
