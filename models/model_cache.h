// Where the default model lives: the GGUF that scripts/install-deps unpacks from PyPI into the user's
// cache (METAPIPE_MODEL_DIR overrides the folder).
#pragma once
#include <string>

namespace mp::models {

// The folder: $METAPIPE_MODEL_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/metapipe/models.
std::string model_dir();
// The file name of the default model inside model_dir().
constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
// The default model's path; user_error naming scripts/install-deps when the file is missing.
std::string default_model_path();

}  // namespace mp::models
