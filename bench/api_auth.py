"""API token authentication cost: an authenticated API read with a bearer token,
against the same read with a browser session (the baseline), in one run.

Token auth hashes the presented token and looks it up by its hash; it should cost
about what a session lookup costs. Runs in-process (Django's test client) against a
throwaway database on the configured server, so it measures the app, not the network.

    .venv/bin/python bench/api_auth.py [--requests 400]
"""

import argparse
import statistics
import time

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import throwaway_database

# isort: split
from django.conf import settings
from django.test import Client

from tenants import services


def _median_ms(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()

    settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {
        "anon": None,
        "user": None,
        "auth_failure": None,
    }
    with throwaway_database("gpuplatform") as connection:
        membership = services.tenant_sign_up(
            email="bench@example.com", password="bench-passphrase-long-1", tenant_name="Bench"
        )
        _, value = services.api_token_create(user=membership.user, name="bench")
        token_client = Client(HTTP_AUTHORIZATION=f"Bearer {value}")
        session_client = Client()
        session_client.force_login(membership.user)
        url = "/api/v1/tiers/"
        for client in (token_client, session_client):
            for _ in range(20):  # warm up
                assert client.get(url).status_code == 200
        # interleave the two so machine noise hits both alike
        token_ms, session_ms = [], []
        for _ in range(5):
            token_ms.append(_median_ms(lambda: token_client.get(url), args.requests // 5))
            session_ms.append(_median_ms(lambda: session_client.get(url), args.requests // 5))
        token = statistics.median(token_ms)
        session = statistics.median(session_ms)
        print(f"database={connection.vendor} requests={args.requests} per auth mode")
        print(
            f"RESULT token_auth_read_ms={token:.3f} ms baseline={session:.3f} "
            f"ratio={token / session:.2f}"
        )


if __name__ == "__main__":
    main()
