# Removes every file that install_manifest.txt lists: what the last
# `cmake --install` of this build wrote (run by the `uninstall` target of
# CMakeLists.txt).  The manifest leaves DESTDIR out, so give the same
# DESTDIR as to the install.  Directories stay: they may hold other files.
#     [DESTDIR=...] cmake -DMANIFEST=build/install_manifest.txt -P cmake/uninstall.cmake
if(NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "uninstall: no ${MANIFEST}; nothing was installed from this build")
endif()
file(STRINGS "${MANIFEST}" files)
foreach(listed IN LISTS files)
  set(f "$ENV{DESTDIR}${listed}")
  if(EXISTS "${f}" OR IS_SYMLINK "${f}")
    message(STATUS "Removing ${f}")
    file(REMOVE "${f}")
    if(EXISTS "${f}" OR IS_SYMLINK "${f}")
      message(FATAL_ERROR "uninstall: could not remove ${f}")
    endif()
  else()
    message(STATUS "Not there: ${f}")
  endif()
endforeach()
