from django.db import migrations

# A key's distinct set is stored out of line and uncompressed (ADR 0010, Consequences):
# compressing a merge's new arrays took the sink's statement 40% of its time.
TABLES = ('orchestrator_resultkey', 'orchestrator_windowkey')


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0012_result_sets_in_rows'),
    ]

    operations = [
        migrations.RunSQL(
            sql=[f'ALTER TABLE {table} ALTER COLUMN "values" SET STORAGE EXTERNAL' for table in TABLES],
            reverse_sql=[
                f'ALTER TABLE {table} ALTER COLUMN "values" SET STORAGE EXTENDED' for table in TABLES
            ],
        ),
    ]
