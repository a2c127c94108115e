"""What a new renter and an owner meet on the pages in a first day, each once wrong: the
launch form's choice of the account's SSH keys, the output box's "nothing printed yet",
the spend-limit page, one status for every form that cannot be accepted, Resume… while a
stop is under way, and `make run`'s production mode (the platform's own error pages,
static files through WhiteNoise with DEBUG off)."""

import re
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.utils import timezone
from django.views.defaults import server_error

from nodes.models import Node
from tenants import services
from tenants.models import AuditEvent, Image, Purchase, Role, Slice, SliceLogLine, Tier, Volume
from tests.factories import MembershipFactory
from tests.tenants.page_support import launch_data, placed_slice
from tests.tenants.ssh_material import public_line

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def image(ops_user) -> Image:
    return services.image_create(
        actor=ops_user, name="torch", reference="pytorch/pytorch:2.4.0", ports=[22]
    )


@pytest.fixture
def purchase(owner_a, ops_user) -> Purchase:
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="trial")
    tier = Tier.objects.get(vram_mb=8192)
    return services.purchase_create(membership=owner_a, tier=tier, hours=2)[0]


def _launch(client, purchase, image, **fields):
    data = launch_data(
        purchase, image, **{"idempotency_token": "renter-day-1", "ssh_public_key": "", **fields}
    )
    return client.post("/launch/", data)


@pytest.fixture
def placed(owner_a, purchase, image, django_capture_on_commit_callbacks):
    """A slice placed on a GPU (provisioning itself is the lab's business), in `state`."""

    def place(state: str) -> Slice:
        slice = placed_slice(
            django_capture_on_commit_callbacks,
            membership=owner_a,
            purchase=purchase,
            image=image,
            state=state,
        )
        assert slice.state == Slice.State.PROVISIONING  # as the launch left it
        return slice

    return place


# --- 1. the launch form offers the account's SSH keys ----------------------------------------


def test_launch_offers_the_accounts_keys_with_the_newest_chosen(client, owner_a, purchase, image):
    old = services.ssh_key_add(user=owner_a.user, name="desk", public_key=public_line())
    new = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    select = re.search(r'<select name="ssh_key".*?</select>', page, re.S).group(0)
    assert f'value="{new.pk}" selected' in select and "laptop" in select
    assert f'value="{old.pk}"' in select and "Paste a key below" in select
    assert new.fingerprint in select


def test_launch_offers_an_ssh_images_home_as_a_volume_path(client, owner_a, ops_user, purchase):
    """An SSH image whose sshd logs in as `renter` offers /home/renter for a volume (so the
    home survives a stop); a root login's home is not offered."""
    services.image_create(
        actor=ops_user, name="ssh-box", reference="lab/ssh:1", ports=[22], ssh_user="renter"
    )
    services.image_create(actor=ops_user, name="root-box", reference="lab/root:1", ports=[22])
    node = Node.objects.create(name="v-node", address="10.9.0.2", host_key="k")
    Volume.objects.create(
        tenant=owner_a.tenant, node=node, name="home", size_gb=5,
        docker_name="gpp-vol-1-0123abcd", state="ready", last_metered_at=timezone.now(),
    )  # fmt: skip
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    hint = re.search(r'<small class="muted" id="volume-paths">.*?</small>', page, re.S).group(0)
    assert "<code>/home/renter</code>" in hint and "/home/root" not in hint


def test_launch_without_registered_keys_says_where_to_register_one(client, owner_a, purchase):
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    assert 'name="ssh_key"' not in page and 'id="no-ssh-keys"' in page


def test_a_chosen_registered_key_is_the_slices_key(client, owner_a, purchase, image):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    client.force_login(owner_a.user)
    response = _launch(client, purchase, image, ssh_key=key.pk)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Slice.objects.get().ssh_public_key == key.public_key


def test_another_accounts_key_is_refused_and_nothing_launches(
    client, owner_a, owner_b, purchase, image
):
    theirs = services.ssh_key_add(user=owner_b.user, name="bob", public_key=public_line())
    colleague = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    same_tenant = services.ssh_key_add(user=colleague.user, name="c", public_key=public_line())
    client.force_login(owner_a.user)
    for key in (theirs, same_tenant):
        response = _launch(client, purchase, image, ssh_key=key.pk)
        assert response.status_code == 400
        assert "Select a valid choice" in response.content.decode()
    assert not Slice.objects.exists()


