// Keeps the testing library non-empty; the helpers are header-only.
#include "testing/status_matchers.h"
