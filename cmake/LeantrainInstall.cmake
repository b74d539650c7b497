# `cmake --install <build> [--prefix DIR]`: headers, the static libraries, the leantrain
# executable (when built) and a CMake package, so that another project writes
#
#   find_package(leantrain CONFIG REQUIRED)      # CMAKE_PREFIX_PATH: DIR and LibTorch's prefix
#   target_link_libraries(app PRIVATE leantrain::trainers)
#
# The layout under DIR:
#   include/leantrain/<layer>/*.h              each folder's include/
#   lib/libleantrain_<layer>.a                 one per layer (GNUInstallDirs' LIBDIR)
#   bin/leantrain                              with LEANTRAIN_BUILD_CLI
#   lib/cmake/leantrain/leantrainConfig.cmake  + ConfigVersion, Targets (leantrain:: names)
#
# The libraries are static, so their private third-party libraries are part of the exported
# link interface ($<LINK_ONLY:...>): leantrainConfig.cmake finds each of them again
# (cmake/leantrainConfig.cmake.in), as cmake/LeantrainDeps.cmake did for the build.
include(CMakePackageConfigHelpers)

set(LEANTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/leantrain CACHE STRING
    "Where leantrainConfig.cmake is installed, relative to the prefix")

set(_lt_install_targets)
foreach(_lib IN LISTS LEANTRAIN_LIBRARIES)
  list(APPEND _lt_install_targets leantrain_${_lib})
endforeach()
if(TARGET leantrain)
  list(APPEND _lt_install_targets leantrain)  # leantrain::leantrain, the executable
endif()
install(TARGETS ${_lt_install_targets} EXPORT leantrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Public headers: every library folder's include/ holds include/leantrain/<layer>/.
foreach(_dir runtime data recompute models comm checkpoint_io optim trainers report launch)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.h")
endforeach()

install(EXPORT leantrainTargets NAMESPACE leantrain:: FILE leantrainTargets.cmake
        DESTINATION ${LEANTRAIN_INSTALL_CMAKEDIR})

# What the config must know about this build: where LibTorch and the CUDA toolkit were (hints
# only; the consumer's CMAKE_PREFIX_PATH comes first) and the NCCL library leantrain::comm
# links. Torch's major.minor must match: the libraries were compiled against its headers.
get_filename_component(LEANTRAIN_TORCH_DIR "${Torch_DIR}" ABSOLUTE)
set(LEANTRAIN_TORCH_VERSION "${Torch_VERSION}")
set(LEANTRAIN_NCCL_LIBRARY "")
if(LEANTRAIN_HAVE_NCCL)
  set(LEANTRAIN_NCCL_LIBRARY "${LT_NCCL_LIBRARY}")
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/leantrainConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/leantrainConfig.cmake
                              INSTALL_DESTINATION ${LEANTRAIN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/leantrainConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/leantrainConfig.cmake ${PROJECT_BINARY_DIR}/leantrainConfigVersion.cmake
        DESTINATION ${LEANTRAIN_INSTALL_CMAKEDIR})
