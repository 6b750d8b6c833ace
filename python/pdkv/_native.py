"""libpdkv.so, loaded with ctypes, and the prototypes of its C ABI (pdkv/pdkv.h).

Why ctypes (docs/integration.md): the package then contains no compiled
Python module, so one build serves every Python version a server image runs
(SGLang and vLLM images run 3.10 to 3.12); ctypes is in the standard library;
and a ctypes.CDLL call releases the GIL for its whole duration, so a blocking
call (waiting for room changes, a bootstrap server's wait) never stalls the
server's other threads.

Where the library is found, first match wins:
  1. $PDKV_LIBRARY (a path to libpdkv.so.0)
  2. pdkv/_lib/libpdkv.so.0 inside this package (pip install)
  3. ../../lib/libpdkv.so.0 from this package (the build tree: build/python/pdkv)
  4. libpdkv.so.0 on the loader's path (an installed pdkv)
"""

import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_SONAME = "libpdkv.so.0"


def _candidates():
    if os.environ.get("PDKV_LIBRARY"):
        yield os.environ["PDKV_LIBRARY"]
    yield os.path.join(_HERE, "_lib", _SONAME)
    yield os.path.normpath(os.path.join(_HERE, "..", "..", "lib", _SONAME))
    yield _SONAME


def _load():
    tried = []
    for path in _candidates():
        if path != _SONAME and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as error:
            tried.append(f"{path} ({error})")
    raise ImportError("pdkv: cannot load libpdkv.so.0; tried: " + "; ".join(tried)
                      + ". Build it (make build) or set PDKV_LIBRARY.")


lib = _load()

c_status = ctypes.c_int
c_handle = ctypes.c_void_p
c_u64_p = ctypes.POINTER(ctypes.c_uint64)
c_u32_p = ctypes.POINTER(ctypes.c_uint32)


class Region(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_uint64),
                ("kind", ctypes.c_int), ("device", ctypes.c_int32)]


class Pools(ctypes.Structure):
    _fields_ = [("kv", ctypes.POINTER(Region)), ("num_kv", ctypes.c_size_t),
                ("aux", ctypes.POINTER(Region)), ("num_aux", ctypes.c_size_t),
                ("state", Region), ("staging", Region)]


class EngineStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "staged_routes", "direct_routes", "batches_in_flight", "rooms", "peers",
        "loop_tasks", "room_steps", "engine_threads")]


class TransferMetrics(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint64), ("latency_us", ctypes.c_uint64),
                ("staged", ctypes.c_int32), ("retries", ctypes.c_uint32)]


_P = ctypes.POINTER
_PROTOTYPES = {
    "pdkv_version": (ctypes.c_char_p, []),
    "pdkv_abi_version": (ctypes.c_int, []),
    "pdkv_status_name": (ctypes.c_char_p, [c_status]),
    "pdkv_poll_state_name": (ctypes.c_char_p, [ctypes.c_int]),
    "pdkv_last_error": (ctypes.c_char_p, []),
    "pdkv_transport_count": (ctypes.c_size_t, []),
    "pdkv_transport_name": (ctypes.c_char_p, [ctypes.c_size_t]),
    "pdkv_config_create": (c_status, [_P(c_handle)]),
    "pdkv_config_destroy": (None, [c_handle]),
    "pdkv_config_set": (c_status, [c_handle, ctypes.c_char_p, ctypes.c_char_p]),
    "pdkv_engine_create": (c_status, [c_handle, _P(Pools), _P(c_handle)]),
    "pdkv_engine_destroy": (None, [c_handle]),
    "pdkv_engine_region_count": (c_status, [c_handle, ctypes.c_int, _P(ctypes.c_size_t)]),
    "pdkv_engine_region": (c_status, [c_handle, ctypes.c_int, ctypes.c_size_t, _P(Region)]),
    "pdkv_engine_control_address": (ctypes.c_char_p, [c_handle]),
    "pdkv_engine_stats_get": (c_status, [c_handle, _P(EngineStats)]),
    "pdkv_engine_poll": (c_status, [c_handle, c_u64_p, ctypes.c_size_t, _P(ctypes.c_int32)]),
    "pdkv_engine_take_changed_rooms": (c_status, [c_handle, c_u64_p, ctypes.c_size_t,
                                                  _P(ctypes.c_size_t)]),
    "pdkv_engine_wait_for_changes": (c_status, [c_handle, ctypes.c_int64, _P(ctypes.c_int32)]),
    "pdkv_engine_change_fd": (c_status, [c_handle, _P(ctypes.c_int32)]),
    "pdkv_engine_sender": (c_status, [c_handle, ctypes.c_uint64, ctypes.c_char_p,
                                      ctypes.c_uint32, _P(c_handle)]),
    "pdkv_sender_destroy": (None, [c_handle]),
    "pdkv_sender_init": (c_status, [c_handle, ctypes.c_uint64, ctypes.c_uint32, c_u32_p,
                                    ctypes.c_size_t]),
    "pdkv_sender_send": (c_status, [c_handle, c_u64_p, ctypes.c_size_t, ctypes.c_int32]),
    "pdkv_sender_poll": (c_status, [c_handle, _P(ctypes.c_int)]),
    "pdkv_sender_abort": (c_status, [c_handle, ctypes.c_char_p]),
    "pdkv_sender_failure": (c_status, [c_handle]),
    "pdkv_sender_decode_prefix_pages": (c_status, [c_handle, c_u64_p]),
    "pdkv_sender_metrics": (c_status, [c_handle, _P(TransferMetrics)]),
    "pdkv_engine_receiver": (c_status, [c_handle, ctypes.c_uint64, ctypes.c_char_p,
                                        ctypes.c_uint32, _P(c_handle)]),
    "pdkv_receiver_destroy": (None, [c_handle]),
    "pdkv_receiver_init": (c_status, [c_handle]),
    "pdkv_receiver_send_metadata": (c_status, [c_handle, c_u64_p, ctypes.c_size_t,
                                               ctypes.c_uint32, c_u32_p, ctypes.c_size_t,
                                               ctypes.c_uint64]),
    "pdkv_receiver_poll": (c_status, [c_handle, _P(ctypes.c_int)]),
    "pdkv_receiver_abort": (c_status, [c_handle, ctypes.c_char_p]),
    "pdkv_receiver_failure": (c_status, [c_handle]),
    "pdkv_receiver_metrics": (c_status, [c_handle, _P(TransferMetrics)]),
    "pdkv_bootstrap_server_start": (c_status, [ctypes.c_char_p, _P(c_handle)]),
    "pdkv_bootstrap_server_start_secured": (c_status, [ctypes.c_char_p, c_handle, _P(c_handle)]),
    "pdkv_bootstrap_server_port": (c_status, [c_handle, _P(ctypes.c_int32)]),
    "pdkv_bootstrap_server_wait": (c_status, [c_handle]),
    "pdkv_bootstrap_server_shutdown": (c_status, [c_handle]),
    "pdkv_bootstrap_server_destroy": (None, [c_handle]),
}

for _name, (_restype, _argtypes) in _PROTOTYPES.items():
    _function = getattr(lib, _name)
    _function.restype = _restype
    _function.argtypes = _argtypes
