// What one control message costs on gRPC's callback API, the way the engine
// makes its calls: a unary call (a `ReportStatus` answered at once) against
// one message and its answer on a bidirectional stream held open (`Watch`,
// echoed), client and server in this process over loopback. Both report
// wall time and the process's CPU time per round trip: the question is
// whether one long-lived stream per link would be cheaper than a unary call
// per message (docs/benchmarks.md, "The control path alone").
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "pdkv.grpc.pb.h"

namespace {

using pdkv::proto::ControlReply;
using pdkv::proto::Heartbeat;
using pdkv::proto::RoomStatus;

// Answers ReportStatus at once and echoes every Watch message.
class EchoService final : public pdkv::proto::Control::CallbackService {
 public:
  grpc::ServerUnaryReactor* ReportStatus(grpc::CallbackServerContext* ctx, const RoomStatus*,
                                         ControlReply*) override {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<Heartbeat, Heartbeat>* Watch(grpc::CallbackServerContext*) override {
    return new Echo;
  }

 private:
  class Echo : public grpc::ServerBidiReactor<Heartbeat, Heartbeat> {
   public:
    Echo() { StartRead(&message_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      StartWrite(&message_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      StartRead(&message_);
    }
    void OnDone() override { delete this; }

   private:
    Heartbeat message_;
  };
};

// One answer awaited at a time.
class Signal {
 public:
  void set() {
    std::lock_guard lock(mu_);
    set_ = true;
    cv_.notify_one();
  }
  void wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return set_; });
    set_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

struct Server {
  Server() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials());
    stub = pdkv::proto::Control::NewStub(channel);
  }
  ~Server() { server->Shutdown(); }
  EchoService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pdkv::proto::Control::Stub> stub;
};

void BM_UnaryCall(benchmark::State& state) {
  Server s;
  Signal answered;
  for (auto _ : state) {
    grpc::ClientContext ctx;
    RoomStatus request;
    request.set_room(7);
    ControlReply reply;
    grpc::Status status;
    s.stub->async()->ReportStatus(&ctx, &request, &reply, [&](const grpc::Status& st) {
      status = st;
      answered.set();
    });
    answered.wait();
    if (!status.ok()) {
      state.SkipWithError(("ReportStatus failed: " + status.error_message()).c_str());
      break;
    }
  }
}
BENCHMARK(BM_UnaryCall)->MeasureProcessCPUTime()->UseRealTime()->MinTime(2.0);

// The client end of the stream: one message out, its echo in, per round
// (and the write's completion: gRPC takes one write at a time).
// A round that fails (the stream broke) ends the stream: nothing more is
// started on it, and finish() only waits for OnDone.
class StreamClient : public grpc::ClientBidiReactor<Heartbeat, Heartbeat> {
 public:
  bool round() {
    StartWrite(&out_);
    StartRead(&in_);
    written_.wait();
    echoed_.wait();
    broken_ = broken_ || !write_ok_ || !read_ok_;
    return !broken_;
  }
  void finish() {
    if (!broken_) StartWritesDone();
    done_.wait();
  }
  void OnWriteDone(bool ok) override {
    write_ok_ = ok;
    written_.set();
  }
  void OnReadDone(bool ok) override {
    read_ok_ = ok;
    echoed_.set();
  }
  void OnDone(const grpc::Status&) override { done_.set(); }

 private:
  Heartbeat out_, in_;
  Signal written_, echoed_, done_;
  bool write_ok_ = false, read_ok_ = false;  // set before their Signal
  bool broken_ = false;                      // the caller's thread only
};

void BM_StreamMessage(benchmark::State& state) {
  Server s;
  grpc::ClientContext ctx;
  StreamClient client;
  s.stub->async()->Watch(&ctx, &client);
  client.StartCall();
  bool up = client.round();  // the stream is up
  for (auto _ : state) {
    if (!up || !client.round()) {
      state.SkipWithError("the stream broke");
      break;
    }
  }
  client.finish();
}
BENCHMARK(BM_StreamMessage)->MeasureProcessCPUTime()->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
