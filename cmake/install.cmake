# `cmake --install`: the headers, libpdkv.so (C ABI), libpdkv_cxx.so (C++
# API), the pdkv binary, pdkvConfig.cmake (pdkv::pdkv, pdkv::c) and pdkv.pc.
# tests/install/ installs into a temporary prefix and builds consumers.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pdkv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(TARGETS pdkv_c pdkv_cxx EXPORT pdkvTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS pdkv_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(pdkv_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/pdkv)
install(EXPORT pdkvTargets NAMESPACE pdkv:: DESTINATION ${pdkv_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pdkvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/pdkvConfig.cmake
                              INSTALL_DESTINATION ${pdkv_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pdkvConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pdkvConfig.cmake ${PROJECT_BINARY_DIR}/pdkvConfigVersion.cmake
        DESTINATION ${pdkv_cmake_dir})

# pdkv.pc names the prefix it was configured for; `cmake --install --prefix`
# elsewhere rewrites it at install time.
install(CODE "
  set(CMAKE_INSTALL_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(CMAKE_INSTALL_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(CMAKE_INSTALL_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(PROJECT_VERSION \"${PROJECT_VERSION}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/cmake/pdkv.pc.in\"
                 \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/pdkv.pc\" @ONLY)
  message(STATUS \"Installing: \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/pdkv.pc\")
")
