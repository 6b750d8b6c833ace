// The one place pdkv's gRPC channels and servers get their security
// (pdkv/security.h): TLS credentials when configured, else plaintext; and on
// every client channel an interceptor that signs each call with the cluster
// secret (call_auth.h). Servers check calls with a CallAuthenticator.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "pdkv/security.h"

namespace pdkv::security {

// A channel to `address` with `args`, secured as `security` says.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const grpc::ChannelArguments& args,
                                            const Security& security);

// What a server listens with: SSL (requiring and verifying client
// certificates when a CA is configured) or plaintext.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const Security& security);

// Logs, once per process, what running without a secret means.
void warn_if_unauthenticated(const Security& security, const std::string& component);

}  // namespace pdkv::security
