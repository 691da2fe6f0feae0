"""Admin for pipelines, policies, sinks' owners and the operator quota; model validation
errors show in the form."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from orchestrator.models import OperatorQuota, SinkOwner
from orchestrator.service import PARAMETERS
from webapp.console.models import Edge, Node, Pipeline, Policy
from webapp.console.roles import has_role

if TYPE_CHECKING:
    from django.contrib.admin.options import BaseModelAdmin, _FieldsetSpec
    from django.utils.datastructures import _ListOrTuple

    # django-stubs make the admin classes generic in their models; Django's own are not
    # subscriptable at run time, so the parameters exist for the type checker only.
    _AdminRoleBase = BaseModelAdmin[Model]
    _PolicyModelAdmin = admin.ModelAdmin[Policy]
    _PipelineModelAdmin = admin.ModelAdmin[Pipeline]
    _SinkOwnerModelAdmin = admin.ModelAdmin[SinkOwner]
    _QuotaModelAdmin = admin.ModelAdmin[OperatorQuota]
    _PipelineInline = admin.TabularInline[Node | Edge, Pipeline]
else:
    # The mixin's super() calls reach the admin class it is mixed into.
    _AdminRoleBase = object
    _PolicyModelAdmin = _PipelineModelAdmin = admin.ModelAdmin
    _SinkOwnerModelAdmin = _QuotaModelAdmin = admin.ModelAdmin
    _PipelineInline = admin.TabularInline


class ConsoleAdminRole(_AdminRoleBase):
    """The console's admins (role ``admin``) manage policies and pipelines here without
    Django's per-model permissions; others keep whatever Django grants them."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, "admin") or super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return has_role(request.user, "admin") or super().has_view_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, "admin") or super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return has_role(request.user, "admin") or super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return has_role(request.user, "admin") or super().has_delete_permission(request, obj)


def _policy_fieldsets() -> _FieldsetSpec:
    # Each section's fields typed as django-stubs type a fieldset's: lists are invariant.
    groups: dict[str, list[str | _ListOrTuple[str]]] = {}
    for param in PARAMETERS:
        groups.setdefault(param.mechanism, []).append(param.name)
    titles = {
        "strategy": "Strategy (layers that compose)",
        "loop": "Load-balance loop",
        "watermark": "Watermark flags (adaptive high/low water)",
        "rate": "Upstream rate coefficient and scale-out trigger",
        "scaling": "Scale-out sized from measured rates",
        "routing": "Water-level rebalancing of traffic shares",
        "stepwise": "Stepwise backpressure",
        "window": "Adaptive send windows",
        "credit": "Credit-based flow control",
        "migration": "Pressure-score migration",
        "rescale": "Hot rescale",
        "elastic": "Elastic Spark workers (a placed run's scale-in)",
        "runtime": "Runtime (batches that keep failing)",
    }
    sections: list[tuple[str | None, list[str | _ListOrTuple[str]]]] = [
        (None, ["name", "description", "is_default"])
    ]
    sections += [(titles.get(group, group), names) for group, names in groups.items()]
    return [(title, {"fields": names}) for title, names in sections]


@admin.register(Policy)
class PolicyAdmin(ConsoleAdminRole, _PolicyModelAdmin):
    list_display = ["name", "is_default", "throttling", "routing", "migration", "updated_at"]
    search_fields = ["name"]
    fieldsets = _policy_fieldsets()


class _ReadOnlyInline(ConsoleAdminRole, _PipelineInline):
    """Nodes and edges change only as a whole topology (load_topology or the editor),
    where cycles, dangling edges and missing sinks are checked before anything is saved;
    row-by-row admin edits could leave a broken graph behind."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class NodeInline(_ReadOnlyInline):
    model = Node
    fields = ["name", "kind", "stage", "operator", "params", "buffer_mb", "max_rate_mbps"]


class EdgeInline(_ReadOnlyInline):
    model = Edge
    fk_name = "pipeline"
    fields = ["source", "target", "bandwidth_mbps"]


@admin.register(Pipeline)
class PipelineAdmin(ConsoleAdminRole, _PipelineModelAdmin):
    list_display = ["name", "policy", "updated_at"]
    search_fields = ["name", "description"]
    inlines = [NodeInline, EdgeInline]


@admin.register(SinkOwner)
class SinkOwnerAdmin(ConsoleAdminRole, _SinkOwnerModelAdmin):
    """Which pipeline owns each sink table and Parquet folder. An owner is taken by a
    pipeline's first run, never typed in; deleting one frees its target for the next
    pipeline that runs over it."""

    list_display = ["kind", "database", "target", "pipeline_name", "created_at"]
    search_fields = ["target", "pipeline_name"]
    readonly_fields = ["kind", "database", "target", "pipeline_name", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(OperatorQuota)
class OperatorQuotaAdmin(ConsoleAdminRole, _QuotaModelAdmin):
    """The one row of operator quotas (created with its defaults when first read, or
    added here while there is none)."""

    list_display = ["__str__", "active_runs", "active_labs", "admins_exempt"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and not OperatorQuota.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
