# Tests of backends/cuda/lower (included from tests/CMakeLists.txt).
set(MP_CUDA_LOWER_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

# The generated code of every program, compiled for the host and run there against the interpreter.
add_executable(cuda_lower_emit ${MP_CUDA_LOWER_TEST_DIR}/cuda_lower_emit.cpp)
target_link_libraries(cuda_lower_emit PRIVATE mp_examples mp_passes mp_cuda_lower)
set(MP_CUDA_LOWER_HOST_TU ${CMAKE_CURRENT_BINARY_DIR}/cuda_lower_host_programs.cpp)
add_custom_command(OUTPUT ${MP_CUDA_LOWER_HOST_TU}
                   COMMAND cuda_lower_emit ${MP_CUDA_LOWER_HOST_TU}
                   DEPENDS cuda_lower_emit
                   COMMENT "Lowering every program to CUDA C++ for the host test" VERBATIM)
set_source_files_properties(${MP_CUDA_LOWER_HOST_TU} PROPERTIES COMPILE_OPTIONS
  "-Wno-unknown-pragmas;-Wno-unused-parameter;-Wno-unused-variable;-Wno-unused-but-set-variable")
mp_add_gtest(test_cuda_lower SOURCES ${MP_CUDA_LOWER_TEST_DIR}/test_cuda_lower.cpp ${MP_CUDA_LOWER_HOST_TU}
             LIBS mp_examples mp_backend_cpu mp_cuda_lower)

# The CLI: --emit cuda, --target cuda, the demo's cuda rows.
mp_add_gtest(test_cuda_lower_cli SOURCES ${MP_CUDA_LOWER_TEST_DIR}/test_cuda_lower_cli.cpp LIBS mp_cuda_lower)
target_compile_definitions(test_cuda_lower_cli PRIVATE MP_CLI_PATH="$<TARGET_FILE:metapipe>")
add_dependencies(test_cuda_lower_cli metapipe)

if(MP_HAVE_CUDA)
  # nvcc compiles the emitted unit of every program for sm_90a (one nvcc call for all of them).
  add_test(NAME CudaLowerNvcc.EveryProgramCompilesForSm90a
           COMMAND bash ${MP_CUDA_LOWER_TEST_DIR}/cuda_lower_nvcc.sh $<TARGET_FILE:metapipe>
                   ${CMAKE_CUDA_COMPILER} ${PROJECT_SOURCE_DIR})
  set_tests_properties(CudaLowerNvcc.EveryProgramCompilesForSm90a PROPERTIES LABELS cpu TIMEOUT 600)
  # NVRTC, the run time's compiler, accepts every program's unit too (no GPU needed).
  mp_add_gtest(test_cuda_lower_nvrtc SOURCES ${MP_CUDA_LOWER_TEST_DIR}/test_cuda_lower_nvrtc.cpp
               LIBS mp_examples mp_cuda_lower)
  # Every program on the GPU against the reference interpreter.
  mp_add_gtest(test_cuda_lower_sm90 SOURCES ${MP_CUDA_LOWER_TEST_DIR}/test_cuda_lower_sm90.cpp
               LIBS mp_examples mp_backend_cpu mp_cuda_lower GPU)
endif()
