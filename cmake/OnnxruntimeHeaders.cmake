# Locate onnxruntime's C/C++ API headers (the custom-op library needs headers only: it never links
# libonnxruntime, onnxruntime hands us its API table in RegisterCustomOps).
#
# Order (see shared DESIGN.md, "Environment facts"):
#   1. ONNXRUNTIME_INCLUDE_DIR (CMake cache variable or environment variable);
#   2. a system install (onnxruntime_c_api.h under an include dir, e.g. /usr/include/onnxruntime);
#   3. Debian's libonnxruntime-dev .deb (onnxruntime 1.21, ORT_API_VERSION 21), fetched once with
#      `apt-get download` through a temporary sources list -- the system's apt configuration is
#      untouched -- checked against a pinned sha256 and unpacked with `dpkg -x` into a cache folder
#      that later builds reuse.
# We build against the OLDEST onnxruntime API we support: a library built against version-21 headers
# loads into newer runtimes (1.32 verified), the reverse fails.
#
# Result: ONNXRUNTIME_HEADERS_DIR (contains onnxruntime_c_api.h) and ONNXRUNTIME_HEADERS_SOURCE.

set(_SD_ORT_DEB_NAME "libonnxruntime-dev")
set(_SD_ORT_DEB_VERSION "1.21.0+dfsg-1")
set(_SD_ORT_DEB_FILE "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb")
set(_SD_ORT_DEB_SHA256 "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08")
set(_SD_ORT_DEB_SUITE "trixie")
set(_SD_ORT_DEB_MIRROR "http://deb.debian.org/debian")

function(_sd_check_headers dir out)
  if(dir AND EXISTS "${dir}/onnxruntime_c_api.h" AND EXISTS "${dir}/onnxruntime_cxx_api.h")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# 1. explicit location
if(NOT ONNXRUNTIME_INCLUDE_DIR AND DEFINED ENV{ONNXRUNTIME_INCLUDE_DIR})
  set(ONNXRUNTIME_INCLUDE_DIR "$ENV{ONNXRUNTIME_INCLUDE_DIR}")
endif()
if(ONNXRUNTIME_INCLUDE_DIR)
  _sd_check_headers("${ONNXRUNTIME_INCLUDE_DIR}" _ok)
  if(NOT _ok)
    message(FATAL_ERROR "ONNXRUNTIME_INCLUDE_DIR=${ONNXRUNTIME_INCLUDE_DIR} does not contain "
                        "onnxruntime_c_api.h and onnxruntime_cxx_api.h")
  endif()
  set(ONNXRUNTIME_HEADERS_DIR "${ONNXRUNTIME_INCLUDE_DIR}")
  set(ONNXRUNTIME_HEADERS_SOURCE "ONNXRUNTIME_INCLUDE_DIR")
  return()
endif()

# 2. system install
find_path(_SD_ORT_SYSTEM_DIR onnxruntime_c_api.h PATH_SUFFIXES onnxruntime onnxruntime/core/session
          NO_CACHE)
_sd_check_headers("${_SD_ORT_SYSTEM_DIR}" _ok)
if(_ok)
  set(ONNXRUNTIME_HEADERS_DIR "${_SD_ORT_SYSTEM_DIR}")
  set(ONNXRUNTIME_HEADERS_SOURCE "system")
  return()
endif()

# 3. Debian package, cached
if(DEFINED ENV{SOFTDEPLOY_CACHE_DIR})
  set(_cache "$ENV{SOFTDEPLOY_CACHE_DIR}")
elseif(DEFINED ENV{XDG_CACHE_HOME})
  set(_cache "$ENV{XDG_CACHE_HOME}/softdeploy")
else()
  set(_cache "$ENV{HOME}/.cache/softdeploy")
endif()
set(_unpacked "${_cache}/onnxruntime-headers-${_SD_ORT_DEB_VERSION}")
set(_headers "${_unpacked}/usr/include/onnxruntime")
set(_deb "${_cache}/${_SD_ORT_DEB_FILE}")

