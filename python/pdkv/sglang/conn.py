"""pdkv as an SGLang transfer backend: classes shaped like SGLang's
disaggregation base classes (python/sglang/srt/disaggregation/base/conn.py
at commit 0094505d), called by SGLang's schedulers in SGLang's order
(docs/integration.md cites, per scenario, the SGLang file it follows).

One pdkv Engine per prefill rank (made by KVManager, registered with the
prefill server's bootstrap service, which KVBootstrapServer hosts). On the
decode side one Engine per prefill server a request names (its
bootstrap_addr), made on first use: a decode server may be fed by several
prefill servers, each with its own bootstrap service.

Threads: SGLang calls these from its scheduler thread; pdkv's own threads
do the rest. Nothing here blocks on a peer.
"""

import os
import socket
import threading
from dataclasses import dataclass
from typing import Optional

import pdkv
from pdkv.sglang import settings

try:  # SGLang's own types when SGLang is installed, so its isinstance checks hold
    from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll, KVTransferMetric
except ImportError:
    class KVArgs:
        """SGLang's KVArgs: a plain class whose fields the caller sets (kv_data_ptrs, ...)."""

    class KVPoll:
        Failed = 0
        Bootstrapping = 1
        WaitingForInput = 2
        Transferring = 3
        Success = 4

    @dataclass
    class KVTransferMetric:
        transfer_latency_s: Optional[float] = None
        alloc_latency_s: Optional[float] = None
        transfer_total_bytes: Optional[int] = None

try:
    from sglang.srt.disaggregation.common.conn import KVTransferError
except ImportError:
    class KVTransferError(Exception):
        """A room's failure, as SGLang's backends raise it from failure_exception()."""

        def __init__(self, bootstrap_room, failure_reason, is_from_another_rank=False):
            super().__init__(failure_reason)
            self.bootstrap_room = bootstrap_room
            self.failure_reason = failure_reason
            self.is_from_another_rank = is_from_another_rank

        def __str__(self):
            return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


PREFILL_ENGINE_ID = "prefill"
_TERMINAL = (KVPoll.Success, KVPoll.Failed)


def _timeouts_from_sglang_env():
    """SGLang's own bootstrap and waiting timeouts (seconds), where set."""
    out = {}
    for env, key in (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "timeout_bootstrap_ms"),
                     ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "timeout_waiting_for_data_ms")):
        if os.environ.get(env):
            out[key] = int(float(os.environ[env]) * 1000)
    return out


