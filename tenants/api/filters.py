"""Filter sets for the tenants API."""

import django_filters

from tenants.models import ApiToken, Membership, Tenant, Tier


class TierFilter(django_filters.FilterSet):
    min_vram_mb = django_filters.NumberFilter(field_name="vram_mb", lookup_expr="gte")

    class Meta:
        model = Tier
        fields = ["vram_mb", "is_active"]


class ApiTokenFilter(django_filters.FilterSet):
    live = django_filters.BooleanFilter(method="filter_live")

    class Meta:
        model = ApiToken
        fields = ["live"]

    def filter_live(self, queryset, name, value):  # type: ignore[no-untyped-def]
        live_ids = queryset.model.objects.live().values("pk")
        return queryset.filter(pk__in=live_ids) if value else queryset.exclude(pk__in=live_ids)


class MemberFilter(django_filters.FilterSet):
    class Meta:
        model = Membership
        fields = ["role"]


class OpsTenantFilter(django_filters.FilterSet):
    class Meta:
        model = Tenant
        fields = ["status"]
