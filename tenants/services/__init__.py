"""Every write to tenants: accounts (members, invitations, tokens), money, and slices."""

from .accounts import *  # noqa: F403
from .accounts import API_TOKEN_MAX_DAYS, INVITATION_PURGE_AFTER  # noqa: F401
from .billing import (  # noqa: F401
    LOW_TIME_WARNING_MINUTES,
    MAX_PURCHASE_HOURS,
    credit_grant,
    purchase_create,
    purchase_refund,
    purchase_warn_if_low,
    slice_meter,
)
from .credit import (  # noqa: F401
    credit_rate_set,
    credit_request_create,
    credit_request_decline,
    credit_request_grant,
    credit_request_withdraw,
)
from .images import image_create, image_update  # noqa: F401
from .slices import (  # noqa: F401
    ALLOWED,
    ServiceRefusal,
    clean_command,
    clean_environment,
    container_remove_quietly,
    measured_peak_mb,
    owner_is_live,
    queue_position,
    slice_finish_stop,
    slice_launch,
    slice_provision,
    slice_stop,
    slices_dispatch_queue,
    slices_meter,
    slices_reconcile,
)
