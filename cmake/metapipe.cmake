# Helpers shared by every layer's CMakeLists.txt.

# mp_add_gtest(NAME SOURCES a.cpp ... LIBS lib ... [GPU])
# One GoogleTest executable registered test by test with ctest. GPU suites (named SM90_*) get the
# `gpu` label, and a test that calls GTEST_SKIP() is reported by ctest as skipped, never as passed
# (tests/support/gtest_main.cpp exits 77 for a skipped test; SKIP_RETURN_CODE maps that to "skipped").
if(NOT TARGET mp_gtest_main)
  add_library(mp_gtest_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/gtest_main.cpp)
  target_link_libraries(mp_gtest_main PUBLIC GTest::gtest)
endif()
function(mp_add_gtest name)
  cmake_parse_arguments(T "GPU" "" "SOURCES;LIBS" ${ARGN})
  if(T_GPU AND NOT MP_HAVE_CUDA)
    return()
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} mp_gtest_main GTest::gtest Threads::Threads)
  set(labels cpu)
  if(T_GPU)
    set(labels gpu)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${labels}" SKIP_RETURN_CODE 77)
endfunction()
