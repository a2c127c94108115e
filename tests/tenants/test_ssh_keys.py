"""SSH keys for the gateway: what a pasted key must be, one account per key, at most 50,
the audit trail, and the reads the gateway signs people in with."""

import base64
import hashlib
import shutil
import subprocess
import threading

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from gpuplatform.errors import ERROR_CODES, Conflict, NotAllowed, ServiceError
from nodes import ssh as node_ssh
from tenants import selectors, services
from tenants.models import AuditEvent, Role, SshKey, Tenant
from tenants.services.keys import MAX_SSH_KEYS_PER_USER
from tests.factories import MembershipFactory, UserFactory
from tests.tenants.ssh_material import ecdsa_compressed_line, private_pastes, public_line

pytestmark = pytest.mark.django_db

ACCEPTED = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
]


@pytest.fixture(autouse=True)
def _gateway_host_key(settings, tmp_path):
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "ssh_host_ed25519_key")


def _audit(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action))


# --- accepted keys --------------------------------------------------------------------------


@pytest.mark.parametrize("key_type", ACCEPTED)
def test_each_accepted_type_is_stored_normalised_with_its_fingerprint(owner_a, key_type):
    line = public_line(key_type, comment="alice@laptop")
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=f"  {line}\n")
    key.refresh_from_db()
    typ, b64, comment = line.split(" ", 2)
    assert key.key_type == typ == key_type
    assert key.public_key == f"{typ} {b64}"  # one line, no comment
    assert key.comment == comment == "alice@laptop"
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(b64)).digest()).decode()
    assert key.fingerprint == "SHA256:" + digest.rstrip("=")
    assert key.last_used_at is None and key.last_used_address is None
    assert key.user == owner_a.user and list(owner_a.user.ssh_keys.all()) == [key]


def test_the_fingerprint_is_the_one_ssh_keygen_prints(owner_a, tmp_path):
    if not shutil.which("ssh-keygen"):
        pytest.skip("no ssh-keygen here")
    for key_type in ("ssh-ed25519", "ecdsa-sha2-nistp384", "ssh-rsa"):
        line = public_line(key_type, comment="me@host")
        path = tmp_path / f"{key_type}.pub"
        path.write_text(line + "\n")
        printed = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[1]
        key = services.ssh_key_add(user=owner_a.user, name=key_type, public_key=line)
        assert key.fingerprint == printed
    # and the same form as the platform's own (node host keys, the gateway's host key)
    ed = services.ssh_key_add(user=owner_a.user, name="again", public_key=public_line())
    assert ed.fingerprint == node_ssh.fingerprint(ed.public_key)


def test_a_line_without_comment_and_a_4096_bit_rsa_key_are_fine(owner_a):
    key = services.ssh_key_add(
        user=owner_a.user, name="big", public_key=public_line("ssh-rsa", bits=4096)
    )
    assert key.comment == "" and key.key_type == "ssh-rsa"


def test_name_is_trimmed(owner_a):
    key = services.ssh_key_add(user=owner_a.user, name="  work pc ", public_key=public_line())
    assert key.name == "work pc"


# --- refused input: a 400 naming the field, nothing stored ----------------------------------


def _refused(user, *, name="laptop", public_key=None) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        services.ssh_key_add(
            user=user, name=name, public_key=public_line() if public_key is None else public_key
        )
    exc = caught.value
    assert exc.status_code == 400, exc.message
    assert exc.code in ERROR_CODES and ERROR_CODES[exc.code].where == "field", exc.code
    assert not SshKey.objects.exists() and not _audit("ssh_key.added")
    return exc


def _ed_blob() -> bytes:
    return base64.b64decode(public_line().split()[1])


