"""Admin for pipelines and policies; model validation errors show in the form."""

from __future__ import annotations

from django.contrib import admin

from orchestrator.service import PARAMETERS
from webapp.console.models import Edge, Node, Pipeline, Policy


def _policy_fieldsets() -> list[tuple[str, dict[str, object]]]:
    groups: dict[str, list[str]] = {}
    for param in PARAMETERS:
        groups.setdefault(param.mechanism, []).append(param.name)
    titles = {
        "strategy": "Strategy (layers that compose)",
        "loop": "Load-balance loop",
        "watermark": "Watermark flags (adaptive high/low water)",
        "rate": "Upstream rate coefficient and scale-out trigger",
        "routing": "Water-level rebalancing of traffic shares",
        "stepwise": "Stepwise backpressure",
        "window": "Adaptive send windows",
        "credit": "Credit-based flow control",
        "migration": "Pressure-score migration",
        "rescale": "Hot rescale",
    }
    return [(None, {"fields": ["name", "description", "is_default"]})] + [  # type: ignore[list-item]
        (titles.get(group, group), {"fields": names}) for group, names in groups.items()
    ]


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "is_default", "throttling", "routing", "migration", "updated_at"]
    search_fields = ["name"]
    fieldsets = _policy_fieldsets()


class NodeInline(admin.TabularInline):
    model = Node
    extra = 0
    fields = ["name", "kind", "stage", "operator", "params", "buffer_mb", "max_rate_mbps"]


class EdgeInline(admin.TabularInline):
    model = Edge
    extra = 0
    fields = ["source", "target", "bandwidth_mbps"]
    fk_name = "pipeline"

    def formfield_for_foreignkey(self, db_field, request, **kwargs):  # type: ignore[no-untyped-def]
        # Only this pipeline's nodes are valid endpoints.
        pipeline_id = request.resolver_match.kwargs.get("object_id")
        if db_field.name in {"source", "target"}:
            kwargs["queryset"] = Node.objects.filter(pipeline_id=pipeline_id)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    list_display = ["name", "policy", "updated_at"]
    search_fields = ["name", "description"]
    inlines = [NodeInline, EdgeInline]
