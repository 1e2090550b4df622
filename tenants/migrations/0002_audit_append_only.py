"""Make the audit log append-only in the database itself (see tenants.audit_guard)."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from tenants import audit_guard


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    audit_guard.install(schema_editor.connection)


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    audit_guard.remove(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
