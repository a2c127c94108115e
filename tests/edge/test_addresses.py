"""Port addresses' host names, and the signed values that let a browser in."""

from __future__ import annotations

import pytest
from django.core import signing

from edge import addresses
from edge.addresses import Address


@pytest.fixture(autouse=True)
def proxy_domain(settings):
    settings.PROXY_DOMAIN = "apps.example.net"
    settings.PROXY_SCHEME = "https"
    settings.PROXY_PUBLIC_PORT = ""
    settings.PROXY_HANDOFF_S = 60


SECRET = "a" * 26


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("s42-8888.apps.example.net", Address(42, 8888)),
        ("S42-8888.APPS.example.net:443", Address(42, 8888)),  # case and port ignored
        ("s42-8888.apps.example.net.", Address(42, 8888)),
        (f"s42-8888-{SECRET}.apps.example.net", Address(42, 8888, SECRET)),
        ("s42-65536.apps.example.net", None),
        ("s42-0.apps.example.net", None),
        ("s0-80.apps.example.net", None),
        ("s042-80.apps.example.net", None),
        ("x.s42-80.apps.example.net", None),  # one label only
        ("s42-80.apps.example.net.evil.test", None),
        ("s42-80.evilapps.example.net", None),
        (f"s42-80-{SECRET[:-1]}.apps.example.net", None),  # a secret is 26 characters
        ("s42-80-0000000000000000000000000a.apps.example.net", None),  # base32 has no 0
        ("apps.example.net", None),
        ("[::1]:8001", None),
        ("", None),
    ],
)
def test_a_host_names_one_slice_and_port_or_nothing(host, expected):
    assert addresses.parse_host(host) == expected


def test_addresses_round_trip_and_say_their_port_when_it_is_not_the_schemes(settings):
    assert addresses.url_for(7, 8888) == "https://s7-8888.apps.example.net/"
    settings.PROXY_PUBLIC_PORT = "8001"
    settings.PROXY_SCHEME = "http"
    url = addresses.url_for(7, 8888, SECRET, "/lab")
    assert url == f"http://s7-8888-{SECRET}.apps.example.net:8001/lab"
    assert addresses.parse_host(url.split("/")[2]) == Address(7, 8888, SECRET)


def test_a_new_secret_is_one_dns_label_of_base32_and_never_repeats():
    secrets = {addresses.new_secret() for _ in range(200)}
    assert len(secrets) == 200
    assert all(addresses.SECRET_RE.fullmatch(s) for s in secrets)


@pytest.mark.parametrize(
    ("asked", "lands"),
    [
        ("/lab?token=x", "/lab?token=x"),
        ("", "/"),
        ("//evil.test/", "/"),
        ("https://evil.test/", "/"),
        ("/\\evil.test", "/"),
        ("/a\r\nSet-Cookie: x", "/"),
        ("lab", "/"),
    ],
)
def test_the_hand_off_lands_only_on_a_path_of_the_address(asked, lands):
    assert addresses.safe_next(asked) == lands


def _query(url: str) -> tuple[str, str]:
    query = url.split("?", 1)[1]
    parts = dict(p.split("=", 1) for p in query.split("&"))
    return parts["t"], parts["next"]


def test_a_hand_off_is_for_its_own_address_and_ages_out(settings):
    url = addresses.handoff(user_id=5, slice_id=42, port=8888, next_path="/lab")
    assert url.startswith("https://s42-8888.apps.example.net/.gpp/handoff?")
    value, next_value = _query(url)
    read = addresses.read_handoff(value, next_value, Address(42, 8888))
    assert read is not None and read[0] == 5 and read[2] == "/lab"
    assert addresses.read_handoff(value, next_value, Address(42, 8889)) is None
    assert addresses.read_handoff(value, next_value, Address(43, 8888)) is None
    assert addresses.read_handoff(value, next_value, Address(42, 8888, SECRET)) is None
    assert addresses.read_handoff(value + "x", next_value, Address(42, 8888)) is None
    settings.PROXY_HANDOFF_S = -1
    assert addresses.read_handoff(value, next_value, Address(42, 8888)) is None


def test_a_session_cookie_holds_for_its_own_address_only(settings):
    value = addresses.session_value(user_id=9, where=Address(42, 8888))
    assert addresses.read_session(value, Address(42, 8888)) == 9
    assert addresses.read_session(value, Address(42, 22)) is None
    assert addresses.read_session(value, Address(41, 8888)) is None
    forged = signing.dumps({"u": 1, "s": 42, "p": 8888, "t": 0}, salt="another")
    assert addresses.read_session(forged, Address(42, 8888)) is None
    settings.PROXY_SESSION_S = -1
    assert addresses.read_session(value, Address(42, 8888)) is None
