# Removes every file that install_manifest.txt lists, what the last
# `cmake --install` of this build wrote, then the directories that install
# created (install_dirs.txt, written by CMakeLists.txt's first install
# step) where they are empty; other directories stay.  Run by the
# `uninstall` target.  The lists leave DESTDIR out: give the same DESTDIR
# as to the install.
#     [DESTDIR=...] cmake -DMANIFEST=build/install_manifest.txt \
#         -DDIRS=build/install_dirs.txt -P cmake/uninstall.cmake
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
if(DIRS AND EXISTS "${DIRS}")
  file(READ "${DIRS}" dirs)
  list(REVERSE dirs)              # deepest first
  foreach(listed IN LISTS dirs)
    set(d "$ENV{DESTDIR}${listed}")
    file(GLOB left "${d}/*" "${d}/.*")
    if(IS_DIRECTORY "${d}" AND NOT left)
      message(STATUS "Removing directory ${d}")
      file(REMOVE_RECURSE "${d}")   # empty: nothing else goes
    endif()
  endforeach()
  file(REMOVE "${DIRS}")
endif()
