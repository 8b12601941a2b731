// Self-signed TLS certificates for tests, made with OpenSSL's API (no `openssl` binary needed):
// an EC P-256 key and an X.509 v3 certificate with the given subjectAltName entries.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

namespace swarm::testing {

struct TlsFiles {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key (unencrypted)
};

/// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key`: a self-signed certificate valid from a
/// minute ago for a day, CN = `common_name`, subjectAltName = `san` (e.g.
/// "DNS:localhost,IP:127.0.0.1"). Throws std::runtime_error when OpenSSL fails.
inline TlsFiles make_self_signed(const std::filesystem::path& dir, const std::string& stem,
                                 const std::string& common_name, const std::string& san) {
  auto fail = [](const char* what) { throw std::runtime_error(std::string("make_self_signed: ") + what); };
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  if (!key) fail("key generation");
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  if (!cert) fail("X509_new");
  X509_set_version(cert.get(), 2);
  static long serial = 1;
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (auto [nid, value] :
       {std::pair{NID_subject_alt_name, san.c_str()}, std::pair{NID_basic_constraints, "critical,CA:TRUE"},
        std::pair{NID_key_usage, "critical,digitalSignature,keyCertSign"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) fail("extension");
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) fail("signing");

  TlsFiles files{(dir / (stem + ".crt")).string(), (dir / (stem + ".key")).string()};
  auto write = [&](const std::string& path, auto&& body) {
    std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "w"), std::fclose);
    if (!f || !body(f.get())) fail("writing a PEM file");
  };
  write(files.cert, [&](FILE* f) { return PEM_write_X509(f, cert.get()) == 1; });
  write(files.key, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  });
  return files;
}

}  // namespace swarm::testing
