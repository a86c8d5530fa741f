# The load harness (load_harness.h), shared by tests/load and bench/load: whichever is configured
# first defines the library; the include guard keeps it to one definition.
include_guard(GLOBAL)
fedlora_cc_library(NAME load_harness SRCS ${CMAKE_CURRENT_LIST_DIR}/load_harness.cc ${CMAKE_CURRENT_LIST_DIR}/load_setup.cc
                   ${CMAKE_CURRENT_LIST_DIR}/load_clients.cc ${CMAKE_CURRENT_LIST_DIR}/load_report.cc ${CMAKE_CURRENT_LIST_DIR}/prober.cc
                   DEPS fedlora::server fedlora::compression fedlora::crypto fedlora::core fedlora::proto
                        absl::synchronization absl::time gRPC::grpc++)
