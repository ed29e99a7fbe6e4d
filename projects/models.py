"""Projects and their two environments: the owners of everything an API key makes or reads.

A project is one product or team served by the installation (what GOV.UK Notify calls a service). It has a
`test` and a `live` environment; every API key belongs to one of them, and so does every row the key makes.
The owner column of an owned table is `environment_id` (docs/projects.md lists which tables carry it and which
are owned through their parent row).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

# The environments of the project `default`, made by the migration with these ids so that the owner columns
# added to existing tables can take a constant default (a metadata-only change, even on the partitioned tables).
DEFAULT_LIVE_ENVIRONMENT_ID = 1
DEFAULT_TEST_ENVIRONMENT_ID = 2
DEFAULT_PROJECT_SLUG = "default"


class Project(models.Model):
    """One product or team: its environments, settings, quotas and staff members."""

    class Promotion(models.TextChoices):
        # Live's templates, layouts and workflows may be changed directly (what callers did before projects).
        DIRECT = "direct"
        # Live changes only by promotion from test: a live key's PUT is a 409 `promotion_required`.
        REQUIRED = "required"

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=255)
    promotion = models.CharField(max_length=8, choices=Promotion.choices, default=Promotion.DIRECT)
    # Sender identities; empty: the installation's (EMAIL_FROM, SMS_FROM, ...).
    email_from = models.CharField(max_length=320, blank=True, default="")
    email_reply_to = models.CharField(max_length=320, blank=True, default="")
    sms_sender = models.CharField(max_length=32, blank=True, default="")
    # The email layout (a key of this project's layouts) used where neither the template nor its category names one.
    default_layout = models.CharField(max_length=128, blank=True, default="")
    # Requests per period over all of the project's keys ("1000/s"); empty: no project-wide limit.
    rate_limit = models.CharField(max_length=32, blank=True, default="")
    # Provider accounts by channel ({"email": "ses-eu"}), names of PROVIDER_ACCOUNTS (secrets stay in the
    # environment); a channel not named uses the installation's providers.
    provider_accounts = models.JSONField(default=dict, blank=True)
    # A project's share of a channel's sending capacity when several projects want it at once.
    weight = models.PositiveSmallIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Environment(models.Model):
    """The `test` or `live` half of a project: the owner of what its keys make."""

    class Name(models.TextChoices):
        LIVE = "live"
        TEST = "test"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="environments")
    name = models.CharField(max_length=4, choices=Name.choices)
    # Daily limits per channel ({"email": 10000}); a channel not named has none. Counted per UTC day.
    quotas = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="environment_project_name_uniq")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}" if self.project_id else self.name


class Membership(models.Model):
    """A staff user's role in one project: what the admin shows and lets them change."""

    class Role(models.TextChoices):
        SUPPORT = "support"
        MARKETING = "marketing"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "project"], name="membership_user_project_uniq")]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.project_id}:{self.role}"
