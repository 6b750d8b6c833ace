"""pdkv.sglang: pdkv as an SGLang PD-disaggregation transfer backend.

Classes shaped like SGLang's disaggregation base classes (KVArgs, KVPoll,
KVManager, KVSender, KVReceiver, KVBootstrapServer); docs/integration.md
shows how an SGLang deployment selects them (plugin.py) and what is not
supported yet.
"""

from pdkv.sglang.conn import (KVArgs, KVBootstrapServer, KVManager, KVPoll, KVReceiver, KVSender,
                              KVTransferError, KVTransferMetric)
from pdkv.sglang.settings import UnsupportedByPdkv

__all__ = ["KVArgs", "KVBootstrapServer", "KVManager", "KVPoll", "KVReceiver", "KVSender",
           "KVTransferError", "KVTransferMetric", "UnsupportedByPdkv"]
