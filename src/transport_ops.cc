// Checks shared by every transport backend.
#include <fmt/format.h>

#include <charconv>

#include "pdkv/transport.h"

namespace pdkv {

namespace {

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

}  // namespace

Result<uint64_t> parse_option_number(std::string_view backend, const std::string& key,
                                     const std::string& value, uint64_t min, uint64_t max) {
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || ptr != value.data() + value.size() || value.empty() || n < min ||
      n > max) {
    return Status::invalid_argument(fmt::format(
        "{} option {}={}: expected a whole number in [{}, {}]", backend, key, value, min, max));
  }
  return n;
}

Status Transport::check_notification(std::string_view notification) const {
  if (notification.size() <= kMaxNotificationBytes) return Status::ok();
  return Status::invalid_argument(fmt::format("{} notification of {} bytes exceeds {}", name(),
                                              notification.size(), kMaxNotificationBytes));
}

Status check_ops_bounds(std::string_view verb, std::span<const WriteOp> ops,
                        std::span<const uint64_t> local_lengths,
                        std::span<const uint64_t> remote_lengths) {
  for (size_t i = 0; i < ops.size(); ++i) {
    PDKV_RETURN_IF_ERROR(check_op_bounds(verb, i, ops[i], local_lengths, remote_lengths));
  }
  return Status::ok();
}

}  // namespace pdkv
