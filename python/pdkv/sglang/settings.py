"""From SGLang's KVArgs and server_args to a pdkv engine configuration.

Only fields SGLang's own transfer backends read are read here (server_args:
tp_size, dp_size, pp_size, enable_dp_attention, disaggregation_bootstrap_port,
disaggregation_ib_device, host, dist_init_addr, page_size). pdkv's own choices
come from the environment (docs/integration.md):

  PDKV_TRANSPORT          a backend name (default nixl)
  PDKV_TRANSPORT_OPTIONS  KEY=VALUE,KEY=VALUE for the backend
  PDKV_KV_MEMORY          host|cuda|hip: where kv_data_ptrs point (default cuda)
  PDKV_STAGING_BYTES      a staging pool for GPU memory the transport cannot write
  PDKV_ENGINE_ID          this server's engine id (default: derived, see engine_id)
  PDKV_CONTROL_HOST       where peers reach this rank (default: the address
                          that routes to the bootstrap host)
  PDKV_SECRET_FILE        the cluster secret (docs/security.md); unset: none
  PDKV_TLS_CERT, PDKV_TLS_KEY, PDKV_TLS_CA  gRPC over TLS (mutual with a CA)

What the adapter cannot do yet is refused with an UnsupportedByPdkv error
naming the field, never ignored.
"""

import os
import socket

ENV_VARS = ("PDKV_TRANSPORT", "PDKV_TRANSPORT_OPTIONS", "PDKV_KV_MEMORY", "PDKV_STAGING_BYTES",
            "PDKV_ENGINE_ID", "PDKV_CONTROL_HOST", "PDKV_SECRET_FILE", "PDKV_TLS_CERT",
            "PDKV_TLS_KEY", "PDKV_TLS_CA")
SECURITY_VARS = {"PDKV_SECRET_FILE": "secret_file", "PDKV_TLS_CERT": "tls_cert",
                 "PDKV_TLS_KEY": "tls_key", "PDKV_TLS_CA": "tls_ca"}
SERVER_ARGS = ("tp_size", "dp_size", "pp_size", "enable_dp_attention",
               "disaggregation_bootstrap_port", "disaggregation_ib_device", "host",
               "dist_init_addr", "page_size")


class UnsupportedByPdkv(ValueError):
    """An SGLang setting pdkv.sglang does not support yet."""


def required_field(obj, name, what):
    if not hasattr(obj, name):
        raise ValueError(f"{what}.{name} is not set: pdkv.sglang needs it")
    return getattr(obj, name)


def mode_name(mode):
    """"prefill" or "decode" from SGLang's DisaggregationMode or a string."""
    name = getattr(mode, "value", mode)
    if name not in ("prefill", "decode"):
        raise ValueError(f"disaggregation mode {mode!r} is neither prefill nor decode")
    return name


def server_settings(server_args):
    """The server_args fields pdkv reads, checked; refuses what it cannot do yet."""
    values = {name: required_field(server_args, name, "server_args") for name in SERVER_ARGS}
    if values["enable_dp_attention"]:
        raise UnsupportedByPdkv("server_args.enable_dp_attention=True: pdkv.sglang does not "
                                "support DP attention yet")
    if values["pp_size"] != 1:
        raise UnsupportedByPdkv(f"server_args.pp_size={values['pp_size']}: pdkv.sglang "
                                "supports pipeline parallelism 1 only (yet)")
    if values["disaggregation_ib_device"]:
        raise UnsupportedByPdkv(
            f"server_args.disaggregation_ib_device={values['disaggregation_ib_device']!r}: "
            "choose devices through PDKV_TRANSPORT_OPTIONS (docs/backends.md)")
    if values["tp_size"] % values["dp_size"]:
        raise ValueError(f"server_args.tp_size={values['tp_size']} is not a multiple of "
                         f"dp_size={values['dp_size']}")
    return values


def security():
    """The pdkv_config keys of the security variables that are set."""
    return {key: os.environ[var] for var, key in SECURITY_VARS.items() if os.environ.get(var)}


def environment():
    memory = os.environ.get("PDKV_KV_MEMORY", "cuda")
    if memory not in ("host", "cuda", "hip"):
        raise ValueError(f"PDKV_KV_MEMORY={memory!r}: expected host, cuda or hip")
    return {"backend": os.environ.get("PDKV_TRANSPORT", "nixl"),
            "transport_options": os.environ.get("PDKV_TRANSPORT_OPTIONS", ""),
            "kv_memory": memory,
            "staging_bytes": int(os.environ.get("PDKV_STAGING_BYTES", "0")),
            "engine_id": os.environ.get("PDKV_ENGINE_ID"),
            "control_host": os.environ.get("PDKV_CONTROL_HOST")}


