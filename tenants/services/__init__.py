"""Every write to tenants, by sub-domain: accounts (tenants, members, invitations, tokens),
keys (the SSH keys people sign in to the gateway with), two_factor (TOTP and recovery
codes), billing (credit grants, purchases, refunds, metering one slice, volume storage
charged), credit (credit requests, the credit rate), spend (spend limits and the 80%
warning), audit (the audit trail and mail to a tenant's members), images (the allowlist),
registries (the registry policy for images renters bring, tenants' registry logins),
templates (launch templates), logs (a slice's output kept), volumes, and `slices/` (the
lifecycle: launch, provision, stop and the minute meter, reconcile, terminate, and the
state machine every change goes through).

The names below are the app's write API for views, the API and tasks: actions only. Reads
are `tenants.selectors`; a launch's fields are checked by `tenants.launch_input`, a pasted
SSH key read by `tenants.ssh_keys`, an amount of credit by `tenants.amounts`; constants and
errors (ServiceRefusal, WrongCode) are imported from the module that defines them, and so
are the steps the modules share among themselves (`audit_event_record`, `slice_meter`)."""

from .accounts import (
    api_token_create,
    api_token_revoke,
    invitation_accept,
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
    tenant_sign_up_confirm,
    tenant_sign_up_request,
)
from .audit import members_notify, members_notify_send
from .billing import (
    credit_grant,
    purchase_create,
    purchase_refund,
)
from .credit import (
    credit_rate_set,
    credit_request_create,
    credit_request_decline,
    credit_request_grant,
    credit_request_withdraw,
)
from .images import image_create, image_update
from .keys import ssh_key_add, ssh_key_remove, ssh_key_touch
from .logs import slice_logs_collect, slice_logs_note, slice_logs_prune, slice_logs_request
from .registries import (
    registry_credential_remove,
    registry_credential_set,
    registry_credential_touch,
    registry_credentials_reseal,
    registry_rule_remove,
    registry_rule_set,
)
from .slices.launch import slice_launch, slice_resume, slices_dispatch_queue
from .slices.preempt import slice_preempt_signal, slices_preempt_due
from .slices.provision import slice_provision
from .slices.reconcile import container_remove_quietly, slices_reconcile
from .slices.requests import slice_launch_request, slice_resume_request
from .slices.stop import running_slices_meter, slice_finish_stop, slice_stop
from .slices.terminate import slice_terminate
from .spend import spend_limit_set
from .templates import template_create, template_update, template_withdraw
from .two_factor import (
    recovery_codes_regenerate,
    two_factor_disable,
    two_factor_enable,
    two_factor_verify,
)
from .volumes import (
    storage_price_set,
    volume_create,
    volume_delete,
    volume_meter,
    volume_provision,
    volume_remove,
    volumes_measure,
    volumes_meter,
)

__all__ = [
    "api_token_create",
    "api_token_revoke",
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
    "invitation_create",
    "invitation_purge_expired",
    "invitation_resend",
    "invitation_revoke",
    "invitation_send",
    "members_notify",
    "members_notify_send",
    "membership_change_role",
    "membership_remove",
    "purchase_create",
    "purchase_refund",
    "recovery_codes_regenerate",
    "registry_credential_remove",
    "registry_credential_set",
    "registry_credential_touch",
    "registry_credentials_reseal",
    "registry_rule_remove",
    "registry_rule_set",
    "running_slices_meter",
    "slice_finish_stop",
    "slice_launch",
    "slice_launch_request",
    "slice_logs_collect",
    "slice_logs_note",
    "slice_logs_prune",
    "slice_logs_request",
    "slice_preempt_signal",
    "slice_provision",
    "slice_resume",
    "slice_resume_request",
    "slice_stop",
    "slice_terminate",
    "slices_dispatch_queue",
    "slices_preempt_due",
    "slices_reconcile",
    "spend_limit_set",
    "ssh_key_add",
    "ssh_key_remove",
    "ssh_key_touch",
    "storage_price_set",
    "template_create",
    "template_update",
    "template_withdraw",
    "tenant_create",
    "tenant_set_status",
    "tenant_sign_up",
    "tenant_sign_up_confirm",
    "tenant_sign_up_request",
    "two_factor_disable",
    "two_factor_enable",
    "two_factor_verify",
    "volume_create",
    "volume_delete",
    "volume_meter",
    "volume_provision",
    "volume_remove",
    "volumes_measure",
    "volumes_meter",
]
