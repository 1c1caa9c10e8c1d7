"""Whether the Hugging Face hub can be reached, asked right before the first download.

On a machine without network, `huggingface_hub` retries every file it asks the hub for (5 retries with backoff, each
warning printed twice) before it gives up: a hub tokenizer is refused after ~50 s, a streamed hub dataset after ~30 s
of retries in every DataLoader worker and then a multi-line worker traceback ("Caught ConnectionError in DataLoader
worker process 0"), and lm-eval's hub tasks fail likewise once the first model has loaded. `check_hub` refuses at
once instead, with a `HubUnreachableError`: a FileNotFoundError, which every command prints as one line (also when a
DataLoader worker raises it: the main process re-raises it as the same type).

The hub cannot be reached when an offline mode is set (`HF_HUB_OFFLINE`, and for streaming `HF_DATASETS_OFFLINE`) or
its host name does not resolve. Only the name is looked up (no connection is opened), and not at all behind a proxy
for the hub's scheme (`HTTPS_PROXY`, `ALL_PROXY`, ..., unless `NO_PROXY` names the host): there the proxy resolves
it, and the libraries are left to find out. What `datasets` can take from its cache (lm-eval's task datasets) is
refused only for the name: an offline mode set means "use the cache".
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass


class HubUnreachableError(FileNotFoundError):
    """Something needs the Hugging Face hub and this machine cannot reach it."""


def hub_unreachable(*, streaming: bool = False, from_cache: bool = False) -> str | None:
    """Why the hub cannot be reached ("HF_HUB_OFFLINE is set", "huggingface.co does not resolve: ..."), or None when
    it may be.

    Args:
        streaming: for streaming a hub dataset, which `datasets` also refuses under HF_DATASETS_OFFLINE.
        from_cache: for what `datasets` can load from its cache in offline mode (lm-eval's task datasets): an offline
            mode that is set is then left to it, and only a host name that does not resolve counts.
    """
    from huggingface_hub import constants

    offline = "HF_HUB_OFFLINE" if constants.HF_HUB_OFFLINE else None
    if offline is None and (streaming or from_cache):
        import datasets.config

        offline = "HF_DATASETS_OFFLINE" if datasets.config.HF_DATASETS_OFFLINE else None
    if offline is not None:
        return None if from_cache else f"{offline} is set"
    endpoint = urlsplit(constants.ENDPOINT)
    host = endpoint.hostname or constants.ENDPOINT
    proxies = getproxies()  # (the environment's *_proxy variables, as requests reads them)
    if (proxies.get(endpoint.scheme) or proxies.get("all")) and not proxy_bypass(host):
        return None
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as err:
        return f"{host} does not resolve: {err.strerror or err}"
    return None


def check_hub(what: str, instead: str, *, streaming: bool = False, from_cache: bool = False) -> None:
    """Raises HubUnreachableError when the hub cannot be reached (`hub_unreachable`), naming `what` needed it and
    what to do `instead`.

    Example message: "streaming the hub dataset 'HuggingFaceFW/fineweb-edu' needs the Hugging Face hub, which cannot
    be reached (huggingface.co does not resolve: Name or service not known): use local files (...)".
    """
    why = hub_unreachable(streaming=streaming, from_cache=from_cache)
    if why is not None:
        raise HubUnreachableError(f"{what} needs the Hugging Face hub, which cannot be reached ({why}): {instead}")
