# The gpuplatform image: one image for web (gunicorn), Celery worker, Celery beat and
# the one-shot migration (see docker-compose.yml). Configuration comes from the
# environment at run time (.env.example lists every variable).
FROM python:3.11-slim

# PYTHONPATH: the source tree in /app is what runs, not the copy `pip install .` puts
# in site-packages, because settings find templates/ and static/ beside the packages.
# DJANGO_STATIC_ROOT is fixed here: collectstatic fills it at build time and whitenoise
# serves its manifest at run time, so both must see the same path.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=gpuplatform.settings \
    DJANGO_STATIC_ROOT=/app/staticfiles \
    GPUPLATFORM_VAR_DIR=/app/var

RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app/var --no-create-home \
       --shell /usr/sbin/nologin app

WORKDIR /app

# Dependencies first, from pyproject.toml alone (with empty packages), so that a code
# change does not reinstall them: this layer stays cached until pyproject.toml changes.
COPY pyproject.toml ./
RUN mkdir gpuplatform tenants nodes incidents estimator \
    && touch gpuplatform/__init__.py tenants/__init__.py nodes/__init__.py incidents/__init__.py \
       estimator/__init__.py \
    && pip install . \
    && rm -rf gpuplatform tenants nodes incidents estimator build ./*.egg-info

COPY . .
RUN pip install --no-deps . && rm -rf build ./*.egg-info

# Production settings refuse the development secret, so collectstatic gets a throwaway
# one that lives only in this RUN step (it is neither an ENV nor in the final config).
RUN DJANGO_DEBUG=false \
    DJANGO_SECRET_KEY=build-only-collectstatic-throwaway-not-used-at-run-time-7f3c9a \
    python manage.py collectstatic --noinput \
    && mkdir -p /app/var/ssh \
    && chown -R app:app /app/var && chmod 700 /app/var/ssh

# The code stays owned by root (read-only for the app); only /app/var (also the app
# user's home) is writable.
USER 10001:10001

EXPOSE 8000

# Three sync workers and a 60 s timeout suit a small node; to change them, override
# the web service's command. The heartbeat files go to /dev/shm, not the overlay fs.
CMD ["gunicorn", "gpuplatform.wsgi:application", \
     "--bind", "0.0.0.0:8000", \
     "--workers", "3", \
     "--timeout", "60", \
     "--graceful-timeout", "30", \
     "--worker-tmp-dir", "/dev/shm", \
     "--access-logfile", "-", \
     "--logger-class", "gpuplatform.gunicorn_logging.RedactingLogger", \
     "--error-logfile", "-"]