def test_a_chosen_key_and_a_pasted_one_at_once_is_refused_by_name(client, owner_a, purchase, image):
    key = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=public_line())
    client.force_login(owner_a.user)
    response = _launch(client, purchase, image, ssh_key=key.pk, ssh_public_key=public_line())
    assert response.status_code == 400
    assert "You chose your registered key &#x27;laptop&#x27;" in response.content.decode()
    assert not Slice.objects.exists()
    pasted = public_line()
    assert _launch(client, purchase, image, ssh_key="", ssh_public_key=pasted).status_code == 302
    assert Slice.objects.get().ssh_public_key.split()[:2] == pasted.split()[:2]


# --- 2. "Nothing printed yet." only while nothing is --------------------------------------------


def test_the_first_lines_polled_take_nothing_printed_yet_away(client, owner_a, placed):
    slice = placed(Slice.State.RUNNING)
    client.force_login(owner_a.user)
    assert 'id="log-empty"' in client.get(f"/slices/{slice.pk}/").content.decode()
    empty = client.get(f"/slices/{slice.pk}/logs/?after=0", **HX).content.decode()
    assert "log-empty" not in empty  # nothing new: the note stays
    SliceLogLine.objects.create(slice=slice, seq=1, at=timezone.now(), text="loading weights")
    polled = client.get(f"/slices/{slice.pk}/logs/?after=0", **HX).content.decode()
    assert '<p id="log-empty" hx-swap-oob="delete"></p>' in polled
    assert "loading weights" in polled
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert "loading weights" in page and "Nothing printed yet." not in page


# --- 6. Resume… while the stop is under way --------------------------------------------------


def test_resume_shows_disabled_while_stopping_then_comes_with_the_poll(client, owner_a, placed):
    slice = placed(Slice.State.STOPPING)
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    button = re.search(r'<button[^>]*id="resume-link"[^>]*>', page).group(0)
    assert "disabled" in button and 'id="resume-note"' in page
    live = client.get(f"/slices/{slice.pk}/", **HX)
    assert live.status_code == 200 and '<section id="slice-runs" hx-swap-oob="true">' in (
        live.content.decode()
    )
    Slice.objects.filter(pk=slice.pk).update(  # as the stop leaves it: no VRAM held
        state=Slice.State.STOPPED, allocation=None, stopped_at=timezone.now()
    )
    done = client.get(f"/slices/{slice.pk}/", **HX)
    runs = done.content.decode().split('<section id="slice-runs" hx-swap-oob="true">')[1]
    assert done.status_code == 286
    assert f'href="/slices/{slice.pk}/resume/" id="resume-link"' in runs
    assert "disabled" not in runs.split("</section>")[0]


def test_a_viewer_gets_no_resume_in_the_live_part(client, owner_a, placed):
    slice = placed(Slice.State.STOPPING)
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    client.force_login(viewer.user)
    assert "resume-link" not in client.get(f"/slices/{slice.pk}/", **HX).content.decode()


# --- 3. spend limits on a page ------------------------------------------------------------------


def test_an_owner_sets_and_lifts_the_tenants_limit_on_the_page_with_an_audit_trail(client, owner_a):
    client.force_login(owner_a.user)
    account = client.get("/account/").content.decode()
    assert 'href="/spend-limits/" id="spend-limits-link"' in account
    page = client.get("/spend-limits/")
    assert page.status_code == 200 and 'id="spend-limit-form"' in page.content.decode()
    saved = client.post("/spend-limits/", {"whose": "tenant", "limit": "250.00"})
    assert saved.status_code == 302 and saved["Location"] == "/spend-limits/"
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.spend_limit == Decimal("250.00")
    event = AuditEvent.objects.get(action="spend.limit")
    assert event.actor == owner_a.user and "250.00 credits" in event.summary
    client.post("/spend-limits/", {"whose": "tenant", "limit": ""})
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.spend_limit is None
    assert AuditEvent.objects.filter(action="spend.limit").count() == 2


