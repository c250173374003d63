# xesp_bpf_skeleton(NAME SOURCE... [DEPENDS headers...])
# Builds each SOURCE with clang for the BPF target (-O2 -g, warnings as errors) and generates
# the bpftool skeleton NAME.skel.h in the current binary directory, as libbpf-bootstrap's
# bpf_object() does. Several sources are linked into one object first with `bpftool gen
# object` (libbpf's static linker, as the kernel's BPF selftests do): one skeleton then holds
# every program, and a map defined __weak in a header they all include exists once, shared.
# Sets NAME_SKEL in the caller's scope to the header's path; add it to a target's sources and
# the current binary directory to its include path.
find_program(XESP_BPF_CLANG NAMES clang clang-14 REQUIRED)
find_program(XESP_BPFTOOL NAMES bpftool PATHS /usr/sbin /sbin REQUIRED)

function(xesp_bpf_skeleton name)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  set(sources ${ARG_UNPARSED_ARGUMENTS})
  list(LENGTH sources nsources)
  if(nsources EQUAL 0)
    message(FATAL_ERROR "xesp_bpf_skeleton(${name}): no source")
  endif()
  set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}.bpf.o)
  set(skel ${CMAKE_CURRENT_BINARY_DIR}/${name}.skel.h)
  # <asm/types.h> lives under the multiarch directory on Debian.
  set(includes -I${CMAKE_SOURCE_DIR})
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND includes -I/usr/include/${CMAKE_LIBRARY_ARCHITECTURE})
  endif()
  set(parts)
  foreach(source ${sources})
    if(nsources EQUAL 1)
      set(part ${obj})
    else()
      get_filename_component(stem ${source} NAME_WE)
      set(part ${CMAKE_CURRENT_BINARY_DIR}/${name}.${stem}.o)
    endif()
    get_filename_component(file ${part} NAME)
    add_custom_command(
      OUTPUT ${part}
      COMMAND ${XESP_BPF_CLANG} -O2 -g -target bpf -Wall -Wextra -Werror ${includes}
              -c ${source} -o ${part}
      DEPENDS ${source} ${ARG_DEPENDS}
      COMMENT "BPF ${file}"
      VERBATIM)
    list(APPEND parts ${part})
  endforeach()
  if(nsources GREATER 1)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${XESP_BPFTOOL} gen object ${obj} ${parts}
      DEPENDS ${parts}
      COMMENT "bpftool link ${name}.bpf.o"
      VERBATIM)
  endif()
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${XESP_BPFTOOL} gen skeleton ${obj} name ${name} > ${skel}
    DEPENDS ${obj}
    COMMENT "bpftool skeleton ${name}.skel.h")
  set(${name}_SKEL ${skel} PARENT_SCOPE)
endfunction()