_sd_check_headers("${_headers}" _ok)
if(NOT _ok)
  file(MAKE_DIRECTORY "${_cache}")
  if(EXISTS "${_deb}")
    file(SHA256 "${_deb}" _sum)
    if(NOT _sum STREQUAL _SD_ORT_DEB_SHA256)
      file(REMOVE "${_deb}")
    endif()
  endif()
  if(NOT EXISTS "${_deb}")
    find_program(_SD_APT_GET apt-get)
    if(NOT _SD_APT_GET)
      message(FATAL_ERROR
        "onnxruntime headers not found and apt-get is unavailable to fetch them.\n"
        "Set ONNXRUNTIME_INCLUDE_DIR to a folder holding onnxruntime_c_api.h (onnxruntime >= 1.16).")
    endif()
    string(RANDOM LENGTH 8 _rnd)
    set(_tmp "${CMAKE_BINARY_DIR}/_sd_apt_${_rnd}")
    file(MAKE_DIRECTORY "${_tmp}/lists/partial" "${_tmp}/cache/archives/partial" "${_tmp}/deb")
    # trusted=yes: the archive signature of a newer suite may be unknown to this system's keyring;
    # integrity is established by the pinned sha256 below instead.
    file(WRITE "${_tmp}/sources.list"
         "deb [trusted=yes] ${_SD_ORT_DEB_MIRROR} ${_SD_ORT_DEB_SUITE} main\n")
    set(_apt_opts
        -o "Dir::Etc::SourceList=${_tmp}/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=${_tmp}/lists" -o "Dir::Cache=${_tmp}/cache"
        -o "APT::Architecture=amd64" -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
    message(STATUS "softdeploy: fetching ${_SD_ORT_DEB_NAME}=${_SD_ORT_DEB_VERSION} (onnxruntime headers)")
    execute_process(COMMAND "${_SD_APT_GET}" ${_apt_opts} -q update
                    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
    if(_rc EQUAL 0)
      execute_process(COMMAND "${_SD_APT_GET}" ${_apt_opts} -q download
                              "${_SD_ORT_DEB_NAME}=${_SD_ORT_DEB_VERSION}"
                      WORKING_DIRECTORY "${_tmp}/deb" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
    endif()
    if(NOT _rc EQUAL 0 OR NOT EXISTS "${_tmp}/deb/${_SD_ORT_DEB_FILE}")
      message(FATAL_ERROR
        "Could not download ${_SD_ORT_DEB_NAME}=${_SD_ORT_DEB_VERSION} from ${_SD_ORT_DEB_MIRROR} "
        "${_SD_ORT_DEB_SUITE}: ${_err}\n"
        "Set ONNXRUNTIME_INCLUDE_DIR to a folder holding onnxruntime_c_api.h instead.")
    endif()
    file(SHA256 "${_tmp}/deb/${_SD_ORT_DEB_FILE}" _sum)
    if(NOT _sum STREQUAL _SD_ORT_DEB_SHA256)
      message(FATAL_ERROR "${_SD_ORT_DEB_FILE}: sha256 ${_sum} does not match the pinned "
                          "${_SD_ORT_DEB_SHA256}; refusing to use it.")
    endif()
    file(RENAME "${_tmp}/deb/${_SD_ORT_DEB_FILE}" "${_deb}")
    file(REMOVE_RECURSE "${_tmp}")
  endif()
  find_program(_SD_DPKG dpkg REQUIRED)
  file(REMOVE_RECURSE "${_unpacked}")
  execute_process(COMMAND "${_SD_DPKG}" -x "${_deb}" "${_unpacked}" RESULT_VARIABLE _rc)
  _sd_check_headers("${_headers}" _ok)
  if(NOT _rc EQUAL 0 OR NOT _ok)
    message(FATAL_ERROR "Unpacking ${_deb} did not yield ${_headers}/onnxruntime_c_api.h")
  endif()
endif()
set(ONNXRUNTIME_HEADERS_DIR "${_headers}")
set(ONNXRUNTIME_HEADERS_SOURCE "${_deb}")
