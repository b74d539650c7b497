# Third-party packages. Each is linked PRIVATE by the one folder that wraps it (STYLE.md):
# toml++/CLI11/spdlog by runtime and launch, MPI/NCCL by comm, HDF5 by checkpoint_io.

# LibTorch: any LibTorch >= 2.4 given by CMAKE_PREFIX_PATH; by default the one in the
# project's virtualenv (.venv, made by scripts/setup.sh).
find_package(Torch QUIET CONFIG)
if(NOT Torch_FOUND)
  set(_venv_python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  if(EXISTS ${_venv_python})
    execute_process(COMMAND ${_venv_python} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
    if(_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
    endif()
  endif()
  # The PyPI wheel is a CUDA build: its config looks for a toolkit, which is under /usr/local/cuda.
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
    set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda)
  endif()
  find_package(Torch REQUIRED CONFIG)
endif()
# Handed to find_package(leantrain) consumers as hints (cmake/leantrainConfig.cmake.in).
set(LEANTRAIN_CUDA_HINT "${CUDAToolkit_ROOT}")
if(Torch_VERSION AND Torch_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "leantrain needs LibTorch >= 2.4, found ${Torch_VERSION} (set CMAKE_PREFIX_PATH)")
endif()
# TORCH_LIBRARIES carries -D flags from the wheel; keep only the flags on the imported target.
message(STATUS "leantrain: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
find_package(HDF5 REQUIRED COMPONENTS C)
if(LEANTRAIN_BUILD_CLI)
  find_package(CLI11 REQUIRED CONFIG)  # launch/ only
endif()
find_package(nlohmann_json REQUIRED CONFIG)
find_package(spdlog REQUIRED CONFIG)
find_package(PkgConfig REQUIRED)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)

# CUDA + NCCL: compiled and linked whenever present, even on machines without a GPU. NCCL is
# looked for in LEANTRAIN_NCCL_ROOT (or $NCCL_ROOT) first, then beside the toolkit, then in
# the nvidia-nccl wheel next to LibTorch's (what a machine with only pip's CUDA has).
set(LEANTRAIN_HAVE_NCCL OFF)
if(LEANTRAIN_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(_nccl_hints ${LEANTRAIN_NCCL_ROOT} $ENV{NCCL_ROOT})
    list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda)
    get_filename_component(_torch_site "${Torch_DIR}/../../../.." ABSOLUTE)  # .../site-packages
    list(APPEND _nccl_hints ${_torch_site}/nvidia/nccl)
    find_path(LT_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(LT_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64)
    if(LT_NCCL_INCLUDE_DIR AND LT_NCCL_LIBRARY)
      set(LEANTRAIN_HAVE_NCCL ON)
      # Named leantrain::nccl so that the installed leantrain::comm can name it too: the
      # package config re-creates it from LT_NCCL_LIBRARY (cmake/leantrainConfig.cmake.in).
      add_library(leantrain::nccl INTERFACE IMPORTED)
      target_include_directories(leantrain::nccl INTERFACE ${LT_NCCL_INCLUDE_DIR})
      target_link_libraries(leantrain::nccl INTERFACE ${LT_NCCL_LIBRARY} CUDA::cudart)
      add_library(leantrain_nccl ALIAS leantrain::nccl)  # the tests' name
    endif()
  endif()
endif()
message(STATUS "leantrain: CUDA toolkit ${CUDAToolkit_VERSION}, NCCL: ${LEANTRAIN_HAVE_NCCL} ${LT_NCCL_LIBRARY}")

# at::parallel_for is a header template whose ATen/ParallelOpenMP.h body is an OpenMP
# parallel region compiled into the caller: without -fopenmp our own parallel loops (the
# packed-activation kernels) ran on one thread. LibTorch's CMake config does not pass it on.
# libgomp.so.1 is then one library in the process (LibTorch's, found first by its RPATH).
find_package(OpenMP REQUIRED COMPONENTS CXX)

# Under a parent project (add_subdirectory), the imported targets found here must be visible
# to the parent's targets that link leantrain::<layer>: LibTorch's `torch` names torch_cpu and
# torch_cuda in generator expressions evaluated in the consumer's directory. (CMake >= 3.24
# has CMAKE_FIND_PACKAGE_TARGETS_GLOBAL; this works from 3.21.)
if(NOT PROJECT_IS_TOP_LEVEL)
  get_directory_property(_lt_imported IMPORTED_TARGETS)
  foreach(_t IN LISTS _lt_imported)
    get_target_property(_global ${_t} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${_t} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()

# Every target that includes LibTorch reuses one precompiled header (same flags everywhere).
function(leantrain_torch_target target)
  target_link_libraries(${target} PUBLIC torch OpenMP::OpenMP_CXX)
  target_compile_features(${target} PUBLIC cxx_std_17)
  if(TARGET leantrain_pch)
    target_precompile_headers(${target} REUSE_FROM leantrain_pch)
  endif()
endfunction()

add_library(leantrain_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
target_link_libraries(leantrain_pch PUBLIC torch OpenMP::OpenMP_CXX)
target_precompile_headers(leantrain_pch PRIVATE <torch/torch.h>)
set_target_properties(leantrain_pch PROPERTIES POSITION_INDEPENDENT_CODE OFF)
