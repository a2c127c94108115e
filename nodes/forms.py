"""Forms for the ops fleet pages; services enforce the rules."""

from django import forms


class NodeForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and hyphens.")
    address = forms.CharField(max_length=255, help_text="Host name or IP address.")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=22)
    ssh_user = forms.CharField(max_length=32, initial="gpuplatform", label="SSH user")
    container_network = forms.CharField(
        max_length=64,
        required=False,
        initial="bridge",
        label="Container network",
        help_text="The Docker network slices join: bridge publishes their ports on the node; "
        "none keeps them on their own loopback.",
    )
    host_key = forms.CharField(
        required=False,
        max_length=4096,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Optional: a known_hosts line you trust (ssh-keyscan output checked out of "
        "band). Empty: the platform reads the key and you approve its fingerprint.",
    )

    def clean_container_network(self) -> str:
        return self.cleaned_data.get("container_network") or "bridge"


class DrainForm(forms.Form):
    reason = forms.CharField(max_length=500, required=False)


class ApproveForm(forms.Form):
    fingerprint = forms.CharField(max_length=128)
