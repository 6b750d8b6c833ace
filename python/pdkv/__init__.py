"""pdkv: KV-cache transfer for disaggregated LLM inference, from Python.

    import pdkv
    server = pdkv.BootstrapServer("127.0.0.1", 0)
    engine = pdkv.Engine({"role": "prefill", "engine_id": "p", "backend": "nixl",
                          "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2,
                          "page_size": 16, "num_layers": 32, "num_pages": 1024,
                          "bootstrap_address": f"127.0.0.1:{server.port}"},
                         pools={"kv": kv_tensors})
    sender = engine.sender(room)

pdkv.sglang is a transfer backend shaped like SGLang's disaggregation
classes. docs/integration.md is the guide.
"""

from pdkv.engine import (BootstrapServer, Engine, PollState, Receiver, Sender, check_config,
                         transport_names, version)
from pdkv.errors import PdkvError, StatusCode
from pdkv.memory import Region, region_of

__all__ = ["BootstrapServer", "Engine", "PollState", "Receiver", "Sender", "PdkvError", "check_config",
           "StatusCode", "Region", "region_of", "transport_names", "version"]
__version__ = version()
