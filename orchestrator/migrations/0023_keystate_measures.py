"""A stateful instance's state as its measures' partial states (JSON) instead of four
numeric columns: a stage of grouped measures keeps any measure, and a ``key``/``value``
stage's count, sum, min and max are the measures of those names."""

from django.db import migrations, models

# The four columns as the measures count, sum, min and max keep them (decimals as text).
_TO_STATES = """
    UPDATE orchestrator_keystate SET
      records = count,
      states = jsonb_build_object(
        'count', count, 'sum', sum::text, 'min', min::text, 'max', max::text)
"""
_FROM_STATES = """
    UPDATE orchestrator_keystate SET
      count = records,
      sum = (states->>'sum')::numeric,
      min = (states->>'min')::numeric,
      max = (states->>'max')::numeric
"""
# Only a key/value stage's state has a form to go back to.
_ONLY_KEY_FORM = """
    DO $$ BEGIN
      IF EXISTS (SELECT 1 FROM orchestrator_keystate
                 WHERE NOT states ?& ARRAY['count', 'sum', 'min', 'max']) THEN
        RAISE EXCEPTION 'orchestrator_keystate holds grouped measures, which the four '
          'columns cannot keep: delete those runs first';
      END IF;
    END $$
"""


class Migration(migrations.Migration):
    dependencies = [("orchestrator", "0022_seen_records_keyed_by_digest")]

    operations = [
        migrations.AddField(
            model_name="keystate",
            name="states",
            field=models.JSONField(
                default=dict, help_text="Each measure's partial state, by its name."
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="keystate",
            name="records",
            field=models.BigIntegerField(default=0, help_text="The records the state holds."),
            preserve_default=False,
        ),
        # Back: the columns are added again (nullable), refilled, then made required.
        migrations.AlterField(
            model_name="keystate", name="count", field=models.BigIntegerField(null=True)
        ),
        migrations.AlterField(
            model_name="keystate",
            name="sum",
            field=models.DecimalField(max_digits=38, decimal_places=10, null=True),
        ),
        migrations.AlterField(
            model_name="keystate",
            name="min",
            field=models.DecimalField(max_digits=38, decimal_places=10, null=True),
        ),
        migrations.AlterField(
            model_name="keystate",
            name="max",
            field=models.DecimalField(max_digits=38, decimal_places=10, null=True),
        ),
        migrations.RunSQL(_TO_STATES, reverse_sql=[_ONLY_KEY_FORM, _FROM_STATES]),
        migrations.RemoveField(model_name="keystate", name="count"),
        migrations.RemoveField(model_name="keystate", name="sum"),
        migrations.RemoveField(model_name="keystate", name="min"),
        migrations.RemoveField(model_name="keystate", name="max"),
        migrations.AlterField(
            model_name="keystate",
            name="key",
            field=models.CharField(
                help_text="The key; of grouped measures, the SHA-256 of the group's values "
                "as JSON.",
                max_length=500,
            ),
        ),
        migrations.AlterField(
            model_name="keystate",
            name="slot",
            field=models.PositiveSmallIntegerField(
                help_text="Key-space slot: crc32(key, or the group's values) mod slots."
            ),
        ),
    ]
