"""Filter sets for the tenants API: accounts, money, images and slices."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from tenants.models import (
    ApiToken,
    Image,
    LedgerEntry,
    Membership,
    Purchase,
    Slice,
    SshKey,
    Tenant,
    Tier,
    UsageRecord,
    Volume,
)


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

    def filter_live(
        self, queryset: QuerySet[ApiToken], name: str, value: bool
    ) -> QuerySet[ApiToken]:
        live_ids = queryset.model.objects.live().values("pk")
        return queryset.filter(pk__in=live_ids) if value else queryset.exclude(pk__in=live_ids)


class SshKeyFilter(django_filters.FilterSet):
    type = django_filters.ChoiceFilter(field_name="key_type", choices=SshKey.KeyType.choices)

    class Meta:
        model = SshKey
        fields = ["type"]


class MemberFilter(django_filters.FilterSet):
    class Meta:
        model = Membership
        fields = ["role"]


class OpsTenantFilter(django_filters.FilterSet):
    class Meta:
        model = Tenant
        fields = ["status"]


# --- the slice lifecycle: money, images, slices --------------------------------------------------


class PurchaseFilter(django_filters.FilterSet):
    has_minutes_left = django_filters.BooleanFilter(method="filter_has_minutes_left")

    class Meta:
        model = Purchase
        fields = ["tier", "has_minutes_left"]

    def filter_has_minutes_left(
        self, queryset: QuerySet[Purchase], name: str, value: bool
    ) -> QuerySet[Purchase]:
        return queryset.filter(minutes_left__gt=0) if value else queryset.filter(minutes_left=0)


class OpsPurchaseFilter(PurchaseFilter):
    tenant = django_filters.NumberFilter(field_name="tenant")
    refunded = django_filters.BooleanFilter(
        field_name="refunded_at", lookup_expr="isnull", exclude=True
    )

    class Meta(PurchaseFilter.Meta):
        fields = ["tenant", "tier", "has_minutes_left", "refunded"]


# Ids of tenant-owned rows filter as plain numbers: a model-choice filter would answer 400
# for an id that does not exist and 200 for another tenant's, telling the two apart.


class SliceFilter(django_filters.FilterSet):
    purchase = django_filters.NumberFilter(field_name="purchase")
    image = django_filters.NumberFilter(field_name="image_entry")

    class Meta:
        model = Slice
        fields = ["state", "purchase", "image"]


class VolumeFilter(django_filters.FilterSet):
    class Meta:
        model = Volume
        fields = ["state"]


class OpsSliceFilter(SliceFilter):
    tenant = django_filters.NumberFilter(field_name="tenant")
    node = django_filters.CharFilter(field_name="allocation__gpu__node__name")

    class Meta(SliceFilter.Meta):
        fields = ["state", "purchase", "image", "tenant", "node"]


class LedgerEntryFilter(django_filters.FilterSet):
    purchase = django_filters.NumberFilter(field_name="purchase")

    class Meta:
        model = LedgerEntry
        fields = ["kind", "purchase"]


class UsageRecordFilter(django_filters.FilterSet):
    slice = django_filters.NumberFilter(field_name="slice")
    purchase = django_filters.NumberFilter(field_name="purchase")

    class Meta:
        model = UsageRecord
        fields = ["slice", "purchase"]


class ImageFilter(django_filters.FilterSet):
    class Meta:
        model = Image
        fields = ["connect"]


class OpsImageFilter(django_filters.FilterSet):
    class Meta:
        model = Image
        fields = ["connect", "is_active"]
