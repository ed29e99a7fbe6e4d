"""Templates and their immutable, numbered versions."""

from __future__ import annotations

from django.db import models


class Template(models.Model):
    """A message template addressed by `key`; its content lives in versions."""

    key = models.SlugField(max_length=128, unique=True)
    category = models.CharField(max_length=64)
    default_locale = models.CharField(max_length=35, default="en")
    description = models.TextField(blank=True, default="")
    # The version used when a request does not pin one. Only a published version is ever used.
    published_version = models.ForeignKey(
        "TemplateVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        permissions = [
            ("publish_template", "Can publish a template version (or roll back to an older one)"),
            ("edit_optional_templates_only", "Can see and edit only templates of optional categories"),
        ]

    def __str__(self) -> str:
        return self.key


class TemplateVersion(models.Model):
    """One immutable version: per locale, the parts of each channel (see API.md)."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    content = models.JSONField()
    published_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["template", "version"], name="template_version_uniq")]
        ordering = ["template_id", "-version"]

    def __str__(self) -> str:
        return f"{self.template.key}@{self.version}"

    @property
    def channels(self) -> list[str]:
        """Return the channels this version serves: those present in its default locale."""
        return sorted((self.content.get(self.template.default_locale) or {}).keys())
