// A registration as a rank of engine "prefill-a" sends it to the bootstrap
// service: 8 KV heads of 128 bf16 elements, 32 layers, 1024 pages of 16
// tokens, over the loopback transport. Tests of the registry, its gRPC
// service and `pdkv topology` change what they are about.
#pragma once

#include <cstdint>
#include <string>

#include "pdkv.pb.h"

namespace pdkv::testing {

inline proto::RankInfo registered_rank(uint32_t tp, uint32_t tp_size, uint32_t pp = 0,
                                       uint32_t pp_size = 1, uint32_t layer_first = 0,
                                       uint32_t layer_count = 32) {
  proto::RankInfo r;
  r.set_engine_id("prefill-a");
  r.set_dp_size(1);
  r.set_tp_rank(tp);
  r.set_tp_size(tp_size);
  r.set_pp_rank(pp);
  r.set_pp_size(pp_size);
  r.set_layer_first(layer_first);
  r.set_layer_count(layer_count);
  auto* s = r.mutable_kv_spec();
  s->set_total_heads(8);
  s->set_head_dim(128);
  s->set_dtype_bytes(2);
  s->set_page_size(16);
  s->set_num_layers(32);
  s->set_num_pages(1024);
  r.set_backend("loopback");
  r.set_control_address("127.0.0.1:" + std::to_string(7000 + tp));
  r.set_incarnation(1);
  return r;
}

}  // namespace pdkv::testing
