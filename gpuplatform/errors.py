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


# --- the error codes the API answers with -------------------------------------------------------
#
# Written down once: README.md's table of error codes is this registry, row for row (a test
# holds them together, and holds every code the code base raises to being listed here).
# `top` codes are the body's `code`; `field` codes appear in `fields` under the field at
# fault, with the body's `code` `validation_error`. A 403, 409 or 422 carries its own code
# at the top, and under `fields` as well when it names a field.


class ErrorCode:
    __slots__ = ("code", "meaning", "statuses", "where")

    def __init__(self, code: str, statuses: tuple[int, ...], where: str, meaning: str):
        assert where in ("top", "field"), where
        self.code = code
        self.statuses = statuses
        self.where = where
        self.meaning = meaning

    @property
    def status(self) -> str:
        return ", ".join(str(s) for s in self.statuses)


def _codes(*rows: tuple[str, tuple[int, ...] | int, str, str]) -> dict[str, ErrorCode]:
    out: dict[str, ErrorCode] = {}
    for code, statuses, where, meaning in rows:
        assert code not in out, code
        out[code] = ErrorCode(
            code, statuses if isinstance(statuses, tuple) else (statuses,), where, meaning
        )
    return out


ERROR_CODES = _codes(
    # the body's `code`
    (
        "validation_error",
        400,
        "top",
        "The input was refused; `fields` names each field at fault, each with its own code below.",
    ),
    ("parse_error", 400, "top", "The body is not JSON, is nested too deeply, or is over 1 MiB."),
    (
        "not_authenticated",
        401,
        "top",
        "No credentials: send `Authorization: Bearer <token>` or a session.",
    ),
    (
        "authentication_failed",
        401,
        "top",
        'Credentials refused: "Invalid Authorization header" when the header is not '
        '`Bearer <token>`; "Invalid, expired or revoked token." when the token is well-formed '
        "but matches no live token.",
    ),
    (
        "permission_denied",
        403,
        "top",
        "Signed in, but your role may not do this (a viewer writing, a tenant on an ops endpoint).",
    ),
    (
        "two_factor_required",
        403,
        "top",
        "An ops account's token is refused until that account sets up two-factor sign-in "
        "(/account/two-factor/), and an ops session until it has passed the code step.",
    ),
    ("no_tenant", 403, "top", "The account belongs to no tenant yet."),
    (
        "insufficient_scope",
        403,
        "top",
        "The API token lacks the scope this request needs (the message names it): `read` "
        "for every GET, else the endpoint's own (docs/api-tokens.md); a viewer's token reads "
        "only. Also a token making a token with a scope it lacks itself.",
    ),
    (
        "ip_not_allowed",
        403,
        "top",
        "The API token is limited to client networks that do not hold your address (or "
        "would make a token usable outside its own networks).",
    ),
    (
        "tenant_suspended",
        403,
        "top",
        "The tenant is suspended: nothing new until ops reactivate it.",
    ),
    (
        "image_not_allowed",
        403,
        "top",
        "The image is on no allowlist and the registry policy does not let renters bring it "
        "(the message names the rule); also a stopped slice's brought image that the policy "
        "no longer allows (docs/images.md).",
    ),
    (
        "not_found",
        404,
        "top",
        "No such object, or another tenant's (the two read the same); also a page past the last.",
    ),
    ("method_not_allowed", 405, "top", "The endpoint does not take this HTTP method."),
    (
        "not_acceptable",
        406,
        "top",
        "The `Accept` header asks for a format the API does not serve (JSON).",
    ),
    ("request_too_large", 413, "top", "The body is over 1 MiB."),
    ("unsupported_media_type", 415, "top", "The body is not `application/json`."),
    (
        "throttled",
        429,
        "top",
        "Too many requests (or failed token attempts): wait `Retry-After` seconds.",
    ),
    ("conflict", 409, "top", "The request conflicts with the object's current state."),
    ("allocation_released", 409, "top", "The VRAM allocation was already released."),
    ("already_allocated", 409, "top", "This owner already holds VRAM."),
    ("already_invited", 409, "top", "The email already has a pending invitation."),
    ("already_member", 409, "top", "The account already belongs to a tenant (or to this one)."),
    (
        "below_allocated",
        409,
        "top",
        "The ratio would leave less sellable VRAM than is allocated now.",
    ),
    ("credit_request_decided", 409, "top", "The credit request was already granted or declined."),
    (
        "credit_request_pending",
        409,
        "top",
        "The tenant already has a credit request waiting for ops.",
    ),
    ("duplicate", 409, "top", "Another node has this name, or this address and port."),
    ("duplicate_endpoint", 409, "top", "Another node has this address and port."),
    ("duplicate_name", 409, "top", "Another node has this name."),
    (
        "duplicate_key",
        409,
        "top",
        "This SSH public key is already registered, on your account or another's (which is "
        "never said).",
    ),
    ("email_taken", 409, "top", "An account with this email exists."),
    (
        "guaranteed_slices",
        409,
        "top",
        "Guaranteed slices run on the GPU: it cannot be overcommitted.",
    ),
    (
        "idempotency_conflict",
        409,
        "top",
        "The `Idempotency-Key` was used before with a different request (any field).",
    ),
    ("image_exists", 409, "top", "An image with this name is on the allowlist."),
    ("template_exists", 409, "top", "A launch template with this name exists."),
    (
        "spend_limit_reached",
        409,
        "top",
        "A monthly spend limit (the tenant's, the member's or the token's) would be passed: "
        "purchases, launches and resumes are refused; running slices go on.",
    ),
    (
        "insufficient_credit",
        409,
        "top",
        "The balance does not cover the price; nothing was charged.",
    ),
    (
        "invalid_invitation",
        (400, 409),
        "top",
        "The invitation link is invalid, expired or already used.",
    ),
    ("invalid_transition", 409, "top", "The slice's state does not allow this change."),
    ("last_owner", 409, "top", "The change would leave the tenant with no owner."),
    ("mig_enabled", 409, "top", "A MIG GPU cannot be overcommitted."),
    (
        "newer_incident_open",
        409,
        "top",
        "A newer open incident covers this one; reopen that instead.",
    ),
    (
        "no_running_slice",
        409,
        "top",
        "The incident names no slice, its slice has already ended, or it was resumed since "
        "(the running one is another run).",
    ),
    ("not_an_orphan", 409, "top", "Only an orphan process can be ended from here."),
    ("not_pending", 409, "top", "The invitation is no longer pending."),
    ("nothing_pending", 409, "top", "The node has no host key waiting for approval."),
    (
        "nothing_to_drain",
        409,
        "top",
        "The incident names no GPU or node to drain, or it takes no placements already.",
    ),
    ("nothing_to_refund", 409, "top", "The purchase has no unused minutes left to refund."),
    ("pending_host_key", 409, "top", "Approve the node's host key first."),
    ("purchase_in_use", 409, "top", "A slice still uses this purchase."),
    ("purchase_used_up", 409, "top", "The purchase has no minutes left."),
    ("ratio_above_recommended", 409, "top", "The ratio is above what the GPU's history supports."),
    ("resolved", 409, "top", "The incident is resolved; reopen it first."),
    ("too_many_webhooks", 409, "top", "The webhook endpoint limit is reached: delete one first."),
    ("too_many_keys", 409, "top", "The account holds 50 SSH keys, the most: remove one first."),
    ("too_many_volumes", 409, "top", "The tenant keeps the most volumes it may: delete one first."),
    ("volume_exists", 409, "top", "The tenant already has a volume with this name."),
    ("volume_in_use", 409, "top", "A slice that is not stopped mounts this volume: stop it first."),
    ("volume_not_ready", 409, "top", "The volume is being made, deleted or failed."),
    ("slice_terminated", 409, "top", "The slice was terminated: it cannot be resumed."),
    ("no_capacity", 409, "top", "No node takes placements right now: try again later."),
    (
        "estimate_exceeds_tier",
        422,
        "top",
        "The job does not fit the purchase's tier: `estimate` holds the breakdown and suggestions.",
    ),
    ("error", 500, "top", "An error with no more specific code (a bug: please report it)."),
    # under `fields`, with `validation_error` at the top
    (
        "unknown_field",
        400,
        "field",
        "The field is not accepted here, at any depth: `bogus`, `model.bogus`, "
        "`known_fixed_builds.0.bogus`.",
    ),
    ("required", 400, "field", "The field is missing."),
    ("null", 400, "field", "`null` where a value is needed."),
    ("blank", 400, "field", "An empty string where text is needed."),
    (
        "invalid",
        400,
        "field",
        "A value of the wrong type or form. An integer field takes a JSON integer: a string "
        '(`"2"`), a boolean or a fraction is "A valid integer is required." (`2.0` counts as '
        '2); a text field takes a JSON string: a number is "Not a valid string.". Otherwise '
        "the message says what is wrong.",
    ),
    ("invalid_choice", 400, "field", "Not one of the allowed values (the message lists them)."),
    ("does_not_exist", 400, "field", "No object with this id (among the ones you may use)."),
    (
        "incorrect_type",
        400,
        "field",
        "A related id of a type no id has (ids that are not integers only: integer ids "
        "answer `invalid`).",
    ),
    (
        "min_value",
        400,
        "field",
        "Below the smallest value allowed: numbers and counts (`hours`, `context_tokens`, "
        "`model.num_layers`), and times before the year 2000.",
    ),
    (
        "max_value",
        400,
        "field",
        "Above the largest value allowed: numbers and counts (`hours`, `context_tokens`, "
        "`model.num_layers`), and times after the year 9000.",
    ),
    ("min_length", 400, "field", "Too short: text, or a list with too few entries."),
    ("max_length", 400, "field", "Too long: text, or a list or object with too many entries."),
    ("max_string_length", 400, "field", "A number written with over 1000 characters."),
    ("max_digits", 400, "field", "A decimal with too many digits."),
    ("max_decimal_places", 400, "field", "A decimal with too many decimal places (credit: two)."),
    ("max_whole_digits", 400, "field", "A decimal with too many digits before the point."),
    ("not_a_list", 400, "field", "A list is expected."),
    ("not_a_dict", 400, "field", "An object is expected."),
    ("empty", 400, "field", "The list or object may not be empty."),
    ("date", 400, "field", "A date where a date and time is expected."),
    ("make_aware", 400, "field", "A time that does not exist in its time zone."),
    ("overflow", 400, "field", "A number or time too large to represent."),
    ("null_characters_not_allowed", 400, "field", "Text with a NUL character."),
    ("surrogate_characters_not_allowed", 400, "field", "Text with a lone surrogate character."),
    (
        "reserved_variable",
        400,
        "field",
        "An environment variable the platform sets or forbids, named in the environment or "
        "set or unset by the command.",
    ),
    (
        "image_sets_reserved_variable",
        400,
        "field",
        "The image itself sets an environment variable the platform reserves.",
    ),
    (
        "image_reference_needs_tag",
        400,
        "field",
        "An image reference names a digest without its tag: give repository:tag@sha256:… "
        "(every start asks the registry for the tag with your tenant's own login).",
    ),
    (
        "interruptible_training",
        400,
        "field",
        "Training cannot run on interruptible hours (they may be preempted).",
    ),
    (
        "unsupported_architecture",
        400,
        "field",
        "A model architecture the estimator does not count exactly: give plain numbers.",
    ),
    (
        "unsupported_quantization",
        400,
        "field",
        "A checkpoint's quantization_config the estimator cannot size (the message names the "
        "key); it is refused rather than counted at 16 bits.",
    ),
    (
        "hub_model_not_found",
        400,
        "field",
        "No such model on the Hugging Face Hub (or it is private): the message names the id.",
    ),
    (
        "hub_revision_not_found",
        400,
        "field",
        "The Hub model has no such branch, tag or commit.",
    ),
    (
        "hub_gated",
        400,
        "field",
        "A gated Hub model the platform's token may not read (accept its terms; ops set HF_TOKEN).",
    ),
    (
        "hub_file_not_found",
        400,
        "field",
        "The Hub model lacks config.json or safetensors weights (only safetensors are read).",
    ),
    (
        "hub_too_large",
        400,
        "field",
        "The Hub model's safetensors headers, shards or JSON files are over the platform's limits.",
    ),
    (
        "hub_timeout",
        400,
        "field",
        "The Hugging Face Hub did not answer in time.",
    ),
    (
        "hub_unavailable",
        400,
        "field",
        "The Hugging Face Hub could not be read (an error or an unreadable answer).",
    ),
    (
        "confirmation_required",
        400,
        "field",
        "A destructive action needs its confirmation (the message says what to type).",
    ),
    ("weak_password", 400, "field", "The password is too weak (the message says why)."),
    ("invalid_address", 400, "field", "Not a usable node address."),
    ("invalid_host_key", 400, "field", "Not a usable SSH host key."),
    (
        "invalid_public_key",
        400,
        "field",
        "Not one OpenSSH public key line: garbage, damaged or cut-short base64, or several keys.",
    ),
    ("private_key", 400, "field", "A private key was pasted where its .pub file belongs."),
    (
        "unsupported_key_type",
        400,
        "field",
        "An SSH key of a type the gateway does not take (ssh-dss, a certificate).",
    ),
    ("weak_key", 400, "field", "An RSA key under 2048 bits."),
    ("invalid_name", 400, "field", "Not a valid node name."),
    ("invalid_network", 400, "field", "Not a Docker network slices may use."),
    (
        "invalid_cidr",
        400,
        "field",
        "Not an IP network in CIDR form (`203.0.113.0/24`, `2001:db8::/32`; host bits unset).",
    ),
    ("invalid_user", 400, "field", "Not a POSIX user name."),
    (
        "fingerprint_mismatch",
        400,
        "field",
        "The fingerprint does not match the host key read from the node.",
    ),
)


def error_code_table() -> str:
    """ERROR_CODES as README.md's Markdown table."""
    lines = ["| `code` | HTTP | Where | Meaning |", "| --- | --- | --- | --- |"]
    for entry in ERROR_CODES.values():
        lines.append(f"| `{entry.code}` | {entry.status} | {entry.where} | {entry.meaning} |")
    return "\n".join(lines)
