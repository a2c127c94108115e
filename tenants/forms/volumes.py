"""The volume pages' forms: create one, and delete one by typing its name."""

from django import forms
from django.conf import settings


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
