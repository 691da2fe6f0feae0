"""Admin for pipelines and policies; model validation errors show in the form."""

from __future__ import annotations

from django.contrib import admin

from orchestrator.service import PARAMETERS
from webapp.console.models import Edge, Node, Pipeline, Policy
from webapp.console.roles import has_role


class ConsoleAdminRole:
    """The console's admins (role ``admin``) manage policies and pipelines here without
    Django's per-model permissions; others keep whatever Django grants them."""

    def has_module_permission(self, request):  # type: ignore[no-untyped-def]
        return has_role(request.user, "admin") or super().has_module_permission(request)  # type: ignore[misc]

    def has_view_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return has_role(request.user, "admin") or super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return has_role(request.user, "admin") or super().has_add_permission(request)  # type: ignore[misc]

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return has_role(request.user, "admin") or super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return has_role(request.user, "admin") or super().has_delete_permission(request, obj)  # type: ignore[misc]


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
        "runtime": "Runtime (batches that keep failing)",
    }
    return [(None, {"fields": ["name", "description", "is_default"]})] + [  # type: ignore[list-item]
        (titles.get(group, group), {"fields": names}) for group, names in groups.items()
    ]


@admin.register(Policy)
class PolicyAdmin(ConsoleAdminRole, admin.ModelAdmin):
    list_display = ["name", "is_default", "throttling", "routing", "migration", "updated_at"]
    search_fields = ["name"]
    fieldsets = _policy_fieldsets()


class _ReadOnlyInline(ConsoleAdminRole, admin.TabularInline):
    """Nodes and edges change only as a whole topology (load_topology or the editor),
    where cycles, dangling edges and missing sinks are checked before anything is saved;
    row-by-row admin edits could leave a broken graph behind."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


class NodeInline(_ReadOnlyInline):
    model = Node
    fields = ["name", "kind", "stage", "operator", "params", "buffer_mb", "max_rate_mbps"]


class EdgeInline(_ReadOnlyInline):
    model = Edge
    fk_name = "pipeline"
    fields = ["source", "target", "bandwidth_mbps"]


@admin.register(Pipeline)
class PipelineAdmin(ConsoleAdminRole, admin.ModelAdmin):
    list_display = ["name", "policy", "updated_at"]
    search_fields = ["name", "description"]
    inlines = [NodeInline, EdgeInline]
