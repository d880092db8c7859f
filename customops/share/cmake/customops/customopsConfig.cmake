# find_package(customops 0.1 REQUIRED) gives the imported target customops::customops: the op
# library of this customops package (customops/lib/libcustomops.so, the very file Python
# loads), its C++ API headers (customops/ops.h) and torch. Relocatable: every path is found
# from this file's place inside the installed customops package.
#
#   cmake -DCMAKE_PREFIX_PATH="$(python -c 'import customops; print(customops.cmake_prefix_path())')" ...
#
# torch is looked up beside customops (the same site-packages), unless Torch_DIR or
# CMAKE_PREFIX_PATH already say where it is. For a CUDA torch, torch's own CMake config needs
# the CUDA toolkit (CUDA_HOME, default /usr/local/cuda) and the CUDA libraries that pip's
# torch keeps in site-packages/nvidia: those are passed to it unless set first.
cmake_minimum_required(VERSION 3.18)
get_filename_component(_customops_package "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
get_filename_component(_customops_site "${_customops_package}/.." ABSOLUTE)
set(_customops_library "${_customops_package}/lib/libcustomops.so")
if(NOT EXISTS "${_customops_library}")
  set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
  set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE
      "the op library ${_customops_library} is missing: build customops (pip install --no-build-isolation .)")
  return()
endif()

if(NOT Torch_DIR)
  if(EXISTS "${_customops_site}/torch/share/cmake/Torch/TorchConfig.cmake")
    set(Torch_DIR "${_customops_site}/torch/share/cmake/Torch")
  else()
    # A source checkout (editable install): the torch the library was built against.
    file(READ "${_customops_package}/lib/build_info.json" _customops_info)
    if(_customops_info MATCHES "\"torch_cmake_dir\": \"([^\"]*)\"")
      set(_customops_torch_dir "${CMAKE_MATCH_1}")
      if(EXISTS "${_customops_torch_dir}/TorchConfig.cmake")
        set(Torch_DIR "${_customops_torch_dir}")
        get_filename_component(_customops_site "${_customops_torch_dir}/../../../.." ABSOLUTE)
      endif()
    endif()
  endif()
endif()
file(GLOB _customops_nvidia_includes "${_customops_site}/nvidia/*/include")
if(EXISTS "${_customops_site}/nvidia")
  if(NOT CUDA_TOOLKIT_ROOT_DIR)
    if(DEFINED ENV{CUDA_HOME})
      set(CUDA_TOOLKIT_ROOT_DIR "$ENV{CUDA_HOME}")
    elseif(EXISTS /usr/local/cuda)
      set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda)
    endif()
  endif()
  foreach(_customops_pair "CUDA_CUDART_LIBRARY;libcudart.so" "CUDA_nvrtc_LIBRARY;libnvrtc.so")
    list(GET _customops_pair 0 _customops_var)
    list(GET _customops_pair 1 _customops_name)
    if(NOT ${_customops_var})
      file(GLOB _customops_hits "${_customops_site}/nvidia/*/lib/${_customops_name}*")
      if(_customops_hits)
        list(SORT _customops_hits)
        list(GET _customops_hits 0 _customops_hit)
        set(${_customops_var} "${_customops_hit}")
      endif()
    endif()
  endforeach()
endif()

include(CMakeFindDependencyMacro)
find_dependency(Torch)

if(NOT TARGET customops::customops)
  add_library(customops::customops SHARED IMPORTED)
  set_target_properties(customops::customops PROPERTIES
    IMPORTED_LOCATION "${_customops_library}"
    IMPORTED_SONAME "libcustomops.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_customops_package}/include;${_customops_nvidia_includes}"
    INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES}"
    # A program that only runs models (and calls none of customops.h's functions) still needs
    # the library's op registrations: keep it on the link line.
    INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed")
endif()
set(customops_LIBRARIES customops::customops)
set(customops_INCLUDE_DIRS "${_customops_package}/include")
