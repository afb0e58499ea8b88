// The attention entry points in a build without CUDA: they check the shape, then say so.
#include "core/error.h"
#include "kernels/attention.h"

namespace mp::kernels {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw not_supported(std::string(what) + " in a build without CUDA (nvcc was not found at configure time)");
}
}  // namespace

void attention_forward(const AttentionShape& s, const void*, const void*, const void*, void*, float*, float,
                       bool, CUstream_st*) {
  check_attention_shape(s);
  no_cuda("the attention forward kernel");
}
void attention_decode(const AttentionShape& s, const void*, const void*, const void*, void*, float*, float,
                      bool, CUstream_st*, const AttentionDecodeConfig& config) {
  check_attention_decode_shape(s);
  attention_decode_plan(s, 1, config);  // a bad config is reported as on a GPU
  no_cuda("the attention decode kernel");
}
void attention_backward(const AttentionShape& s, const void*, const void*, const void*, const void*,
                        const float*, const void*, void*, void*, void*, float, bool, CUstream_st*,
                        attention_backward_impl) {
  check_attention_shape(s);
  no_cuda("the attention backward kernel");
}
AttentionCheckResult check_attention(const AttentionShape& s, attention_pass pass,
                                     const AttentionCheckOptions&) {
  pass == attention_pass::decode ? check_attention_decode_shape(s) : check_attention_shape(s);
  no_cuda("the attention check");
}
AttentionTiming time_attention(const AttentionShape& s, attention_pass pass, bool, int, double,
                               attention_backward_impl, const AttentionDecodeConfig&) {
  pass == attention_pass::decode ? check_attention_decode_shape(s) : check_attention_shape(s);
  no_cuda("attention timing");
}

}  // namespace mp::kernels