BAD_KEYS = {
    "garbage": ("hello world", "invalid_public_key"),
    "just base64": (base64.b64encode(b"x" * 51).decode(), "invalid_public_key"),
    "type only": ("ssh-ed25519", "invalid_public_key"),
    "truncated": (public_line()[:-10], "invalid_public_key"),
    "cut base64 of a whole number of quads": (public_line()[:-8], "invalid_public_key"),
    "damaged base64": (public_line()[:30] + "!!!!" + public_line()[34:], "invalid_public_key"),
    "extra bytes": (
        "ssh-ed25519 " + base64.b64encode(_ed_blob() + b"junk").decode(),
        "invalid_public_key",
    ),
    "type differs from the key": (
        "ssh-rsa " + public_line().split()[1],
        "invalid_public_key",
    ),
    "ecdsa curve differs": (
        "ecdsa-sha2-nistp384 " + public_line("ecdsa-sha2-nistp256").split()[1],
        "invalid_public_key",
    ),
    "compressed ecdsa point": (ecdsa_compressed_line(), "invalid_public_key"),
    "authorized_keys options": ('from="10.0.0.1" ' + public_line(), "invalid_public_key"),
    "two lines": (public_line() + "\n" + public_line(), "invalid_public_key"),
    "two keys on one line": (public_line() + " " + public_line(), "invalid_public_key"),
    "rfc4716": (
        "---- BEGIN SSH2 PUBLIC KEY ----\nAAAAB3NzaC1yc2E\n---- END SSH2 PUBLIC KEY ----",
        "invalid_public_key",
    ),
    "dsa": (
        "ssh-dss AAAAB3NzaC1kc3MAAACBAP1/U4EddRIpUt9KnC7s5Of2EbdSPO9EAMMeP4C2",
        "unsupported_key_type",
    ),
    "certificate": (
        "ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1lZDI1NTE5LWNlcnQtdjAxQG9wZW5zc2guY29t",
        "unsupported_key_type",
    ),
    "rsa under 2048 bits": (public_line("ssh-rsa", bits=1024), "weak_key"),
    "empty": ("", "required"),
    "blank": ("  \n\t ", "required"),
    "nul": (public_line() + "\x00", "invalid_public_key"),
    "a whole file": (public_line() + " " + "x" * 9000, "max_length"),
}


@pytest.mark.parametrize("case", list(BAD_KEYS), ids=list(BAD_KEYS))
def test_a_bad_public_key_is_refused_on_its_field(owner_a, case):
    text, code = BAD_KEYS[case]
    exc = _refused(owner_a.user, public_key=text)
    assert (exc.code, exc.field) == (code, "public_key"), exc.message
    if code == "unsupported_key_type":  # the answer says which kinds work
        assert "ssh-ed25519" in exc.message


def test_several_keys_are_told_apart_from_garbage(owner_a):
    exc = _refused(owner_a.user, public_key=public_line() + "\n" + public_line("ssh-rsa"))
    assert "several keys" in exc.message


@pytest.mark.parametrize("form", ["openssh", "rsa-pem", "pkcs8", "putty"])
def test_a_private_key_is_refused_clearly(owner_a, form):
    exc = _refused(owner_a.user, public_key=private_pastes()[form])
    assert (exc.code, exc.field) == ("private_key", "public_key")
    assert exc.message.startswith("This is a private key; paste the .pub file")


@pytest.mark.parametrize(
    ("name", "code"),
    [("", "required"), ("   ", "required"), ("x" * 10_000, "max_length"), ("x" * 65, "max_length")],
    ids=["empty", "blank", "10000 characters", "65 characters"],
)
def test_a_bad_name_is_refused_on_its_field(owner_a, name, code):
    exc = _refused(owner_a.user, name=name)
    assert (exc.code, exc.field) == (code, "name")


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "nul\x00"], ids=repr)
def test_a_name_is_one_line_of_text(owner_a, name):
    exc = _refused(owner_a.user, name=name)
    assert (exc.code, exc.field) == ("invalid", "name")


def test_a_64_character_name_is_fine(owner_a):
    key = services.ssh_key_add(user=owner_a.user, name="é" * 64, public_key=public_line())
    assert key.name == "é" * 64


# --- one account per key, at most 50 ------------------------------------------------------


def test_the_same_key_twice_on_one_account_is_a_duplicate(owner_a):
    line = public_line(comment="first")
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    # the comment is not the key: a different one does not make it new
    again = line.rsplit(" ", 1)[0] + " other-comment"
    with pytest.raises(Conflict) as caught:
        services.ssh_key_add(user=owner_a.user, name="laptop 2", public_key=again)
    assert (caught.value.code, caught.value.field) == ("duplicate_key", "public_key")
    assert "laptop" in caught.value.message
    assert SshKey.objects.count() == 1 and len(_audit("ssh_key.added")) == 1


def test_a_key_of_another_account_is_refused_without_saying_whose(owner_a, owner_b):
    line = public_line()
    services.ssh_key_add(user=owner_a.user, name="alice-secret-box", public_key=line)
    for user in (owner_b.user, MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER).user):
        with pytest.raises(Conflict) as caught:
            services.ssh_key_add(user=user, name="mine", public_key=line)
        exc = caught.value
        assert (exc.code, exc.field, exc.status_code) == ("duplicate_key", "public_key", 409)
        for secret in (owner_a.user.email, "alice", owner_a.tenant.name):
            assert secret.lower() not in exc.message.lower()
    assert SshKey.objects.get().user == owner_a.user


