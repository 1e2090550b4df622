"""The resource limits (`RESOURCE_FIELDS`) are named alike wherever the console holds a workload.

Each step from the API to the driver copies them by these names, so a limit
missing from one of these would be dropped on the way (or fail at import).
"""

from __future__ import annotations

import dataclasses

from common.protocol.messages import RESOURCE_FIELDS
from jobs.api.image_serializers import LaunchPresetInputSerializer
from jobs.api.serializers import WorkloadItemSerializer, WorkloadSerializer
from jobs.models import LaunchPreset, Workload
from jobs.services.presets import PRESET_FIELDS, PresetValues
from jobs.services.spec import FILLED_BY_PRESET, WorkloadSpec


def test_every_resource_field_is_a_field_of_each_shape_of_a_workload() -> None:
    for model in (Workload, LaunchPreset):
        assert set(RESOURCE_FIELDS) <= {f.name for f in model._meta.get_fields()}, model
    for cls in (WorkloadSpec, PresetValues):
        assert set(RESOURCE_FIELDS) <= {f.name for f in dataclasses.fields(cls)}, cls
    for serializer in (WorkloadItemSerializer(), LaunchPresetInputSerializer(), WorkloadSerializer()):
        assert set(RESOURCE_FIELDS) <= set(serializer.fields), serializer
    assert set(RESOURCE_FIELDS) <= set(FILLED_BY_PRESET) <= set(PRESET_FIELDS)
