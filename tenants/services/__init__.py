"""Every write to tenants, by sub-domain: accounts (members, invitations, tokens), keys (the
SSH keys people sign in to the gateway with), billing (purchases, credit, metering one
slice), images and slices (`slices/`: the lifecycle).
The names below are the app's write API for views, the API and tasks."""

from .accounts import (
    API_TOKEN_MAX_DAYS,
    api_token_create,
    api_token_revoke,
    invitation_accept,
    invitation_by_token,
    invitation_create,
    invitation_purge_expired,
    invitation_resend,
    invitation_revoke,
    invitation_send,
    membership_change_role,
    membership_remove,
    tenant_create,
    tenant_set_status,
    tenant_sign_up,
)
from .billing import (
    MAX_PURCHASE_HOURS,
    credit_grant,
    purchase_create,
    purchase_refund,
    purchase_warn_if_low,
    slice_meter,
)
from .credit import (
    credit_rate_set,
    credit_request_create,
    credit_request_decline,
    credit_request_grant,
    credit_request_withdraw,
)
from .images import image_create, image_update
from .keys import (
    MAX_SSH_KEYS_PER_USER,
    SSH_KEY_NAME_MAX,
    SSH_PUBLIC_KEY_MAX_CHARS,
    ssh_key_add,
    ssh_key_remove,
    ssh_key_touch,
    ssh_public_key_parse,
)
from .notify import audit_event_record, members_notify, members_notify_send
from .slices.launch import (
    ServiceRefusal,
    clean_command,
    clean_environment,
    queue_position,
    slice_launch,
    slices_dispatch_queue,
)
from .slices.provision import slice_provision
from .slices.reconcile import container_remove_quietly, owner_is_live, slices_reconcile
from .slices.state import ALLOWED, measured_peak_mb
from .slices.stop import slice_finish_stop, slice_stop, slices_meter

__all__ = [
    "ALLOWED",
    "API_TOKEN_MAX_DAYS",
    "MAX_PURCHASE_HOURS",
    "MAX_SSH_KEYS_PER_USER",
    "SSH_KEY_NAME_MAX",
    "SSH_PUBLIC_KEY_MAX_CHARS",
    "ServiceRefusal",
    "api_token_create",
    "api_token_revoke",
    "audit_event_record",
    "clean_command",
    "clean_environment",
    "container_remove_quietly",
    "credit_grant",
    "credit_rate_set",
    "credit_request_create",
    "credit_request_decline",
    "credit_request_grant",
    "credit_request_withdraw",
    "image_create",
    "image_update",
    "invitation_accept",
    "invitation_by_token",
    "invitation_create",
    "invitation_purge_expired",
    "invitation_resend",
    "invitation_revoke",
    "invitation_send",
    "measured_peak_mb",
    "members_notify",
    "members_notify_send",
    "membership_change_role",
    "membership_remove",
    "owner_is_live",
    "purchase_create",
    "purchase_refund",
    "purchase_warn_if_low",
    "queue_position",
    "slice_finish_stop",
    "slice_launch",
    "slice_meter",
    "slice_provision",
    "slice_stop",
    "slices_dispatch_queue",
    "slices_meter",
    "slices_reconcile",
    "ssh_key_add",
    "ssh_key_remove",
    "ssh_key_touch",
    "ssh_public_key_parse",
    "tenant_create",
    "tenant_set_status",
    "tenant_sign_up",
]