class KVManager:
    """Registers this rank's KV and aux buffers with pdkv (SGLang's BaseKVManager)."""

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.mode = settings.mode_name(disaggregation_mode)
        self.is_mla_backend = bool(is_mla_backend)
        server = settings.server_settings(server_args)
        env = settings.environment()
        settings.refuse_state(args)
        kv, heads_local = settings.kv_shape(args, server["page_size"], self.is_mla_backend)
        aux, aux_ptrs = settings.aux_shape(args)
        self.page_size = server["page_size"]
        self.tp_size = server["tp_size"]
        self.tp_rank = settings.required_field(args, "engine_rank", "KVArgs") % self.tp_size
        self._check_heads(kv["kv_heads"], heads_local)
        self._bootstrap_host = settings.reachable_host(
            settings.split_host_port(server["dist_init_addr"], "server_args.dist_init_addr")[0]
            if server["dist_init_addr"] else server["host"])
        self._config = dict(
            kv, **aux, role=self.mode, tp_rank=self.tp_rank, tp_size=self.tp_size,
            dp_size=server["dp_size"], dp_rank=getattr(args, "system_dp_rank", 0) or 0,
            backend=env["backend"], engine_id=env["engine_id"] or self._default_engine_id(server),
            **_timeouts_from_sglang_env())
        if env["transport_options"]:
            self._config["transport_options"] = env["transport_options"]
        if env["staging_bytes"]:
            self._config["staging_bytes"] = env["staging_bytes"]
        self._config.update(settings.security())
        pdkv.check_config(self._config)  # a bad setting is named now, not at the first request
        self._control_host = env["control_host"]
        self._pools = self._pools_from(args, aux_ptrs, env["kv_memory"])
        self._engines = {}  # bootstrap address -> Engine (decode: one per prefill server)
        self._engines_lock = threading.Lock()
        self.prefill_info_table = {}  # read by SGLang's decode scheduler (fast path)
        self.bootstrap_port = server["disaggregation_bootstrap_port"]
        if self.mode == "prefill":
            self.register_to_bootstrap()

    def _check_heads(self, total, local):
        expected = max(total // self.tp_size, 1) if not self.is_mla_backend else 1
        if local != expected:
            raise ValueError(f"KVArgs.kv_head_num={local}, but {total} KV heads over TP "
                             f"{self.tp_size} give {expected} per rank")

    def _default_engine_id(self, server):
        if self.mode == "prefill":
            return PREFILL_ENGINE_ID  # one prefill server per bootstrap service
        # Every rank of one decode server must agree, and no other decode
        # server may share it: the torch.distributed address, or else the
        # launcher that spawned this server's ranks.
        if server["dist_init_addr"]:
            return f"decode@{server['dist_init_addr']}"
        owner = os.getppid() if self.tp_size > 1 else os.getpid()
        return f"decode@{socket.gethostname()}:{owner}"

    def _pools_from(self, args, aux_ptrs, kv_memory):
        """SGLang's K layers then V layers, as pdkv's K,V per layer."""
        ptrs, lens = list(args.kv_data_ptrs), list(args.kv_data_lens)
        device = getattr(args, "gpu_id", 0) or 0
        regions = [pdkv.Region(p, n, kv_memory, device) for p, n in zip(ptrs, lens)]
        if not self.is_mla_backend:
            layers = len(regions) // 2
            regions = [r for layer in range(layers)
                       for r in (regions[layer], regions[layers + layer])]
        aux = [pdkv.Region(p, n) for p, n in zip(aux_ptrs, args.aux_data_lens)]
        return {"kv": regions, "aux": aux}

    def _engine_config(self, bootstrap_address):
        bootstrap_host, _ = settings.split_host_port(bootstrap_address, "bootstrap address")
        return dict(self._config, bootstrap_address=bootstrap_address,
                    control_host=self._control_host
                    or settings.local_address_toward(bootstrap_host))

    def register_to_bootstrap(self):
        """Prefill: the rank's engine, registered with this server's bootstrap service."""
        self.engine_for(f"{self._bootstrap_host}:{self.bootstrap_port}")

    def engine_for(self, bootstrap_address):
        """The engine that talks to the prefill server of `bootstrap_address`."""
        with self._engines_lock:
            engine = self._engines.get(bootstrap_address)
            if engine is None:
                if self.mode == "prefill" and self._engines:
                    raise ValueError(f"a prefill KVManager serves one bootstrap service, not "
                                     f"{bootstrap_address} too")
                engine = pdkv.Engine(self._engine_config(bootstrap_address), self._pools)
                self._engines[bootstrap_address] = engine
            return engine

    def prefill_engine(self):
        return next(iter(self._engines.values()))

    def engines(self):
        """The engines made so far (for waiting on their change notifications)."""
        with self._engines_lock:
            return list(self._engines.values())

    def try_ensure_parallel_info(self, bootstrap_addr):
        """SGLang's decode scheduler asks before init(); pdkv finds the prefill's
        topology itself (after init), so there is nothing to fetch first."""
        self.prefill_info_table.setdefault(bootstrap_addr, None)
        return True

    def close(self):
        with self._engines_lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()


class _Room:
    """What KVSender and KVReceiver share: poll, failure, abort, clear."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.conclude_state = None
        self._room = None  # the pdkv Sender or Receiver, once made
        self._failure = None  # a reason found here (a refused call), before pdkv knew
        self._aborted = False  # by abort() or a refusal here: Failed once pdkv says it ended
        self._metrics = None

    def _fail_here(self, error):
        self._failure = str(error)
        self.conclude_state = KVPoll.Failed

    def _guarded(self, method, *args):
        """A pdkv call whose refusal fails the room (SGLang polls for it, it does not catch)."""
        try:
            method(*args)
        except pdkv.PdkvError as error:
            self._abort(str(error))  # a refusal here fails the room at its peers too

    def _abort(self, reason):
        """Fails the room here and at its peers (abort(), or a refusal here).
        With a pdkv room, Failed comes from pdkv's own poll: only then may
        SGLang reuse the request's pages (no write of the room reads or fills
        them any more)."""
        self._failure = self._failure or reason
        if self._room is None:
            self.conclude_state = KVPoll.Failed
            return
        self._aborted = True
        self._room.abort(self._failure)

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        if self._room is None:
            return KVPoll.Bootstrapping
        state = int(self._room.poll())
        if state in _TERMINAL:
            # An aborted request stays failed, even if its bytes got through.
            self.conclude_state = KVPoll.Failed if self._aborted else state
            self._metrics = self._room.metrics()
            return self.conclude_state
        return state

    def failure_exception(self):
        """Raises the room's failure (SGLang calls it once poll() said Failed)."""
        reason = self._failure
        if reason is None and self._room is not None:
            error = self._room.failure()
            reason = error.message if error is not None else None
        raise KVTransferError(self.bootstrap_room, reason or "the transfer has not failed",
                              is_from_another_rank=False)

    def abort(self):
        self._abort("Aborted by AbortReq.")

    def clear(self):
        """Releases the pdkv room (SGLang calls it once the request is done)."""
        if self._room is not None:
            if self.conclude_state is None:
                self.poll()
            if self._metrics is None:
                self._metrics = self._room.metrics()
            self._room.close()


