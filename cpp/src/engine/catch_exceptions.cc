#include "engine/catch_exceptions.h"

#include <exception>
#include <new>
#include <string>

namespace shardkeep::internal {

Status StatusOfCurrentException(std::string_view what) {
  const std::string where(what);
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    return ResourceExhaustedError(where + " ran out of memory (" + e.what() + ")");
  } catch (const std::exception& e) {
    return InternalError(where + " threw an exception: " + e.what());
  } catch (...) {
    return InternalError(where + " threw an exception of unknown type");
  }
}

}  // namespace shardkeep::internal
