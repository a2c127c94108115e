"""Errors services raise for people: a stable code, a message, and the field at fault.

The API turns them into its JSON error shape; pages show the message on the form.
"""


class ServiceError(Exception):
    status_code = 400
    default_code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field


class NotAllowed(ServiceError):
    status_code = 403
    default_code = "permission_denied"


class Conflict(ServiceError):
    status_code = 409
    default_code = "conflict"
