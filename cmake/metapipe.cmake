# Helpers shared by every layer's CMakeLists.txt.

# mp_add_gtest(NAME SOURCES a.cpp ... LIBS lib ... [GPU])
# One GoogleTest executable registered test by test with ctest. GPU suites (named SM90_*) get the
# `gpu` label, and a test that calls GTEST_SKIP() is reported by ctest as skipped, never as passed.
function(mp_add_gtest name)
  cmake_parse_arguments(T "GPU" "" "SOURCES;LIBS" ${ARGN})
  if(T_GPU AND NOT MP_HAVE_CUDA)
    return()
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  set(labels cpu)
  if(T_GPU)
    set(labels gpu)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${labels}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()
