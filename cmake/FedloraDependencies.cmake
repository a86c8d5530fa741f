# Every dependency comes from a Debian package installed by scripts/setup.sh. Nothing is
# downloaded at build time.
include_guard(GLOBAL)
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(OpenSSL 3 REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(nlohmann_json 3 CONFIG REQUIRED)
# Eigen (header-only): the QR and SVD of LORA_PRODUCT aggregation (aggregation/lora_product.h).
find_package(Eigen3 3.3 CONFIG REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
# oneDNN (libdnnl-dev): the CPU's bf16 GEMMs (kernels/gemm_bf16_cpu.cc). Debian's build runs on
# OpenMP (libgomp). Found by hand: its CMake package also asks for OpenCL, which fedlora never uses.
find_path(FEDLORA_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(FEDLORA_DNNL_LIBRARY dnnl REQUIRED)
find_library(FEDLORA_GOMP_LIBRARY NAMES gomp libgomp.so.1 REQUIRED)
add_library(fedlora_dnnl INTERFACE)
target_include_directories(fedlora_dnnl SYSTEM INTERFACE ${FEDLORA_DNNL_INCLUDE_DIR})
target_link_libraries(fedlora_dnnl INTERFACE ${FEDLORA_DNNL_LIBRARY} ${FEDLORA_GOMP_LIBRARY})
# PCRE2 (libpcre2-dev) runs the byte-level BPE pre-tokenizer regexes; ICU (libicu-dev) gives
# their NFC normalizer (model/pretokenize.h).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
# cpp-httplib (libcpp-httplib-dev): the server's metrics endpoint. Debian ships it compiled; the
# .pc file's defines (OpenSSL, zlib, brotli support) must reach every user of httplib.h, since they
# change the classes' layout.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
if(FEDLORA_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(FEDLORA_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()
find_program(FEDLORA_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
