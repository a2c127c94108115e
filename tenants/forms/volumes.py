"""The volume pages' forms: create one, delete one by typing its name; resume a slice on
a purchase of its tier, terminate one."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.db.models import QuerySet

from gpuplatform.pages import form_field

from ..models import Purchase


class VolumeForm(forms.Form):
    name = forms.CharField(
        label="Name",
        max_length=63,
        help_text="a-z, 0-9, '.', '_' and '-', e.g. checkpoints.",
    )
    size_gb = forms.IntegerField(
        label="Size (GB)",
        min_value=1,
        max_value=settings.VOLUME_MAX_GB,
        initial=20,
        help_text="Billed per GB-hour while it exists; a full volume stops the slices using it.",
    )


class VolumeDeleteForm(forms.Form):
    confirm = forms.CharField(
        label="Type the volume's name to confirm",
        max_length=63,
        help_text="Its files are deleted for good.",
    )


class ResumePurchaseField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Purchase) -> str:
        return f"#{obj.pk}: {obj.tier.name}, {obj.minutes_left} of {obj.minutes_total} min left"


class ResumeForm(forms.Form):
    purchase = ResumePurchaseField(
        label="Pay from",
        queryset=None,
        empty_label=None,
        help_text="A purchase of the slice's tier with minutes left.",
    )

    def __init__(self, *args: Any, purchases: QuerySet[Purchase], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        form_field(self, "purchase", ResumePurchaseField).queryset = purchases


class TerminateForm(forms.Form):
    confirm = forms.BooleanField(widget=forms.HiddenInput, initial=True)
    delete_volumes = forms.BooleanField(
        label="Also delete the volumes only this slice used", required=False
    )
