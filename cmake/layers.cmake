# The layers of src/ (CONTRIBUTING.md): each is an object library whose include path holds only the
# layers it may use, so an include across the layering fails to compile. A layer's headers are
# reached as "<dir>/name.hpp" through a folder of the build tree that links to src/<dir> alone.

# The include root of layer folder `dir` (src/<dir>), made once per configure.
function(flashtq_layer_root dir out)
  set(root ${CMAKE_BINARY_DIR}/layers/${dir})
  if(NOT EXISTS ${root}/${dir})
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${dir} ${root}/${dir} SYMBOLIC)
  endif()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

# flashtq_layer(target DIR dir SOURCES ... USES layer-targets...): an object library over src/<dir>
# that sees its own folder, the public headers and the folders of the layers it USES.
function(flashtq_layer target)
  cmake_parse_arguments(L "" "DIR" "SOURCES;USES" ${ARGN})
  flashtq_layer_root(${L_DIR} root)
  add_library(${target} OBJECT ${L_SOURCES})
  target_include_directories(${target} PUBLIC ${root} ${CMAKE_SOURCE_DIR}/include)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  foreach(dep IN LISTS L_USES)
    target_include_directories(${target} PUBLIC $<TARGET_PROPERTY:${dep},INTERFACE_INCLUDE_DIRECTORIES>)
  endforeach()
endfunction()
