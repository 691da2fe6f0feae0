"""The three roles as groups, and the shipped default policy."""

from django.db import migrations

ROLES = ("viewer", "operator", "admin")


def forwards(apps, schema_editor):
    group = apps.get_model("auth", "Group")
    for role in ROLES:
        group.objects.get_or_create(name=role)
    policy = apps.get_model("console", "Policy")
    if not policy.objects.filter(is_default=True).exists():
        # Field defaults are the shipped values (balancer/policy.py).
        policy.objects.create(name="default", is_default=True, description="Shipped defaults.")


def backwards(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
