from django.db import migrations

# A group's measure states (a distinct count's set among them) are stored out of line
# and uncompressed, as a key's set is (ADR 0010, Consequences): a sink batch rewrites
# the states of every group it brings data, and compressing them took its statement a
# third of its time (docs/benchmarks.md, "Grouped measures against Spark SQL").


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0019_refreshed_references'),
    ]

    operations = [
        migrations.RunSQL(
            sql='ALTER TABLE orchestrator_resultgroup ALTER COLUMN states SET STORAGE EXTERNAL',
            reverse_sql=(
                'ALTER TABLE orchestrator_resultgroup ALTER COLUMN states SET STORAGE EXTENDED'
            ),
        ),
    ]
