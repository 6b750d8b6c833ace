#include "engine/engine_context.h"

#include "engine/routing.h"

namespace pdkv::engine {

proto::RankRef EngineContext::self_ref() const { return ref_of(self); }

void EngineContext::advance(RoomHandle* room, PollState state) {
  if (room != nullptr && room->state.advance(state)) feed.changed(room->id);
}

void EngineContext::fail(RoomHandle* room, const Status& reason) {
  if (room != nullptr && room->state.fail(reason)) feed.changed(room->id);
}

void EngineContext::note_staged(RoomHandle* room) {
  ++counters.staged_routes;
  if (room == nullptr) return;
  std::lock_guard lock(room->mu);
  room->metrics_.staged = true;
}

void EngineContext::copy_then(Copy kind, TransferPlan plan, uint64_t slot,
                              std::function<void(const Status&)> done) {
  const bool on_loop = !pool_staging.copies_off_loop() || plan.bytes() < kCopyOnLoopBytes;
  auto copy = [&staging = pool_staging, kind, slot, plan = std::move(plan)] {
    return kind == Copy::kGather ? staging.gather(plan, slot) : staging.scatter(plan, slot);
  };
  if (on_loop) return loop.post([copy = std::move(copy), done = std::move(done)] { done(copy()); });
  // The loop's post hands the copy's bytes over to the loop thread (the
  // queue's lock orders them), as this thread's run() handed the caller's.
  copier.run([&loop = loop, copy = std::move(copy), done = std::move(done)] {
    loop.post([done, outcome = copy()] { done(outcome); });
  });
}

}  // namespace pdkv::engine
