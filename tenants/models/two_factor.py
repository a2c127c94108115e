"""Two-factor recovery codes: one-use codes for when the authenticator app is lost, kept
only as SHA-256 (the TOTP secret itself lives in django-otp's TOTPDevice)."""

from django.conf import settings
from django.db import models


class RecoveryCode(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="recovery_codes"
    )
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when the code signs someone in: a used code never works again.
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "used_at"])]

    def __str__(self) -> str:
        return f"recovery code of {self.user_id}"
