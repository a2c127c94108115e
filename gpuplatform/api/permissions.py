"""Permissions shared by every app's API."""

from rest_framework import permissions


class IsOps(permissions.IsAdminUser):
    message = "Only ops (staff) can use this endpoint."
