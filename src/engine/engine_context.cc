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

}  // namespace pdkv::engine
