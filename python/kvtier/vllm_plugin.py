"""vLLM general plugin: makes ``"kv_connector": "KVTierConnector"`` resolve.

When kvtier is installed as a package (``pip install ./python``), its
``vllm.general_plugins`` entry point names :func:`register`. vLLM calls every
function in that group in each of its processes before it creates a KV
connector, so after the call its ``KVConnectorFactory`` knows the name
``KVTierConnector`` and loads ``kvtier.vllm.KVTierConnector`` lazily, the
first time a connector is built. ``--kv-transfer-config`` then needs no
``kv_connector_module_path``.

:func:`register` must be safe wherever it runs:

- vLLM may call plugins more than once (it only guards against a second
  call within one process), and its factory raises ``ValueError`` on a name
  that is already registered, so a name already present is left alone;
- without vLLM it does nothing and says nothing;
- it never raises: vLLM does not catch exceptions from plugin functions, and
  a failure here must not stop an engine that may not even use kvtier. A
  vLLM whose factory cannot be imported or refuses the name gets a warning.

Registering imports nothing of vLLM's beyond the factory module, and not
:mod:`kvtier.vllm`: the factory imports that when a connector is built.
"""

from __future__ import annotations

import importlib.util
import logging

log = logging.getLogger("kvtier.vllm_plugin")

CONNECTOR_NAME = "KVTierConnector"
CONNECTOR_MODULE = "kvtier.vllm"
CONNECTOR_CLASS = "KVTierConnector"

_FACTORY_MODULE = "vllm.distributed.kv_transfer.kv_connector.factory"


def register() -> bool:
    """Registers ``KVTierConnector`` with vLLM's ``KVConnectorFactory``.

    Returns True when the name is registered afterwards (by this call or an
    earlier one), False when vLLM is not installed or registration failed.
    """
    try:
        if importlib.util.find_spec("vllm") is None:
            return False
    except (ImportError, ValueError):
        return False
    try:
        factory_module = importlib.import_module(_FACTORY_MODULE)
        factory = factory_module.KVConnectorFactory
    except Exception:  # noqa: BLE001 - never raise into vLLM's start-up
        log.warning("kvtier: vLLM is installed but %s.KVConnectorFactory could not be "
                    "loaded; use kv_connector_module_path=%r instead",
                    _FACTORY_MODULE, CONNECTOR_MODULE, exc_info=True)
        return False

    registry = getattr(factory, "_registry", None)
    if isinstance(registry, dict) and CONNECTOR_NAME in registry:
        return True
    try:
        factory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_CLASS)
    except ValueError:
        # The factory's answer to a name it already holds; with no readable
        # registry above, this is how a repeated call shows up.
        return True
    except Exception:  # noqa: BLE001
        log.warning("kvtier: registering %s with vLLM failed; use "
                    "kv_connector_module_path=%r instead",
                    CONNECTOR_NAME, CONNECTOR_MODULE, exc_info=True)
        return False
    log.debug("kvtier: registered %s -> %s.%s with vLLM",
              CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_CLASS)
    return True