def test_the_database_holds_one_account_per_fingerprint(owner_a, owner_b):
    key = services.ssh_key_add(user=owner_a.user, name="a", public_key=public_line())
    with (
        pytest.raises(IntegrityError, match="tenants_sshkey_one_account_per_key"),
        transaction.atomic(),
    ):
        SshKey.objects.create(
            user=owner_b.user,
            name="b",
            key_type=key.key_type,
            public_key=key.public_key,
            fingerprint=key.fingerprint,
        )


def test_an_account_holds_at_most_50_keys(owner_a):
    SshKey.objects.bulk_create(
        SshKey(
            user=owner_a.user,
            name=f"k{i}",
            key_type="ssh-ed25519",
            public_key=f"ssh-ed25519 fake{i}",
            fingerprint=f"SHA256:fake{i}",
        )
        for i in range(MAX_SSH_KEYS_PER_USER - 1)
    )
    services.ssh_key_add(user=owner_a.user, name="the 50th", public_key=public_line())
    with pytest.raises(Conflict) as caught:
        services.ssh_key_add(user=owner_a.user, name="the 51st", public_key=public_line())
    assert caught.value.code == "too_many_keys" and "50" in caught.value.message
    assert owner_a.user.ssh_keys.count() == 50
    # the cap is per account: a colleague still has room
    colleague = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    services.ssh_key_add(user=colleague.user, name="one", public_key=public_line())


# --- who may --------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.OWNER, Role.MEMBER, Role.VIEWER])
def test_every_role_manages_its_own_keys(owner_a, role):
    m = MembershipFactory(tenant=owner_a.tenant, role=role)
    key = services.ssh_key_add(user=m.user, name="mine", public_key=public_line())
    assert services.ssh_key_remove(user=m.user, key_id=key.pk) is True


def test_a_user_without_a_tenant_adds_no_key_but_ops_may(ops_user):
    with pytest.raises(NotAllowed) as caught:
        services.ssh_key_add(user=UserFactory(), name="x", public_key=public_line())
    assert caught.value.code == "no_tenant"
    assert services.ssh_key_add(user=ops_user, name="ops", public_key=public_line()).pk


def test_a_suspended_tenant_adds_no_key_but_may_remove_one(owner_a):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    Tenant.objects.filter(pk=owner_a.tenant_id).update(status=Tenant.Status.SUSPENDED)
    with pytest.raises(NotAllowed) as caught:
        services.ssh_key_add(user=owner_a.user, name="new", public_key=public_line())
    assert caught.value.code == "tenant_suspended"
    assert services.ssh_key_remove(user=owner_a.user, key_id=key.pk) is True


# --- removal and the audit trail ------------------------------------------------------------


def test_add_and_remove_are_audited_like_tokens(owner_a):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    (added,) = _audit("ssh_key.added")
    assert added.tenant == owner_a.tenant and added.actor == owner_a.user
    assert key.fingerprint in added.summary and "laptop" in added.summary
    assert added.data == {
        "ssh_key_id": key.pk,
        "name": "laptop",
        "type": "ssh-ed25519",
        "fingerprint": key.fingerprint,
    }
    assert services.ssh_key_remove(user=owner_a.user, key_id=key.pk) is True
    assert not SshKey.objects.filter(pk=key.pk).exists()
    (removed,) = _audit("ssh_key.removed")
    assert removed.actor == owner_a.user and removed.data == added.data
    assert key.fingerprint in removed.summary
    # the tenant's activity list shows both
    actions = [e.action for e in selectors.audit_event_list(tenant=owner_a.tenant)]
    assert {"ssh_key.added", "ssh_key.removed"} <= set(actions)


def test_nobody_removes_another_users_key_and_twice_is_harmless(owner_a, owner_b):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    colleague = MembershipFactory(tenant=owner_a.tenant, role=Role.OWNER)
    for user in (owner_b.user, colleague.user):
        assert services.ssh_key_remove(user=user, key_id=key.pk) is False
    assert SshKey.objects.filter(pk=key.pk).exists() and not _audit("ssh_key.removed")
    assert services.ssh_key_remove(user=owner_a.user, key_id=key.pk) is True
    assert services.ssh_key_remove(user=owner_a.user, key_id=key.pk) is False
    assert len(_audit("ssh_key.removed")) == 1


def test_a_removed_key_can_be_added_again_even_by_another_account(owner_a, owner_b):
    line = public_line()
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    services.ssh_key_remove(user=owner_a.user, key_id=key.pk)
    assert services.ssh_key_add(user=owner_b.user, name="now mine", public_key=line).pk


