# Small declarative helpers so that each module's CMakeLists.txt stays short.
#
#   fedlora_cc_library(NAME core SRCS a.cc b.cc CUDA_SRCS a.cu DEPS absl::status PUBLIC_INCLUDE dir)
#     -> target fedlora_core, alias fedlora::core. Sources are listed, never globbed.
#     CUDA_SRCS are compiled only when the CUDA backend is enabled (FEDLORA_HAVE_CUDA); the
#     target then defines FEDLORA_HAVE_CUDA for its own sources only.
#   fedlora_cc_test(NAME core_status_test SRCS status_test.cc DEPS fedlora::core LABELS unit)
#     -> a GoogleTest executable registered with CTest (one CTest entry per binary).
#   fedlora_cc_binary(NAME fedlora SRCS main.cc DEPS ...)
#   fedlora_cc_kernels_library(NAME kernels SRCS a_cpu.cc CUDA_SRCS a.cu DEPS ...)
#     -> fedlora::kernels, with the CUDA backend or without it per binary (below).
include_guard(GLOBAL)

function(fedlora_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;CUDA_SRCS;DEPS;PRIVATE_DEPS;PUBLIC_INCLUDE" ${ARGN})
  set(target fedlora_${ARG_NAME})
  set(srcs ${ARG_SRCS})
  if(FEDLORA_HAVE_CUDA)
    list(APPEND srcs ${ARG_CUDA_SRCS})
  endif()
  if(srcs)
    add_library(${target} STATIC ${srcs})
    target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                               ${ARG_PUBLIC_INCLUDE})
    target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
    if(FEDLORA_HAVE_CUDA AND ARG_CUDA_SRCS)
      set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                                 CUDA_ARCHITECTURES "${FEDLORA_CUDA_ARCHITECTURES}")
      # Private: the CUDA headers and defines stay inside this target; its consumers link the
      # CUDA libraries (a static library passes them on) and compile as they would without CUDA.
      target_compile_definitions(${target} PRIVATE FEDLORA_HAVE_CUDA=1 $<$<BOOL:${NCCL_FOUND}>:FEDLORA_HAVE_NCCL=1>)
      target_link_libraries(${target} PRIVATE CUDA::cudart CUDA::cublas)
    endif()
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                               ${ARG_PUBLIC_INCLUDE})
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
  endif()
  add_library(fedlora::${ARG_NAME} ALIAS ${target})
endfunction()

# A kernels module (kernels/, kernels/base/). Without CUDA, a fedlora_cc_library. With it, two
# twins: fedlora_<name>_cuda (SRCS and CUDA_SRCS) and fedlora_<name>_cpu (SRCS only, built only
# for a target that needs it), and fedlora::<name> is the CPU twin for a binary whose
# FEDLORA_CPU_ONLY property is set, the CUDA one otherwise. The property is read on the target
# being linked, through every library between it and this one: a binary that sets it (fedlora-cpu,
# the container images' binary) loads no CUDA library. No other object differs between the two.
function(fedlora_cc_kernels_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;CUDA_SRCS;DEPS" ${ARGN})
  set(lib fedlora_${ARG_NAME})
  if(NOT FEDLORA_HAVE_CUDA)
    fedlora_cc_library(NAME ${ARG_NAME} SRCS ${ARG_SRCS} DEPS ${ARG_DEPS})
    set(targets ${lib})
  else()
    fedlora_cc_library(NAME ${ARG_NAME}_cuda SRCS ${ARG_SRCS} CUDA_SRCS ${ARG_CUDA_SRCS} DEPS ${ARG_DEPS})
    fedlora_cc_library(NAME ${ARG_NAME}_cpu SRCS ${ARG_SRCS} DEPS ${ARG_DEPS})
    set_target_properties(${lib}_cpu PROPERTIES EXCLUDE_FROM_ALL ON)
    add_library(${lib} INTERFACE)
    target_link_libraries(${lib} INTERFACE
      "$<IF:$<BOOL:$<TARGET_PROPERTY:FEDLORA_CPU_ONLY>>,${lib}_cpu,${lib}_cuda>")
    add_library(fedlora::${ARG_NAME} ALIAS ${lib})
    set(targets ${lib}_cuda ${lib}_cpu)
  endif()
  # The CPU loops read neither floating-point exception flags nor errno. Without these flags GCC
  # refuses to if-convert loops with clamps (the polynomial exp in kernels/cpu_math.h) and keeps a
  # libm call beside every sqrt (AdamW), so neither vectorises. Neither flag changes any result.
  foreach(t IN LISTS targets)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-trapping-math -fno-math-errno>)
  endforeach()
endfunction()

function(fedlora_cc_binary)
  cmake_parse_arguments(ARG "" "NAME;OUTPUT_NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  if(ARG_OUTPUT_NAME)
    set_target_properties(${ARG_NAME} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
endfunction()

# LABELS: unit, integration, gpu, slow. TIMEOUT in seconds (default 300).
function(fedlora_cc_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ENV" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "FEDLORA_SOURCE_DIR=${PROJECT_SOURCE_DIR};FEDLORA_BINARY_DIR=${PROJECT_BINARY_DIR};${ARG_ENV}")
  if("unit" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY FEDLORA_UNIT_TESTS ${ARG_NAME})
  endif()
  if("gpu" IN_LIST ARG_LABELS)
    # GoogleTest exits 0 when its cases skip themselves (no GPU here); report that to CTest as a
    # skip, not as a pass.
    set_tests_properties(${ARG_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endfunction()

# A test driven by a script (Python reference checks). COMMAND is run as given.
function(fedlora_script_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "COMMAND;LABELS;DEPENDS_TARGETS" ${ARGN})
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_COMMAND} WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  if(NOT ARG_LABELS)
    set(ARG_LABELS integration)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "FEDLORA_SOURCE_DIR=${PROJECT_SOURCE_DIR};FEDLORA_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()
