"""Templates and their immutable, numbered versions."""

from __future__ import annotations

from django.db import models

from core.chat import CHAT_CHANNELS, CHAT_PART
from projects.scoping import OwnedManager, owner_field


class Template(models.Model):
    """A message template addressed by `key`; its content lives in versions."""

    environment = owner_field()

    key = models.SlugField(max_length=128)
    category = models.CharField(max_length=64)
    default_locale = models.CharField(max_length=35, default="en")
    description = models.TextField(blank=True, default="")
    # Who made it: the API client that created it over the API, or null for staff (the admin, bootstrap_demo).
    # Information only: every key of the environment with the `templates` scope may change it. A plain id, not
    # a foreign key: API clients live in notifier, which sits above this app.
    owner_client_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    # The version used when a request does not pin one. Only a published version is ever used.
    published_version = models.ForeignKey(
        "TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["environment", "key"], name="template_environment_key_uniq")]
        permissions = [
            ("publish_template", "Can publish a template version (or roll back to an older one)"),
            ("edit_optional_templates_only", "Can see and edit only templates of optional categories"),
        ]

    def __str__(self) -> str:
        return self.key


class TemplateVersion(models.Model):
    """One immutable version: per locale, the parts of each channel (see docs/templates.md)."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    content = models.JSONField()
    # The key of the email layout this version's HTML is placed in; empty: the category's default, if any.
    layout = models.CharField(max_length=128, blank=True, default="")
    published_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("template__environment_id")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["template", "version"], name="template_version_uniq")]
        ordering = ["template_id", "-version"]

    def __str__(self) -> str:
        return f"{self.template.key}@{self.version}"

    @property
    def channels(self) -> list[str]:
        """Return the channels this version serves: those present in its default locale (`chat`: every network)."""
        keys = (self.content.get(self.template.default_locale) or {}).keys()
        if CHAT_PART not in keys:
            return sorted(keys)  # most templates: no chat part to spread over the networks
        return sorted({channel for key in keys for channel in (CHAT_CHANNELS if key == CHAT_PART else (key,))})


class Layout(models.Model):
    """An email layout addressed by `key`: the frame (header, footer, styles) a template's HTML is placed in."""

    environment = owner_field()

    key = models.SlugField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["environment", "key"], name="layout_environment_key_uniq")]

    def __str__(self) -> str:
        return self.key


class LayoutVersion(models.Model):
    """One immutable version of a layout; the newest one is the one used."""

    layout = models.ForeignKey(Layout, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    html = models.TextField()
    text = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("layout__environment_id")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["layout", "version"], name="layout_version_uniq")]
        ordering = ["layout_id", "-version"]

    def __str__(self) -> str:
        return f"{self.layout.key}@{self.version}"
