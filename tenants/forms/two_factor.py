"""The one field every two-factor form asks for: a code from the app or a recovery code."""

from django import forms


class CodeForm(forms.Form):
    code = forms.CharField(
        label="Code",
        max_length=20,
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "text", "autofocus": True}
        ),
        help_text="6 digits from your authenticator app, or one of your recovery codes.",
    )
