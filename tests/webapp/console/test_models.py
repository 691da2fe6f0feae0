"""Model validation: policies, pipelines, nodes, edges."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from orchestrator.service import PARAMETERS
from orchestrator.service import Policy as PolicyValues
from webapp.console.models import Edge, Node, Pipeline, Policy

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_migration_ships_one_default_policy_with_the_spec_defaults() -> None:
    default = Policy.objects.get(is_default=True)
    assert default.values() == PolicyValues().to_dict()
    assert default.values()["high_water"] == 0.7
    assert default.values()["alpha"] == 0.3


def test_roles_exist_as_groups() -> None:
    from django.contrib.auth.models import Group

    assert set(Group.objects.values_list("name", flat=True)) >= {"viewer", "operator", "admin"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("high_water", 0.95, "outside [0.6, 0.9]"),
        ("low_water", 0.05, "outside [0.1, 0.4]"),
        ("alpha", 0.0, "outside (0, 1)"),
        ("beta", 0.0, "outside (0, 10]"),
        ("watermark_step", 0.0, "outside (0, 0.3]"),
        ("duty_ratio", 1.5, "outside (0, 1]"),
        ("throttling", "telepathy", "is not one of"),
        ("scale_in_busy", 1.0, "outside (0, 1)"),
        ("scale_in_after_s", 2.0, "outside [5, 3600]"),
    ],
)
def test_out_of_range_parameter_is_reported_on_its_field(
    field: str, value: object, message: str
) -> None:
    policy = Policy(name="p", **{field: value})
    with pytest.raises(ValidationError) as err:
        policy.full_clean()
    assert field in err.value.message_dict
    assert any(message in m for m in err.value.message_dict[field])


def test_low_water_must_stay_below_high_water() -> None:
    policy = Policy(name="p", high_water=0.6, low_water=0.4)
    policy.full_clean()  # 0.4 < 0.6 is fine
    policy = Policy(name="q", high_water=0.6, low_water=0.4, recovery_threshold=0.8)
    with pytest.raises(ValidationError) as err:
        policy.full_clean()
    assert "recovery_threshold" in err.value.message_dict


def test_only_one_default_policy() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Policy.objects.create(name="second", is_default=True)


def test_model_fields_follow_the_declaration() -> None:
    for param in PARAMETERS:
        field = Policy._meta.get_field(param.name)
        assert field.default == param.default
        if param.kind != "choice":
            assert param.range_text() in field.help_text


def test_pipeline_overrides_are_validated() -> None:
    pipeline = Pipeline(name="p", policy_overrides={"high_water": 2, "nonsense": 1})
    with pytest.raises(ValidationError) as err:
        pipeline.full_clean()
    found = " ".join(err.value.message_dict["policy_overrides"])
    assert "high_water" in found
    assert "nonsense: unknown policy parameter" in found


def test_node_parameters_are_validated_per_operator() -> None:
    pipeline = Pipeline.objects.create(name="p")
    node = Node(pipeline=pipeline, name="f", kind="operator", operator="filter", params={})
    with pytest.raises(ValidationError) as err:
        node.full_clean()
    assert "parameter 'condition' is required" in " ".join(err.value.message_dict["params"])
    wrong_kind = Node(pipeline=pipeline, name="m", kind="operator", operator="merge")
    with pytest.raises(ValidationError, match="runs on sink nodes"):
        wrong_kind.full_clean()


def test_edge_endpoints_belong_to_the_pipeline_and_no_self_loops() -> None:
    a = Pipeline.objects.create(name="a")
    b = Pipeline.objects.create(name="b")
    src = Node.objects.create(pipeline=a, name="s", kind="source", operator="read")
    other = Node.objects.create(pipeline=b, name="t", kind="sink", operator="merge")
    with pytest.raises(ValidationError, match="same pipeline"):
        Edge(pipeline=a, source=src, target=other).full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        Edge.objects.create(pipeline=a, source=src, target=src)
