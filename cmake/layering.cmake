# The libraries' layering (shared/DESIGN.md), checked when CMake configures: a source of library
# FOLDER may include the headers of FOLDER and of the libraries it links (directly or through
# them), nothing above. Every library sees the whole tree on its include path
# (include_directories(${CMAKE_SOURCE_DIR})), so without this check an include could run back
# up a layer and the link would still succeed through the binary that links both. A violation
# stops the configure with the file, the include and the folders that library may use.
function(pt_layering folder)
  set(allowed ${folder} ${ARGN})
  file(GLOB_RECURSE sources ${CMAKE_SOURCE_DIR}/${folder}/*.h ${CMAKE_SOURCE_DIR}/${folder}/*.cc
       ${CMAKE_SOURCE_DIR}/${folder}/*.cu ${CMAKE_SOURCE_DIR}/${folder}/*.cuh)
  foreach(source ${sources})
    file(STRINGS ${source} includes REGEX "^#include \"[a-z_]+/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" used "${line}")
      if(NOT used IN_LIST allowed)
        file(RELATIVE_PATH where ${CMAKE_SOURCE_DIR} ${source})
        list(JOIN allowed ", " may)
        message(FATAL_ERROR "${where}: ${line}: ${folder}/ may include only ${may} (cmake/layering.cmake)")
      endif()
    endforeach()
  endforeach()
endfunction()

pt_layering(core)
pt_layering(onnx_import core)
pt_layering(partition core)
pt_layering(schedule core)
pt_layering(autodiff partition core)
pt_layering(plan autodiff schedule partition core)
pt_layering(exec core)
pt_layering(train exec autodiff schedule partition core)
