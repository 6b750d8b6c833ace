#include "cli/shape_flags.h"

#include <fmt/format.h>

namespace pdkv::cli {

void add_shape_flags(CLI::App& cmd, worker::Shape& s) {
  cmd.add_option("--backend", s.backend, "Transport backend")->capture_default_str();
  cmd.add_option("--backend-opt", s.backend_options,
                 "A backend option KEY=VALUE (repeatable; see docs/backends.md)");
  cmd.add_option("--rails", s.rails, "mooncake: TCP connections per peer (backend option rails)");
  cmd.add_option("--provider", s.provider,
                 "mori: libfabric provider, e.g. shm or 'tcp;ofi_rxm' (backend option provider)");
  cmd.add_option("--prefill-tp", s.prefill_tp, "Prefill tensor-parallel size")
      ->capture_default_str();
  cmd.add_option("--decode-tp", s.decode_tp, "Decode tensor-parallel size")->capture_default_str();
  cmd.add_option("--decode-engines", s.decode_engines,
                 "Decode engines (of TP --decode-tp each) fed by the prefill engine; requests go "
                 "round-robin over them")
      ->capture_default_str();
  cmd.add_option("--prefill-engine", s.prefill_engine, "The prefill engine's id")
      ->capture_default_str();
  cmd.add_option("--decode-engine", s.decode_engine,
                 "The decode engine's id; with several, the stem of ID-0, ID-1, ...")
      ->capture_default_str();
  cmd.add_option("--kv-heads", s.kv_heads, "Total KV heads (ignored with --mla)")
      ->capture_default_str();
  cmd.add_option("--head-dim", s.head_dim, "Elements per head vector")->capture_default_str();
  cmd.add_option("--layers", s.layers, "Model layers")->capture_default_str();
  cmd.add_option("--page-size", s.page_size, "Tokens per page")->capture_default_str();
  cmd.add_option("--dtype-bytes", s.dtype_bytes, "Bytes per element")->capture_default_str();
  cmd.add_option("--layout", s.layout, "Pool layout")
      ->capture_default_str()
      ->check(CLI::IsMember({"nhd", "hnd"}));
  cmd.add_flag("--mla", s.mla, "MLA cache: one latent vector per token");
  cmd.add_option("--staging", s.staging,
                 "Gather small fragments into staging buffers: on, off, auto; naive = one write "
                 "per token, no coalescing (a benchmark baseline)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off", "auto", "naive"}));
  cmd.add_option("--requests", s.requests, "Requests to transfer")->capture_default_str();
  cmd.add_option("--warmup", s.warmup,
                 "The first N requests are left out of GB/s and latency (they warm the pools)")
      ->capture_default_str();
  cmd.add_option("--tokens", s.tokens, "Tokens per request")->capture_default_str();
  cmd.add_option("--chunks", s.chunks, "send() calls per request (chunked prefill)")
      ->capture_default_str();
  cmd.add_option("--window", s.window, "Requests in flight per rank")->capture_default_str();
  cmd.add_option("--interval-ms", s.interval_ms,
                 "Prefill ranks start a request at most once per this many ms (steady arrivals)")
      ->capture_default_str();
  cmd.add_option("--aux-bytes", s.aux_bytes, "Aux data bytes per request")->capture_default_str();
  cmd.add_option("--device", s.device,
                 "Where the KV pools live: host, or GPU memory (cuda, hip) that a transport "
                 "without GPU support moves through pinned staging")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "cuda", "hip"}));
  cmd.add_flag("!--no-verify", s.verify,
               "Benchmark mode: neither write nor check the pattern (bytes still move)");
  cmd.add_option("--fault", s.faults,
                 "Inject a transport fault KEY=VALUE (repeatable): fail_batch=P, stall_batch=P, "
                 "delay_us=N, drain_us=N, fail_connect=P, seed=N (docs/backends.md)");
  cmd.add_flag("--keep-going", s.keep_going,
               "Count a failed request with its reason and go on; fail only for a wrong byte or "
               "a crash");
  cmd.add_option("--engine-timeout", s.engine_timeouts,
                 "An engine timeout KEY=MS (repeatable): bootstrap, data, transfer, keepalive, "
                 "connect");
}

std::vector<std::string> shape_arguments(const worker::Shape& s) {
  std::vector<std::string> a = {"--backend",        s.backend,
                                "--prefill-tp",     std::to_string(s.prefill_tp),
                                "--decode-tp",      std::to_string(s.decode_tp),
                                "--decode-engines", std::to_string(s.decode_engines),
                                "--prefill-engine", s.prefill_engine,
                                "--decode-engine",  s.decode_engine,
                                "--kv-heads",       std::to_string(s.kv_heads),
                                "--head-dim",       std::to_string(s.head_dim),
                                "--layers",         std::to_string(s.layers),
                                "--page-size",      std::to_string(s.page_size),
                                "--dtype-bytes",    std::to_string(s.dtype_bytes),
                                "--layout",         s.layout,
                                "--staging",        s.staging,
                                "--requests",       std::to_string(s.requests),
                                "--tokens",         std::to_string(s.tokens),
                                "--chunks",         std::to_string(s.chunks),
                                "--window",         std::to_string(s.window),
                                "--interval-ms",    std::to_string(s.interval_ms),
                                "--aux-bytes",      std::to_string(s.aux_bytes),
                                "--device",         s.device};
  if (s.mla) a.push_back("--mla");
  if (!s.verify) a.push_back("--no-verify");
  if (s.keep_going) a.push_back("--keep-going");
  for (const auto& [flag, values] :
       {std::pair{"--fault", &s.faults}, {"--engine-timeout", &s.engine_timeouts}}) {
    for (const auto& v : *values) {
      a.push_back(flag);
      a.push_back(v);
    }
  }
  for (const auto& option : s.backend_options) {
    a.push_back("--backend-opt");
    a.push_back(option);
  }
  if (s.rails > 0) {
    a.push_back("--rails");
    a.push_back(std::to_string(s.rails));
  }
  if (!s.provider.empty()) {
    a.push_back("--provider");
    a.push_back(s.provider);
  }
  return a;
}

}  // namespace pdkv::cli