def split_host_port(address, what):
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} {address!r} is not host:port")
    return host.strip("[]"), int(port)


def reachable_host(host):
    """A local address peers can reach for a bind host (0.0.0.0 -> loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def local_address_toward(host):
    """This machine's address on the route to `host` (no packet is sent)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def bytes_per_element(head_bytes):
    """The widest element size (8, 4, 2, 1) dividing one head's bytes: KVArgs carries no
    dtype, and both sides derive the same one from the same bytes."""
    return next(size for size in (8, 4, 2, 1) if head_bytes % size == 0)


def kv_shape(args, page_size, is_mla):
    """KvSpec keys and the number of layers from KVArgs (SGLang's item lengths)."""
    ptrs, lens, items = (list(required_field(args, n, "KVArgs"))
                         for n in ("kv_data_ptrs", "kv_data_lens", "kv_item_lens"))
    if not ptrs or len(ptrs) != len(lens) or len(ptrs) != len(items):
        raise ValueError(f"KVArgs: {len(ptrs)} kv_data_ptrs, {len(lens)} kv_data_lens and "
                         f"{len(items)} kv_item_lens must be as many, and not none")
    if len(set(items)) != 1 or len(set(lens)) != 1:
        raise UnsupportedByPdkv(f"KVArgs.kv_item_lens {sorted(set(items))} / kv_data_lens differ "
                                "between buffers (a draft model's or a hybrid pool): pdkv.sglang "
                                "needs one shape for every layer")
    buffers_per_layer = 1 if is_mla else 2
    if len(ptrs) % buffers_per_layer:
        raise ValueError(f"KVArgs: {len(ptrs)} kv_data_ptrs is odd: expected K layers then V "
                         "layers")
    if required_field(args, "page_size", "KVArgs") != page_size:
        raise ValueError(f"KVArgs.page_size={args.page_size} but server_args.page_size="
                         f"{page_size}")
    heads_local = 1 if is_mla else required_field(args, "kv_head_num", "KVArgs")
    total_heads = 1 if is_mla else required_field(args, "total_kv_head_num", "KVArgs")
    item = items[0]
    if item % (page_size * heads_local):
        raise ValueError(f"KVArgs.kv_item_lens[0]={item} is not page_size {page_size} x "
                         f"kv_head_num {heads_local} x bytes per head")
    head_bytes = item // (page_size * heads_local)
    element = bytes_per_element(head_bytes)
    if lens[0] % item:
        raise ValueError(f"KVArgs.kv_data_lens[0]={lens[0]} is not a multiple of "
                         f"kv_item_lens[0]={item}")
    return {"kv_heads": total_heads, "head_dim": head_bytes // element, "dtype_bytes": element,
            "page_size": page_size, "num_layers": len(ptrs) // buffers_per_layer,
            "num_pages": lens[0] // item, "mla": bool(is_mla)}, heads_local


def aux_shape(args):
    ptrs = list(getattr(args, "aux_data_ptrs", []) or [])
    lens = list(getattr(args, "aux_data_lens", []) or [])
    items = list(getattr(args, "aux_item_lens", []) or [])
    if not (len(ptrs) == len(lens) == len(items)):
        raise ValueError(f"KVArgs: {len(ptrs)} aux_data_ptrs, {len(lens)} aux_data_lens and "
                         f"{len(items)} aux_item_lens must be as many")
    if not ptrs:
        return {}, ptrs
    slots = {length // item for length, item in zip(lens, items)}
    if len(slots) != 1 or any(length % item for length, item in zip(lens, items)):
        raise ValueError(f"KVArgs aux buffers hold different numbers of slots ({sorted(slots)})")
    return {"aux_item_bytes": items, "aux_slots": slots.pop()}, ptrs


def refuse_state(args):
    if list(getattr(args, "state_types", []) or []) or list(
            getattr(args, "state_data_ptrs", []) or []):
        raise UnsupportedByPdkv(f"KVArgs.state_types={list(getattr(args, 'state_types', []))}: "
                                "pdkv.sglang does not move SGLang's state buffers (Mamba, SWA, "
                                "...) yet")
