"""One fast check before a command fetches from the Hugging Face Hub (a streamed dataset, the
data of lm-eval's tasks), so that no network fails in one line within seconds instead of after
the Hub client's retries (30-40 s) and a traceback."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from .errors import UserError

TIMEOUT_SECONDS = 3.0
_TRUE = {"1", "true", "yes", "on"}


def declared(name: str) -> bool:
    """Whether the environment variable `name` is set true (1, true, yes, on)."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def offline_by_setting() -> str | None:
    """The environment variable that declares this machine offline, if one does."""
    return next((name for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if declared(name)), None)


def _target() -> tuple[str, int]:
    """Where a connection to the Hub goes first: the proxy when one is set, else the endpoint."""
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        if os.environ.get(name):
            proxy = urlparse(os.environ[name] if "://" in os.environ[name] else "http://" + os.environ[name])
            return proxy.hostname or "", proxy.port or 8080
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)


def require_hub(field: str, what: str, fix: str) -> None:
    """Raise UserError `<field>: <what> needs the network ...; <fix>` when the Hub is declared
    offline or cannot be connected to within TIMEOUT_SECONDS."""
    offline = offline_by_setting()
    if offline:
        raise UserError(f"{field}: {what} needs the network, and {offline} is set; {fix}")
    host, port = _target()
    try:
        socket.create_connection((host, port), timeout=TIMEOUT_SECONDS).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UserError(
            f"{field}: {what} needs the network, and {host}:{port} cannot be reached ({reason}); {fix}"
        ) from None


def require_hub_for_tasks(tasks: list[str], include_path: str | None) -> None:
    """lm-eval's tasks download their data from the Hub. HF_DATASETS_OFFLINE=1 asks `datasets`
    for its cache, so it is let through (a failure then is the caller's one line); tasks of
    one's own (--lm-eval-include) may read local files."""
    if include_path is not None or declared("HF_DATASETS_OFFLINE"):
        return
    fix = "run where the Hub is reachable, or with HF_DATASETS_OFFLINE=1 once the data is cached"
    if declared("HF_HUB_OFFLINE"):
        raise UserError(
            f"--lm-eval-tasks: {','.join(tasks)} downloads its data from the Hugging Face Hub, and HF_HUB_OFFLINE is set; {fix}"
        )
    require_hub("--lm-eval-tasks", f"{','.join(tasks)} (its data is on the Hugging Face Hub)", fix)
