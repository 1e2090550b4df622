"""Node and GPU memory are in MiB, and their columns say so (`memory_mib`, as a workload's request does)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("inventory", "0010_pool_usage_half_life")]

    operations = [
        migrations.RenameField(model_name="node", old_name="memory_mb", new_name="memory_mib"),
        migrations.RenameField(model_name="gpu", old_name="memory_mb", new_name="memory_mib"),
    ]
