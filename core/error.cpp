// Out-of-line anchor for the error types (keeps their vtables in one object file).
#include "core/error.h"
