"""GPU telemetry's memory is in MiB, and its columns say so (`memory_used_mib`, as the GPU's `memory_mib`)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("inventory", "0011_memory_mib")]

    operations = [
        migrations.RenameField(model_name="gpu", old_name="memory_used_mb", new_name="memory_used_mib"),
        migrations.RenameField(model_name="gpuminute", old_name="memory_used_max_mb", new_name="memory_used_max_mib"),
    ]