# --- what the gateway reads and writes -------------------------------------------------------


def test_ssh_key_owner_finds_the_person_by_fingerprint(owner_a):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    found, user = selectors.ssh_key_owner(fingerprint=key.fingerprint)
    assert (found, user) == (key, owner_a.user)
    assert selectors.ssh_key_owner(fingerprint="SHA256:nothing") is None
    owner_a.user.is_active = False
    owner_a.user.save(update_fields=["is_active"])
    assert selectors.ssh_key_owner(fingerprint=key.fingerprint) is None
    services.ssh_key_remove(user=owner_a.user, key_id=key.pk)
    assert selectors.ssh_key_owner(fingerprint=key.fingerprint) is None


def test_ssh_key_owner_is_one_query(owner_a, django_assert_num_queries):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    with django_assert_num_queries(1):
        _, user = selectors.ssh_key_owner(fingerprint=key.fingerprint)
        assert user.email == owner_a.user.email


@pytest.mark.parametrize(
    ("address", "stored"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8::1", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("not an address", None),
        (None, None),
    ],
)
def test_ssh_key_touch_notes_the_last_use(owner_a, address, stored):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    before = timezone.now()
    assert services.ssh_key_touch(key_id=key.pk, address=address) is True
    key.refresh_from_db()
    assert key.last_used_at >= before and key.last_used_address == stored


def test_ssh_key_touch_of_a_removed_key_is_false(owner_a):
    assert services.ssh_key_touch(key_id=987654, address="203.0.113.7") is False


def test_ssh_keys_of_lists_only_the_users_own_newest_first(owner_a, owner_b):
    first = services.ssh_key_add(user=owner_a.user, name="one", public_key=public_line())
    second = services.ssh_key_add(user=owner_a.user, name="two", public_key=public_line())
    services.ssh_key_add(user=owner_b.user, name="bob", public_key=public_line())
    assert list(selectors.ssh_keys_of(owner_a.user)) == [second, first]
    assert list(selectors.ssh_keys_of(AnonymousUser())) == []


def test_the_gateway_host_key_is_made_once_and_kept(settings, tmp_path):
    path = tmp_path / "gateway" / "ssh_host_ed25519_key"
    assert not path.exists()
    fingerprint = selectors.gateway_host_key_fingerprint()
    assert path.exists() and (path.stat().st_mode & 0o777) == 0o600
    assert fingerprint.startswith("SHA256:") and len(fingerprint) == 50
    # the one the gateway serves: the same file, read the way nodes.ssh reads it
    assert fingerprint == node_ssh.fingerprint(node_ssh.load_or_create_platform_key(path))
    assert selectors.gateway_host_key_fingerprint() == fingerprint


def test_an_unusable_gateway_host_key_reads_as_unknown(settings, tmp_path):
    broken = tmp_path / "broken_key"
    broken.write_text("not a key")
    settings.GATEWAY_HOST_KEY_PATH = str(broken)
    assert selectors.gateway_host_key_fingerprint() == ""


# --- races: the database and the owner's row lock hold the rules ---------------------------


def _race(calls) -> list:
    """Run each call in its own thread and connection, released together; what each
    returned or raised."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test reads
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


@pytest.mark.django_db(transaction=True)
def test_one_key_raced_by_two_accounts_lands_on_one(owner_a, owner_b):
    line = public_line()
    results = _race(
        [
            lambda u=m.user: services.ssh_key_add(user=u, name="race", public_key=line)
            for m in (owner_a, owner_b)
        ]
    )
    added = [r for r in results if isinstance(r, SshKey)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert len(added) == 1 and len(refused) == 1, results
    assert refused[0].code == "duplicate_key"
    assert SshKey.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_parallel_adds_never_pass_the_cap(owner_a):
    SshKey.objects.bulk_create(
        SshKey(
            user=owner_a.user,
            name=f"k{i}",
            key_type="ssh-ed25519",
            public_key=f"ssh-ed25519 fake{i}",
            fingerprint=f"SHA256:fake{i}",
        )
        for i in range(MAX_SSH_KEYS_PER_USER - 2)
    )
    lines = [public_line() for _ in range(4)]
    results = _race(
        [
            lambda line=line: services.ssh_key_add(user=owner_a.user, name="p", public_key=line)
            for line in lines
        ]
    )
    assert sum(isinstance(r, SshKey) for r in results) == 2, results
    assert all(r.code == "too_many_keys" for r in results if isinstance(r, Conflict))
    assert owner_a.user.ssh_keys.count() == MAX_SSH_KEYS_PER_USER
