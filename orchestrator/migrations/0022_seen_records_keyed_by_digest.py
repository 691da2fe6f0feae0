"""Seen records keyed by (run, stage, digest) with the digest a UUID: a table built
anew beside the old one, its rows copied, the old one dropped (Django does not turn a
table's single primary key into a composite one in place)."""

import django.contrib.postgres.indexes
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0021_seen_records"),
    ]

    operations = [
        migrations.RenameModel("SeenRecord", "SeenRecordBefore"),
        migrations.CreateModel(
            name="SeenRecord",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "run",
                        "stage",
                        "digest",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("stage", models.CharField(max_length=100)),
                ("digest", models.UUIDField()),
                ("kept_at", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="seen_records",
                        to="orchestrator.run",
                    ),
                ),
            ],
            options={
                "indexes": [
                    django.contrib.postgres.indexes.BrinIndex(
                        fields=["kept_at"], name="seen_record_kept_at"
                    )
                ],
            },
        ),
        migrations.RunSQL(
            "INSERT INTO orchestrator_seenrecord (run_id, stage, digest, kept_at)"
            " SELECT run_id, stage, digest::uuid, kept_at FROM orchestrator_seenrecordbefore",
            reverse_sql="INSERT INTO orchestrator_seenrecordbefore (run_id, stage, digest, kept_at)"
            " SELECT run_id, stage, replace(digest::text, '-', ''), kept_at"
            " FROM orchestrator_seenrecord",
        ),
        migrations.DeleteModel("SeenRecordBefore"),
    ]
