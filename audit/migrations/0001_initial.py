from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="AuditEntry",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "actor_type",
                    models.CharField(
                        choices=[("client", "Client"), ("staff", "Staff"), ("recipient", "Recipient"), ("system", "System")],
                        max_length=16,
                    ),
                ),
                ("actor_id", models.CharField(blank=True, default="", max_length=64)),
                ("actor_name", models.CharField(blank=True, default="", max_length=150)),
                ("action", models.CharField(max_length=64)),
                ("target_type", models.CharField(max_length=64)),
                ("target_id", models.CharField(blank=True, default="", max_length=255)),
                ("changes", models.JSONField(blank=True, default=dict)),
            ],
            options={
                "verbose_name": "audit entry",
                "verbose_name_plural": "audit entries",
                "indexes": [models.Index(fields=["target_type", "target_id", "-at"], name="audit_target_idx")],
            },
        ),
    ]
