# xesp_bpf_skeleton(NAME SOURCE [DEPENDS headers...])
# Builds SOURCE with clang for the BPF target (-O2 -g, warnings as errors) and generates its
# bpftool skeleton NAME.skel.h in the current binary directory, as libbpf-bootstrap's
# bpf_object() does. Sets NAME_SKEL in the caller's scope to the header's path; add it to a
# target's sources and the current binary directory to its include path.
find_program(XESP_BPF_CLANG NAMES clang clang-14 REQUIRED)
find_program(XESP_BPFTOOL NAMES bpftool PATHS /usr/sbin /sbin REQUIRED)

function(xesp_bpf_skeleton name source)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}.bpf.o)
  set(skel ${CMAKE_CURRENT_BINARY_DIR}/${name}.skel.h)
  # <asm/types.h> lives under the multiarch directory on Debian.
  set(includes -I${CMAKE_SOURCE_DIR})
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND includes -I/usr/include/${CMAKE_LIBRARY_ARCHITECTURE})
  endif()
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${XESP_BPF_CLANG} -O2 -g -target bpf -Wall -Wextra -Werror ${includes}
            -c ${source} -o ${obj}
    DEPENDS ${source} ${ARG_DEPENDS}
    COMMENT "BPF ${name}.bpf.o"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${XESP_BPFTOOL} gen skeleton ${obj} name ${name} > ${skel}
    DEPENDS ${obj}
    COMMENT "bpftool skeleton ${name}.skel.h")
  set(${name}_SKEL ${skel} PARENT_SCOPE)
endfunction()