class KVSender(_Room):
    """The prefill side of one request (SGLang's BaseKVSender)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank,
                 req_has_disagg_prefill_dp_rank=False):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.dest_tp_ranks = dest_tp_ranks
        self.pp_rank = pp_rank
        self.num_kv_indices = None
        self.aux_index = None
        self.curr_idx = 0
        self._announced_last = None  # what should_send_kv_chunk was told of the next send
        try:
            self._room = mgr.prefill_engine().sender(bootstrap_room)
        except pdkv.PdkvError as error:
            self._fail_here(error)

    def init(self, num_kv_indices, aux_index=None):
        self.num_kv_indices = int(num_kv_indices)
        self.aux_index = aux_index
        if self._room is not None:
            self._guarded(self._room.init, self.num_kv_indices, aux_index or 0)

    def should_send_kv_chunk(self, num_pages, last_chunk):
        """SGLang asks before each send(): the last chunk goes even without pages,
        as it carries the aux data (which SGLang fills only for the last chunk)."""
        self._announced_last = bool(last_chunk)
        return num_pages > 0 or last_chunk

    def send(self, kv_indices, state_indices=None, token_position_offset=0):
        if state_indices:
            raise settings.UnsupportedByPdkv(
                f"state_indices={state_indices!r}: pdkv.sglang does not move state yet")
        if token_position_offset:
            raise settings.UnsupportedByPdkv(
                f"token_position_offset={token_position_offset}: not supported by pdkv.sglang")
        if self.num_kv_indices is None:
            raise RuntimeError(f"room {self.bootstrap_room}: send() before init()")
        pages = [int(p) for p in kv_indices]
        self.curr_idx += len(pages)
        if self.curr_idx > self.num_kv_indices:
            self._abort(f"{self.curr_idx} pages sent, more than the "
                                 f"{self.num_kv_indices} given to init()")
            return
        # SGLang's scheduler says which chunk is last (should_send_kv_chunk);
        # a caller that does not say is judged by the page count, as SGLang's
        # own backends do.
        announced, self._announced_last = self._announced_last, None
        is_last = announced if announced is not None else self.curr_idx == self.num_kv_indices
        if is_last and self.curr_idx != self.num_kv_indices:
            self._abort(f"the last chunk leaves {self.curr_idx} of the "
                                 f"{self.num_kv_indices} pages given to init() sent")
            return
        if self._room is not None and self.conclude_state is None:
            self._guarded(self._room.send, pages, is_last)

    def pop_decode_prefix_len(self):
        """Tokens the decode side holds already (known once out of Bootstrapping)."""
        if self._room is None:
            return 0
        return self._room.decode_prefix_pages() * self.kv_mgr.page_size

    def get_transfer_metric(self):
        metrics = self._metrics or (self._room.metrics() if self._room is not None else None)
        if not metrics:
            return KVTransferMetric()
        latency = metrics["latency_us"] / 1e6 if metrics["latency_us"] else None
        return KVTransferMetric(transfer_latency_s=latency,
                                transfer_total_bytes=metrics["bytes"])


class KVReceiver(_Room):
    """The decode side of one request (SGLang's BaseKVReceiver)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.require_staging = False  # read by SGLang's decode scheduler

    def init(self, prefill_dp_rank):
        if self.bootstrap_room is None:
            self._fail_here("a KVReceiver without a bootstrap_room cannot receive")
            return
        try:
            engine = self.kv_mgr.engine_for(self.bootstrap_addr)
            self._room = engine.receiver(self.bootstrap_room, PREFILL_ENGINE_ID,
                                         int(prefill_dp_rank))
            self._room.init()
        except (pdkv.PdkvError, ValueError) as error:
            self._fail_here(error)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None,
                      decode_prefix_len=None):
        if state_indices:
            raise settings.UnsupportedByPdkv(
                f"state_indices={state_indices!r}: pdkv.sglang does not move state yet")
        prefix = int(decode_prefix_len or 0)
        if prefix % self.kv_mgr.page_size:
            raise settings.UnsupportedByPdkv(
                f"decode_prefix_len={prefix} is not whole pages of {self.kv_mgr.page_size}")
        if self._room is None or self.conclude_state is not None:
            return
        self._guarded(self._room.send_metadata, [int(p) for p in kv_indices], aux_index or 0,
                      None, prefix // self.kv_mgr.page_size)


class KVBootstrapServer:
    """The bootstrap service, hosted by the prefill server (SGLang's BaseKVBootstrapServer)."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self._server = pdkv.BootstrapServer(host, port, security=settings.security())

    def close(self):
        self._server.close()
