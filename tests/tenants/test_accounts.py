"""Sign-up, members, roles and invitations: the account rules and their pages."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.cache import cache

from gpuplatform.celery import app
from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from tenants import services
from tenants.models import AuditEvent, Invitation, Membership, Role, Tenant
from tenants.tokens import hash_secret
from tests.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db
User = get_user_model()


def _signup(client, **overrides):
    data = {
        "tenant_name": "Gamma AI",
        "email": "Carol@Gamma.test",
        "password": PASSWORD,
        "password_confirm": PASSWORD,
        **overrides,
    }
    return client.post("/signup/", data)


def sign_up_link(outbox) -> str:
    """The path of the link the last sign-up mail holds."""
    link = re.search(r"http://\S+(/signup/confirm/\S+/)", outbox[-1].body)
    assert link, outbox[-1].body
    return link.group(1)


def test_signup_mails_a_link_that_creates_the_tenant_with_its_owner_and_logs_in(client):
    response = _signup(client)
    assert response.status_code == 302 and response["Location"] == "/signup/sent/"
    assert "Check your email" in client.get("/signup/sent/").content.decode()
    assert not User.objects.exists() and not Tenant.objects.exists()  # nothing before the link
    assert [m.to for m in mail.outbox] == [["carol@gamma.test"]]
    assert "Gamma AI" in mail.outbox[0].body

    hop = client.get(sign_up_link(mail.outbox))
    assert hop.status_code == 302 and hop["Location"] == "/signup/confirm/"
    page = client.get("/signup/confirm/").content.decode()
    assert "carol@gamma.test" in page and "Gamma AI" in page
    assert not User.objects.exists()  # opening the link alone makes nothing
    done = client.post("/signup/confirm/")
    assert done.status_code == 302 and done["Location"] == "/dashboard/"
    membership = Membership.objects.get(user__email="carol@gamma.test")
    assert membership.role == Role.OWNER
    assert membership.tenant.name == "Gamma AI"
    assert membership.tenant.slug == "gamma-ai"
    assert membership.tenant.status == Tenant.Status.ACTIVE
    page = client.get("/account/").content.decode()
    assert "Gamma AI" in page and "owner" in page
    assert AuditEvent.objects.filter(tenant=membership.tenant, action="tenant.created").exists()
    # the password chosen on the form is the account's
    client.logout()
    login = client.post("/accounts/login/", {"username": "carol@gamma.test", "password": PASSWORD})
    assert login.status_code == 302


def test_signup_with_taken_email_changes_nothing_and_mails_the_owner(client, owner_a):
    tenants_before = Tenant.objects.count()
    response = _signup(client, email=owner_a.user.email.upper())
    assert response.status_code == 302 and response["Location"] == "/signup/sent/"
    assert Tenant.objects.count() == tenants_before
    assert User.objects.count() == 1
    assert [m.to for m in mail.outbox] == [[owner_a.user.email]]
    assert "already has an account" in mail.outbox[0].body
    assert "/signup/confirm/" not in mail.outbox[0].body


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"password": "password1", "password_confirm": "password1"}, "too common"),
        ({"password_confirm": "different-thing-99"}, "differ"),
        ({"email": "not-an-email"}, "valid email"),
        ({"tenant_name": ""}, "required"),
        ({"tenant_name": "x" * 101}, "at most 100"),
    ],
)
def test_signup_rejects_bad_input_without_creating_anything(client, overrides, message):
    response = _signup(client, **overrides)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not User.objects.exists()
    assert not Tenant.objects.exists()


def test_signup_is_atomic_when_tenant_step_fails():
    with pytest.raises(ServiceError):
        services.tenant_sign_up(email="d@d.test", password=PASSWORD, tenant_name="   ")
    assert not User.objects.filter(email="d@d.test").exists()


def test_invitation_flow_emails_a_link_that_joins_the_tenant(
    client, owner_a, django_capture_on_commit_callbacks, settings
):
    settings.CELERY_TASK_ALWAYS_EAGER = True

    app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            invitation = services.invitation_create(
                actor_membership=owner_a, email="Dan@Alpha.test", role=Role.VIEWER
            )
    finally:
        app.conf.task_always_eager = False
    invitation.refresh_from_db()
    assert invitation.email == "dan@alpha.test"
    assert invitation.sent_at is not None and invitation.token_hash
    assert len(mail.outbox) == 1
    link = re.search(r"http://\S+/invitations/(\S+)/", mail.outbox[0].body)
    assert link, mail.outbox[0].body
    token = link.group(1)
    assert token not in invitation.token_hash  # only the hash is stored

    hop = client.get(f"/invitations/{token}/")
    assert hop.status_code == 302 and hop["Location"] == "/invitations/accept/"
    page = client.get("/invitations/accept/")
    assert page.status_code == 200 and "Alpha Labs" in page.content.decode()
    assert token not in page.content.decode()  # the secret is not echoed back
    response = client.post(
        "/invitations/accept/", {"password": PASSWORD, "password_confirm": PASSWORD}
    )
    assert response.status_code == 302
    member = Membership.objects.get(user__email="dan@alpha.test")
    assert member.tenant == owner_a.tenant and member.role == Role.VIEWER
    # the link works once
    client.logout()
    assert client.get(f"/invitations/{token}/").status_code == 404


def test_invitation_task_is_safe_to_run_twice(owner_a):
    invitation = services.invitation_create(
        actor_membership=owner_a, email="e@alpha.test", role=Role.MEMBER
    )
    assert services.invitation_send(invitation_id=invitation.pk) is True
    assert services.invitation_send(invitation_id=invitation.pk) is False
    assert services.invitation_send(invitation_id=999999) is False
    assert len(mail.outbox) == 1


def test_only_owners_invite_and_duplicates_are_refused(owner_a):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    with pytest.raises(NotAllowed):
        services.invitation_create(actor_membership=member, email="x@y.test", role="member")
    services.invitation_create(actor_membership=owner_a, email="x@y.test", role="member")
    with pytest.raises(Conflict, match="pending invitation"):
        services.invitation_create(actor_membership=owner_a, email="X@y.test", role="viewer")
    with pytest.raises(Conflict, match="already a member"):
        services.invitation_create(actor_membership=owner_a, email=member.user.email, role="member")


def test_revoked_invitation_link_no_longer_works(client, owner_a):
    invitation = services.invitation_create(
        actor_membership=owner_a, email="f@alpha.test", role=Role.MEMBER
    )

    Invitation.objects.filter(pk=invitation.pk).update(token_hash=hash_secret("known"))
    assert client.get("/invitations/known/").status_code == 302
    services.invitation_revoke(actor_membership=owner_a, invitation=invitation)
    assert client.get("/invitations/known/").status_code == 404


def test_last_owner_cannot_be_demoted_or_removed(owner_a):
    with pytest.raises(Conflict, match="at least one owner"):
        services.membership_change_role(
            actor_membership=owner_a, membership=owner_a, role=Role.MEMBER
        )
    with pytest.raises(Conflict, match="at least one owner"):
        services.membership_remove(actor_membership=owner_a, membership=owner_a)
    second = MembershipFactory(tenant=owner_a.tenant, role=Role.OWNER)
    services.membership_change_role(actor_membership=second, membership=owner_a, role=Role.MEMBER)
    owner_a.refresh_from_db()
    assert owner_a.role == Role.MEMBER


def test_members_page_actions_via_htmx(client, owner_a):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    client.force_login(owner_a.user)
    response = client.post(
        f"/account/members/{member.pk}/role/", {"role": "viewer"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert "is now viewer" in response.content.decode()
    member.refresh_from_db()
    assert member.role == Role.VIEWER
    response = client.post(
        f"/account/members/{owner_a.pk}/role/", {"role": "viewer"}, HTTP_HX_REQUEST="true"
    )
    assert "at least one owner" in response.content.decode()
    response = client.post(f"/account/members/{member.pk}/remove/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert not Membership.objects.filter(pk=member.pk).exists()


def test_non_owner_sees_no_member_controls_and_cannot_post(client, owner_a):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    client.force_login(viewer.user)
    page = client.get("/account/").content.decode()
    assert "Invite someone" not in page
    response = client.post(f"/account/members/{owner_a.pk}/remove/")
    assert response.status_code == 302
    assert Membership.objects.filter(pk=owner_a.pk).exists()


def test_password_reset_sends_a_working_link(client, owner_a):
    response = client.post("/accounts/password_reset/", {"email": owner_a.user.email})
    assert response.status_code == 302
    assert len(mail.outbox) == 1
    path = re.search(r"http://[^/]+(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
    response = client.get(path, follow=True)
    form_url = response.redirect_chain[-1][0]
    new = "another-long-passphrase-42"
    response = client.post(form_url, {"new_password1": new, "new_password2": new})
    assert response.status_code == 302
    assert client.login(username=owner_a.user.username, password=new)


def test_password_change_requires_login_and_old_password(client, owner_a):
    assert client.get("/accounts/password_change/").status_code == 302
    client.force_login(owner_a.user)
    new = "yet-another-passphrase-7"
    response = client.post(
        "/accounts/password_change/",
        {
            "old_password": "wrong",
            "new_password1": new,
            "new_password2": new,
        },
    )
    assert response.status_code == 200
    response = client.post(
        "/accounts/password_change/",
        {
            "old_password": PASSWORD,
            "new_password1": new,
            "new_password2": new,
        },
    )
    assert response.status_code == 302


def test_logout_is_post_only(client, owner_a):
    client.force_login(owner_a.user)
    assert client.get("/accounts/logout/").status_code == 405
    assert client.post("/accounts/logout/").status_code in (200, 302)
    assert client.get("/account/").status_code == 302


def test_user_without_tenant_can_create_one(client):
    user = UserFactory()
    client.force_login(user)
    assert "not in a tenant" in client.get("/account/").content.decode()
    response = client.post("/account/", {"tenant_name": "Solo"})
    assert response.status_code == 302
    assert Membership.objects.get(user=user).role == Role.OWNER


def test_failed_logins_are_limited_per_address(client, owner_a, settings):
    cache.clear()
    settings.LOGIN_FAILURE_LIMIT = 3
    for _ in range(3):
        response = client.post(
            "/accounts/login/", {"username": owner_a.user.username, "password": "wrong"}
        )
        assert response.status_code == 200
    locked = client.post(
        "/accounts/login/", {"username": owner_a.user.username, "password": PASSWORD}
    )
    assert locked.status_code == 429  # even the right password waits
    cache.clear()
    ok = client.post("/accounts/login/", {"username": owner_a.user.username, "password": PASSWORD})
    assert ok.status_code == 302
