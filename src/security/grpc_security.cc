#include "security/grpc_security.h"

#include <grpcpp/support/client_interceptor.h>

#include <atomic>
#include <vector>

#include "crypto.h"
#include "log.h"
#include "security/call_auth.h"

namespace pdkv::security {
namespace {

using grpc::experimental::ClientRpcInfo;
using grpc::experimental::InterceptionHookPoints;

std::string bytes_of(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Adds pdkv-auth to a call's initial metadata. A unary call's request goes
// out in the same batch as its metadata, so its bytes are signed too; a
// stream's opening is signed without messages (call_auth.h).
class SigningInterceptor final : public grpc::experimental::Interceptor {
 public:
  SigningInterceptor(ClientRpcInfo* info, std::shared_ptr<const std::string> secret)
      : info_(info), secret_(std::move(secret)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::string body;
      if (info_->type() == ClientRpcInfo::Type::UNARY &&
          methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
        if (grpc::ByteBuffer* message = methods->GetSerializedSendMessage()) {
          body = bytes_of(*message);
        }
      }
      // A nonce the kernel cannot give is left empty: the server refuses it.
      auto nonce = crypto::random_bytes(kNonceBytes);
      methods->GetSendInitialMetadata()->emplace(
          kAuthMetadata, sign_call(*secret_, info_->method(), body, unix_ms_now(),
                                   nonce.is_ok() ? *nonce : std::string()));
    }
    methods->Proceed();
  }

 private:
  ClientRpcInfo* info_;
  std::shared_ptr<const std::string> secret_;
};

class SigningFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SigningFactory(std::shared_ptr<const std::string> secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(ClientRpcInfo* info) override {
    return new SigningInterceptor(info, secret_);
  }

 private:
  std::shared_ptr<const std::string> secret_;
};

// TLS as soon as there is a certificate to show or a CA to check servers with.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const Security& security) {
  if (!security.tls() && security.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.tls_ca;
  options.pem_private_key = security.tls_key;
  options.pem_cert_chain = security.tls_cert;
  return grpc::SslCredentials(options);
}

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const grpc::ChannelArguments& args,
                                            const Security& security) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> signing;
  if (security.authenticated()) {
    signing.push_back(
        std::make_unique<SigningFactory>(std::make_shared<const std::string>(security.secret)));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, channel_credentials(security), args, std::move(signing));
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const Security& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      security.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = security.tls_ca;
  options.pem_key_cert_pairs.push_back({security.tls_key, security.tls_cert});
  return grpc::SslServerCredentials(options);
}

void warn_if_unauthenticated(const Security& security, const std::string& component) {
  static std::atomic<bool> warned{false};
  if (security.authenticated() || warned.exchange(true)) return;
  logger(component)->warn(
      "no cluster secret (--secret-file / PDKV_SECRET_FILE): any process that reaches this "
      "rank's ports may read its transport descriptors and write its memory "
      "(docs/security.md)");
}

}  // namespace pdkv::security
