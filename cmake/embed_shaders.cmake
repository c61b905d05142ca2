# Writes OUTPUT, a C++ file defining flashtq::webgpu::shader_source() over the WGSL files in DIR
# (each as a raw string literal); files whose names start with "_" are preludes, prepended to every
# other shader (WGSL has no include). Run at build time by the webgpu backend's custom command.
file(GLOB shaders "${DIR}/*.wgsl")
list(SORT shaders)
set(body "// Generated from src/webgpu/shaders/*.wgsl by cmake/embed_shaders.cmake; do not edit.\n#include \"webgpu/shaders.hpp\"\n\n#include <map>\n\nnamespace flashtq::webgpu {\n\nstd::string shader_source(const std::string& name) {\n  static const std::map<std::string, const char*> sources = {\n")
foreach(path IN LISTS shaders)
  get_filename_component(name "${path}" NAME_WE)
  file(READ "${path}" text)
  string(FIND "${text}" ")wgsl\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${path} contains the raw-string delimiter )wgsl\"")
  endif()
  string(APPEND body "      {\"${name}\", R\"wgsl(${text})wgsl\"},\n")
endforeach()
string(APPEND body "  };\n  auto it = sources.find(name);\n  if (it == sources.end() || name.empty() || name[0] == '_') return {};\n  std::string text;\n  for (const auto& [file, source] : sources) {\n    if (file[0] == '_') text += source;\n  }\n  return text + it->second;\n}\n\n}  // namespace flashtq::webgpu\n")
file(WRITE "${OUTPUT}.tmp" "${body}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
