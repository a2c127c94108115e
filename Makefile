# One command to run the platform, one to test it (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TEST_DATABASE_URL ?= $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/test)
TEST_REDIS_URL ?= $(or $(REDIS_URL),redis://127.0.0.1:6379/0)
VENDOR := static/vendor

.PHONY: run test install install-test chromium lab-packages lint format vendor clean screenshots

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# `make run` runs as production does (DJANGO_DEBUG off: the platform's own 404 and 500
# pages, static files collected into var/staticfiles and served by WhiteNoise), over plain
# HTTP on loopback: a secret of its own kept in var/secret-key, no HTTPS redirect, HSTS or
# secure-only cookies. A variable already set in the environment wins.
run: export DJANGO_DEBUG ?= false
run: export DJANGO_SECRET_KEY ?= $(shell cat var/secret-key 2>/dev/null)
run: export DJANGO_ALLOWED_HOSTS ?= 127.0.0.1,localhost,[::1]
run: export DJANGO_SECURE_SSL_REDIRECT ?= false
run: export DJANGO_SESSION_COOKIE_SECURE ?= false
run: export DJANGO_CSRF_COOKIE_SECURE ?= false
run: export DJANGO_SECURE_HSTS_SECONDS ?= 0
run: export DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS ?= false
run: export DJANGO_SECURE_HSTS_PRELOAD ?= false
run: export DJANGO_BEHIND_TLS_PROXY ?= false
# the slices' port addresses over plain HTTP on the edge's port: http://s<id>-<port>.gpp-proxy.localhost:8001/
run: export GPUPLATFORM_PROXY_SCHEME ?= http
run: export GPUPLATFORM_PROXY_PUBLIC_PORT ?= 8001

var/secret-key: | $(PY)
	@mkdir -p var
	@umask 077 && $(PY) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@

## run: migrate, collect static files, seed the demo, start web + Celery worker + beat
## (Ctrl-C stops all)
run: install var/secret-key
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py seed_demo
	$(PY) manage.py run_stack

## chromium: Debian's browser for the page-flow tests (never a downloaded build)
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

## lab-packages: what the node lab needs (a real sshd and Docker Engine per lab node, a
## static busybox and gcc for its workload image) and docker-compose to check the compose
## file; installed only where missing, as root
lab-packages:
	@missing=""; \
	command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || missing="$$missing docker.io"; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	[ -x /usr/bin/rsync ] || missing="$$missing rsync"; \
	command -v ssh-keygen >/dev/null 2>&1 || missing="$$missing openssh-client"; \
	dpkg -s busybox-static >/dev/null 2>&1 || missing="$$missing busybox-static"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	dpkg -s libc6-dev >/dev/null 2>&1 || missing="$$missing libc6-dev"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing for the node lab:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "the node lab needs:$$missing (not root or no apt: lab tests will say why)"; \
	  fi; \
	fi

## test: install what the tests need and run the whole suite on PostgreSQL and Redis
test: install-test chromium lab-packages
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	  $(PY) -m pytest --durations=10 $(PYTEST_ARGS)

## screenshots: redraw the README's pictures (docs/screenshots/*.png: dashboard, launch, fit,
## fleet, incident ledger; each at 1366x900 as <name>.png and at 390x844 as <name>-phone.png)
## in headless chromium, from a scene made in a throwaway test database on PostgreSQL
## (TEST_DATABASE_URL as for `make test`; no Redis needed)
screenshots: install-test chromium
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL= GPUPLATFORM_SCREENSHOTS_DIR=docs/screenshots \
	  $(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_every_page.py -k test_readme_screenshots

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install-test
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## vendor: refresh static/vendor/ from the pinned npm packages (files are committed)
vendor:
	npm ci --no-audit --no-fund
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/htmx $(VENDOR)/chartjs $(VENDOR)/pico $(VENDOR)/swagger-ui \
	  $(VENDOR)/xterm
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/htmx.org/LICENSE $(VENDOR)/htmx/
	cp node_modules/chart.js/dist/chart.umd.min.js node_modules/chart.js/dist/chart.umd.min.js.map \
	   node_modules/chart.js/LICENSE.md $(VENDOR)/chartjs/
	cp node_modules/@picocss/pico/css/pico.min.css node_modules/@picocss/pico/LICENSE.md $(VENDOR)/pico/
	cp node_modules/swagger-ui-dist/swagger-ui-bundle.js \
	   node_modules/swagger-ui-dist/swagger-ui-standalone-preset.js \
	   node_modules/swagger-ui-dist/swagger-ui.css \
	   node_modules/swagger-ui-dist/swagger-ui.css.map \
	   node_modules/swagger-ui-dist/favicon-32x32.png \
	   node_modules/swagger-ui-dist/LICENSE $(VENDOR)/swagger-ui/
	cp node_modules/@xterm/xterm/lib/xterm.js node_modules/@xterm/xterm/lib/xterm.js.map \
	   node_modules/@xterm/xterm/css/xterm.css node_modules/@xterm/xterm/LICENSE \
	   node_modules/@xterm/addon-fit/lib/addon-fit.js node_modules/@xterm/addon-fit/lib/addon-fit.js.map \
	   $(VENDOR)/xterm/
	node -e 'const p=require("./package.json").devDependencies;console.log(Object.entries(p).map(e=>e.join("@")).join("\n"))' > $(VENDOR)/VERSIONS.txt

clean:
	rm -rf $(VENV) var node_modules
