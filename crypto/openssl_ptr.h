// Owning pointers to OpenSSL objects: std::unique_ptr with the object's own free function.
//
//   X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
#pragma once

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

namespace fedlora::crypto {

template <typename T, void (*F)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { F(p); }
};
template <typename T, void (*F)(T*)>
using OpenSslPtr = std::unique_ptr<T, OpenSslDeleter<T, F>>;

using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using CrlPtr = OpenSslPtr<X509_CRL, X509_CRL_free>;
using KeyPtr = OpenSslPtr<EVP_PKEY, EVP_PKEY_free>;
using MdCtxPtr = OpenSslPtr<EVP_MD_CTX, EVP_MD_CTX_free>;
using StorePtr = OpenSslPtr<X509_STORE, X509_STORE_free>;
using StoreCtxPtr = OpenSslPtr<X509_STORE_CTX, X509_STORE_CTX_free>;
using BnPtr = OpenSslPtr<BIGNUM, BN_free>;
using AsnIntPtr = OpenSslPtr<ASN1_INTEGER, ASN1_INTEGER_free>;
using AsnTimePtr = OpenSslPtr<ASN1_TIME, ASN1_TIME_free>;
using RevokedPtr = OpenSslPtr<X509_REVOKED, X509_REVOKED_free>;
using ExtPtr = OpenSslPtr<X509_EXTENSION, X509_EXTENSION_free>;
using NamesPtr = OpenSslPtr<GENERAL_NAMES, GENERAL_NAMES_free>;

}  // namespace fedlora::crypto
