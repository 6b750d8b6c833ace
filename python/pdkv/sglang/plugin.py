"""SGLang plugin entry point (group "sglang.srt.plugins", python/pyproject.toml).

SGLang resolves --disaggregation-transfer-backend through a fixed enum and
get_kv_class() in sglang/srt/disaggregation/utils.py; it has no slot for an
outside backend. The plugin therefore wraps get_kv_class with SGLang's hook
registry (sglang/srt/plugins/hook_registry.py): for the backend named by
PDKV_SGLANG_REPLACES (e.g. "mooncake"), it answers pdkv's classes instead.

    pip install --no-build-isolation ./python     # registers the entry point
    SGLANG_PLUGINS=pdkv PDKV_SGLANG_REPLACES=mooncake PDKV_TRANSPORT=nixl \\
        python -m sglang.launch_server ... --disaggregation-transfer-backend mooncake

Without PDKV_SGLANG_REPLACES the plugin changes nothing (and says so).
"""

import logging
import os

_log = logging.getLogger("pdkv.sglang")


def pdkv_classes():
    from pdkv.sglang import conn
    return {"kvargs": conn.KVArgs, "manager": conn.KVManager, "sender": conn.KVSender,
            "receiver": conn.KVReceiver, "bootstrap_server": conn.KVBootstrapServer}


def around_get_kv_class(replaced):
    """A get_kv_class wrapper answering pdkv's classes for backend `replaced`."""
    classes = pdkv_classes()

    def hook(original, transfer_backend, class_type):
        if getattr(transfer_backend, "value", transfer_backend) == replaced:
            return classes[getattr(class_type, "value", class_type)]
        return original(transfer_backend, class_type)
    return hook


def register():
    replaced = os.environ.get("PDKV_SGLANG_REPLACES")
    if not replaced:
        _log.warning("pdkv plugin loaded, but PDKV_SGLANG_REPLACES is unset: no SGLang "
                     "transfer backend is replaced by pdkv")
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class",
                          around_get_kv_class(replaced), HookType.AROUND)
    _log.info("pdkv replaces SGLang's %r transfer backend", replaced)
