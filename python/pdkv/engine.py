"""Engine, Sender, Receiver and BootstrapServer: pdkv's API (pdkv/engine.h)
over its C ABI. The call order and the meaning of each state are those of
the C++ API; docs/integration.md shows them.

Every object may be used from any thread. A call that waits
(wait_for_changes, BootstrapServer.wait) releases the GIL while it waits.
close() (or leaving a `with` block) releases an object at once; otherwise
it goes with the last reference. A Sender or Receiver may outlive its Engine:
its room then fails ("engine shut down").
"""

import contextlib
import ctypes
import enum

from pdkv import _native
from pdkv.errors import PdkvError, StatusCode, check, last_error_message
from pdkv.memory import Region, region_of

lib = _native.lib


class PollState(enum.IntEnum):
    """A room's state; the numbers of SGLang's KVPoll."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


def transport_names():
    """The transport backends of the loaded library."""
    return [lib.pdkv_transport_name(i).decode() for i in range(lib.pdkv_transport_count())]


def version():
    return lib.pdkv_version().decode()


def _setting(key, value):
    """A configuration value as the C ABI's KEY=VALUE text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if key == "layers":
            return f"{value[0]}:{value[1]}"
        return ",".join(str(v) for v in value)
    return str(value)


@contextlib.contextmanager
def _c_config(config):
    """A pdkv_config holding `config`'s keys (refused ones raise PdkvError)."""
    c_config = ctypes.c_void_p()
    check(lib.pdkv_config_create(ctypes.byref(c_config)))
    try:
        for key, value in config.items():
            check(lib.pdkv_config_set(c_config, key.encode(), _setting(key, value).encode()))
        yield c_config
    finally:
        lib.pdkv_config_destroy(c_config)


def check_config(config):
    """Raises PdkvError for a key or value pdkv_config_set refuses (a secret
    file it cannot use, say), before anything is started."""
    with _c_config(config):
        pass


def _u64_array(values):
    values = [int(v) for v in values]
    return (ctypes.c_uint64 * len(values))(*values), len(values)


def _u32_array(values):
    values = [int(v) for v in (values or [])]
    return (ctypes.c_uint32 * len(values))(*values), len(values)


class _Handle:
    """An owned C handle, released once by its destroy function."""
    _destroy = None

    def __init__(self, handle):
        self._handle = handle

    @property
    def handle(self):
        if not self._handle:
            raise PdkvError(StatusCode.FAILED_PRECONDITION,
                            f"this {type(self).__name__} was closed")
        return self._handle

    def close(self):
        handle, self._handle = self._handle, None
        if handle:
            type(self)._destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


class BootstrapServer(_Handle):
    """The bootstrap service (pdkv/bootstrap.h); port 0 picks a free port.

    `security`: the keys secret_file, tls_cert, tls_key, tls_ca of
    pdkv_config_set (docs/security.md); empty: no authentication."""
    _destroy = lib.pdkv_bootstrap_server_destroy

    def __init__(self, host="127.0.0.1", port=0, security=None):
        out = ctypes.c_void_p()
        address = f"{host}:{port}".encode()
        if not security:
            check(lib.pdkv_bootstrap_server_start(address, ctypes.byref(out)))
        else:
            with _c_config(security) as c_config:
                check(lib.pdkv_bootstrap_server_start_secured(address, c_config,
                                                              ctypes.byref(out)))
        super().__init__(out)

    @property
    def port(self):
        port = ctypes.c_int32()
        check(lib.pdkv_bootstrap_server_port(self.handle, ctypes.byref(port)))
        return port.value

    def wait(self):
        check(lib.pdkv_bootstrap_server_wait(self.handle))

    def shutdown(self):
        check(lib.pdkv_bootstrap_server_shutdown(self.handle))


class _Room(_Handle):
    """What Sender and Receiver share: poll, abort, failure, metrics."""
    _prefix = None

    def __init__(self, handle, room):
        super().__init__(handle)
        self.room = room

    def _call(self, name, *args):
        return getattr(lib, f"pdkv_{self._prefix}_{name}")(self.handle, *args)

    def poll(self):
        state = ctypes.c_int()
        check(self._call("poll", ctypes.byref(state)))
        return PollState(state.value)

    def abort(self, reason="aborted by the caller"):
        check(self._call("abort", reason.encode()))

    def failure(self):
        """None while the room has not failed; else a PdkvError naming why."""
        status = self._call("failure")
        return None if status == StatusCode.OK else PdkvError(status, last_error_message())

    def metrics(self):
        """bytes, latency_us (0 until success), staged, retries."""
        out = _native.TransferMetrics()
        check(self._call("metrics", ctypes.byref(out)))
        return {"bytes": out.bytes, "latency_us": out.latency_us, "staged": bool(out.staged),
                "retries": out.retries}


class Sender(_Room):
    """The prefill side of one room."""
    _destroy = lib.pdkv_sender_destroy
    _prefix = "sender"

    def init(self, num_pages, aux_slot=0, state_slots=None):
        slots, count = _u32_array(state_slots)
        check(lib.pdkv_sender_init(self.handle, int(num_pages), int(aux_slot), slots, count))

    def send(self, pages, is_last):
        array, count = _u64_array(pages)
        check(lib.pdkv_sender_send(self.handle, array, count, 1 if is_last else 0))

    def decode_prefix_pages(self):
        pages = ctypes.c_uint64()
        check(lib.pdkv_sender_decode_prefix_pages(self.handle, ctypes.byref(pages)))
        return pages.value


