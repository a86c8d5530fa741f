# The CUDA backend is compiled when nvcc is found (FEDLORA_CUDA=AUTO), or required (ON), or left
# out (OFF). A binary built with it still runs on the CPU on a machine with no GPU or no driver:
# the backend is chosen at run time (kernels/base/device.h).
include_guard(GLOBAL)
set(FEDLORA_HAVE_CUDA OFF)
if(NOT FEDLORA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_fedlora_nvcc nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
    if(_fedlora_nvcc)
      set(CMAKE_CUDA_COMPILER "${_fedlora_nvcc}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${FEDLORA_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag (its CUDA20 table arrived later); nvcc 12+
    # accepts -std=c++20, so tell CMake the option instead of dropping to C++17.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_package(NCCL)
    set(FEDLORA_HAVE_CUDA ON)
    # FEDLORA_HAVE_CUDA (and FEDLORA_HAVE_NCCL) are defined for the targets with CUDA sources
    # only (fedlora_cc_library): every other object is the same bits with or without CUDA, so a
    # CPU-only twin of the kernels can be linked from the same build (kernels/CMakeLists.txt).
    message(STATUS "fedlora: CUDA backend ON (${CMAKE_CUDA_COMPILER}, archs ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${NCCL_FOUND})")
  elseif(FEDLORA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FEDLORA_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "fedlora: CUDA backend OFF (no nvcc found)")
  endif()
else()
  message(STATUS "fedlora: CUDA backend OFF (FEDLORA_CUDA=OFF)")
endif()
