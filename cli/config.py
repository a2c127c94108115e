"""Where `gpp` keeps the platform's URL and the API token: one JSON file in the user's
config directory, readable by its owner only; GPP_URL and GPP_TOKEN override it."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import click

APP_NAME = "gpp"
FILE_NAME = "config.json"
DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str
    url_from: str  # "GPP_URL", the config file's path, or "default"
    token_from: str  # "GPP_TOKEN", the config file's path, or "" when there is none


def config_dir() -> Path:
    """GPP_CONFIG_DIR, else the platform's per-user config directory (XDG_CONFIG_HOME or
    ~/.config/gpp on Linux, ~/Library/Application Support/gpp on macOS, %APPDATA% on
    Windows)."""
    chosen = os.environ.get("GPP_CONFIG_DIR")
    return Path(chosen) if chosen else Path(click.get_app_dir(APP_NAME))


def config_path() -> Path:
    return config_dir() / FILE_NAME


def read_file() -> dict[str, str]:
    """The stored settings; {} when there are none. A file others may read is still read
    (refusing would lock the owner out) but `gpp login` rewrites it 0600."""
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"{path} is not a gpp config file ({exc}): run gpp login") from exc
    if not isinstance(data, dict):
        raise click.UsageError(f"{path} is not a gpp config file: run gpp login")
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):  # people paste the API's own address too
        url = url[: -len("/api/v1")]
    if not url.startswith(("http://", "https://")):
        raise click.UsageError(f"the platform URL must start with http:// or https://: {url!r}")
    return url


def load() -> Settings:
    stored = read_file()
    where = str(config_path())
    env_url = os.environ.get("GPP_URL", "").strip()
    env_token = os.environ.get("GPP_TOKEN", "").strip()
    if env_url:
        url, url_from = env_url, "GPP_URL"
    elif stored.get("url"):
        url, url_from = stored["url"], where
    else:
        url, url_from = DEFAULT_URL, "default"
    if env_token:
        token, token_from = env_token, "GPP_TOKEN"
    elif stored.get("token"):
        token, token_from = stored["token"], where
    else:
        token, token_from = "", ""
    return Settings(normalise_url(url), token, url_from, token_from)


def save(url: str, token: str) -> Path:
    """Write the settings so that no other user can read the token at any moment: the
    file is created 0600 beside the old one and renamed over it."""
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / FILE_NAME
    temporary = folder / f".{FILE_NAME}.{os.getpid()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as out:
            json.dump({"url": url, "token": token}, out, indent=2)
            out.write("\n")
        os.chmod(temporary, stat.S_IRUSR | stat.S_IWUSR)  # an umask cannot widen it, but be sure
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return path


def forget() -> bool:
    """Remove the stored token (the URL is kept); whether there was one."""
    stored = read_file()
    if not stored.get("token"):
        return False
    save(stored.get("url", DEFAULT_URL), "")
    return True