class Receiver(_Room):
    """The decode side of one room."""
    _destroy = lib.pdkv_receiver_destroy
    _prefix = "receiver"

    def init(self):
        check(lib.pdkv_receiver_init(self.handle))

    def send_metadata(self, pages, aux_slot=0, state_slots=None, prefix_pages=0):
        array, count = _u64_array(pages)
        slots, slot_count = _u32_array(state_slots)
        check(lib.pdkv_receiver_send_metadata(self.handle, array, count, int(aux_slot), slots,
                                              slot_count, int(prefix_pages)))


_POOL_KINDS = {"kv": 0, "aux": 1, "state": 2, "staging": 3}


class Engine(_Handle):
    """One rank's engine.

    `config`: the keys of pdkv_config_set (docs/integration.md), as Python
    values: Engine({"role": "prefill", "engine_id": "p", "kv_heads": 8, ...}).
    `pools`: None (the engine allocates them, zeroed) or a dict with "kv" (a
    list, K then V per local layer), and optionally "aux" (a list), "state"
    and "staging", each a Region, torch tensor, CUDA array or writable buffer.
    The engine keeps references to the given objects while it lives.
    """
    _destroy = lib.pdkv_engine_destroy

    def __init__(self, config, pools=None):
        with _c_config(config) as c_config:
            self._memory = pools  # keeps the caller's buffers alive with the engine
            c_pools = None if pools is None else ctypes.byref(self._c_pools(pools))
            out = ctypes.c_void_p()
            check(lib.pdkv_engine_create(c_config, c_pools, ctypes.byref(out)))
        super().__init__(out)

    @staticmethod
    def _c_pools(pools):
        unknown = set(pools) - set(_POOL_KINDS)
        if unknown:
            raise ValueError(f"pools: unknown entries {sorted(unknown)} "
                             f"(known: {sorted(_POOL_KINDS)})")
        kv = [region_of(b).to_c() for b in pools.get("kv", [])]
        aux = [region_of(b).to_c() for b in pools.get("aux", [])]
        single = {k: region_of(pools[k]).to_c() if pools.get(k) is not None else _native.Region()
                  for k in ("state", "staging")}
        return _native.Pools((_native.Region * len(kv))(*kv), len(kv),
                             (_native.Region * len(aux))(*aux), len(aux),
                             single["state"], single["staging"])

    def regions(self, pool="kv"):
        """The Regions of one pool ("kv", "aux", "state", "staging")."""
        if pool not in _POOL_KINDS:
            raise ValueError(f"pool {pool!r} is none of {sorted(_POOL_KINDS)}")
        count = ctypes.c_size_t()
        check(lib.pdkv_engine_region_count(self.handle, _POOL_KINDS[pool], ctypes.byref(count)))
        regions = []
        for i in range(count.value):
            r = _native.Region()
            check(lib.pdkv_engine_region(self.handle, _POOL_KINDS[pool], i, ctypes.byref(r)))
            regions.append(Region.from_c(r))
        return regions

    def host_view(self, region):
        """A writable memoryview of a host Region of this engine (e.g. allocated pools)."""
        if region.kind != "host":
            raise ValueError(f"a {region.kind} region has no host view")
        return memoryview((ctypes.c_char * region.length).from_address(region.base)).cast("B")

    @property
    def control_address(self):
        return lib.pdkv_engine_control_address(self.handle).decode()

    def stats(self):
        out = _native.EngineStats()
        check(lib.pdkv_engine_stats_get(self.handle, ctypes.byref(out)))
        return {name: getattr(out, name) for name, _ in _native.EngineStats._fields_}

    def sender(self, room, decode_engine=None, decode_dp_rank=0):
        out = ctypes.c_void_p()
        name = decode_engine.encode() if decode_engine is not None else None
        check(lib.pdkv_engine_sender(self.handle, int(room), name, int(decode_dp_rank),
                                     ctypes.byref(out)))
        return Sender(out, int(room))

    def receiver(self, room, prefill_engine, prefill_dp_rank=0):
        out = ctypes.c_void_p()
        check(lib.pdkv_engine_receiver(self.handle, int(room), prefill_engine.encode(),
                                       int(prefill_dp_rank), ctypes.byref(out)))
        return Receiver(out, int(room))

    def poll(self, rooms):
        """The PollState of each room (Failed for one not open here)."""
        array, count = _u64_array(rooms)
        states = (ctypes.c_int32 * count)()
        check(lib.pdkv_engine_poll(self.handle, array, count, states))
        return [PollState(s) for s in states]

    def take_changed_rooms(self):
        """The rooms whose state changed since the last call, each once."""
        taken, chunk = [], (ctypes.c_uint64 * 256)()
        while True:
            count = ctypes.c_size_t()
            check(lib.pdkv_engine_take_changed_rooms(self.handle, chunk, len(chunk),
                                                     ctypes.byref(count)))
            taken.extend(chunk[:count.value])
            if count.value < len(chunk):
                return taken

    def wait_for_changes(self, timeout_s):
        """True once some room changed, False after `timeout_s`; the GIL is released."""
        changed = ctypes.c_int32()
        check(lib.pdkv_engine_wait_for_changes(self.handle, int(timeout_s * 1000),
                                               ctypes.byref(changed)))
        return bool(changed.value)

    def change_fd(self):
        fd = ctypes.c_int32()
        check(lib.pdkv_engine_change_fd(self.handle, ctypes.byref(fd)))
        return fd.value