def test_an_owner_sets_a_members_limit_but_not_another_tenants(client, owner_a, owner_b):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    client.force_login(owner_a.user)
    client.post("/spend-limits/", {"whose": f"member:{member.pk}", "limit": "40"})
    member.refresh_from_db()
    assert member.spend_limit == Decimal("40.00")
    page = client.get("/spend-limits/").content.decode()
    assert f'data-member="{member.pk}"' in page
    foreign = client.post("/spend-limits/", {"whose": f"member:{owner_b.pk}", "limit": "1"})
    assert foreign.status_code == 400 and "Select a valid choice" in foreign.content.decode()
    owner_b.refresh_from_db()
    assert owner_b.spend_limit is None
    bad = client.post("/spend-limits/", {"whose": "tenant", "limit": "-5"})
    assert bad.status_code == 400 and "greater than or equal to 0" in bad.content.decode()


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_read_the_limits_but_cannot_set_them(client, owner_a, role):
    services.spend_limit_set(actor=owner_a.user, tenant=owner_a.tenant, limit="99")
    other = MembershipFactory(tenant=owner_a.tenant, role=role)
    client.force_login(other.user)
    page = client.get("/spend-limits/").content.decode()
    assert 'id="spend-owners-only"' in page and "spend-limit-form" not in page
    assert re.search(r'id="tenant-limit">.*99\.00', page)
    refused = client.post("/spend-limits/", {"whose": "tenant", "limit": "100000"})
    assert refused.status_code == 403
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.spend_limit == Decimal("99.00")


def test_the_spend_limit_form_needs_its_csrf_token(owner_a):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner_a.user)
    assert browser.post("/spend-limits/", {"whose": "tenant", "limit": "5"}).status_code == 403
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.spend_limit is None


# --- 4. one status for a form that cannot be accepted ----------------------------------------


def test_signup_ssh_key_and_volume_forms_all_answer_400_with_the_field_error(client, owner_a):
    bad_signup = client.post(
        "/signup/",
        {"tenant_name": "", "email": "x@y.test", "password": "p", "password_confirm": "p"},
    )
    assert bad_signup.status_code == 400 and "required" in bad_signup.content.decode()
    client.force_login(owner_a.user)
    for extra in ({}, HX):
        key = client.post("/account/ssh-keys/", {"name": "a", "public_key": "hello"}, **extra)
        assert key.status_code == 400 and "Not an OpenSSH public key" in key.content.decode()
    volume = client.post("/volumes/", {"name": "ckpt", "size_gb": "0"})
    assert volume.status_code == 400 and "greater than or equal to 1" in volume.content.decode()
    token = client.post("/account/tokens/", {"name": ""}, **HX)
    assert token.status_code == 400


def test_htmx_is_told_to_swap_the_4xx_answers_forms_give(client):
    page = client.get("/tiers/").content.decode()
    config = re.search(r"<meta name=\"htmx-config\" content='([^']*)'", page).group(1)
    assert '"^(400|403|409|422|429)$", "swap": true' in config


# --- 5. production mode, as `make run` serves ---------------------------------------------------


@pytest.fixture
def production(settings, tmp_path):
    """DEBUG off with the manifest storage and WhiteNoise serving what collectstatic wrote."""
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    call_command("collectstatic", interactive=False, verbosity=0)
    settings.DEBUG = False
    return Client()  # its handler loads WhiteNoise with these settings


def test_with_debug_off_pages_load_their_css_and_js_through_whitenoise(production):
    page = production.get("/tiers/")
    assert page.status_code == 200
    html = page.content.decode()
    css = re.search(r'href="(/static/css/app\.[0-9a-f]{12}\.css)"', html).group(1)
    js = re.search(r'src="(/static/vendor/htmx/htmx\.min\.[0-9a-f]{12}\.js)"', html).group(1)
    for url, kind in ((css, "text/css"), (js, "javascript")):
        answer = production.get(url)
        assert answer.status_code == 200 and kind in answer["Content-Type"]
        assert b"".join(answer.streaming_content)
    assert production.get("/static/css/no-such-file.css").status_code == 404


def test_with_debug_off_a_missing_page_is_the_platforms_own_404_without_routes(production):
    missing = production.get("/no/such/page/")
    assert missing.status_code == 404
    html = missing.content.decode()
    assert 'id="not-found"' in html and "gpuplatform" in html
    assert "URLconf" not in html and "api/v1/" not in html and "admin/" not in html


def test_the_500_page_is_the_platforms_own_and_needs_no_request_context(production):
    response = server_error(RequestFactory().get("/boom/"))
    html = response.content.decode()
    assert response.status_code == 500 and 'id="server-error"' in html
    assert re.search(r"/static/css/app\.[0-9a-f]{12}\.css", html)
