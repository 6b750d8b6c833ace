// Checks shared by every transport backend.
#include <fmt/format.h>

#include "pdkv/transport.h"

namespace pdkv {

Status check_op_bounds(std::string_view verb, size_t index, const WriteOp& op,
                       std::span<const uint64_t> local_lengths,
                       std::span<const uint64_t> remote_lengths) {
  if (op.local_region >= local_lengths.size()) {
    return Status::out_of_range(fmt::format("{} {}: local region {} is not registered ({} are)",
                                            verb, index, op.local_region, local_lengths.size()));
  }
  // Written so that no sum can overflow: offset <= length, then length - offset.
  const uint64_t local_len = local_lengths[op.local_region];
  if (op.local_offset > local_len || op.length > local_len - op.local_offset) {
    return Status::out_of_range(
        fmt::format("{} {}: local bytes [{}, {}) outside local region {} of {} bytes", verb, index,
                    op.local_offset, op.local_offset + op.length, op.local_region, local_len));
  }
  if (op.remote_region >= remote_lengths.size()) {
    return Status::out_of_range(
        fmt::format("{} {}: remote region {} is not in the peer's descriptor ({} are)", verb, index,
                    op.remote_region, remote_lengths.size()));
  }
  const uint64_t remote_len = remote_lengths[op.remote_region];
  if (op.remote_offset > remote_len || op.length > remote_len - op.remote_offset) {
    return Status::out_of_range(fmt::format(
        "{} {}: remote bytes [{}, {}) outside remote region {} of {} bytes", verb, index,
        op.remote_offset, op.remote_offset + op.length, op.remote_region, remote_len));
  }
  return Status::ok();
}

}  // namespace pdkv
